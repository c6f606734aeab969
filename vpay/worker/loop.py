"""The worker: claim loops in a thread pool, Outcome dispatch, reapers, drain.

Design page, "The job queue", "Leases and crash recovery" and "SIGTERM and
the drain". The shape:

* ``concurrency`` claim loops run in a ``ThreadPoolExecutor``, split among the
  lanes this worker serves (``vpay.engine.lanes.split``: each lane its own loops, so
  a hanging merchant endpoint holds only the ``webhooks`` loops and MTN polls
  go on). Each loop claims one job of its lanes, calls its dispatcher (``vpay.handlers``), and applies the answer with a fenced write:
  ``Done`` → finish, ``RetryAfter`` → reschedule, ``DeadLetter`` → park. Any
  other exception is retried with backoff and parked after
  ``queue.MAX_FAILURES`` in a row. A fenced write that matches nothing is
  counted as **lost** and changes nothing.
* A ``Done`` is written together with the claim of the loop's next job
  (``queue.finish_and_claim``, one statement): one round trip per job while
  a loop has work. Only a database error enters the retrying path.
* A loop that finds nothing sleeps on the ``Waker`` (vpay/engine/wake.py): until a
  job of its lanes is committed due (LISTEN/NOTIFY through one listener
  thread per process), until the next job of its lanes is due (the empty
  claim says when), or for a jittered ``idle_sleep`` at most.
* A ``heartbeat`` thread renews the leases this worker holds every
  ``lease / 3``, so a lease runs out only when its worker is dead. Expired
  leases are reaped at boot (before claiming: the dead worker may have held
  ``sweep:expired``), and every ``lease / 2`` on this module's own timer
  thread, so a dead queue cannot stop the reaper.
* A signal stops claiming; in-flight jobs get ``shutdown_grace`` seconds from
  the signal. All done → ``Drain.CLEAN``. Otherwise the leases still held are
  released (due at once for another worker) → ``Drain.TIMED_OUT``. A claim
  loop that died (a bug: database errors and bad answers are survived) ends
  the worker with ``Drain.CRASHED``, never a clean exit.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from vpay.engine import fairness, lanes, queue, vacuum
from vpay.base import logs, metrics
from vpay.engine.outcome import DeadLetter, Done, JobError, Outcome, RetryAfter
from vpay.worker.sdnotify import Notifier, watchdog_interval
from vpay.worker.signals import Drain, ShutdownSignals
from vpay.engine.wake import Listener, Waker, jittered

log = logging.getLogger("vpay.worker")

GAUGE_EVERY = 60.0  # seconds between gauge lines
# The database is away, restarting, or refusing writes for a while (a
# demoted primary, a hot standby: ReadOnlySqlTransaction): retried, never fatal.
DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout,
             psycopg.errors.ReadOnlySqlTransaction)


@dataclass
class WorkerConfig:
    """Flags of ``vpay-worker`` (contract: Commands). Seconds throughout.

    ``concurrency`` is the total of claim loops; ``queues`` the lanes served
    (``--queues``, default all); ``lane_concurrency`` exact loop counts for
    some lanes (``--lane-concurrency``); ``passive`` rail lanes whose rail is
    not configured here (they share the housekeeping loop). The split is
    ``vpay.engine.lanes.split``; it raises ``lanes.LaneError`` on counts that do not fit."""

    worker_id: str
    concurrency: int = 4
    shutdown_grace: float = 30.0
    lease: float = 300.0
    idle_sleep: float = 1.0
    queues: tuple[str, ...] = field(default_factory=lambda: lanes.LANES)
    lane_concurrency: dict[str, int] = field(default_factory=dict)
    passive: tuple[str, ...] = ()
    listen: bool = True
    jobs_vacuum_every: int = vacuum.VACUUM_EVERY
    """Finished jobs between two vacuums of ``jobs`` by this process
    (``VPAY_JOBS_VACUUM_EVERY``; 0: none, autovacuum alone; vpay/engine/vacuum.py)."""

    def loops(self) -> list[tuple[str, ...]]:
        """The lanes each claim loop serves (``lanes.split``)."""
        return lanes.split(self.concurrency, self.queues, self.lane_concurrency, self.passive)


COUNTERS = ("claimed", "done", "retried", "failed", "parked", "lost", "reaped")


@dataclass
class Gauge:
    """Counters since boot, in total and per lane. ``lost`` counts fenced
    writes that matched nothing: a handler outran its lease and someone else
    holds the job now."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0
    parked: int = 0
    lost: int = 0
    reaped: int = 0
    per_lane: dict[str, dict[str, int]] = field(
        default_factory=lambda: {lane: dict.fromkeys(COUNTERS, 0) for lane in lanes.LANES})
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, lane: str, name: str) -> None:
        """One more ``name`` (one of ``COUNTERS``) in the totals and in
        ``lane``'s row; ``lost`` and ``reaped`` go to ``metrics.leases`` too.
        Once or twice per job, so kept to one lock and no keyword dict."""
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)
            row = self.per_lane.get(lane)
            if row is None:
                row = self.per_lane.setdefault(lane, dict.fromkeys(COUNTERS, 0))
            row[name] += 1
        if name in ("lost", "reaped"):
            metrics.leases(**{name: 1})

    def snapshot(self) -> dict[str, int]:
        """The totals (the gauge line's top-level keys)."""
        with self._lock:
            return {k: getattr(self, k) for k in COUNTERS}

    def lane_snapshot(self) -> dict[str, dict[str, int]]:
        """``{lane: {claimed, done, ...}}``."""
        with self._lock:
            return {lane: dict(row) for lane, row in self.per_lane.items()}


MAX_UNANSWERED = 1000
"""Tokens of claims whose answer was lost that a worker keeps to hand back
(``Worker._hand_back``) while the database cannot be reached; past it the
oldest are dropped, and their jobs, if those claims committed, wait for the
reaper as before (a lease)."""


def answer_lost(exc: BaseException) -> bool:
    """Whether a statement that raised ``exc`` may have committed without our
    hearing it: the server answered no SQLSTATE (the connection died). An
    error the server answered (read-only, deadlock, a constraint) rolled the
    statement back, and a ``PoolTimeout`` sent nothing: no connection was
    had. Neither leaves anything to hand back."""
    if isinstance(exc, PoolTimeout):
        return False
    return getattr(exc, "sqlstate", None) is None


SKIPPED_RETRY_SECONDS = 0.05
"""How soon a loop claims again after a claim that found nothing while a due
job of its lanes exists (``next_due_in`` <= 0): another statement held that
job's row (a sibling's claim, a lane rebalance placing it) for a moment.
Short: nothing wakes the loop when such a lock is let go."""


def idle_timeout(idle_sleep: float, next_due: float | None) -> float:
    """Seconds a claim loop sleeps (unless woken) after a claim that found
    nothing. ``next_due``: the claim's ``next_due_in``, seconds until the next
    job of its lanes is due (``None``: none scheduled). A jittered
    ``idle_sleep`` at most; until the next job is due when that is sooner; and
    ``SKIPPED_RETRY_SECONDS`` when a job is already due but was locked."""
    timeout = jittered(idle_sleep)
    if next_due is not None:
        timeout = min(timeout, max(next_due, SKIPPED_RETRY_SECONDS))
    return timeout


def failure_backoff(failures: int) -> float:
    """Seconds before a job whose handler raised runs again: 5 s doubling per
    consecutive failure, capped at 10 min, with ±20 % jitter."""
    base = min(5.0 * (2 ** failures), 600.0)
    return base * random.uniform(0.8, 1.2)


def _retry_db(fn):
    """Apply a write through a brief database outage (a restart, a dropped
    connection): up to 30 s. After that the lease stays, and the reaper
    frees the job later; nothing is lost either way."""
    return retry(retry=retry_if_exception_type(DB_ERRORS), stop=stop_after_delay(30),
                 wait=wait_exponential(multiplier=0.2, max=5), reraise=True)(fn)


class Dispatcher(Protocol):
    """What runs a claimed job: the handlers of the layers above
    (``vpay.handlers.Context``). The worker knows no job kind."""

    def handle(self, job: queue.Job) -> Outcome:
        """Run ``job``'s handler and answer its ``Outcome``; raising means a
        bug (the loop retries with backoff, then parks)."""

    def rail_pauses(self) -> dict[str, str | None]:
        """For the gauge line: per rail, the end of its backpressure pause."""


class Worker:
    """One worker process's loops. ``run()`` blocks until the drain ends and
    answers the ``Drain``; the caller exits with its value. ``ctx`` runs the
    claimed jobs (a ``Dispatcher``)."""

    def __init__(self, pool: ConnectionPool, ctx: Dispatcher, config: WorkerConfig,
                 signals: ShutdownSignals, notifier: Notifier | None = None):
        self.pool = pool
        self.ctx = ctx
        self.config = config
        self.signals = signals
        self.notifier = notifier or Notifier.from_env()
        self.gauge = Gauge()
        self._stopping = threading.Event()  # the loops' view of the drain
        self._halt = threading.Event()      # the helper threads' stop
        self._inflight: dict[uuid.UUID, queue.Job] = {}
        self._inflight_lock = threading.Lock()
        # tokens of claims whose answer was lost, not yet handed back (_hand_back);
        # a dict for its order: the oldest go first past MAX_UNANSWERED
        self._unanswered: dict[uuid.UUID, None] = {}
        self.loops = config.loops()  # lanes.LaneError on a split that does not fit
        self.waker = Waker(self.loops)
        self.fairness = fairness.Rebalancer()
        self.listener: Listener | None = None
        self.jobs_vacuum: vacuum.JobsVacuum | None = None
        if config.jobs_vacuum_every > 0:
            self.jobs_vacuum = vacuum.JobsVacuum(pool.conninfo, config.jobs_vacuum_every,
                                                 self._halt, config.worker_id)
        self._beats: list[float] = [time.monotonic()] * config.concurrency

    # ---- the claim loop -------------------------------------------------

    def _claim_loop(self, slot: int) -> None:
        backoff = 0.5
        served = self.loops[slot]
        job: queue.Job | None = None
        # signals.stop too: a signal stops claiming at once, not when the main
        # thread next looks at the flag (it polls every 0.1 s).
        while not self._stopping.is_set() and not self.signals.stop.is_set():
            self._beats[slot] = time.monotonic()
            if job is None:
                answer = self.waker.take(slot)
                if answer is not None:
                    # Woken by the listener, which claimed for this loop
                    # (Waker.claim_for): its answer stands for our own claim.
                    job, next_due = answer
                else:
                    try:
                        with self.pool.connection() as conn:
                            job, next_due = self._claim_on(conn, served)
                    except psycopg.Error as exc:  # any database error: back off, never end the loop
                        log.warning("claim failed; database unavailable",
                                    extra={"worker_id": self.config.worker_id, "error": str(exc)[:300]})
                        self._stopping.wait(backoff)
                        backoff = min(backoff * 2, 10.0)
                        continue
                    backoff = 0.5
                if job is None:
                    # Until woken (a job of our lanes committed), the next job
                    # of our lanes is due, or the jittered idle sleep ends.
                    self.waker.sleep(slot, idle_timeout(self.config.idle_sleep, next_due))
                    continue
            # There may be more where this came from: one idle sibling claims too.
            self.waker.spread(slot)
            if self.fairness.take_turn(job.lane, job.late_by):
                self._rebalance(job.lane)
            job = self._serve(job, served)
            self._beats[slot] = time.monotonic()
        answer = self.waker.take(slot)
        if job is None and answer is not None:
            job = answer[0]  # the listener claimed for this loop as the drain began
        if job is not None:
            # Claimed with the last finish as the drain began: hand it back
            # now rather than hold it until its lease runs out.
            self._release([job.lease_token])

    def _listener_claim(self, conn: psycopg.Connection,
                        lanes: tuple[str, ...]) -> tuple[queue.Job | None, float | None]:
        """The claim the listener makes, on its own connection, for the idle
        loop serving ``lanes`` it is about to wake (``Waker.claim_for``):
        ``(job, next_due_in)`` exactly as that loop's own claim would answer."""
        return self._claim_on(conn, lanes)

    def _claim_on(self, conn: psycopg.Connection,
                  lanes: tuple[str, ...]) -> tuple[queue.Job | None, float | None]:
        """``queue.claim_or_next_due`` for this worker on ``conn``, under a
        lease token of our own: when the statement fails, it may still have
        committed (the answer lost with the connection), so the claim it may
        have made is handed back by that token (``_hand_back``) before the
        error propagates."""
        token = queue.new_lease_token()
        try:
            return queue.claim_or_next_due(conn, self.config.worker_id, self.config.lease, lanes,
                                           token=token)
        except psycopg.Error as exc:
            if answer_lost(exc):
                self._hand_back(token)
            raise

    def _hand_back(self, token: uuid.UUID) -> None:
        """A claim statement under ``token`` failed without an answer. If it
        committed, it leased a job to this live worker that no loop runs and
        no heartbeat renews: without this, that job would wait out its whole
        lease and then count a failure at the reaper. Released now when the
        database answers, else on the heartbeat's next turn (every lease / 3)
        or at the drain. A token whose statement had not committed matches
        nothing."""
        with self._inflight_lock:
            self._unanswered[token] = None
            while len(self._unanswered) > MAX_UNANSWERED:
                del self._unanswered[next(iter(self._unanswered))]
        self._release_unanswered()

    def _release_unanswered(self) -> None:
        with self._inflight_lock:
            tokens = list(self._unanswered)
        if not tokens:
            return
        try:
            with self.pool.connection(timeout=2) as conn:
                released = queue.release(conn, self.config.worker_id, tokens)
        except (psycopg.Error, PoolTimeout):
            return  # the heartbeat tries again
        with self._inflight_lock:
            for token in tokens:
                self._unanswered.pop(token, None)
        if released:
            log.warning("a claim whose answer was lost was handed back",
                        extra={"worker_id": self.config.worker_id, "released": released})

    def _serve(self, job: queue.Job, served: tuple[str, ...]) -> queue.Job | None:
        """Run ``job`` and record its outcome; answers the next job of
        ``served`` when the outcome's write claimed one (``Done``, not
        draining), else ``None``."""
        self.gauge.count(job.lane, "claimed")
        metrics.job_claimed(job)
        with self._inflight_lock:
            self._inflight[job.lease_token] = job
        try:
            with logs.job_context(job, self.config.worker_id):
                return self._run(job, served)
        finally:
            with self._inflight_lock:
                self._inflight.pop(job.lease_token, None)

    def _rebalance(self, lane: str) -> None:
        # The lane is behind: queue each merchant's excess in rounds behind
        # everyone's share (vpay.engine.fairness). Best effort: an error costs
        # fairness for one pass, never the job already claimed.
        try:
            with self.pool.connection(timeout=5) as conn:
                placed, aged = self.fairness.rebalance(conn, lane)
        except (psycopg.Error, PoolTimeout) as exc:
            log.warning("lane rebalance failed", extra={"worker_id": self.config.worker_id,
                                                        "lane": lane, "error": str(exc)[:300]})
            return
        metrics.lane_rebalanced(lane, placed)
        if placed or aged:
            log.info("lane behind: rebalanced", extra={"worker_id": self.config.worker_id,
                                                        "lane": lane, "placed_in_rounds": placed,
                                                        "aged_to_round_0": aged})

    def _release(self, tokens: list[uuid.UUID]) -> int:
        try:
            with self.pool.connection(timeout=5) as conn:
                return queue.release(conn, self.config.worker_id, tokens)
        except psycopg.Error as exc:
            log.error("could not release leases; they will be reaped",
                      extra={"worker_id": self.config.worker_id, "error": str(exc)[:300]})
            return 0

    def _job_extra(self, job: queue.Job, **more) -> dict:
        return {"worker_id": self.config.worker_id, "job_id": job.id, "kind": job.kind,
                "lane": job.lane, "dedupe_key": job.dedupe_key, "attempts": job.attempts, **more}

    def _run(self, job: queue.Job, claim_next: tuple[str, ...] | None = None) -> queue.Job | None:
        """Handle ``job`` and apply its outcome. With ``claim_next`` (lanes),
        a ``Done`` is written together with the claim of the next job of
        those lanes, which is answered (``None`` when there was none)."""
        started = time.monotonic()
        error: str | None = None
        try:
            outcome: Outcome | None = self.ctx.handle(job)
        except JobError as exc:
            outcome = exc.decision
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried, never fatal
            outcome = None
            error = f"{type(exc).__name__}: {exc}"
            log.error("handler raised", extra=self._job_extra(
                job, error=error, traceback=traceback.format_exc(limit=8)))
        elapsed = round(time.monotonic() - started, 3)
        try:
            kept, nxt = self._apply(job, outcome, error, claim_next)
        except Exception as exc:  # noqa: BLE001 - the claim loop must outlive any one job
            # A database that stayed away past the retries, or an answer that
            # is not an Outcome: the lease is left to the reaper, which counts
            # the failure and parks the job after MAX_FAILURES.
            log.error("could not record the job's outcome; its lease will be reaped",
                      extra=self._job_extra(job, error=f"{type(exc).__name__}: {exc}"[:300]))
            metrics.job_finished(job, outcome, None, elapsed)
            return None
        metrics.job_finished(job, outcome, kept, elapsed)
        if kept and self.jobs_vacuum is not None:
            self.jobs_vacuum.finished()
        if not kept:
            self.gauge.count(job.lane, "lost")
            log.warning("lease lost: the outcome was discarded", extra=self._job_extra(
                job, outcome=type(outcome).__name__ if outcome else "error", seconds=elapsed))
        elif log.isEnabledFor(logging.INFO):
            log.info("job handled", extra=self._job_extra(
                job, outcome=type(outcome).__name__ if outcome else "error", seconds=elapsed))
        return nxt

    def _apply(self, job: queue.Job, outcome: Outcome | None, error: str | None,
               claim_next: tuple[str, ...] | None = None) -> tuple[bool, queue.Job | None]:
        """Write the outcome (fenced): ``(kept, next job claimed or None)``.
        One attempt first; only a database error enters the retrying path
        (tenacity, up to 30 s, fresh connections, no claim), so a healthy
        job pays for no retry machinery."""
        next_token = queue.new_lease_token()  # the lease token of the next job, if this write claims one
        try:
            with self.pool.connection() as conn:
                return self._write(conn, job, outcome, error, claim_next, next_token)
        except DB_ERRORS as exc:
            # INFO: the retrying path logs an ERROR if it gives up
            log.info("could not record the job's outcome; retrying",
                        extra=self._job_extra(job, error=str(exc)[:300]))
            lost_answer = answer_lost(exc)
        if lost_answer and claim_next is not None and isinstance(outcome, Done):
            self._hand_back(next_token)
        return self._write_retrying(job, outcome, error, lost_answer), None

    def _write_retrying(self, job: queue.Job, outcome: Outcome | None, error: str | None,
                        lost_answer: bool = False) -> bool:
        """The retrying path of ``_apply`` (``_retry_db``: up to 30 s).
        ``lost_answer``: the first attempt's answer was lost, so it may have
        committed. A retry that matches nothing asks the row whether one of
        this lease's attempts made the write (``queue.write_was_made``): for
        a reschedule, retry_failed or park the row names the lease that last
        ended it, whatever the errors were; for a finish (the row gone) only
        a write whose answer was lost, the first or any retry's, can have made
        it: after errors the server answered (or a checkout that timed out),
        nothing committed, and matching nothing is a lost lease. Inexact in
        the two rare paths ``write_was_made`` names, neither touching money."""
        lost = [lost_answer]

        @_retry_db
        def attempt() -> bool:
            with self.pool.connection() as conn:
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
                             extra=self._job_extra(job))
                    self.gauge.count(job.lane, self._counted_as(job, outcome))
                    kept = True
                return kept

        return attempt()

    @staticmethod
    def _counted_as(job: queue.Job, outcome: Outcome | None) -> str:
        """The gauge counter a kept write of ``outcome`` adds to (as ``_write``)."""
        if outcome is None:
            return "parked" if job.failures + 1 >= queue.MAX_FAILURES else "failed"
        return {Done: "done", RetryAfter: "retried", DeadLetter: "parked"}[type(outcome)]

    def _write(self, conn: psycopg.Connection, job: queue.Job, outcome: Outcome | None,
               error: str | None, claim_next: tuple[str, ...] | None,
               next_token: uuid.UUID | None = None) -> tuple[bool, queue.Job | None]:
        if outcome is None:
            if job.failures + 1 >= queue.MAX_FAILURES:
                reason = f"dead-lettered after {job.failures + 1} consecutive failures; last: {error}"
                kept = queue.park(conn, job, reason)
                if kept:
                    self.gauge.count(job.lane, "parked")
                    log.error("job dead-lettered", extra=self._job_extra(job, reason=reason))
                return kept, None
            kept = queue.retry_failed(conn, job, failure_backoff(job.failures), error or "")
            if kept:
                self.gauge.count(job.lane, "failed")
            return kept, None
        if isinstance(outcome, Done):
            # Looked at when writing, not when the job began: a signal during
            # the handler means claim nothing new.
            if claim_next is not None and not (self._stopping.is_set() or self.signals.stop.is_set()):
                kept, nxt, _ = queue.finish_and_claim(conn, job, self.config.lease, claim_next,
                                                      token=next_token)
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
                log.error("job dead-lettered", extra=self._job_extra(job, reason=outcome.reason))
            return kept, None
        raise TypeError(f"handler for {job.kind!r} returned {outcome!r}, not an Outcome")

    # ---- maintenance threads --------------------------------------------

    def reap(self) -> int:
        """Free leases past their own expiry; log each reaped job."""
        with self.pool.connection() as conn:
            rows = queue.reap_expired_leases(conn)
        for row in rows:
            log.warning("lease reaped", extra={"worker_id": self.config.worker_id,
                                               "job_id": row["id"], "kind": row["kind"],
                                               "lane": row["lane"], "dedupe_key": row["dedupe_key"],
                                               "parked": row["parked"]})
        for row in rows:
            self.gauge.count(row["lane"], "reaped")
        return len(rows)

    def _heartbeat_thread(self) -> None:
        # A live worker renews what it holds, so a lease runs out only when
        # its worker is dead (or too wedged to run this thread).
        interval = max(self.config.lease / 3.0, 0.3)
        while not self._halt.wait(interval):
            self._release_unanswered()
            with self._inflight_lock:
                tokens = list(self._inflight)
            if not tokens:
                continue
            try:
                with self.pool.connection() as conn:
                    queue.renew(conn, self.config.worker_id, tokens, self.config.lease)
            except psycopg.Error as exc:
                log.warning("could not renew leases", extra={"worker_id": self.config.worker_id,
                                                             "error": str(exc)[:300]})

    def _reaper_thread(self) -> None:
        interval = max(self.config.lease / 2.0, 0.5)
        while not self._halt.wait(interval):
            try:
                self.reap()
            except psycopg.Error as exc:  # the timer must outlive any database error
                log.warning("reaper could not reach the database", extra={"error": str(exc)[:300]})

    def gauge_line(self, final: bool = False) -> dict:
        """Log the gauge: the totals since boot and the queue depth as
        top-level keys (``claimed`` ... ``reaped``, ``due``, ``leased``,
        ``dead``), and ``lanes``: the same per lane, plus ``loops`` (this
        worker's loops serving that lane). Depths are -1 when the database
        cannot be read. With the worker's own vacuum on, ``jobs_vacuum``:
        ``vacuum.JobsVacuum.snapshot()``. Answers the line's fields."""
        counts: dict = self.gauge.snapshot()
        per_lane = self.gauge.lane_snapshot()
        unknown = {"due": -1, "leased": -1, "dead": -1}
        try:
            with self.pool.connection(timeout=5) as conn:
                counts |= queue.depth(conn)
                depths = queue.depth_by_lane(conn)
        except psycopg.Error:
            counts |= unknown
            depths = {}
        for lane, row in per_lane.items():
            row |= depths.get(lane, unknown)
            row["loops"] = sum(1 for group in self.loops if lane in group)
        status = " ".join(f"{k}={v}" for k, v in counts.items())
        status += " due_by_lane=" + ",".join(f"{lane}:{row['due']}" for lane, row in per_lane.items())
        counts["lanes"] = per_lane
        if self.jobs_vacuum is not None:
            counts["jobs_vacuum"] = self.jobs_vacuum.snapshot()
        log.info("gauge", extra={"worker_id": self.config.worker_id, "final": final, **counts,
                                 "rail_paused_until": self.ctx.rail_pauses()})
        self.notifier.status(status)
        return counts

    def _gauge_thread(self) -> None:
        while not self._halt.wait(GAUGE_EVERY):
            self.gauge_line()

    def _watchdog_thread(self, interval: float) -> None:
        # Ping only while every claim loop has come round recently: a loop
        # stuck in a handler past the watchdog deadline lets systemd act.
        # An idle loop comes round every idle_sleep: that is not being stuck.
        deadline = interval * 2 + self.config.idle_sleep
        while not self._halt.wait(interval):
            if self._stopping.is_set():
                self.notifier.watchdog()  # the drain has its own clock
                continue
            now = time.monotonic()
            if all(now - beat < deadline for beat in self._beats):
                self.notifier.watchdog()
            else:
                log.error("watchdog withheld: a claim loop has not come round",
                          extra={"worker_id": self.config.worker_id})

    # ---- run and drain --------------------------------------------------

    def run(self) -> Drain:
        cfg = self.config
        reaped = self.reap()
        split = lanes.describe(self.loops)
        log.info("worker started", extra={"worker_id": cfg.worker_id, "concurrency": cfg.concurrency,
                                          "queues": list(cfg.queues), "loops": split,
                                          "lease_seconds": cfg.lease, "reaped_at_boot": reaped,
                                          "jobs_vacuum_every": cfg.jobs_vacuum_every})
        # A rail lane riding along for want of its rail calls nobody: not a risk.
        shared = ["+".join(g) for g in dict.fromkeys(self.loops)
                  if len([lane for lane in g if lane not in cfg.passive]) > 1]
        if shared:
            log.warning("lanes share claim loops: a stuck job in one holds the others",
                        extra={"worker_id": cfg.worker_id, "shared": shared,
                               "hint": f"--worker-concurrency {len(cfg.queues)} or more gives "
                                       f"each lane its own loop"})
        # READY=1 before the first claim: start-up (pool, boot reap) is over,
        # and no job is handled before the service manager hears it.
        self.notifier.ready(status=f"claiming with {cfg.concurrency} loops")
        self._beats[:] = [time.monotonic()] * cfg.concurrency
        helpers = [threading.Thread(target=self._heartbeat_thread, name="heartbeat", daemon=True),
                   threading.Thread(target=self._reaper_thread, name="reaper", daemon=True),
                   threading.Thread(target=self._gauge_thread, name="gauge", daemon=True)]
        wd = watchdog_interval()
        if wd and self.notifier.enabled:
            helpers.append(threading.Thread(target=self._watchdog_thread, args=(wd,),
                                            name="watchdog", daemon=True))
        if cfg.listen:
            # Its own session-level connection, never one of the pool's (wake.py).
            self.listener = Listener(self.pool.conninfo, self.waker, self._halt, cfg.worker_id,
                                     claim=self._listener_claim)
            helpers.append(self.listener)
        if self.jobs_vacuum is not None:
            helpers.append(self.jobs_vacuum)
        for t in helpers:
            t.start()
        executor = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="claim")
        futures = [executor.submit(self._claim_loop, slot) for slot in range(cfg.concurrency)]

        # The main thread polls the flags rather than waiting on them: see signals.py.
        while not self.signals.stop.is_set():
            if any(f.done() for f in futures):
                break  # a claim loop died: should not happen; drain and let systemd restart us
            time.sleep(0.1)
        return self._drain(executor, futures)

    def _drain(self, executor: ThreadPoolExecutor, futures) -> Drain:
        cfg = self.config
        self._stopping.set()
        self.waker.stop()  # no loop sleeps through the drain
        started = self.signals.received_at or time.monotonic()
        self.notifier.stopping()
        self.notifier.extend_timeout(cfg.shutdown_grace + 5)
        log.info("draining", extra={"worker_id": cfg.worker_id, "signal": self.signals.signal_name,
                                    "grace_seconds": cfg.shutdown_grace,
                                    "in_flight": len(self._inflight)})
        deadline = started + cfg.shutdown_grace
        while time.monotonic() < deadline and not self.signals.hurry.is_set():
            done, pending = wait(futures, timeout=0.1)
            if not pending:
                break
        pending = [f for f in futures if not f.done()]
        crashed = [f for f in futures if f.done() and f.exception() is not None]
        for f in crashed:
            log.error("claim loop crashed", extra={"worker_id": cfg.worker_id,
                                                   "error": repr(f.exception())})
        self._halt.set()
        if self.jobs_vacuum is not None:
            self.jobs_vacuum.stop()
        self._release_unanswered()  # the heartbeat will not come round again
        if not pending:
            executor.shutdown(wait=True)
            self.gauge_line(final=True)
            if crashed:  # never "clean": systemd must restart us (Restart=on-failure)
                log.error("drain after a claim loop crashed",
                          extra={"worker_id": cfg.worker_id, "drain": "crashed"})
                return Drain.CRASHED
            log.info("drain clean", extra={"worker_id": cfg.worker_id, "drain": "clean"})
            return Drain.CLEAN
        with self._inflight_lock:
            tokens = list(self._inflight)
        released = 0
        try:
            with self.pool.connection(timeout=5) as conn:
                released = queue.release(conn, cfg.worker_id, tokens)
        except psycopg.Error as exc:
            log.error("could not release leases; they will be reaped",
                      extra={"worker_id": cfg.worker_id, "error": str(exc)[:300]})
        self.gauge_line(final=True)
        log.warning(f"drain timed out: released={released}",
                    extra={"worker_id": cfg.worker_id, "drain": "timed_out", "released": released,
                           "hurried": self.signals.hurry.is_set()})
        return Drain.CRASHED if crashed else Drain.TIMED_OUT
