"""The worker's counters since boot and the gauge line that logs them with the
queue's depth.

``Gauge`` is counted by the claim loops (claimed, done, lost, ...) and the
reaper (reaped); ``GaugeLine`` writes them out, every ``GAUGE_EVERY`` seconds
from the gauge thread (vpay/worker/maintenance.py) and once more, ``final``,
at the end of the drain.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

import psycopg
from psycopg_pool import ConnectionPool

from vpay.base import metrics
from vpay.engine import lanes, queue, vacuum
from vpay.worker.sdnotify import Notifier

log = logging.getLogger("vpay.worker")

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


class GaugeLine:
    """The ``gauge`` log line of one worker, and the service manager's
    STATUS= with it. ``loops``: the lanes each claim loop serves;
    ``rail_pauses``: the dispatcher's per-rail end of backpressure
    (``Dispatcher.rail_pauses``); ``jobs_vacuum``: the worker's own vacuum
    thread, if on; ``listener``: the wake-up listener's
    ``Listener.snapshot`` (``None`` when there is none)."""

    def __init__(self, pool: ConnectionPool, gauge: Gauge, loops: Sequence[tuple[str, ...]],
                 worker_id: str, notifier: Notifier,
                 rail_pauses: Callable[[], dict[str, str | None]],
                 jobs_vacuum: vacuum.JobsVacuum | None,
                 listener: Callable[[], dict | None] = lambda: None):
        self.pool = pool
        self.gauge = gauge
        self.loops = loops
        self.worker_id = worker_id
        self.notifier = notifier
        self.rail_pauses = rail_pauses
        self.jobs_vacuum = jobs_vacuum
        self.listener = listener

    def emit(self, final: bool = False) -> dict:
        """Log the gauge: the totals since boot and the queue depth as
        top-level keys (``claimed`` ... ``reaped``, ``due``, ``leased``,
        ``dead``), and ``lanes``: the same per lane, plus ``loops`` (this
        worker's loops serving that lane). Depths are -1 when the database
        cannot be read. With the worker's own vacuum on, ``jobs_vacuum``:
        ``vacuum.JobsVacuum.snapshot()``; with a listener, ``listener``:
        ``Listener.snapshot()``. Answers the line's fields."""
        counts: dict = self.gauge.snapshot()
        per_lane = self.gauge.lane_snapshot()
        unknown = {"due": -1, "leased": -1, "dead": -1}
        try:
            with self.pool.connection(timeout=5) as conn:
                counts |= queue.depth(conn)
                depths = queue.depth_by_lane(conn)
        except psycopg.Error:
            metrics.database_error("gauge")
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
        if (listening := self.listener()) is not None:
            counts["listener"] = listening
        log.info("gauge", extra={"worker_id": self.worker_id, "final": final, **counts,
                                 "rail_paused_until": self.rail_pauses()})
        self.notifier.status(status)
        return counts
