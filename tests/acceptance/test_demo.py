"""`vpay-server demo`, run as the README runs it: no database configured."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from support import script

pytestmark = pytest.mark.slow


def test_demo_on_the_embedded_default_ends_every_payment_as_scripted(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPAY_")}
    env["VPAY_DATA_DIR"] = str(tmp_path / "data")
    res = subprocess.run([script("vpay-server"), "demo"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=280)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "29/29 charges ended as the sandbox scripted them: PASS" in res.stdout
    rows = [line for line in res.stdout.splitlines() if line.startswith("ch_")]
    assert len(rows) == 29 and all(line.rstrip().endswith("yes") for line in rows)
    events, verified = re.search(r"events written: (\d+); webhooks received with a valid signature: (\d+)",
                                 res.stdout).groups()
    assert events == verified == "54"
    assert "worker drained with exit 0" in res.stdout
    assert (tmp_path / "data" / "pgdata" / "PG_VERSION").exists()  # the embedded default was used
