"""The test harness itself: where its embedded Postgres lives."""

from __future__ import annotations

import os
from pathlib import Path


def test_a_killed_runs_embedded_server_is_stopped_and_removed_by_the_next_run(tmp_path):
    # A run killed with SIGKILL runs no atexit: its postmaster keeps running
    # and its folder stays. The next run's sweep stops and removes it, and
    # leaves alone a run that is still alive or only starting.
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    import pg_orphans
    from support import wait_until

    base = Path(tempfile.mkdtemp(prefix="vpo-"))  # short: a Unix socket path has ~107 bytes
    try:
        orphan = base / "vpay-test-pg-orphan"
        killed = subprocess.run([sys.executable, "-c",
                                 "import os, sys; from vpay.base.db import embedded_url; "
                                 "embedded_url(sys.argv[1], 'delete'); os.kill(os.getpid(), 9)", str(orphan)],
                                timeout=120)
        assert killed.returncode == -signal.SIGKILL
        postmaster = pg_orphans._postmaster((orphan / "pgdata").resolve())
        assert postmaster is not None, "the killed run left its server running"

        live = base / "vpay-test-pg-live"
        (live / "pgdata").mkdir(parents=True)
        (live / "pgdata" / ".handle_pids.json").write_text(f"[{os.getpid()}]")
        starting = base / "vpay-test-pg-starting"
        starting.mkdir()
        stale = base / "vpay-test-pg-stale"
        stale.mkdir()
        old = time.time() - pg_orphans.STARTING_GRACE_SECONDS - 60
        os.utime(stale, (old, old))

        # A live run's list read while pgserver rewrites it (truncated, then
        # written): unreadable, so its running postmaster is left alone.
        users = orphan / "pgdata" / ".handle_pids.json"
        listed = users.read_text()
        users.write_text("")
        os.utime(orphan, (old, old))
        assert orphan not in pg_orphans.sweep(base, keep=stale)
        assert pg_orphans._alive(postmaster)
        users.write_text(listed)

        assert set(pg_orphans.sweep(base)) == {orphan, stale}
        wait_until(lambda: not pg_orphans._alive(postmaster), timeout=15, what="the orphan's postmaster stopped")
        assert not orphan.exists() and not stale.exists()
        assert live.is_dir() and starting.is_dir()
        assert pg_orphans.sweep(base, keep=live) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)
