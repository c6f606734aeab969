"""Outcomes whose write met a database outage: kept, and written as soon as
the database answers.

Issue 25, "Outcomes after an outage". A handler's outcome is written back
fenced on the lease (vpay/worker/outcomes.py), retried for
``outcomes.RETRY_SECONDS`` (30) through a brief outage. When the database stays away longer, the outcome is not
dropped (which left the job leased to this live worker, which no longer ran
it, until the lease ran out: up to 300 s, 7 minutes seen): it is kept here,
the job stays held (the heartbeat renews its lease when it can), and the
``handback`` thread (vpay/worker/maintenance.py) tries its fenced write every
``RETRY_EVERY`` seconds, so it lands within about a second of the database
answering. The try is the same ``OutcomeWriter.write_once`` as the retrying
path's: matching nothing is a lost lease (another worker reaped it), and an
attempt whose answer was lost is looked up on the row.

The bound: an outcome is kept at most ``keep_for`` seconds (the worker's
lease) from the first failed write. By then the lease, not renewed while the
database was away, has run out and any reaper frees the job; the outcome is
given up (its lease released, fenced, if the database answers) and counted.
At most ``MAX_KEPT`` are kept (the oldest given up first). Each kept, written,
lost or given-up outcome is logged and counted in
``vpay_outcome_handbacks_total{result}`` (docs/observability.md).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from vpay.base import metrics
from vpay.engine import queue
from vpay.engine.outcome import Outcome
from vpay.worker.leases import Leases
from vpay.worker.outcomes import DB_ERRORS, job_extra

log = logging.getLogger("vpay.worker")

RETRY_EVERY = 1.0
"""Seconds between two tries of the kept outcomes' writes: how soon after
the database answers again a kept outcome lands, at most."""

CHECKOUT_SECONDS = 2.0
"""How long one try waits for a pooled connection: a database still away
costs the ``handback`` thread this, not the pool's 30 s."""

ANSWER_SECONDS = 5.0
"""How long one try's statements may wait for the database's answer in all
(seconds), on top of ``CHECKOUT_SECONDS``: a database gone silent (a stuck
proxy, a NAT that dropped its mapping: nothing refused, nothing answered)
fails the try as a lost answer instead of holding the ``handback`` thread,
or the drain's last try, for ever (``vpay.base.db.answer_within``)."""

MAX_KEPT = 1000
"""Outcomes kept at most; past it the oldest is given up (its lease runs out
and the reaper frees it, as before this existed). A worker keeps at most one
per claim loop per outage in practice: a loop claims nothing while the
database is away."""


@dataclass
class Kept:
    """One outcome waiting for the database: ``job`` and what its handler
    answered (``outcome``, or ``None`` with ``error``), ``lost``: whether a
    write attempt's answer was lost (it may have committed), ``since``: the
    monotonic time it was kept."""

    job: queue.Job
    outcome: Outcome | None
    error: str | None
    lost: list[bool]
    since: float


class KeptOutcomes:
    """The outcomes ``worker_id`` could not write yet. ``write_once(job,
    outcome, error, lost, timeout, answer_seconds)`` is the writer's one
    fenced try (raises the database's errors; each try here is bounded by
    ``CHECKOUT_SECONDS`` and ``ANSWER_SECONDS``); ``leases`` holds the jobs while kept (renewed by
    the heartbeat) and releases them when given up; ``keep_for``: the bound,
    seconds. Thread-safe: the claim loops keep, the ``handback`` thread and
    the drain retry."""

    def __init__(self, write_once: Callable[..., bool], leases: Leases, worker_id: str,
                 keep_for: float, clock: Callable[[], float] = time.monotonic):
        self.write_once = write_once
        self.leases = leases
        self.worker_id = worker_id
        self.keep_for = keep_for
        self.clock = clock
        self._kept: dict[uuid.UUID, Kept] = {}
        self._lock = threading.Lock()
        # One round of tries at a time (the handback thread's and the drain's
        # last one): an outcome is never written twice at once.
        self._round = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def holds(self, job: queue.Job) -> bool:
        """Whether ``job``'s outcome is kept here (its lease stays held)."""
        return job.lease_token in self._kept

    def keep(self, job: queue.Job, outcome: Outcome | None, error: str | None, lost: bool,
             exc: BaseException | None = None) -> None:
        """Keep ``job``'s outcome after its write met an outage (``exc``):
        the job stays held until the outcome is written or given up."""
        self.leases.hold(job)
        oldest = None
        with self._lock:
            self._kept[job.lease_token] = Kept(job, outcome, error, [lost], self.clock())
            if len(self._kept) > MAX_KEPT:
                oldest = self._kept.pop(next(iter(self._kept)))
        log.warning("could not record the job's outcome; kept, to be written when the database answers",
                    extra=job_extra(self.worker_id, job, error=f"{type(exc).__name__}: {exc}"[:300],
                                    keep_for_seconds=self.keep_for))
        metrics.outcome_handback("kept")
        if oldest is not None:
            self._give_up([oldest], "too many kept")

    def retry(self) -> None:
        """One try of every kept outcome's write, oldest first; stops at the
        first database error (it is still away: the others would wait on it
        too). Outcomes kept past ``keep_for`` are then given up."""
        with self._round:
            self._retry()

    def _retry(self) -> None:
        with self._lock:
            entries = list(self._kept.values())
        for entry in entries:
            try:
                kept = self.write_once(entry.job, entry.outcome, entry.error, entry.lost,
                                       CHECKOUT_SECONDS, ANSWER_SECONDS)
            except DB_ERRORS:
                break
            self._written(entry, kept)
        now = self.clock()
        with self._lock:
            late = [e for e in self._kept.values() if now - e.since > self.keep_for]
            for entry in late:
                self._kept.pop(entry.job.lease_token, None)
        if late:
            self._give_up(late, f"kept past its bound ({self.keep_for:g} s)")

    def last_try(self) -> None:
        """At the drain: one more try of each write, then the leases of what
        is left handed back (fenced; when the database answers), so no job
        stays leased to a worker that is exiting."""
        if not self._kept:
            return
        with self._round:
            self._retry()
            with self._lock:
                left = list(self._kept.values())
                self._kept.clear()
            if left:
                self._give_up(left, "the worker is draining")

    def _written(self, entry: Kept, kept: bool) -> None:
        with self._lock:
            self._kept.pop(entry.job.lease_token, None)
        self.leases.drop(entry.job)
        waited = round(self.clock() - entry.since, 3)
        if kept:
            log.warning("kept outcome written: the database answers again",
                        extra=job_extra(self.worker_id, entry.job, kept_seconds=waited))
            metrics.outcome_handback("written")
        else:
            log.warning("lease lost: the kept outcome was discarded",
                        extra=job_extra(self.worker_id, entry.job, kept_seconds=waited))
            metrics.outcome_handback("lost")

    def _give_up(self, entries: list[Kept], why: str) -> None:
        for entry in entries:
            self.leases.drop(entry.job)
        released = self.leases.release([e.job.lease_token for e in entries])
        for i, entry in enumerate(entries):
            # release answers a count: the first ``released`` are counted so
            handed = i < released
            log.error("kept outcome given up; its lease was " + (
                "handed back" if handed else "left to the reaper"),
                extra=job_extra(self.worker_id, entry.job, why=why))
            metrics.outcome_handback("released" if handed else "abandoned")
