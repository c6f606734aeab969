"""Writing a handler's Outcome back to its job, fenced on the lease, through a
brief database outage.

Design page, "The job queue" and "Leases and crash recovery". ``Done`` →
finish (with the claim of the loop's next job when asked), ``RetryAfter`` →
reschedule, ``DeadLetter`` → park, a handler that raised (``None``) → retry
with ``failure_backoff``, parked after ``queue.MAX_FAILURES`` in a row. A
fenced write that matches nothing is not kept: the lease was lost. One
attempt first; only a database error enters the retrying path, which asks
the row whether an attempt whose answer was lost made the write
(``queue.write_was_made``). An outage longer than the retrying path's
``RETRY_SECONDS`` (30) hands the outcome to ``KeptOutcomes``
(vpay/worker/handback.py): the job stays held, and its fenced write is tried
every second until the database answers, never left leased to this live
worker without anyone writing it.
"""

from __future__ import annotations

import contextlib
import logging
import random
import uuid
from typing import Callable

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from vpay.base import metrics
from vpay.base.db import answer_within
from vpay.engine import queue
from vpay.engine.outcome import DeadLetter, Done, Outcome, RetryAfter
from vpay.worker.gauge import Gauge
from vpay.worker.leases import Leases

log = logging.getLogger("vpay.worker")

# The database is away, restarting, or refusing writes for a while (a
# demoted primary, a hot standby: ReadOnlySqlTransaction): retried, never fatal.
DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout,
             psycopg.errors.ReadOnlySqlTransaction)


def answer_lost(exc: BaseException) -> bool:
    """Whether a statement that raised ``exc`` may have committed without our
    hearing it: the server answered no SQLSTATE (the connection died). An
    error the server answered (read-only, deadlock, a constraint) rolled the
    statement back, and a ``PoolTimeout`` sent nothing: no connection was
    had. Neither leaves anything to hand back."""
    if isinstance(exc, PoolTimeout):
        return False
    return getattr(exc, "sqlstate", None) is None


def failure_backoff(failures: int) -> float:
    """Seconds before a job whose handler raised runs again: 5 s doubling per
    consecutive failure, capped at 10 min, with ±20 % jitter."""
    base = min(5.0 * (2 ** failures), 600.0)
    return base * random.uniform(0.8, 1.2)


def counted_as(job: queue.Job, outcome: Outcome | None) -> str:
    """The gauge counter a kept write of ``outcome`` adds to (as ``OutcomeWriter._write``)."""
    if outcome is None:
        return "parked" if job.failures + 1 >= queue.MAX_FAILURES else "failed"
    return {Done: "done", RetryAfter: "retried", DeadLetter: "parked"}[type(outcome)]


def job_extra(worker_id: str, job: queue.Job, **more) -> dict:
    """The log fields naming ``job`` (and the worker running it), plus ``more``."""
    return {"worker_id": worker_id, "job_id": job.id, "kind": job.kind,
            "lane": job.lane, "dedupe_key": job.dedupe_key, "attempts": job.attempts, **more}


RETRY_SECONDS = 30.0
"""How long the claim loop itself retries an outcome's write through a
database outage (a restart, a dropped connection), with waits of at most
2 s; past it the outcome is kept and written by the ``handback`` thread as
soon as the database answers (vpay/worker/handback.py), and the loop goes on."""


def _retry_db(fn):
    """Apply a write through a brief database outage: up to ``RETRY_SECONDS``."""
    return retry(retry=retry_if_exception_type(DB_ERRORS), stop=stop_after_delay(RETRY_SECONDS),
                 wait=wait_exponential(multiplier=0.2, max=2), reraise=True)(fn)


class OutcomeWriter:
    """Writes outcomes for ``worker_id``'s claim loops. A kept write counts in
    ``gauge``; the claim of a next job whose answer was lost is handed back
    through ``leases``; ``draining()`` true means a ``Done`` claims nothing
    new; ``lease``: seconds of the lease on a next job claimed."""

    def __init__(self, pool: ConnectionPool, worker_id: str, lease: float, gauge: Gauge,
                 leases: Leases, draining: Callable[[], bool]):
        self.pool = pool
        self.worker_id = worker_id
        self.lease = lease
        self.gauge = gauge
        self.leases = leases
        self.draining = draining
        self.kept = None
        """Where an outcome goes whose write met a database outage longer
        than ``RETRY_SECONDS``: a ``KeptOutcomes``
        (vpay/worker/handback.py), set by the worker; ``None``: the error is
        raised instead."""

    def apply(self, job: queue.Job, outcome: Outcome | None, error: str | None,
              claim_next: queue.Scope | None = None) -> tuple[bool | None, queue.Job | None]:
        """Write the outcome (fenced): ``(kept, next job claimed or None)``.
        ``claim_next``: with a ``Done``, claim the loop's next job in the same
        statement, within that scope (its lanes, lanes lent, parties skipped).
        One attempt first; only a database error enters the retrying path
        (tenacity, up to ``RETRY_SECONDS``, fresh connections, no claim), so a healthy
        job pays for no retry machinery. ``kept`` is ``None`` when the
        database stayed away past those: the outcome is then kept by
        ``kept`` (vpay/worker/handback.py) and written as soon as the database
        answers. ``error``: the handler's exception text when ``outcome`` is
        ``None``. Raises ``TypeError`` for an answer that is not an Outcome."""
        next_token = queue.new_lease_token()  # the lease token of the next job, if this write claims one
        try:
            with self.pool.connection() as conn:
                return self._write(conn, job, outcome, error, claim_next, next_token)
        except DB_ERRORS as exc:
            metrics.database_error("outcome")
            # INFO: the retrying path logs a WARNING if it hands the outcome over
            log.info("could not record the job's outcome; retrying",
                     extra=job_extra(self.worker_id, job, error=str(exc)[:300]))
            lost_answer = answer_lost(exc)
        if lost_answer and claim_next is not None and isinstance(outcome, Done):
            self.leases.hand_back(next_token)
        return self.write_retrying(job, outcome, error, lost_answer), None

    def write_retrying(self, job: queue.Job, outcome: Outcome | None, error: str | None,
                       lost_answer: bool = False) -> bool | None:
        """The retrying path of ``apply`` (``_retry_db``: up to
        ``RETRY_SECONDS``), each try a ``write_once``. ``lost_answer``: the
        first attempt's answer was lost, so it may have committed. Past
        ``RETRY_SECONDS`` the outcome is handed to ``kept`` and ``None``
        answered (raised instead when there is no ``kept``)."""
        lost = [lost_answer]
        try:
            return _retry_db(lambda: self.write_once(job, outcome, error, lost))()
        except DB_ERRORS as exc:
            if self.kept is None:
                raise
            self.kept.keep(job, outcome, error, lost[0], exc)
            return None

    def write_once(self, job: queue.Job, outcome: Outcome | None, error: str | None,
                   lost: list[bool], timeout: float | None = None,
                   answer_seconds: float | None = None) -> bool:
        """One try of a retried write, on a connection had within ``timeout``
        seconds (the pool's default when ``None``); raises ``DB_ERRORS``.
        ``answer_seconds``: the try's statements are answered within that
        many seconds in all, or fail as a lost answer (``answer_within``: a
        database gone silent, not away, cannot hold the caller).
        ``lost[0]``: an earlier attempt's answer was lost (set here when this
        one's is). A try that matches nothing asks the row whether one of
        this lease's attempts made the write (``queue.write_was_made``): for
        a reschedule, retry_failed or park the row names the lease that last
        ended it, whatever the errors were; for a finish (the row gone) only
        a write whose answer was lost, the first or any retry's, can have made
        it: after errors the server answered (or a checkout that timed out),
        nothing committed, and matching nothing is a lost lease. Inexact in
        the two rare paths ``write_was_made`` names, neither touching money."""
        with self.pool.connection(timeout=timeout) as conn, \
                (answer_within(conn, answer_seconds) if answer_seconds else contextlib.nullcontext()):
            try:
                kept = self._write(conn, job, outcome, error, None)[0]
            except DB_ERRORS as exc:
                # Only the write's own lost answer counts: an error of
                # the checkout or of write_was_made's read sent no write.
                lost[0] = lost[0] or answer_lost(exc)
                raise
            finished = isinstance(outcome, Done)
            if not kept and (lost[0] or not finished) and queue.write_was_made(conn, job, finished):
                log.info("the outcome was recorded by an attempt whose answer was lost",
                         extra=job_extra(self.worker_id, job))
                self.gauge.count(job.lane, counted_as(job, outcome))
                kept = True
            return kept

    def _write(self, conn: psycopg.Connection, job: queue.Job, outcome: Outcome | None,
               error: str | None, claim_next: queue.Scope | None,
               next_token: uuid.UUID | None = None) -> tuple[bool, queue.Job | None]:
        if outcome is None:
            if job.failures + 1 >= queue.MAX_FAILURES:
                reason = f"dead-lettered after {job.failures + 1} consecutive failures; last: {error}"
                kept = queue.park(conn, job, reason)
                if kept:
                    self.gauge.count(job.lane, "parked")
                    log.error("job dead-lettered", extra=job_extra(self.worker_id, job, reason=reason))
                return kept, None
            kept = queue.retry_failed(conn, job, failure_backoff(job.failures), error or "")
            if kept:
                self.gauge.count(job.lane, "failed")
            return kept, None
        if isinstance(outcome, Done):
            # Looked at when writing, not when the job began: a signal during
            # the handler means claim nothing new.
            if claim_next is not None and not self.draining():
                kept, nxt, _ = queue.finish_and_claim(conn, job, self.lease, claim_next.lanes,
                                                      token=next_token, lent=claim_next.lent,
                                                      skip=claim_next.skip)
            else:
                kept, nxt = queue.finish(conn, job), None
            if kept:
                self.gauge.count(job.lane, "done")
            return kept, nxt
        if isinstance(outcome, RetryAfter):
            kept = queue.reschedule(conn, job, outcome.seconds, outcome.note,
                                    spent=outcome.attempt_spent)
            if kept:
                self.gauge.count(job.lane, "retried")
            return kept, None
        if isinstance(outcome, DeadLetter):
            kept = queue.park(conn, job, outcome.reason)
            if kept:
                self.gauge.count(job.lane, "parked")
                log.error("job dead-lettered", extra=job_extra(self.worker_id, job, reason=outcome.reason))
            return kept, None
        raise TypeError(f"handler for {job.kind!r} returned {outcome!r}, not an Outcome")
