"""The worker vacuums ``jobs`` itself after every so many finished jobs
(issue #15, "Churn"; docs/performance.md, "Churn").

Why: every job's row is updated at claim and deleted (or rescheduled) at its
outcome, and the dead index entries gather at the head of the claim indexes,
exactly where every claim starts its ordered scan. ``sql/0014_jobs_autovacuum.sql``
lets autovacuum take ``jobs`` at 2,000 dead rows, but the autovacuum launcher
visits a database only once per ``autovacuum_naptime`` (server-wide, 60 s by
default; per-table settings cannot shorten it), and a busy queue finishes
tens of thousands of jobs in that minute.

The shape:

* Each claim loop counts the outcomes it writes and keeps (``done``,
  ``retry``, ``error``, ``dead_letter``: each left at least two dead row
  versions, the claimed one and the finished one) through
  ``JobsVacuum.finished``: a counter under a lock, nothing else on the hot
  path.
* When ``every`` (``VPAY_JOBS_VACUUM_EVERY``, default ``VACUUM_EVERY``; 0 turns
  it off) have been counted since the last vacuum began, one thread of the
  process (``JobsVacuum``, beside the heartbeat and the reaper) runs
  ``vacuum_jobs`` (sql/queries/maintenance.sql), but never sooner than
  ``MIN_INTERVAL_SECONDS`` after its previous one began.
* The vacuum runs on a connection of its own to the session URL
  (``VPAY_SESSION_DATABASE_URL``, default ``VPAY_DATABASE_URL``), opened for
  it and closed after (never one of the pool's, which the claim loops and
  handlers use). Its ``statement_timeout`` of ``TIMEOUT_SECONDS`` is a
  ``SET`` after connecting, not a startup ``options`` (which pgbouncer
  refuses: ``unsupported startup parameter: options``), and is reset after
  the vacuum; a session-mode pgbouncer also resets it when the client
  leaves (``server_reset_query``).
* ``VACUUM (SKIP_LOCKED)``: when ``jobs`` is being vacuumed already (another
  replica's vacuum, autovacuum, an operator) this one is skipped at once
  instead of queueing behind it, so replicas never pile up. Each replica
  counts only its own finishes, so the table is vacuumed about once per
  ``every`` finishes fleet-wide, whatever the number of replicas.
  ``TRUNCATE OFF``: giving back empty pages at the table's end needs an
  ACCESS EXCLUSIVE lock, which would stall every claim for its duration, for
  pages a queue fills again within seconds (autovacuum still truncates).
  ``INDEX_CLEANUP ON``: the index entries are the point; Postgres would
  otherwise skip the index pass when few heap pages hold dead rows.

Why not a job kind in the housekeeping lane: a vacuum job would be a row of
the very queue it cleans, claimed in ``run_at`` order behind the backlog that
makes the churn (100,000 due jobs are ahead of it); it would hold a claim
loop while it runs; and a worker started with ``--queues mtn`` churns its
lane without serving housekeeping. A thread of the process that does the
finishing has none of these problems.

Nothing here decides anything about a job: a vacuum only removes row
versions no transaction can see, and one that fails or is skipped changes
nothing but the next claims' speed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Mapping

import psycopg

from vpay.base import metrics
from vpay.base.db import ConfigError, session_connect
from vpay.base.queries import Q

log = logging.getLogger("vpay.worker")

VACUUM_EVERY = 5000
"""Default of ``VPAY_JOBS_VACUUM_EVERY``: finished jobs (kept outcomes) of
this process between two vacuums of ``jobs``. At the queue's ~1,500 no-op
jobs/s on the bench box that is a vacuum every 3 s or so, each removing
about 10,000 dead row versions; at a deployment's hundreds of jobs/s, one
every few tens of seconds (docs/capacity.md, "Churn")."""

MAX_VACUUM_EVERY = 10_000_000
"""The largest ``VPAY_JOBS_VACUUM_EVERY`` accepted: beyond it the worker's
own vacuum would come after more dead rows than any autovacuum leaves; use
0 to leave ``jobs`` to autovacuum alone."""

MIN_INTERVAL_SECONDS = 1.0
"""Seconds between the starts of two vacuums of one process, at least,
however fast jobs finish: bounds the vacuums' share of the database when
``jobs`` is large and jobs are tiny. Counted from the start, so a vacuum
longer than this is followed by the next at once if enough jobs finished
meanwhile (the one running thread never overlaps itself)."""

TIMEOUT_SECONDS = 60.0
"""``statement_timeout`` of one vacuum (seconds). A vacuum that passes it is
cancelled by the server (what it removed so far stays removed), counted as
``error`` and logged; the next comes after ``every`` more finishes."""


def every_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``VPAY_JOBS_VACUUM_EVERY`` (finished jobs between two vacuums; default
    ``VACUUM_EVERY``; 0 = off). Raises ``ConfigError`` (exit 78) unless it is
    a whole number from 0 to ``MAX_VACUUM_EVERY``."""
    env = os.environ if environ is None else environ
    raw = env.get("VPAY_JOBS_VACUUM_EVERY", "").strip()
    if not raw:
        return VACUUM_EVERY
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_VACUUM_EVERY:
        raise ConfigError(f"VPAY_JOBS_VACUUM_EVERY must be a whole number of finished jobs from 0 "
                          f"(off) to {MAX_VACUUM_EVERY}, got {raw!r}")
    return value


# SQLSTATE of the WARNING a VACUUM (SKIP_LOCKED) gives when someone else holds
# the table's vacuum lock (lock_not_available); any other warning (the role
# does not own jobs: 42501) means this vacuum can never run.
_LOCK_NOT_AVAILABLE = "55P03"


def vacuum_jobs(url: str, timeout: float = TIMEOUT_SECONDS, application_name: str = "vpay-vacuum") -> tuple[str, str | None]:
    """Run ``vacuum_jobs`` once on a new autocommit connection to ``url`` (the
    session URL; ``vpay.base.db.session_connect``: no startup options), with
    a ``statement_timeout`` of ``timeout`` seconds set after connecting. Answers ``(result,
    detail)``: ``("done", None)``; ``("skipped", message)`` when ``jobs`` was
    being vacuumed by someone else; ``("error", message)`` when the vacuum
    could not run (the timeout, a database error, a role that may not
    vacuum ``jobs``). Never raises a database error."""
    warnings: list[tuple[str | None, str | None]] = []  # (sqlstate, message)

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        # read inside the handler: the diagnostic is freed after it returns
        if diag.severity_nonlocalized == "WARNING":
            warnings.append((diag.sqlstate, diag.message_primary))

    try:
        with session_connect(url, application_name, timeout) as conn:
            # VACUUM cannot run inside a transaction block, so no SET LOCAL:
            # a session SET, taken back after it.
            conn.execute(f"SET statement_timeout = {max(1, round(timeout * 1000))}")
            conn.add_notice_handler(keep)
            try:
                conn.execute(Q["vacuum_jobs"])
            finally:
                if not conn.broken:
                    conn.execute("RESET statement_timeout")
    except psycopg.Error as exc:
        return "error", f"{type(exc).__name__}: {exc}"[:300]
    for sqlstate, message in warnings:
        if sqlstate == _LOCK_NOT_AVAILABLE:
            return "skipped", message
    if warnings:
        return "error", warnings[0][1]
    return "done", None


class JobsVacuum(threading.Thread):
    """The thread that vacuums ``jobs`` after every ``every`` finished jobs
    of this process (module docstring). Claim loops call ``finished()``;
    ``stop()`` ends the thread (a vacuum in progress is left to finish or to
    its timeout: the process exits without waiting for it).

    ``min_interval`` and ``timeout`` are seconds (defaults
    ``MIN_INTERVAL_SECONDS``, ``TIMEOUT_SECONDS``)."""

    def __init__(self, url: str, every: int, halt: threading.Event, worker_id: str = "", *,
                 min_interval: float = MIN_INTERVAL_SECONDS, timeout: float = TIMEOUT_SECONDS):
        if every <= 0:
            raise ValueError("JobsVacuum needs every >= 1 (0 means: do not start it)")
        super().__init__(name="jobs-vacuum", daemon=True)
        self.url = url
        self.every = every
        self.halt = halt
        self.worker_id = worker_id
        self.min_interval = min_interval
        self.timeout = timeout
        self._lock = threading.Lock()
        self._since = 0          # finished jobs since the last vacuum began
        self._due = threading.Event()
        self._last_start = float("-inf")  # time.monotonic() when the last vacuum began
        self.runs = {"done": 0, "skipped": 0, "error": 0}

    def finished(self, n: int = 1) -> None:
        """``n`` more jobs finished in this process (kept outcomes). Cheap:
        the thread is only signalled when the count reaches ``every``."""
        with self._lock:
            self._since += n
            if self._since >= self.every:
                self._due.set()

    def snapshot(self) -> dict:
        """For the gauge line: ``every``, ``since`` (finished since the last
        vacuum began), ``due`` (``every`` reached, the vacuum not begun yet)
        and ``runs`` (vacuums by result since boot)."""
        with self._lock:
            return {"every": self.every, "since": self._since, "due": self._since >= self.every,
                    "runs": dict(self.runs)}

    def pause_before(self, now: float) -> float:
        """Seconds to wait at ``now`` (``time.monotonic()``) before the next
        vacuum may begin: what is left of ``min_interval`` since the last one
        began; 0 when none has or it has passed."""
        return max(0.0, self._last_start + self.min_interval - now)

    def stop(self) -> None:
        """End the thread: ``halt`` it and wake it if it waits for a count."""
        self.halt.set()
        self._due.set()

    def run(self) -> None:
        while not self.halt.is_set():
            # No timeout: an idle worker's thread never wakes (stop() wakes it).
            self._due.wait()
            if self.halt.is_set():
                return
            pause = self.pause_before(time.monotonic())
            if pause > 0 and self.halt.wait(pause):
                return
            with self._lock:
                finished, self._since = self._since, 0
                self._due.clear()
            self._last_start = started = time.monotonic()
            result, detail = vacuum_jobs(self.url, self.timeout,
                                         f"vpay-vacuum {self.worker_id}")
            seconds = round(time.monotonic() - started, 3)
            with self._lock:
                self.runs[result] += 1
            metrics.jobs_vacuumed(result)
            extra = {"worker_id": self.worker_id, "result": result, "finished": finished,
                     "seconds": seconds, "error": detail}
            if result == "error":
                log.warning("could not vacuum jobs; the claims slow down until it can", extra={
                    **extra, "hint": "the worker's role must own jobs; VPAY_JOBS_VACUUM_EVERY=0 "
                                     "leaves jobs to autovacuum alone"})
            else:
                log.info("jobs vacuumed" if result == "done" else "jobs vacuum skipped: "
                         "another vacuum of jobs is running", extra=extra)
