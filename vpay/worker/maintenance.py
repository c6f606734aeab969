"""The worker's helper threads: heartbeat, reaper, handback, gauge and
watchdog, each a small service with one loop on its own interval.

As River's maintenance services (riverqueue/river, internal/maintenance/):
each ``Service`` is a named daemon thread that, every ``interval`` seconds
until the worker's ``halt`` is set, takes one ``turn``, which survives
the database being away. They run beside the claim loops, never in them, so a
wedged queue or a stuck handler cannot stop a lease being renewed or reaped.
The listener (vpay/engine/wake.py) and the jobs vacuum (vpay/engine/vacuum.py)
run beside them, threads of the engine's.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from vpay.base import metrics
from vpay.engine import queue, workers
from vpay.worker import handback
from vpay.worker.gauge import Gauge, GaugeLine
from vpay.worker.handback import KeptOutcomes
from vpay.worker.leases import Leases
from vpay.worker.presence import Presence
from vpay.worker.sdnotify import Notifier

log = logging.getLogger("vpay.worker")

GAUGE_EVERY = 60.0  # seconds between gauge lines


class Service(threading.Thread):
    """A helper thread named ``name``: a ``turn`` every ``interval``
    seconds until ``halt`` is set (the first after one interval)."""

    def __init__(self, name: str, interval: float, halt: threading.Event):
        super().__init__(name=name, daemon=True)
        self.interval = interval
        self.halt = halt

    def run(self) -> None:
        while not self.halt.wait(self.interval):
            self.turn()

    def turn(self) -> None:
        """One round of the service's work. What it raises ends the thread:
        a turn catches the database's errors itself."""
        raise NotImplementedError


class Heartbeat(Service):
    """Beats this worker's row in ``workers`` and renews the leases it holds,
    every ``lease / 3`` or ``dead_after / 4`` seconds, whichever is sooner
    (0.3 s at least), so a lease runs out, and the worker is judged dead,
    only when its worker is dead (or too wedged to run this thread); first
    hands back the claims whose answer was lost (``Leases.hand_back``) that
    the database could not take at the time."""

    def __init__(self, leases: Leases, presence: Presence, lease: float, halt: threading.Event):
        super().__init__("heartbeat", max(min(lease / 3.0, workers.beat_interval(presence.dead_after)),
                                          0.3), halt)
        self.leases = leases
        self.presence = presence

    def turn(self) -> None:
        self.leases.release_unanswered()
        self.presence.beat()
        if not self.presence.taken_over:  # under another process's id, nothing held is ours to keep
            self.leases.renew()


class Reaper(Service):
    """Frees leases past their own expiry, and leases whose holder is gone
    (``queue.reap_expired_leases``: stopped, restarted, or dead by its
    heartbeat while ``presence.steady()``), every ``lease / 2`` or
    ``dead_after / 4`` seconds, whichever is sooner (0.5 s at least), on a
    timer of its own so a dead queue cannot stop it; the worker also
    ``reap``s once at boot."""

    def __init__(self, pool: ConnectionPool, worker_id: str, gauge: Gauge, lease: float,
                 halt: threading.Event, presence: Presence):
        super().__init__("reaper", max(min(lease / 2.0, workers.beat_interval(presence.dead_after)),
                                       0.5), halt)
        self.pool = pool
        self.worker_id = worker_id
        self.gauge = gauge
        self.presence = presence

    def reap(self) -> int:
        """Free leases past their own expiry or whose holder is gone; log
        each reaped job. Answers how many; raises ``psycopg.Error`` when the
        database cannot be reached."""
        by_heartbeat = self.presence.steady()
        with self.pool.connection() as conn:
            rows = queue.reap_expired_leases(conn, by_heartbeat=by_heartbeat, reaper=self.worker_id)
        for row in rows:
            log.warning("lease reaped", extra={"worker_id": self.worker_id,
                                               "job_id": row["id"], "kind": row["kind"],
                                               "lane": row["lane"], "dedupe_key": row["dedupe_key"],
                                               "parked": row["parked"], "why": row["why"]})
        for row in rows:
            self.gauge.count(row["lane"], "reaped")
        return len(rows)

    def turn(self) -> None:
        try:
            self.reap()
        except (psycopg.Error, PoolTimeout) as exc:  # the timer must outlive any database error
            metrics.database_error("reaper")
            self.presence.trouble()
            log.warning("reaper could not reach the database", extra={"error": str(exc)[:300]})


class Handback(Service):
    """Tries the writes of the outcomes kept through a database outage
    (``KeptOutcomes.retry``, vpay/worker/handback.py) every
    ``handback.RETRY_EVERY`` seconds: each lands within about that long after
    the database answers again."""

    def __init__(self, kept: KeptOutcomes, halt: threading.Event):
        super().__init__("handback", handback.RETRY_EVERY, halt)
        self.kept = kept

    def turn(self) -> None:
        if len(self.kept):
            self.kept.retry()


class GaugeTimer(Service):
    """Logs the gauge line every ``GAUGE_EVERY`` seconds."""

    def __init__(self, line: GaugeLine, halt: threading.Event):
        super().__init__("gauge", GAUGE_EVERY, halt)
        self.line = line

    def turn(self) -> None:
        self.line.emit()


class Watchdog(Service):
    """Pings the service manager's watchdog every ``interval`` (from
    ``WATCHDOG_USEC``) while every claim loop has come round recently:
    ``beats`` holds each loop's last time round (``time.monotonic()``), and
    a loop stuck in a handler past ``interval * 2 + idle_sleep`` withholds
    the ping so systemd acts. Once ``stopping`` is set the drain has its own
    clock, and the ping goes on."""

    def __init__(self, notifier: Notifier, beats: list[float], stopping: threading.Event,
                 idle_sleep: float, worker_id: str, interval: float, halt: threading.Event):
        super().__init__("watchdog", interval, halt)
        self.notifier = notifier
        self.beats = beats
        self.stopping = stopping
        self.worker_id = worker_id
        # An idle loop comes round every idle_sleep: that is not being stuck.
        self.deadline = interval * 2 + idle_sleep

    def turn(self) -> None:
        if self.stopping.is_set():
            self.notifier.watchdog()  # the drain has its own clock
            return
        now = time.monotonic()
        if all(now - beat < self.deadline for beat in self.beats):
            self.notifier.watchdog()
        else:
            log.error("watchdog withheld: a claim loop has not come round",
                      extra={"worker_id": self.worker_id})
