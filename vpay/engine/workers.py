"""Workers as rows: the ``workers`` table (sql/0024_workers.sql), one row per
worker id, and how the queue judges a lease's holder by it.

Design page, "Leases and crash recovery"; issue 25, "Workers as rows". A
worker ``register``s at start (its id is the one it writes in
``jobs.locked_by``), ``beat``s from its heartbeat thread every
``beat_interval(dead_after)`` seconds, and ``stop``s when it exits cleanly.
The view ``worker_states`` says what each is: ``live`` (its heartbeat is
within its own ``dead_after_seconds``), ``dead``, or ``stopped``.

A lease's holder is gone (``lease_holder_gone`` in the migration) when its
row says ``stopped``; ``restarted`` when the lease was claimed before the
holder's row was last registered (a worker restarted under the same id,
``--worker-id %H:%i`` under systemd, holds nothing from before: its earlier
incarnation claimed it and is gone); ``dead`` when the holder's heartbeat is
older than the holder's own bound, unless the database itself started less
than that bound ago (after a restart nobody could beat). The reaper frees
those leases then, not at lease expiry (``queue.reap_expired_leases``); a
holder with no row at all is judged by the lease's expiry alone. Every
lease-ending write is still fenced on ``locked_by`` and the lease token, so a
holder judged dead that was only frozen changes nothing when it wakes.

One id, one process: a second process under a live id, or under the id of
a vpay-worker still running on this host (even frozen), is refused at start
(``refuse_shared_id``); a process that finds at a beat that its row now
names another process (``TAKEN_OVER``: it was frozen past its bound and the
id was taken over) stops claiming and exits, and never registers over it.

Retention: the hourly sweep deletes rows of workers dead or stopped for
longer than ``DEAD_WORKER_RETENTION_SECONDS`` (``prune``).
"""

from __future__ import annotations

import math
import os
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import psycopg
from psycopg.rows import dict_row

from vpay.base.db import ConfigError
from vpay.base.queries import Q

DEAD_AFTER_SECONDS = 30.0
"""Default of ``VPAY_WORKER_DEAD_AFTER_SECONDS``: a worker whose heartbeat is
older than this is dead, and the leases it holds are reaped then rather than
at their expiry (the lease, 300 s by default, stays the fallback). Four
heartbeats fit in it (``beat_interval``): one late beat under load, or a
database blip of a few seconds, is not death."""

MIN_DEAD_AFTER_SECONDS = 1.0
"""The smallest ``VPAY_WORKER_DEAD_AFTER_SECONDS`` accepted: below it the
heartbeat would write every quarter of a second per worker, and a loaded box
misses that often enough to reap live workers' leases."""

MAX_DEAD_AFTER_SECONDS = 3600.0
"""The largest ``VPAY_WORKER_DEAD_AFTER_SECONDS`` accepted: past an hour the
lease's expiry (300 s by default) frees the jobs first anyway."""

BEATS_PER_BOUND = 4
"""Heartbeats per ``dead_after``: a worker is judged dead only after missing
about four in a row."""

DEAD_WORKER_RETENTION_SECONDS = 7 * 86400.0
"""How long the row of a worker dead or stopped stays in ``workers`` (seconds:
a week, to look back at a crash over a weekend). The hourly sweep deletes
older ones (``prune``), never one whose worker still holds a lease."""

MAX_WORKER_ID_CHARS = 200
"""The longest ``--worker-id`` accepted (characters): room for a host name
(64 at most), an instance and a note, short enough to read in ``workers
list``, a log line and ``jobs.locked_by``."""

STATES = ("live", "dead", "stopped")
"""The ``state`` of a row of ``worker_states``."""


def dead_after_from_env(env: Mapping[str, str] | None = None) -> float:
    """``VPAY_WORKER_DEAD_AFTER_SECONDS`` from ``env`` (default
    ``os.environ``): seconds, ``DEAD_AFTER_SECONDS`` when unset or blank.
    Raises ``ConfigError`` (the worker exits 78) unless it is a finite
    number from ``MIN_DEAD_AFTER_SECONDS`` to ``MAX_DEAD_AFTER_SECONDS``."""
    env = os.environ if env is None else env
    name = "VPAY_WORKER_DEAD_AFTER_SECONDS"
    raw = env.get(name, "").strip()
    if not raw:
        return DEAD_AFTER_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and MIN_DEAD_AFTER_SECONDS <= value <= MAX_DEAD_AFTER_SECONDS):
        raise ConfigError(f"{name} must be a number of seconds from {MIN_DEAD_AFTER_SECONDS:g} to "
                          f"{MAX_DEAD_AFTER_SECONDS:g}, got {raw!r}")
    return value


def worker_id_problem(worker_id: str) -> str | None:
    """What is wrong with ``worker_id`` as a ``--worker-id`` (one line for the
    refusal, exit 78), or ``None``. Refused: blank (``""`` would silently be
    the default), whitespace alone or around it (two ids that look alike),
    a character ``str.isprintable`` refuses (a control character such as a
    newline would forge log and table lines; a format or separator
    character hides), and more than ``MAX_WORKER_ID_CHARS`` characters."""
    if not worker_id.strip():
        return "--worker-id is blank: name the worker, or leave the flag out for <hostname>:<pid>"
    if len(worker_id) > MAX_WORKER_ID_CHARS:
        return f"--worker-id is {len(worker_id)} characters long; at most {MAX_WORKER_ID_CHARS}"
    if not worker_id.isprintable():
        return (f"--worker-id {worker_id!r} holds a control or invisible character; "
                f"printable characters only")
    if worker_id != worker_id.strip():
        return f"--worker-id {worker_id!r} starts or ends with whitespace"
    return None


def beat_interval(dead_after: float) -> float:
    """Seconds between two heartbeats of a worker whose bound is ``dead_after``."""
    return dead_after / BEATS_PER_BOUND


def register(conn: psycopg.Connection, worker_id: str, *, host: str, pid: int,
             lanes: Iterable[str], version: str, dead_after: float,
             started_at: datetime | None = None) -> datetime:
    """Insert or take over ``worker_id``'s row, at a process's start (after
    ``refuse_shared_id``): live from now (``stopped_at`` cleared), naming
    this process. ``started_at``: ``None`` for now (the registration again
    of a running process is ``register_again``). Answers the row's
    ``started_at``."""
    row = conn.execute(Q["worker_register"], {
        "id": worker_id, "host": host, "pid": int(pid), "lanes": list(lanes), "version": version,
        "dead_after": float(dead_after), "started_at": started_at}).fetchone()
    return row[0]


def refuse_shared_id(conn: psycopg.Connection, worker_id: str, *, host: str, pid: int,
                     runs_worker: Callable[[int], bool] | None = None) -> None:
    """Refuse to start a second process under ``worker_id``. Two processes
    sharing an id would take each other's leases for a restart's
    (``lease_holder_gone``: "restarted"), redo each other's work, and show as
    one row in ``workers list``. Raises ``ConfigError`` (the worker exits 78)
    when the id's row, not stopped, names another process that may still
    run: on this host, a pid that still runs a vpay-worker (``runs_worker``,
    default ``runs_vpay_worker``), live or dead by its heartbeat (a worker
    frozen by SIGSTOP or a paused VM is dead by its heartbeat but comes
    back); on another host, a row live by its heartbeat (that host's
    processes cannot be seen from here). Taken over: a stopped row, a row on
    this host whose pid is gone or runs something else now (a crash restarted
    by systemd under ``--worker-id %H:%i``), a row of another host dead by
    its heartbeat. A process taken over finds out at its next beat and
    stops (``beat`` answers ``TAKEN_OVER``; vpay/worker/presence.py)."""
    row = conn.execute(Q["worker_claimant"], {"id": worker_id}).fetchone()
    if row is None:
        return
    other_host, other_pid, state, age = row
    if state == "stopped" or (other_host == host and other_pid == pid):
        return
    if other_host == host:
        if not (runs_worker or runs_vpay_worker)(other_pid):
            return
        if state != "live":
            raise ConfigError(
                f"worker id {worker_id!r} is held by a vpay-worker still running on this host (pid "
                f"{other_pid}, dead by its heartbeat {float(age):.0f} s ago: frozen, and it comes back): "
                f"give each worker its own --worker-id (systemd: --worker-id %H:%i), or stop that one first")
    elif state != "live":
        return
    raise ConfigError(
        f"worker id {worker_id!r} is live in another process ({other_host} pid {other_pid}, heartbeat "
        f"{float(age):.0f} s ago): give each worker its own --worker-id (systemd: --worker-id %H:%i), "
        f"or stop that one first")


def runs_vpay_worker(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (``pid_running``) and is a
    worker: its ``/proc/<pid>/cmdline`` holds an argument named
    ``vpay-worker`` (the script, in any directory), or ``vpay-server``
    followed by ``worker``. A pid reused by an unrelated program is not.
    When the command line cannot be read (``hidepid``), a running pid is
    taken for a worker: refusing a start is the safe side of the doubt."""
    if not pid_running(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    names = [os.path.basename(a.decode("utf-8", "replace")) for a in raw.split(b"\0") if a]
    if "vpay-worker" in names:
        return True
    return "vpay-server" in names and "worker" in names[names.index("vpay-server") + 1:]


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie does not: it has
    exited and waits for its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


BEATEN = "beaten"
GONE = "gone"
TAKEN_OVER = "taken_over"
"""What a ``beat`` found: the row beaten; no row (pruned) or this process's
own row marked stopped; the row names another process (host, pid)."""


class Beat(NamedTuple):
    """A ``beat``'s answer: ``found`` (``BEATEN``, ``GONE``, ``TAKEN_OVER``)
    and the ``host`` and ``pid`` the row names now (``None``: no row)."""

    found: str
    host: str | None
    pid: int | None


def beat(conn: psycopg.Connection, worker_id: str, *, host: str, pid: int) -> Beat:
    """``heartbeat_at = now()`` on ``worker_id``'s row, only while it names
    this process (``host``, ``pid``) and is not stopped. ``found`` is
    ``BEATEN``; ``GONE`` when there is no row (pruned while the process was
    frozen for a week) or this process's own row is stopped: the caller
    registers again (``register_again``); ``TAKEN_OVER`` when the row names
    another process (``refuse_shared_id`` let it take the id while this one
    was frozen): the caller must stop, never register over it."""
    beaten, row_host, row_pid = conn.execute(
        Q["worker_beat"], {"id": worker_id, "host": host, "pid": int(pid)}).fetchone()
    if beaten:
        return Beat(BEATEN, row_host, row_pid)
    if row_host is None or (row_host == host and row_pid == int(pid)):
        return Beat(GONE, row_host, row_pid)
    return Beat(TAKEN_OVER, row_host, row_pid)


def claimant(conn: psycopg.Connection, worker_id: str) -> Beat:
    """``TAKEN_OVER`` with the host and pid ``worker_id``'s row names now
    (``None`` when there is none): for a process whose registration again
    (``register_again``) found the id another process's."""
    row = conn.execute(Q["worker_claimant"], {"id": worker_id}).fetchone()
    return Beat(TAKEN_OVER, row[0] if row else None, row[1] if row else None)


def register_again(conn: psycopg.Connection, worker_id: str, *, host: str, pid: int,
                   lanes: Iterable[str], version: str, dead_after: float,
                   started_at: datetime | None) -> datetime | None:
    """``register`` for a process whose row a beat found ``GONE``, only while
    the row, if any, still names this process: answers the row's
    ``started_at``, or ``None`` (nothing written) when another process
    registered the id meanwhile (the caller stops, as for ``TAKEN_OVER``)."""
    row = conn.execute(Q["worker_register_again"], {
        "id": worker_id, "host": host, "pid": int(pid), "lanes": list(lanes), "version": version,
        "dead_after": float(dead_after), "started_at": started_at}).fetchone()
    return row[0] if row else None


def stop(conn: psycopg.Connection, worker_id: str, *, host: str, pid: int) -> bool:
    """Mark ``worker_id`` stopped (a clean exit of process ``pid`` on
    ``host``): a lease it still holds is reaped at once. Only that process's
    row: one another process took over is left as it is. Answers whether a
    row was marked."""
    return conn.execute(Q["worker_stop"], {"id": worker_id, "host": host,
                                           "pid": int(pid)}).fetchone() is not None


def list_workers(conn: psycopg.Connection, state: str | None = None,
                 limit: int = 1000) -> list[dict[str, Any]]:
    """Rows of ``worker_states``, live first, then by id: ``[{id, host, pid,
    lanes, version, started_at, heartbeat_at, heartbeat_age (seconds),
    dead_after_seconds, stopped_at, state, leases}]``; ``leases`` counts the
    jobs leased to that id now. ``state``: only rows in that state (one of
    ``STATES``; ``ValueError`` otherwise)."""
    if state is not None and state not in STATES:
        raise ValueError(f"unknown worker state {state!r}; states are {','.join(STATES)}")
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["workers_list"], {"state": state, "limit": limit}).fetchall()


def live_count(conn: psycopg.Connection) -> int:
    """How many workers are live now."""
    return conn.execute(Q["workers_live"]).fetchone()[0]


def prune(conn: psycopg.Connection,
          retention: float = DEAD_WORKER_RETENTION_SECONDS) -> int:
    """Delete the rows of workers dead or stopped for longer than
    ``retention`` seconds (since their last heartbeat, or their stop) that
    hold no lease. Answers how many."""
    return len(conn.execute(Q["workers_prune"], {"retention": float(retention)}).fetchall())
