"""Left-over embedded test servers: found and removed at the next run.

A run killed with SIGKILL (or an xdist worker killed with its controller)
runs no ``atexit``: its pgserver Postgres keeps running and its folder
(``$TMPDIR/vpay-test-pg-<run>``, ~80 MB) stays, and since each run picks a
new folder nothing would ever reuse or remove it. ``sweep`` removes the
folders whose every user process is gone, stopping their postmaster first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

from vpay.api.exposition import pid_alive as _alive

PREFIX = "vpay-test-pg-"
STARTING_GRACE_SECONDS = 3600.0
"""A folder with no list of user processes yet may be a run starting now:
left alone until it is this old."""
STOP_WAIT_SECONDS = 10.0
"""How long a postmaster gets to stop on SIGINT (fast shutdown) before SIGKILL."""


def _users(folder: Path) -> list[int] | None:
    try:
        return [int(p) for p in json.loads((folder / "pgdata" / ".handle_pids.json").read_text())]
    except (OSError, ValueError, TypeError):
        return None


def _postmaster(pgdata: Path) -> int | None:
    """The pid in ``postmaster.pid`` if that process is a postgres of this
    folder (a reused pid of some other process is never signalled)."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return None
    return pid if "postgres" in cmdline and str(pgdata) in cmdline else None


def _stop(pid: int) -> None:
    # Another run's sweep may be stopping the same orphan: a pid already gone
    # is the goal reached, not an error.
    try:
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sweep(base: Path, keep: Path | None = None) -> list[Path]:
    """Remove every ``base/vpay-test-pg-*`` folder but ``keep`` whose user
    processes are all gone (or that has no readable list of them, no running
    postmaster, and is older than ``STARTING_GRACE_SECONDS``); answer the
    folders removed."""
    removed = []
    for folder in sorted(base.glob(PREFIX + "*")):
        if not folder.is_dir() or (keep is not None and folder.resolve() == keep.resolve()):
            continue
        users = _users(folder)
        pid = _postmaster((folder / "pgdata").resolve())
        if users is None:
            # No readable list: a run starting now, or pgserver rewriting the
            # list this instant (it truncates, then writes). A running
            # postmaster may be a live run's: never stopped on this alone.
            if pid is not None:
                continue
            try:
                if time.time() - folder.stat().st_mtime < STARTING_GRACE_SECONDS:
                    continue
            except OSError:
                continue
        elif any(_alive(user) for user in users):
            continue
        if pid is not None:
            _stop(pid)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed
