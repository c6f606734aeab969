"""This worker's row in ``workers``, and whether it may judge others dead.

The row (vpay/engine/workers.py) is registered at start, beaten by the
heartbeat thread, and marked stopped at the exit. A beat that finds the row
naming another process (this one was frozen past its bound and the id taken
over) logs one error and asks for a drain (``on_taken_over``): this process
must not claim, beat or register under an id that is no longer its own.

Issue 25, "Workers as rows". The reaper (vpay/worker/maintenance.py) reaps a
lease whose holder's heartbeat is older than the holder's bound only while
``steady()``: this worker has had no trouble reaching the database (a failed
beat or reap) for ``dead_after`` seconds, nor started less than that ago.
After an outage every worker's heartbeat is old at once; the first worker
back must not take the others' leases before they have had the time to beat.
(The database's own restart is the migration's part: ``lease_holder_gone``.)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import datetime
from typing import Callable, Iterable

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from vpay.base.db import answer_within
from vpay.engine import workers
from vpay.worker.leases import EXIT_WRITE_SECONDS

log = logging.getLogger("vpay.worker")


class Presence:
    """``worker_id``'s row, serving ``lanes``, with bound ``dead_after``
    seconds (``VPAY_WORKER_DEAD_AFTER_SECONDS``) and ``version``; host and
    pid are this process's. ``clock``: monotonic seconds (tests).
    ``on_taken_over``: called once, from the heartbeat thread, when the row
    names another process (the worker drains, then exits 1)."""

    def __init__(self, pool: ConnectionPool, worker_id: str, lanes: Iterable[str], dead_after: float,
                 version: str, clock: Callable[[], float] = time.monotonic,
                 on_taken_over: Callable[[], None] | None = None):
        self.pool = pool
        self.worker_id = worker_id
        self.lanes = tuple(lanes)
        self.dead_after = dead_after
        self.version = version
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.clock = clock
        self.started_at: datetime | None = None
        """The database's time of the registration (kept for a registration
        again when the row was pruned)."""
        self._trouble = clock()  # the start counts as trouble: see steady()
        self._failing = False
        self.on_taken_over = on_taken_over
        self.taken_over_by: tuple[str | None, int | None] | None = None
        """The (host, pid) the row named when a beat found it taken over;
        ``None`` while the id is this process's."""

    def register(self) -> None:
        """Insert or take over the row (``workers.register``): at start,
        before the boot reap and any claim. Raises ``psycopg.Error`` or
        ``PoolTimeout`` when the database cannot be reached."""
        with self.pool.connection() as conn:
            self._register(conn)

    def _register(self, conn: psycopg.Connection) -> None:
        self.started_at = workers.register(conn, self.worker_id, host=self.host, pid=self.pid,
                                           lanes=self.lanes, version=self.version,
                                           dead_after=self.dead_after)

    @property
    def taken_over(self) -> bool:
        """Whether a beat found the id taken over by another process."""
        return self.taken_over_by is not None

    def beat(self) -> bool:
        """``heartbeat_at = now()`` on this process's row (registering again,
        with its first ``started_at``, when the row is gone: a lease this
        process claimed is never taken for an earlier incarnation's).
        Answers whether the row was beaten. A failure is trouble (see
        ``steady``) and is logged once per run of failures. A row that names
        another process is never written: ``taken_over`` (one error line,
        and ``on_taken_over`` called); every later beat answers ``False``
        without a statement."""
        if self.taken_over:
            return False
        try:
            with self.pool.connection(timeout=workers.beat_interval(self.dead_after)) as conn:
                found = workers.beat(conn, self.worker_id, host=self.host, pid=self.pid)
                if found.found == workers.GONE:
                    again = workers.register_again(conn, self.worker_id, host=self.host, pid=self.pid,
                                                   lanes=self.lanes, version=self.version,
                                                   dead_after=self.dead_after, started_at=self.started_at)
                    if again is None:  # another process registered the id meanwhile
                        found = workers.claimant(conn, self.worker_id)
                    else:
                        self.started_at = again
                        log.warning("this worker's row was gone: registered again",
                                    extra={"worker_id": self.worker_id})
        except (psycopg.Error, PoolTimeout) as exc:
            self.trouble()
            if not self._failing:
                log.warning("worker heartbeat failed; database unavailable",
                            extra={"worker_id": self.worker_id, "error": str(exc)[:300]})
            self._failing = True
            return False
        if self._failing:
            log.info("worker heartbeat restored", extra={"worker_id": self.worker_id})
        self._failing = False
        if found.found == workers.TAKEN_OVER:
            self._taken_over(found.host, found.pid)
            return False
        return True

    def _taken_over(self, host: str | None, pid: int | None) -> None:
        self.taken_over_by = (host, pid)
        log.error("worker id taken over by another process; stopping",
                  extra={"worker_id": self.worker_id, "host": self.host, "pid": self.pid,
                         "taken_over_by_host": host, "taken_over_by_pid": pid})
        if self.on_taken_over is not None:
            self.on_taken_over()

    def trouble(self) -> None:
        """The database could not be reached just now (a beat, a reap)."""
        self._trouble = self.clock()

    def steady(self) -> bool:
        """Whether this worker has reached the database without trouble for
        ``dead_after`` seconds (and started at least that long ago): then
        every live worker has had the time to beat, and a heartbeat older
        than its bound means its worker is dead."""
        return self.clock() - self._trouble >= self.dead_after

    def stop(self) -> None:
        """Mark the row stopped (the exit): a lease still held under this id
        is reaped at once by any worker. Only this process's row (host,
        pid): nothing when the id was taken over. Best effort: when the
        database cannot be reached the heartbeat's age tells the same within
        ``dead_after``."""
        if self.taken_over:
            return
        try:
            with self.pool.connection(timeout=2.0) as conn, answer_within(conn, EXIT_WRITE_SECONDS):
                workers.stop(conn, self.worker_id, host=self.host, pid=self.pid)
        except (psycopg.Error, PoolTimeout) as exc:
            log.warning("could not mark this worker stopped; its heartbeat will age",
                        extra={"worker_id": self.worker_id, "error": str(exc)[:300]})
