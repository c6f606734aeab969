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
        # the block writes no file where it runs (the operator's checkout)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["block.log", "pg"]
        charge_id = re.search(r"^(ch_[A-Za-z0-9]+)\s+pending", log, re.MULTILINE).group(1)  # payments show's table
        assert "CHARGES:" in log and "EVENTS:" in log
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


UNITS = README.parent / "systemd"


def test_the_units_run_what_the_readme_installs_and_systemd_analyze_verifies_them(tmp_path):
    """Every unit's ExecStart names the README's install path (the venv at
    /opt/vpay/venv), and ``systemd-analyze verify`` accepts the units with
    that path laid out under a root of their own."""
    import shutil
    block = run_it_for_real()
    venv = re.match(r"python3 -m venv (\S+)", block).group(1)
    units = sorted(UNITS.glob("*.service"))
    for unit in units:
        for line in unit.read_text().splitlines():
            if line.startswith("ExecStart="):
                assert line.split("=", 1)[1].startswith(f"{venv}/bin/vpay-"), (unit.name, line)
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed here")
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    bin_dir = root / venv.lstrip("/") / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("vpay-server", "vpay-worker"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    for system in ("usr/lib/systemd/system", "lib/systemd/system"):  # sysinit.target and the like
        if (Path("/") / system).is_dir() and not (root / "usr/lib/systemd/system").exists():
            shutil.copytree(Path("/") / system, root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/vpay").mkdir()
    (root / "etc/vpay/vpay.env").write_text("")
    for unit in [*units, UNITS / "vpay.target"]:
        shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    names = ["vpay-api.service", "vpay-worker@1.service", "vpay-worker-lanes@mtn.service", "vpay.target"]
    res = subprocess.run(["systemd-analyze", f"--root={root}", "verify", "--man=no", *names],
                         capture_output=True, text=True, timeout=120)
    problems = [l for l in res.stderr.splitlines() if "vpay" in l and "not executable" in l or "/opt/" in l]
    assert res.returncode == 0 and not problems, res.stderr
