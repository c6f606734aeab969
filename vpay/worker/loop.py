"""The worker as one process's composition root: claim loops in a thread pool,
each serving a job and writing its outcome back, and the drain that ends
them.

Design page, "The job queue", "Leases and crash recovery" and "SIGTERM and
the drain". The parts, each in a module of its own:

* ``concurrency`` claim loops (here) run in a ``ThreadPoolExecutor``, split
  among the lanes this worker serves (``vpay.engine.lanes.split``: each lane
  its own loops, so a hanging merchant endpoint holds only the ``webhooks``
  loops and MTN polls go on). Each loop claims one job of its lanes, calls
  its dispatcher (``vpay.handlers``), and has its answer written back.
* The write is fenced (vpay/worker/outcomes.py): ``Done`` → finish,
  ``RetryAfter`` → reschedule, ``DeadLetter`` → park. Any other exception
  is retried with backoff and parked after ``queue.MAX_FAILURES`` in a row.
  A fenced write that matches nothing is counted as **lost** and changes
  nothing. A ``Done`` is written together with the claim of the loop's next
  job (``queue.finish_and_claim``, one statement): one round trip per job
  while a loop has work. Only a database error enters the retrying path.
* A loop that finds nothing sleeps on the ``Waker`` (vpay/engine/wake.py): until a
  job of its lanes is committed due (LISTEN/NOTIFY through one listener
  thread per process), until the next job of its lanes is due (the empty
  claim says when), or for a jittered ``idle_sleep`` at most.
* Time is shared (vpay/engine/timeshare.py, issue 30): each claim skips
  the parties (merchants) already at their share of the lane's loops here
  unless their jobs are known fast, and a claim that raced a sibling past
  that share is handed back unrun (``unclaim``); a loop whose own lanes
  have nothing due borrows the oldest due job of another lane that is not
  slow (``--lend``), one job at a time, its own lanes first at every claim.
* The worker is a row in ``workers`` (vpay/worker/presence.py), registered
  at start and marked stopped at the exit. The leases held
  (vpay/worker/leases.py) are renewed, and the row beaten, by a
  ``heartbeat`` thread every ``lease / 3`` or ``dead_after / 4``, so a lease
  runs out, and the worker is judged dead, only when it is. Expired leases,
  and leases whose holder is gone (stopped, restarted, or dead by its
  heartbeat: vpay/engine/workers.py), are reaped at boot (before claiming:
  the dead worker may have held ``sweep:expired``), and every ``lease / 2``
  or ``dead_after / 4`` on a timer thread of their own, so a dead queue
  cannot stop the reaper (vpay/worker/maintenance.py; the counters and the
  gauge line: vpay/worker/gauge.py).
* An outcome whose write met a database outage longer than the retries'
  30 s is kept and written as soon as the database answers, by the
  ``handback`` thread (vpay/worker/handback.py).
* A signal stops claiming; in-flight jobs get ``shutdown_grace`` seconds from
  the signal. All done → ``Drain.CLEAN``. Otherwise the leases still held are
  released (due at once for another worker) → ``Drain.TIMED_OUT``; so too
  when a job whose outcome could not be written (the database refused or
  stayed away) was still leased to this worker at the drain: it is released
  then, and the drain is not called clean (``Leases.release_unrecorded``). A claim
  loop that died (a bug: database errors and bad answers are survived) ends
  the worker with ``Drain.CRASHED``, never a clean exit.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from vpay.base import logs, metrics
from vpay import __version__
from vpay.engine import fairness, lanes, queue, timeshare, vacuum, workers
from vpay.engine.outcome import JobError, Outcome
from vpay.engine.liveness import DEAD_AFTER_SECONDS, Liveness
from vpay.engine.wake import Listener, Waker, jittered
from vpay.worker import maintenance
from vpay.worker.gauge import Gauge, GaugeLine
from vpay.worker.handback import KeptOutcomes
from vpay.worker.leases import Leases
from vpay.worker.outcomes import OutcomeWriter, answer_lost, job_extra
from vpay.worker.presence import Presence
from vpay.worker.sdnotify import Notifier, watchdog_interval
from vpay.worker.signals import Drain, ShutdownSignals

log = logging.getLogger("vpay.worker")


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
    listener_dead_after: float = DEAD_AFTER_SECONDS
    """Seconds within which a wake-up listener that stopped answering is
    replaced (``VPAY_LISTENER_DEAD_AFTER_SECONDS``; vpay/engine/liveness.py)."""
    session_url: str | None = None
    """The URL of the connections that need a session: the listener's and the
    vacuum's (``VPAY_SESSION_DATABASE_URL``); ``None``: the pool's."""
    dead_after: float = workers.DEAD_AFTER_SECONDS
    """``VPAY_WORKER_DEAD_AFTER_SECONDS``: this worker is judged dead, and its
    leases reaped, when its heartbeat is older (vpay/engine/workers.py)."""
    party_share: float = timeshare.PARTY_SHARE
    """``--party-share``: the fraction of a lane's own loops one party's jobs
    may hold at once unless they are known fast (vpay/engine/timeshare.py)."""
    lend: bool = True
    """``--lend/--no-lend``: a loop whose own lanes have nothing due borrows
    another lane's due job (vpay/engine/timeshare.py)."""

    def loops(self) -> list[tuple[str, ...]]:
        """The lanes each claim loop serves (``lanes.split``)."""
        return lanes.split(self.concurrency, self.queues, self.lane_concurrency, self.passive)


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
    claimed jobs (a ``Dispatcher``).

    Its parts: ``gauge`` (counters), ``leases`` (what it holds, and the
    hand-back of claims whose answer was lost), ``outcomes`` (the fenced
    writes), ``heartbeat``, ``reaper`` and ``gauge_timer`` (helper threads,
    started by ``run``), ``gauge_line``."""

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
        self.leases = Leases(pool, config.worker_id, config.lease)
        self.outcomes = OutcomeWriter(pool, config.worker_id, config.lease, self.gauge,
                                      self.leases, self._draining)
        # Outcomes whose write met a long outage: kept, written when the
        # database answers; bounded by the lease (vpay/worker/handback.py).
        self.kept = KeptOutcomes(self.outcomes.write_once, self.leases, config.worker_id,
                                 keep_for=config.lease)
        self.outcomes.kept = self.kept
        self.loops = config.loops()  # lanes.LaneError on a split that does not fit
        self.timeshare = timeshare.TimeShare(self.loops, config.party_share, config.lend,
                                             passive=config.passive, fixed=config.lane_concurrency)
        self.waker = Waker(self.loops, self.timeshare.lendable if config.lend else None)
        self.fairness = fairness.Rebalancer()
        self.listener: Listener | None = None
        self.jobs_vacuum: vacuum.JobsVacuum | None = None
        self.session_url = config.session_url or pool.conninfo
        if config.jobs_vacuum_every > 0:
            self.jobs_vacuum = vacuum.JobsVacuum(self.session_url, config.jobs_vacuum_every,
                                                 self._halt, config.worker_id)
        self._beats: list[float] = [time.monotonic()] * config.concurrency
        self.gauge_line = GaugeLine(pool, self.gauge, self.loops, config.worker_id, self.notifier,
                                    lambda: self.ctx.rail_pauses(), self.jobs_vacuum,
                                    lambda: self.listener.snapshot() if self.listener else None)
        self.presence = Presence(pool, config.worker_id, config.queues, config.dead_after, __version__,
                                 on_taken_over=lambda: signals.request("taken_over"))
        self.heartbeat = maintenance.Heartbeat(self.leases, self.presence, config.lease, self._halt)
        self.reaper = maintenance.Reaper(pool, config.worker_id, self.gauge, config.lease, self._halt,
                                         self.presence)
        self.handback = maintenance.Handback(self.kept, self._halt)
        self.gauge_timer = maintenance.GaugeTimer(self.gauge_line, self._halt)

    def _draining(self) -> bool:
        # signals.stop too: a signal stops claiming at once, not when the main
        # thread next looks at the flag (it polls every 0.1 s).
        return self._stopping.is_set() or self.signals.stop.is_set()

    # ---- the claim loop -------------------------------------------------

    def _claim_loop(self, slot: int) -> None:
        backoff = 0.5
        served = self.loops[slot]
        job: queue.Job | None = None
        while not self._draining():
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
                            self.waker.claiming(slot)
                            job, next_due = self._claim_on(conn, served)
                    except psycopg.Error as exc:  # any database error: back off, never end the loop
                        metrics.database_error("claim")
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
            borrowed = job.lane not in served
            if not self._admit(job, borrowed):
                job = None  # handed back: its party is at its share; claim again
                continue
            if borrowed:
                metrics.job_borrowed(job.lane)
            # There may be more where this came from: one idle sibling claims
            # too. (Tried and left out: waking one only when the claim saw
            # more due. One empty claim fewer per lone job, but borrowers then
            # missed re-reads falling due by time, 1 % of a burst's reads:
            # docs/performance.md.)
            self.waker.spread(slot, job.lane)
            if self.fairness.take_turn(job.lane, job.late_by):
                self._rebalance(job.lane)
            job = self._serve(job, served, slot)
            self._beats[slot] = time.monotonic()
        answer = self.waker.take(slot)
        if job is None and answer is not None:
            job = answer[0]  # the listener claimed for this loop as the drain began
        if job is not None:
            # Claimed with the last finish as the drain began: hand it back
            # now rather than hold it until its lease runs out.
            self.leases.release([job.lease_token])

    def _listener_claim(self, conn: psycopg.Connection,
                        lanes: tuple[str, ...]) -> tuple[queue.Job | None, float | None]:
        """The claim the listener makes, on its own connection, for the idle
        loop serving ``lanes`` it is about to wake (``Waker.claim_for``):
        ``(job, next_due_in)`` exactly as that loop's own claim would answer."""
        return self._claim_on(conn, lanes)

    def _claim_on(self, conn: psycopg.Connection,
                  lanes: tuple[str, ...]) -> tuple[queue.Job | None, float | None]:
        """``queue.claim_or_next_due`` for this worker on ``conn``, for a
        loop serving ``lanes``, within what the time share allows now
        (``TimeShare.plan``: lanes it may borrow from, parties to skip),
        under a lease token of our own: when the statement fails, it may
        still have committed (the answer lost with the connection), so the
        claim it may have made is handed back by that token
        (``Leases.hand_back``) before the error propagates."""
        token = queue.new_lease_token()
        lent, skip = self.timeshare.plan(lanes)
        try:
            return queue.claim_or_next_due(conn, self.config.worker_id, self.config.lease, lanes,
                                           token=token, lent=lent, skip=skip)
        except psycopg.Error as exc:
            if answer_lost(exc):
                self.leases.hand_back(token)
            raise

    def _admit(self, job: queue.Job, borrowed: bool = False) -> bool:
        """Count ``job`` as running (``TimeShare.admit``), or, when its party
        is already at its share here (a sibling's claim raced ours), hand it
        back unrun (``queue.unclaim``) and answer ``False``. A hand-back the
        database refuses leaves the job to run: the share is exceeded once
        rather than the job left leased to nobody running it. A hand-back
        whose answer was lost does not: it may have committed, and the job
        may be another worker's already (its token is handed back again,
        ``Leases.hand_back``)."""
        ts = self.timeshare
        party = timeshare.party_of(job.kind, job.fair_key)
        if ts.admit(job.id, job.lane, party, borrowed):
            return True
        try:
            with self.pool.connection(timeout=5) as conn:
                queue.unclaim(conn, job)
        except (psycopg.Error, PoolTimeout) as exc:
            metrics.database_error("claim")
            if answer_lost(exc):
                # The hand-back may have committed: the job may be due for
                # another worker already, so it is not run here. If it did not
                # commit, the lease is released by its token when the
                # database answers (as a claim whose answer was lost).
                self.leases.hand_back(job.lease_token)
                log.warning("a claim over its party's share was handed back without an answer; "
                            "not running it", extra=job_extra(self.config.worker_id, job,
                                                              error=str(exc)[:300]))
                return False
            log.warning("could not hand back a claim over its party's share; running it",
                        extra=job_extra(self.config.worker_id, job, error=str(exc)[:300]))
            return ts.admit(job.id, job.lane, party, force=True)
        metrics.claim_handed_back(job.lane)
        return False

    def _rebalance(self, lane: str) -> None:
        # The lane is behind: queue each merchant's excess in rounds behind
        # everyone's share (vpay.engine.fairness). Best effort: an error costs
        # fairness for one pass, never the job already claimed.
        try:
            with self.pool.connection(timeout=5) as conn:
                placed, aged = self.fairness.rebalance(conn, lane)
        except (psycopg.Error, PoolTimeout) as exc:
            metrics.database_error("rebalance")
            log.warning("lane rebalance failed", extra={"worker_id": self.config.worker_id,
                                                        "lane": lane, "error": str(exc)[:300]})
            return
        metrics.lane_rebalanced(lane, placed)
        if placed or aged:
            log.info("lane behind: rebalanced", extra={"worker_id": self.config.worker_id,
                                                        "lane": lane, "placed_in_rounds": placed,
                                                        "aged_to_round_0": aged})

    # ---- one job --------------------------------------------------------

    def _serve(self, job: queue.Job, served: tuple[str, ...], slot: int | None = None) -> queue.Job | None:
        """Run ``job`` and record its outcome; answers the next job of
        ``served`` when the outcome's write claimed one (``Done``, not
        draining), else ``None``. ``slot``: the claim loop serving it (told
        to the waker before that claim)."""
        self.gauge.count(job.lane, "claimed")
        metrics.job_claimed(job)
        self.leases.hold(job)
        try:
            with logs.job_context(job, self.config.worker_id):
                return self._run(job, served, slot)
        finally:
            if not self.kept.holds(job):  # a kept outcome's job stays held
                self.leases.drop(job)

    def _run(self, job: queue.Job, claim_next: tuple[str, ...] | None = None,
             slot: int | None = None) -> queue.Job | None:
        """Handle ``job`` and apply its outcome. With ``claim_next`` (the
        loop's lanes), a ``Done`` is written together with the claim of the
        loop's next job (its lanes first, then lanes lent, as
        ``_claim_on``), which is answered (``None`` when there was none)."""
        wid = self.config.worker_id
        started = time.monotonic()
        error: str | None = None
        try:
            outcome: Outcome | None = self.ctx.handle(job)
        except JobError as exc:
            outcome = exc.decision
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried, never fatal
            outcome = None
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, (psycopg.Error, PoolTimeout)):
                metrics.database_error("handler")
            log.error("handler raised", extra=job_extra(
                wid, job, error=error, traceback=traceback.format_exc(limit=8)))
        elapsed = round(time.monotonic() - started, 3)
        # The loop is free: its time counts for the job's party and lane
        # before the next claim is planned (that claim may be this write's).
        self.timeshare.done(job.id, job.lane, timeshare.party_of(job.kind, job.fair_key), elapsed)
        scope = None
        if claim_next is not None:
            lent, skip = self.timeshare.plan(claim_next)
            scope = queue.Scope(tuple(claim_next), lent, skip)
            if slot is not None:
                self.waker.claiming(slot)  # the outcome's write claims for this loop
        try:
            kept, nxt = self.outcomes.apply(job, outcome, error, scope)
        except Exception as exc:  # noqa: BLE001 - the claim loop must outlive any one job
            # A statement the database refused, or an answer that is not an
            # Outcome (a bug): the lease is left to the reaper, which counts
            # the failure and parks the job after MAX_FAILURES. Kept, so the
            # drain cannot call itself clean while the job is still leased to
            # us (Leases.release_unrecorded). (An outage past the retries does
            # not land here: that outcome is kept and written when the
            # database answers, vpay/worker/handback.py.)
            if isinstance(exc, (psycopg.Error, PoolTimeout)):
                metrics.database_error("outcome")
            self.leases.unrecorded(job)
            log.error("could not record the job's outcome; its lease will be reaped",
                      extra=job_extra(wid, job, error=f"{type(exc).__name__}: {exc}"[:300]))
            metrics.job_finished(job, outcome, None, elapsed)
            return None
        metrics.job_finished(job, outcome, kept, elapsed)
        if kept is None:
            # The database stayed away past the retries: the outcome is kept
            # and written when it answers (vpay/worker/handback.py).
            return None
        if kept and self.jobs_vacuum is not None:
            self.jobs_vacuum.finished()
        if not kept:
            self.gauge.count(job.lane, "lost")
            log.warning("lease lost: the outcome was discarded", extra=job_extra(
                wid, job, outcome=type(outcome).__name__ if outcome else "error", seconds=elapsed))
        elif log.isEnabledFor(logging.INFO):
            log.info("job handled", extra=job_extra(
                wid, job, outcome=type(outcome).__name__ if outcome else "error", seconds=elapsed))
        return nxt

    # ---- run and drain --------------------------------------------------

    def run(self) -> Drain:
        """Register this worker's row, reap at boot, run the claim loops and
        helper threads until a signal, drain, and mark the row stopped.
        Answers the ``Drain``: never ``CLEAN`` when the id was taken over by
        another process (the heartbeat found the row naming it: the drain
        began then, and the row, now the other's, is left as it is)."""
        self.presence.register()  # before the boot reap: leases of an earlier process under our id
        drain = self._run_until_drained()
        self.presence.stop()  # nothing when taken over
        if self.presence.taken_over and drain is Drain.CLEAN:
            return Drain.TIMED_OUT
        return drain

    def _run_until_drained(self) -> Drain:
        cfg = self.config
        reaped = self.reaper.reap()
        split = lanes.describe(self.loops)
        log.info("worker started", extra={"worker_id": cfg.worker_id, "concurrency": cfg.concurrency,
                                          "queues": list(cfg.queues), "loops": split,
                                          "lease_seconds": cfg.lease, "reaped_at_boot": reaped,
                                          "jobs_vacuum_every": cfg.jobs_vacuum_every,
                                          "listener_dead_after_seconds": cfg.listener_dead_after,
                                          "dead_after_seconds": cfg.dead_after,
                                          "party_share": cfg.party_share,
                                          "party_caps": self.timeshare.caps, "lend": cfg.lend})
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
        helpers: list[threading.Thread] = [self.heartbeat, self.reaper, self.handback, self.gauge_timer]
        wd = watchdog_interval()
        if wd and self.notifier.enabled:
            helpers.append(maintenance.Watchdog(self.notifier, self._beats, self._stopping,
                                                cfg.idle_sleep, cfg.worker_id, wd, self._halt))
        if cfg.listen:
            # Its own session-level connection, never one of the pool's (wake.py).
            self.listener = Listener(self.session_url, self.waker, self._halt, cfg.worker_id,
                                     claim=self._listener_claim,
                                     liveness=Liveness(cfg.listener_dead_after))
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
                                    "in_flight": self.leases.in_flight()})
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
        self.leases.release_unanswered()  # the heartbeat will not come round again
        self.kept.last_try()  # written, or the lease handed back: nothing left held
        if not pending:
            executor.shutdown(wait=True)
            # After the loops: none can add to it any more.
            unrecorded = self.leases.release_unrecorded()
            self.gauge_line.emit(final=True)
            if crashed:  # never "clean": systemd must restart us (Restart=on-failure)
                log.error("drain after a claim loop crashed",
                          extra={"worker_id": cfg.worker_id, "drain": "crashed"})
                return Drain.CRASHED
            if unrecorded is None or unrecorded > 0:
                # Not clean: jobs whose outcome could not be written were still
                # leased to us (issue 25: a "clean" drain left 2 jobs leased).
                log.warning("drain not clean: jobs whose outcome could not be written were still leased",
                            extra={"worker_id": cfg.worker_id, "drain": "unrecorded",
                                   "released": unrecorded or 0,
                                   "left_leased": "unknown" if unrecorded is None else 0})
                return Drain.TIMED_OUT
            log.info("drain clean", extra={"worker_id": cfg.worker_id, "drain": "clean"})
            return Drain.CLEAN
        released = self.leases.release(self.leases.held())
        unrecorded = self.leases.release_unrecorded()
        self.gauge_line.emit(final=True)
        log.warning(f"drain timed out: released={released}",
                    extra={"worker_id": cfg.worker_id, "drain": "timed_out", "released": released,
                           "unrecorded_released": unrecorded, "hurried": self.signals.hurry.is_set()})
        return Drain.CRASHED if crashed else Drain.TIMED_OUT
