"""README's "Run it for real" block, run as written on a Postgres of its own.

The block is followed line by line as a new operator would (bash, `set -e`),
with ``PGHOST``/``PGUSER`` naming a fresh server as the README says, and
only its first line (the venv and ``pip install .``) left out: the test runs
from the installed package already (the ``export PATH`` that follows is run
and is harmless). The processes it starts in the background (the
sandbox rail, the API, the worker) run in the block's own session, which the
test ends with SIGTERM after checking the payment ended.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from support import script, wait_until

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def run_it_for_real() -> str:
    text = README.read_text(encoding="utf-8")
    part = text[text.index("## Run it for real"):]
    return re.search(r"^```sh\n(.*?)^```", part, re.MULTILINE | re.DOTALL).group(1)


def test_the_run_it_for_real_block_can_be_followed_as_written(tmp_path):
    import pgserver
    block = run_it_for_real()
    first, rest = block.split("\n", 1)
    # Into a venv: a bare `pip install .` fails on Debian's externally-managed Python.
    venv = re.match(r"python3 -m venv (\S+) && \1/bin/pip install \.(\s|$)", first)
    assert venv, first
    assert rest.splitlines()[0].startswith(f"export PATH={venv.group(1)}/bin:$PATH")
    assert "createdb vpay" in rest.splitlines()[1]  # the database exists before migrate
    server = pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    socket_dir = str(server.get_postmaster_info().socket_dir)
    pg_bin = str(Path(pgserver.__file__).parent / "pginstall" / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VPAY_", "PG"))}
    env.update({"PGHOST": socket_dir, "PGUSER": "postgres", "PYTHONUNBUFFERED": "1",
                "PATH": f"{Path(script('vpay-server')).parent}:{env.get('PATH', '')}:{pg_bin}"})
    out = open(tmp_path / "block.log", "wb")
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", rest], cwd=tmp_path, env=env,
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        assert proc.wait(120) == 0, (tmp_path / "block.log").read_text()[-4000:]
        log = (tmp_path / "block.log").read_text()
        assert "Traceback" not in log
        created = (tmp_path / "payment.json").read_text()
        charge_id = re.search(r'"id": "(ch_[A-Za-z0-9]+)"', created).group(1)
        assert f'"id": "{charge_id}"' in log and '"poll": {' in log  # what payments show printed
        with psycopg.connect(server.get_uri("vpay"), autocommit=True) as conn:
            # the background worker asks the sandbox rail until the payment ends
            wait_until(lambda: conn.execute("SELECT status FROM charges WHERE id = %s",
                                            (charge_id,)).fetchone()[0] == "succeeded",
                       timeout=90, what="the README's payment to succeed")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        wait_until(lambda: _session_gone(proc.pid), timeout=60, what="the block's processes to stop")
        out.close()
        server.cleanup()


def _session_gone(sid: int) -> bool:
    try:
        os.killpg(sid, 0)
    except ProcessLookupError:
        return True
    return False
