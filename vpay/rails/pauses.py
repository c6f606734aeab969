"""The rail pause board in Postgres: a rail's 429/503 ``Retry-After`` pause
shared by every worker and API process (issue 25, "Rail backpressure
fleet-wide"; table ``rail_pauses``, ``sql/0026_rail_pauses.sql``; queries in
``sql/queries/rail_pauses.sql``).

``DatabasePauses`` is the ``vpay.rails.gate.PauseBoard`` a process hands to
``share_pauses``: ``publish`` writes a pause (one upsert; a pause only
extends), ``in_force`` answers from a copy of every rail's pause that is
read again when it is ``REFRESH_SECONDS`` old, on the calling thread (the
claim path: the gate's ``check`` before a rail call), by one thread at a
time while the others wait for its copy (never a stale one). Every database call is
bounded (``WAIT_SECONDS`` for a pooled connection and for the statement)
and best effort: a board that cannot be read keeps the last copy (its
pauses age as they would) and one that cannot be written leaves the pause
to the process that got it; either is logged once per outage.

The rows' times are the database's (``now()``), so replicas whose clocks
disagree still agree on when a pause ends; a copy turns them into seconds
left, aged on this process's monotonic clock.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from vpay.rails.gate import SharedPause

log = logging.getLogger("vpay.rail_gate")

REFRESH_SECONDS = 1.0
"""How old a process's copy of the board may get before the next rail call
reads it again (seconds): a replica honours another's pause at most this
long after it was written (plus one read)."""

WAIT_SECONDS = 2.0
"""Bound on each board read or write: the pool checkout, then the
statement (``statement_timeout``); past it the call goes on without."""


class DatabasePauses:
    """The board through ``pool`` (a ``psycopg_pool.ConnectionPool`` of
    autocommit connections). ``set_by`` names this process on the rows it
    writes (a worker id, ``api <host>:<pid>``). ``clock`` is monotonic
    seconds. Thread-safe."""

    def __init__(self, pool: Any, set_by: str, *, refresh: float = REFRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.pool = pool
        self.set_by = set_by[:200]
        self.refresh = refresh
        self._clock = clock
        self._lock = threading.Lock()        # guards the copy
        self._reading = threading.Lock()     # one reader at a time
        self._copy: dict[str, tuple[float, SharedPause]] = {}  # rail -> (read at, pause)
        self._read_at: float | None = None
        self._failing = False

    def publish(self, rail: str, seconds: float, reason: str) -> None:
        """Pause ``rail`` for ``seconds`` from the database's now, unless a
        pause in force ends later; the row in force afterwards enters the
        copy. Never raises (a failure is logged)."""
        from vpay.base.queries import Q
        try:
            row = self._run(Q["rail_pause_extend"], {"rail": rail, "seconds": float(seconds),
                                                     "reason": reason[:200], "set_by": self.set_by})
        except Exception as exc:  # noqa: BLE001 - the pause still holds in this process
            log.warning("rail pause not shared", extra={"rail": rail, "error": _short(exc)})
            return
        read_at = self._clock()
        if row:  # None: a longer pause was in force; the next read copies it
            with self._lock:
                self._copy[rail] = (read_at, _pause(row, float(seconds)))

    def in_force(self, rail: str) -> SharedPause | None:
        """The board's pause of ``rail`` in force now, from the copy (read
        again first when it is ``refresh`` seconds old; a thread that finds
        another reading it waits for that copy). Never raises."""
        if self._stale():
            # One reader; the others wait for its copy (bounded by its
            # WAIT_SECONDS): a thread that went on with the stale copy could
            # send what the fresh one would hold back.
            with self._reading:
                if self._stale():  # not read by the thread we waited for
                    self._read()
        with self._lock:
            held = self._copy.get(rail)
        if held is None:
            return None
        read_at, pause = held
        left = pause.seconds_left - (self._clock() - read_at)
        if left <= 0:
            return None
        return SharedPause(pause.rail, left, pause.paused_until, pause.reason, pause.set_by)

    def _stale(self) -> bool:
        return self._read_at is None or self._clock() - self._read_at >= self.refresh

    def _read(self) -> None:
        from vpay.base.queries import Q
        try:
            rows = self._run(Q["rail_pauses_in_force"], None, many=True)
        except Exception as exc:  # noqa: BLE001 - keep the copy; the gate's own pauses hold
            if not self._failing:
                log.warning("rail pauses not read; using the last copy", extra={"error": _short(exc)})
            self._failing = True
            # Also on failure: one attempt per refresh, not one per call.
            self._read_at = self._clock()
            return
        if self._failing:
            log.info("rail pauses read again")
            self._failing = False
        read_at = self._clock()
        copy = {r[0]: (read_at, _pause(r, r[4])) for r in rows}
        with self._lock:
            self._copy = copy
        # Only now, after the copy: a thread that finds the copy fresh skips
        # the reading lock and uses it. Marked fresh at the start of the read,
        # every other claim loop took the copy from before it (empty in a
        # process that never read the board) and sent to a paused rail while
        # the read was on its way (seen with two workers under load).
        self._read_at = read_at

    def _run(self, sql: str, params: dict | None, many: bool = False):
        with self.pool.connection(timeout=WAIT_SECONDS) as conn, conn.transaction():
            conn.execute(f"SET LOCAL statement_timeout = {int(WAIT_SECONDS * 1000)}")
            cur = conn.execute(sql, params)
            return cur.fetchall() if many else cur.fetchone()


def _pause(row: tuple, seconds_left: float) -> SharedPause:
    rail, paused_until, reason, set_by = row[:4]
    return SharedPause(rail, seconds_left, paused_until, reason, set_by)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def board(conn: Any) -> dict[str, dict[str, Any]]:
    """Every rail's last pause on the board, in force or over, by rail:
    ``{rail: {paused_until, in_force, seconds_left, reason, set_by, set_at}}``
    (``seconds_left`` 0 once over; at most one row per rail)."""
    from psycopg.rows import dict_row
    from vpay.base.queries import Q
    with conn.cursor(row_factory=dict_row) as cur:
        return {r.pop("rail"): r for r in cur.execute(Q["rail_pauses_list"]).fetchall()}
