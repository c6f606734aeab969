"""The job leases one worker holds: the jobs in flight by lease token, and the
claims whose answer was lost, to hand back.

Design page, "Leases and crash recovery". A claim loop ``hold``s a job while
its handler runs and its outcome is written; the heartbeat ``renew``s what is
held (vpay/worker/maintenance.py); a claim statement that failed without an
answer may still have leased a job to this worker, so its token is kept and
``release``d by it (``hand_back``). Every write here is fenced on this
worker's id and the lease tokens (``queue.renew``, ``queue.release``).
"""

from __future__ import annotations

import logging
import threading
import uuid

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from vpay.base import metrics
from vpay.base.db import answer_within
from vpay.engine import queue

log = logging.getLogger("vpay.worker")

EXIT_WRITE_SECONDS = 5.0
"""How long a lease release may wait for the database's answer (seconds),
on top of the wait for a pooled connection: past it the release is given up
(the reaper frees those leases when they run out), so a database that went
silent cannot hold a drain past its grace (``vpay.base.db.answer_within``)."""

MAX_UNANSWERED = 1000
"""Tokens of claims whose answer was lost that a worker keeps to hand back
(``Leases.hand_back``) while the database cannot be reached; past it the
oldest are dropped, and their jobs, if those claims committed, wait for the
reaper as before (a lease)."""


class Leases:
    """What ``worker_id`` holds: ``inflight`` (lease token → job being run)
    and ``unanswered`` (tokens of claims whose answer was lost, not yet
    handed back; a dict for its order: the oldest go first past
    ``MAX_UNANSWERED``). ``lease``: seconds a renewal extends a lease by.
    Thread-safe: the claim loops, the heartbeat and the drain share it."""

    def __init__(self, pool: ConnectionPool, worker_id: str, lease: float):
        self.pool = pool
        self.worker_id = worker_id
        self.lease = lease
        self.inflight: dict[uuid.UUID, queue.Job] = {}
        self.unanswered: dict[uuid.UUID, None] = {}
        self._unrecorded: dict[uuid.UUID, None] = {}
        self._lock = threading.Lock()

    def hold(self, job: queue.Job) -> None:
        """``job`` is being run by a claim loop: renewed until ``drop``."""
        with self._lock:
            self.inflight[job.lease_token] = job

    def drop(self, job: queue.Job) -> None:
        """``job``'s outcome is written (or left to the reaper): no more renewals."""
        with self._lock:
            self.inflight.pop(job.lease_token, None)

    def held(self) -> list[uuid.UUID]:
        """The lease tokens of the jobs in flight."""
        with self._lock:
            return list(self.inflight)

    def in_flight(self) -> int:
        """How many jobs are in flight."""
        return len(self.inflight)

    def renew(self) -> None:
        """Extend every lease in flight by ``lease`` seconds from now (one
        statement); a database error is logged, and the next turn tries again."""
        tokens = self.held()
        if not tokens:
            return
        try:
            with self.pool.connection() as conn:
                queue.renew(conn, self.worker_id, tokens, self.lease)
        except psycopg.Error as exc:
            metrics.database_error("leases")
            log.warning("could not renew leases", extra={"worker_id": self.worker_id,
                                                         "error": str(exc)[:300]})

    def release(self, tokens: list[uuid.UUID]) -> int:
        """Hand the leases of ``tokens`` back (due at once for any worker);
        answers how many were released, 0 when the database cannot be
        reached (the reaper frees them when they run out)."""
        try:
            with self.pool.connection(timeout=5) as conn, answer_within(conn, EXIT_WRITE_SECONDS):
                return queue.release(conn, self.worker_id, tokens)
        except (psycopg.Error, PoolTimeout) as exc:
            metrics.database_error("leases")
            log.error("could not release leases; they will be reaped",
                      extra={"worker_id": self.worker_id, "error": str(exc)[:300]})
            return 0

    def unrecorded(self, job: queue.Job) -> None:
        """``job``'s outcome could not be written (the database refused the
        write or stayed away past the retries): its lease is still ours, kept
        by token (at most ``MAX_UNANSWERED``, oldest dropped first) for the
        drain to release and report (``release_unrecorded``)."""
        with self._lock:
            self._unrecorded[job.lease_token] = None
            while len(self._unrecorded) > MAX_UNANSWERED:
                del self._unrecorded[next(iter(self._unrecorded))]

    def release_unrecorded(self) -> int | None:
        """Release the leases of the jobs whose outcome could not be written
        (``unrecorded``), fenced on this worker and their tokens; answers how
        many were still leased to us (now released: due at once for any
        worker), 0 when none was (none kept, or reaped meanwhile), ``None``
        when the database could not be reached (they stay leased until
        reaped). For the drain's verdict: it is clean only on 0."""
        with self._lock:
            tokens = list(self._unrecorded)
        if not tokens:
            return 0
        try:
            with self.pool.connection(timeout=5) as conn, answer_within(conn, EXIT_WRITE_SECONDS):
                released = queue.release(conn, self.worker_id, tokens)
        except (psycopg.Error, PoolTimeout) as exc:
            log.error("could not release the leases of jobs whose outcome was not written; "
                      "they will be reaped", extra={"worker_id": self.worker_id, "jobs": len(tokens),
                                                    "error": str(exc)[:300]})
            return None
        with self._lock:
            for token in tokens:
                self._unrecorded.pop(token, None)
        return released

    def hand_back(self, token: uuid.UUID) -> None:
        """A claim statement under ``token`` failed without an answer. If it
        committed, it leased a job to this live worker that no loop runs and
        no heartbeat renews: without this, that job would wait out its whole
        lease and then count a failure at the reaper. Released now when the
        database answers, else on the heartbeat's next turn (every lease / 3)
        or at the drain. A token whose statement had not committed matches
        nothing."""
        with self._lock:
            self.unanswered[token] = None
            while len(self.unanswered) > MAX_UNANSWERED:
                del self.unanswered[next(iter(self.unanswered))]
        self.release_unanswered()

    def release_unanswered(self) -> None:
        """Release the tokens kept by ``hand_back``; kept for the next try
        when the database cannot be reached."""
        with self._lock:
            tokens = list(self.unanswered)
        if not tokens:
            return
        try:
            with self.pool.connection(timeout=2) as conn, answer_within(conn, EXIT_WRITE_SECONDS):
                released = queue.release(conn, self.worker_id, tokens)
        except (psycopg.Error, PoolTimeout):
            return  # the heartbeat tries again
        with self._lock:
            for token in tokens:
                self.unanswered.pop(token, None)
        if released:
            log.warning("a claim whose answer was lost was handed back",
                        extra={"worker_id": self.worker_id, "released": released})
