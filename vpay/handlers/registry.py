"""The handler registry and what handlers are given: ``Context``, ``register``,
``handle`` (dispatch by ``jobs.kind``) and the hourly jobs every worker
ensures at boot. Handler modules import from here; ``vpay.handlers`` imports
them (so registering them) and re-exports these names."""


from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

from psycopg_pool import ConnectionPool

from vpay.engine.outcome import DeadLetter, Outcome, RetryAfter
from vpay.engine.queue import Job
from vpay.rails.port import Rail, RailError, RailPaused
from vpay.base.settings import Settings

log = logging.getLogger("vpay.handlers")


@dataclass
class Context:
    """What handlers may use: the pool (autocommit connections), the rails by
    code (built on first use, shared by threads), the settings and this
    worker's id."""

    pool: ConnectionPool
    worker_id: str
    settings: Settings = field(default_factory=Settings)
    lease_seconds: float = 300.0
    rail_factory: Callable[[str], Rail] | None = None
    _rails: dict[str, Rail] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def rail(self, code: str) -> Rail:
        """The adapter for ``code``; raises ``RailError`` when it is not configured."""
        with self._lock:
            if code not in self._rails:
                factory = self.rail_factory
                if factory is None:
                    from vpay.rails import build_rail
                    factory = build_rail
                self._rails[code] = factory(code)
            return self._rails[code]

    def handle(self, job: Job) -> Outcome:
        """Run ``job``'s handler with this context (``handle``): what the
        worker's loops call (``vpay.worker.loop.Dispatcher``)."""
        return handle(job, self)

    def rail_pauses(self) -> dict[str, str | None]:
        """Per rail built so far, the end of its backpressure pause (ISO 8601
        UTC) or None: the gauge line's ``rail_paused_until``."""
        with self._lock:
            rails = dict(self._rails)
        return {code: gate.paused_until() for code, rail in rails.items()
                if (gate := getattr(rail, "gate", None)) is not None}


Handler = Callable[[Job, Context], Outcome]
REGISTRY: dict[str, Handler] = {}


def register(kind: str) -> Callable[[Handler], Handler]:
    def wrap(fn: Handler) -> Handler:
        REGISTRY[kind] = fn
        return fn
    return wrap


RAIL_UNCONFIGURED_RETRY = 300.0
"""Seconds before a job whose rail is not configured in this worker runs
again. A missing ``VPAY_<RAIL>_*`` setting is the operator's to fix; the
payment must not be dead-lettered for it."""


def handle(job: Job, ctx: Context) -> Outcome:
    """Run the handler for ``job.kind``. An unknown kind is dead-lettered:
    no retry could make it known. A rail this worker cannot build
    (``RailError``: unknown or unconfigured) is logged at error and retried
    every ``RAIL_UNCONFIGURED_RETRY`` seconds, never parked. A rail that asked
    for less traffic (``RailPaused``, raised before any request is sent, or
    by the call that got the 429/503) defers the job to the end of the
    pause: not a failure, and the claim's attempt is given back."""
    fn = REGISTRY.get(job.kind)
    if fn is None:
        return DeadLetter(f"no handler for job kind {job.kind!r}")
    try:
        return fn(job, ctx)
    except RailPaused as paused:
        log.info("rail paused: job deferred", extra={
            "worker_id": ctx.worker_id, "job_id": job.id, "kind": job.kind,
            "dedupe_key": job.dedupe_key, "rail": paused.rail,
            "retry_in_seconds": round(paused.seconds, 3), "reason": paused.reason})
        return RetryAfter(paused.seconds, f"rail {paused.rail} paused: {paused.reason}",
                          attempt_spent=False)
    except RailError as exc:
        log.error("rail not configured in this worker", extra={
            "worker_id": ctx.worker_id, "job_id": job.id, "kind": job.kind,
            "dedupe_key": job.dedupe_key, "error": str(exc)})
        return RetryAfter(RAIL_UNCONFIGURED_RETRY, f"rail not configured: {exc}")


HOURLY = 3600.0
SCHEDULED = {"scan:live": "scan", "sweep:expired": "sweep", "sample:overview": "sample"}
"""The jobs that exist from worker boot and reschedule themselves (hourly;
``sample:overview`` every minute, its first a minute after boot)."""
_FIRST_DELAY = {"sample:overview": 60.0}


def ensure_scheduled(conn) -> None:
    """Enqueue ``SCHEDULED`` unless they exist (``ON CONFLICT DO NOTHING``):
    every worker calls this at boot."""
    from vpay.engine.queue import enqueue
    for key, kind in SCHEDULED.items():
        enqueue(conn, kind, key, {}, delay=_FIRST_DELAY.get(key, 0))
