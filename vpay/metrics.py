"""Prometheus metrics: every metric vpay exports, defined here and nowhere else.

Names and labels are the contract's ("Metrics", prefix ``vpay_``); meanings,
types and the alerts built on them are in ``docs/observability.md``. The
exposition is ``prometheus_client``'s (no hand-written text format).

Two kinds of metric live here:

* **Counted in process** (``Counter``, ``Histogram``): jobs handled, job
  seconds, poll lateness, rail requests, leases lost and reaped, webhook
  attempts, API requests. Code records them through the small functions
  below (``job_claimed``, ``job_finished``, ``rail_call``, ...), one line
  per call site.
* **Read from the database at scrape** (``DatabaseCollector``): queue depth
  by lane and state, open alerts by kind, charges by status, disabled
  webhook endpoints. One bounded query (``metrics_snapshot`` in
  ``sql/queries/metrics.sql``, ``statement_timeout`` 2 s), its answer
  reused for ``CACHE_SECONDS`` so several scrapers cost one query. Only the
  worker registers it (``serve``); every replica reports the same values.

Processes: the worker serves ``REGISTRY`` on its own port (``serve``).
The API runs under gunicorn's several worker processes and uses the
library's multiprocess mode instead (``vpay.api.exposition``): there,
``PROMETHEUS_MULTIPROC_DIR`` must be set before this module is first
imported, because ``prometheus_client`` picks its value store at import.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily

from .alert_kinds import ALERT_KINDS
from .lanes import LANES
from .rails.port import RailPaused

log = logging.getLogger("vpay.metrics")

# ``_created`` samples double every counter's series for no operator value.
disable_created_metrics()

REGISTRY = CollectorRegistry(auto_describe=True)
"""vpay's own registry (not the library's global one): exactly the metrics
below, plus ``DatabaseCollector`` in the worker."""

# Seconds. A status read or a webhook POST takes tens of milliseconds to tens
# of seconds (timeouts are at most 600 s); a job includes its rail calls.
_CALL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Lateness is the queue's own delay: the idle sleep (1 s) at best, a backlog
# or a missing worker at worst. The 5 s alert threshold is a bucket edge.
_LATENESS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

JOBS = Counter(
    "vpay_jobs", "Jobs handled, by kind, lane and outcome (done, retry, dead_letter, error, "
    "lost, unrecorded).", ["kind", "lane", "outcome"], registry=REGISTRY)
JOB_SECONDS = Histogram(
    "vpay_job_seconds", "Seconds a handler ran (claim to outcome, rail calls included).",
    ["kind", "lane"], buckets=_CALL_BUCKETS, registry=REGISTRY)
POLL_LATENESS = Histogram(
    "vpay_poll_lateness_seconds", "Seconds between a status read's due time (jobs.run_at) and "
    "its claim, for poll and refund_poll jobs.", ["lane"], buckets=_LATENESS_BUCKETS,
    registry=REGISTRY)
RAIL_REQUESTS = Counter(
    "vpay_rail_requests", "Rail calls that reached the network, by rail, operation "
    "(request_to_pay, status, refund, refund_status) and the port's answer.",
    ["rail", "operation", "answer"], registry=REGISTRY)
RAIL_SECONDS = Histogram(
    "vpay_rail_request_seconds", "Seconds one rail call took, token fetch and transport "
    "retries included.", ["rail", "operation"], buckets=_CALL_BUCKETS, registry=REGISTRY)
LEASES_LOST = Counter(
    "vpay_leases_lost", "Outcomes discarded because the job's lease was no longer ours "
    "(a handler outran its lease).", registry=REGISTRY)
LEASES_REAPED = Counter(
    "vpay_leases_reaped", "Expired leases this process reaped (a worker died holding them).",
    registry=REGISTRY)
WEBHOOK_ATTEMPTS = Counter(
    "vpay_webhook_attempts", "Webhook delivery attempts, by result (delivered, retry, gone, "
    "give_up; held: the URL policy refused the endpoint's URL).", ["result"], registry=REGISTRY)
JOBS_VACUUMS = Counter(
    "vpay_jobs_vacuums", "Vacuums of the jobs table this worker ran (vpay/vacuum.py), by result: "
    "done, skipped (jobs was being vacuumed by someone else), error (the timeout, a database "
    "error, a role that may not vacuum jobs).", ["result"], registry=REGISTRY)
API_REQUESTS = Counter(
    "vpay_api_requests", "HTTP requests the API answered, by method, route template and "
    "status code.", ["method", "route", "status"], registry=REGISTRY)
API_SECONDS = Histogram(
    "vpay_api_request_seconds", "Seconds the API took to answer a request.",
    ["method", "route"], buckets=_CALL_BUCKETS, registry=REGISTRY)

OVER_SHARE = Counter(
    "vpay_jobs_over_share", "Due jobs a lane rebalance placed in a round behind every "
    "merchant's share (vpay.fairness): a merchant's backlog in a lane that fell behind.", ["lane"],
    registry=REGISTRY)

POLL_KINDS = frozenset({"poll", "refund_poll"})
"""Job kinds whose work is a status read: their lateness is observed."""


# --- the worker's loop --------------------------------------------------------


def job_claimed(job: Any) -> None:
    """A job was claimed: for a status read, observe its lateness, the
    claim's ``now()`` minus ``job.run_at`` (``job.late_by``, seconds, at
    least 0), both on the database's clock."""
    if job.kind in POLL_KINDS:
        POLL_LATENESS.labels(job.lane).observe(max(0.0, job.late_by))


def lane_rebalanced(lane: str, placed: int) -> None:
    """Count the jobs one rebalance of ``lane`` placed in a round beyond
    their merchant's share."""
    if placed:
        OVER_SHARE.labels(lane).inc(placed)


def outcome_label(outcome: Any, kept: bool | None) -> str:
    """The ``outcome`` label of ``vpay_jobs_total``: ``lost`` when the fenced
    write matched nothing (``kept`` False), ``unrecorded`` when it could not
    be made (``kept`` None: the lease is left to the reaper), else what the
    handler answered: ``done``, ``retry``, ``dead_letter``, or ``error``
    when it raised (``outcome`` None)."""
    if kept is None:
        return "unrecorded"
    if not kept:
        return "lost"
    name = type(outcome).__name__ if outcome is not None else ""
    return {"Done": "done", "RetryAfter": "retry", "DeadLetter": "dead_letter"}.get(name, "error")


_job_children: dict[tuple[str, str, str], tuple[Any, Any]] = {}


def job_finished(job: Any, outcome: Any, kept: bool | None, seconds: float) -> None:
    """Count one handled job and its handler's ``seconds``. The labelled
    children are looked up once per (kind, lane, outcome) and kept: bounded
    (the job kinds × ``LANES`` × six outcomes), and ``labels()`` on every job
    cost a third of this function (issue #15, CPU per job)."""
    key = (job.kind, job.lane, outcome_label(outcome, kept))
    children = _job_children.get(key)
    if children is None:
        children = _job_children.setdefault(
            key, (JOBS.labels(*key), JOB_SECONDS.labels(job.kind, job.lane)))
    children[0].inc()
    children[1].observe(max(0.0, seconds))


def leases(lost: int = 0, reaped: int = 0, **_other: int) -> None:
    """Add to the lease counters; takes the loop's gauge counts as they are
    added (other counts are ignored)."""
    if lost:
        LEASES_LOST.inc(lost)
    if reaped:
        LEASES_REAPED.inc(reaped)


def jobs_vacuumed(result: str) -> None:
    """Count one vacuum of ``jobs`` by the worker (``vpay.vacuum``):
    ``done``, ``skipped`` or ``error``."""
    JOBS_VACUUMS.labels(result).inc()


def webhook_attempt(result: str) -> None:
    """Count one delivery attempt; ``result`` is the schedule's decision
    (``vpay.webhooks.schedule.Decision.action``)."""
    WEBHOOK_ATTEMPTS.labels(result).inc()


def api_request(method: str, route: str, status: int, seconds: float) -> None:
    """Count one API request by its route *template* (bounded cardinality)."""
    API_REQUESTS.labels(method, route, str(status)).inc()
    API_SECONDS.labels(method, route).observe(max(0.0, seconds))


# --- rail adapters ------------------------------------------------------------

rail_log = logging.getLogger("vpay.rails")


CALL_IDS = ("charge_id", "refund_id", "rail_reference", "charge_rail_reference")
"""Identifiers of a rail call's request copied onto its ``rail call`` line."""


def rail_call(operation: str) -> Callable:
    """Decorate a ``Rail`` port method (``request_to_pay``, ``status``,
    ``refund``, ``refund_status``): count it in ``vpay_rail_requests_total``
    with the port's answer (``accepted``, ``rejected``, ``pending``,
    ``succeeded``, ``failed``, ``not_found``, ``no_answer``; ``error`` when
    the method raised), time it in ``vpay_rail_request_seconds``, and log one
    structured line: ``rail``, ``operation``, ``http_status``, ``answer``,
    ``reason``, ``seconds``, ``sent``. The job's fields (``job_id``,
    ``charge_id``, ...) come from the log context (``vpay.logs``).

    An answer made without a request (``http_status`` None and not
    ``no_answer``: an unsupported currency, Orange's refusal to refund) is
    logged with ``sent`` false and not counted as a request; so is a call
    refused by a paused rail (``RailPaused``: answer ``paused``). From the
    call's argument (a ``ChargeRequest`` / ``RefundRequest``) only its
    identifiers are logged (``CALL_IDS``: ``charge_id`` / ``refund_id``,
    ``rail_reference``, a refund's ``charge_rail_reference``), so no credential or token can be; this line is the
    adapters' one record of a call's answer (they log only what it lacks:
    a no-answer's detail, a token refused, a retry, a configuration refusal)."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            started = time.monotonic()
            result, answer = None, "error"
            try:
                result = fn(self, *args, **kwargs)
                answer = getattr(getattr(result, "kind", None), "value", "error")
                return result
            except RailPaused:
                # The rail asked for less traffic (vpay.rail_gate): logged and
                # counted by the gate, not as a request of this call.
                answer = "paused"
                raise
            finally:
                seconds = time.monotonic() - started
                http_status = getattr(result, "http_status", None)
                sent = http_status is not None or answer in ("no_answer", "error")
                if sent:
                    RAIL_REQUESTS.labels(self.code, operation, answer).inc()
                    RAIL_SECONDS.labels(self.code, operation).observe(seconds)
                rail_log.log(logging.WARNING if answer in ("no_answer", "error") else logging.INFO,
                             "rail call", extra={
                                 "rail": self.code, "operation": operation, "answer": answer,
                                 "http_status": http_status, "reason": getattr(result, "reason", None),
                                 "seconds": round(seconds, 3), "sent": sent,
                                 **_call_ids(args)})
        return call
    return wrap


def _call_ids(args: tuple) -> dict[str, str]:
    """``CALL_IDS`` of a rail method's request (its first argument), those it has."""
    request = args[0] if args else None
    return {k: v for k in CALL_IDS if isinstance(v := getattr(request, k, None), str)}


# --- read from the database at scrape -----------------------------------------

CACHE_SECONDS = 5.0
"""How long one snapshot of the database gauges is reused (seconds)."""
STATEMENT_TIMEOUT_MS = 2000
"""The snapshot query's bound; past it the scrape reports vpay_database_up 0."""

KNOWN_STATES = ("due", "leased", "dead")
CHARGE_STATUSES = ("pending", "succeeded", "failed", "unresolved")
# ALERT_KINDS (vpay/alert_kinds.py) are reported as 0 when absent, so an alert
# on ``> 0`` resolves instead of its series vanishing.


class DatabaseCollector:
    """The gauges read from the database at scrape: ``vpay_queue_jobs{lane,
    state}``, ``vpay_alerts_open{kind}``, ``vpay_charges{status}``,
    ``vpay_webhook_endpoints_disabled`` and ``vpay_database_up`` (1 when the
    snapshot query answered within its bound, else 0 and the other families
    are empty: a number from an unanswered query would be a lie).

    ``pool`` is a ``psycopg_pool.ConnectionPool`` (``None`` until attached:
    then every family is empty and ``vpay_database_up`` is 0). ``lanes``
    are reported as 0 when they hold no job."""

    def __init__(self, pool: Any = None, lanes: Iterable[str] = (), *,
                 clock: Callable[[], float] = time.monotonic):
        self.pool = pool
        self.lanes = tuple(lanes)
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, list[tuple] | None] | None = None

    def describe(self):
        return self._families(None)

    def collect(self):
        return self._families(self._snapshot())

    def _snapshot(self) -> list[tuple] | None:
        with self._lock:
            now = self._clock()
            if self._cached is not None and now - self._cached[0] < CACHE_SECONDS:
                return self._cached[1]
            rows = self._query()
            self._cached = (now, rows)
            return rows

    def _query(self) -> list[tuple] | None:
        if self.pool is None:
            return None
        from .queries import Q
        try:
            with self.pool.connection(timeout=2.0) as conn, conn.transaction():
                conn.execute(f"SET LOCAL statement_timeout = {int(STATEMENT_TIMEOUT_MS)}")
                return conn.execute(Q["metrics_snapshot"]).fetchall()
        except Exception as exc:  # noqa: BLE001 - a scrape must answer whatever the database does
            log.warning("metrics: database snapshot failed", extra={"error": f"{type(exc).__name__}: {exc}"[:300]})
            return None

    def _families(self, rows: list[tuple] | None):
        queue = GaugeMetricFamily("vpay_queue_jobs", "Jobs by lane and state: due (run_at passed, "
                                  "unleased), leased, dead (dead-lettered).", labels=["lane", "state"])
        alerts = GaugeMetricFamily("vpay_alerts_open", "Alerts not yet acknowledged, by kind.",
                                   labels=["kind"])
        charges = GaugeMetricFamily("vpay_charges", "Charges by status.", labels=["status"])
        disabled = GaugeMetricFamily("vpay_webhook_endpoints_disabled",
                                     "Webhook endpoints that are disabled (410 Gone, or by an operator).")
        up = GaugeMetricFamily("vpay_database_up", "1 when the scrape's database snapshot answered "
                               f"within {STATEMENT_TIMEOUT_MS} ms, else 0.")
        if rows is not None:
            values: dict[tuple, float] = {}
            for lane in self.lanes:
                for state in KNOWN_STATES:
                    values[("queue_jobs", lane, state)] = 0
            for kind in ALERT_KINDS:
                values[("alerts_open", kind, None)] = 0
            for status in CHARGE_STATUSES:
                values[("charges", status, None)] = 0
            values[("webhook_endpoints_disabled", None, None)] = 0
            for family, a, b, n in rows:
                values[(family, a, b)] = n
            for (family, a, b), n in sorted(values.items(), key=lambda kv: tuple(map(str, kv[0]))):
                if family == "queue_jobs":
                    queue.add_metric([a, b], n)
                elif family == "alerts_open":
                    alerts.add_metric([a], n)
                elif family == "charges":
                    charges.add_metric([a], n)
                elif family == "webhook_endpoints_disabled":
                    disabled.add_metric([], n)
        up.add_metric([], 0 if rows is None else 1)
        return [queue, alerts, charges, disabled, up]


# --- the worker's HTTP server -------------------------------------------------


def serve(port: int, bind: str = "127.0.0.1", collector: DatabaseCollector | None = None):
    """Serve ``REGISTRY`` (plus ``collector``, and the process's own
    ``process_*`` metrics) on ``http://bind:port/metrics`` from a daemon
    thread. Answers ``(server, thread)``; raises ``OSError`` when the address
    cannot be bound (in use, not local)."""
    from prometheus_client import ProcessCollector, start_http_server
    answer = start_http_server(port, addr=bind, registry=REGISTRY)  # OSError before registering
    if collector is not None:
        REGISTRY.register(collector)
    ProcessCollector(registry=REGISTRY)
    return answer
