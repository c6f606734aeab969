"""Prometheus metrics: every metric vpay exports, defined here and nowhere else.

Names and labels are the contract's ("Metrics", prefix ``vpay_``); meanings,
types and the alerts built on them are in ``docs/observability.md``. The
exposition is ``prometheus_client``'s (no hand-written text format).

Two kinds of metric live here:

* **Counted in process** (``Counter``, ``Histogram``): jobs handled, job
  seconds, poll lateness, rail requests, leases lost and reaped, webhook
  attempts, API requests. Code records them through the small functions
  below (``job_claimed``, ``job_finished``, ``rail_call``, ...), one line
  per call site (rail calls: ``vpay.rails.calls.rail_call``).
* **Read from the database at scrape** (``vpay.money.gauges.DatabaseCollector``): queue depth
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

import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics


log = logging.getLogger("vpay.metrics")

# ``_created`` samples double every counter's series for no operator value.
disable_created_metrics()

REGISTRY = CollectorRegistry(auto_describe=True)
"""vpay's own registry (not the library's global one): exactly the metrics
below, plus the database gauges (``vpay.money.gauges``) in the worker."""

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
    "vpay_leases_reaped", "Leases this process reaped: expired, or their holder gone (dead by "
    "its heartbeat, stopped, restarted).", registry=REGISTRY)
OUTCOME_HANDBACKS = Counter(
    "vpay_outcome_handbacks", "Outcomes whose write met a database outage past the retries "
    "(vpay/worker/handback.py), by result: kept, written (once the database answered), lost "
    "(the lease was gone by then), released (given up, lease handed back), abandoned (given up, "
    "the database still away: left to the reaper).", ["result"], registry=REGISTRY)
WEBHOOK_ATTEMPTS = Counter(
    "vpay_webhook_attempts", "Webhook delivery attempts, by result (delivered, retry, gone, "
    "give_up; held: the URL policy refused the endpoint's URL).", ["result"], registry=REGISTRY)
JOBS_VACUUMS = Counter(
    "vpay_jobs_vacuums", "Vacuums of the jobs table this worker ran (vpay/engine/vacuum.py), by result: "
    "done, skipped (jobs was being vacuumed by someone else), error (the timeout, a database "
    "error, a role that may not vacuum jobs).", ["result"], registry=REGISTRY)
API_REQUESTS = Counter(
    "vpay_api_requests", "HTTP requests the API answered, by method, route template and "
    "status code, each from a fixed set (other for the rest: api_labels).",
    ["method", "route", "status"], registry=REGISTRY)
API_SECONDS = Histogram(
    "vpay_api_request_seconds", "Seconds the API took to answer a request.",
    ["method", "route"], buckets=_CALL_BUCKETS, registry=REGISTRY)

HTTP_CLOSED = Counter(
    "vpay_http_connections_closed", "Connections an HTTP server of vpay closed before a whole "
    "request arrived, by reason: header_timeout, body_timeout (a deadline of "
    "vpay.api.server.HttpLimits passed), address_limit (refused on accept: the client address "
    "held its share).", ["reason"], registry=REGISTRY)

OVER_SHARE = Counter(
    "vpay_jobs_over_share", "Due jobs a lane rebalance placed in a round behind every "
    "merchant's share (vpay.engine.fairness): a merchant's backlog in a lane that fell behind.", ["lane"],
    registry=REGISTRY)

JOBS_BORROWED = Counter(
    "vpay_jobs_borrowed", "Jobs of a lane run by a claim loop of another lane whose own lanes had "
    "nothing due (lending idle loops; vpay/engine/timeshare.py), by the job's lane.", ["lane"],
    registry=REGISTRY)

CLAIMS_HANDED_BACK = Counter(
    "vpay_claims_handed_back", "Claims handed back unrun because the job's party (merchant) already "
    "held its share of the lane's loops in this worker (two loops claimed for it at once; "
    "vpay/engine/timeshare.py), by lane.", ["lane"], registry=REGISTRY)

LISTENER_RECONNECTS = Counter(
    "vpay_listener_reconnects", "Times the worker's wake-up listener connected again, by cause: "
    "unresponsive (its connection did not answer a ping within the bound, "
    "VPAY_LISTENER_DEAD_AFTER_SECONDS; vpay/engine/liveness.py) or lost (the connection failed).",
    ["cause"], registry=REGISTRY)
DATABASE_PARTS = frozenset({"claim", "handler", "outcome", "listener", "leases", "reaper", "gauge",
                            "rebalance"})
"""The ``part`` labels of ``vpay_database_errors``: where in the worker a
database statement failed."""

DATABASE_ERRORS = Counter(
    "vpay_database_errors", "Database statements of this worker that failed (a dropped connection, "
    "a refused or broken query: any psycopg error), by part of the worker: claim, handler, outcome, "
    "listener, leases, reaper, gauge, rebalance.", ["part"], registry=REGISTRY)

DATABASE_ERROR_WINDOW_SECONDS = 60.0
"""``vpay_database_up`` is 0 for this long after any statement of the worker
failed (``database_error``), even when the scrape's own snapshot answers: a
database that answers one query and fails the next (a transaction-pooling
bouncer mixing up prepared statements, issue 25) is not up. A minute is one
scrape at the slowest usual interval."""

_last_database_error: float | None = None  # time.monotonic() of the latest database_error()

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


def job_borrowed(lane: str) -> None:
    """A loop of another lane took a job of ``lane`` (lending)."""
    JOBS_BORROWED.labels(lane).inc()


def claim_handed_back(lane: str) -> None:
    """A claim of ``lane`` was handed back unrun: its party was at its share."""
    CLAIMS_HANDED_BACK.labels(lane).inc()


def outcome_label(outcome: Any, kept: bool | None) -> str:
    """The ``outcome`` label of ``vpay_jobs_total``: ``lost`` when the fenced
    write matched nothing (``kept`` False), ``unrecorded`` when it could not
    be made yet (``kept`` None: the database stayed away past the retries;
    the outcome is kept and written when it answers, ``outcome_handback``), else what the
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
    (the job kinds × the lanes × six outcomes), and ``labels()`` on every job
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


OUTCOME_HANDBACK_RESULTS = frozenset({"kept", "written", "lost", "released", "abandoned"})


def outcome_handback(result: str) -> None:
    """Count one step of an outcome kept through a database outage
    (``OUTCOME_HANDBACK_RESULTS``; vpay/worker/handback.py)."""
    OUTCOME_HANDBACKS.labels(result if result in OUTCOME_HANDBACK_RESULTS else OTHER).inc()


def jobs_vacuumed(result: str) -> None:
    """Count one vacuum of ``jobs`` by the worker (``vpay.engine.vacuum``):
    ``done``, ``skipped`` or ``error``."""
    JOBS_VACUUMS.labels(result).inc()


def listener_reconnected(cause: str) -> None:
    """Count one reconnection of the wake-up listener (``vpay.engine.wake``):
    ``unresponsive`` or ``lost``."""
    LISTENER_RECONNECTS.labels(cause).inc()
def database_error(part: str) -> None:
    """A database statement of the worker failed in ``part`` (one of
    ``DATABASE_PARTS``, else ``other``): counted, and ``vpay_database_up``
    reads 0 for ``DATABASE_ERROR_WINDOW_SECONDS`` from now."""
    global _last_database_error
    _last_database_error = time.monotonic()
    DATABASE_ERRORS.labels(part if part in DATABASE_PARTS else OTHER).inc()


def database_failed_recently(now: float | None = None) -> bool:
    """Whether ``database_error`` was called in the last
    ``DATABASE_ERROR_WINDOW_SECONDS`` before ``now`` (``time.monotonic()``)."""
    last = _last_database_error
    if last is None:
        return False
    return (time.monotonic() if now is None else now) - last < DATABASE_ERROR_WINDOW_SECONDS


def webhook_attempt(result: str) -> None:
    """Count one delivery attempt; ``result`` is the schedule's decision
    (``vpay.webhooks.schedule.Decision.action``)."""
    WEBHOOK_ATTEMPTS.labels(result).inc()


OTHER = "other"
"""The label value of everything outside a label's fixed set."""

HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""The ``method`` labels; any other method a client makes up is ``other``."""

HTTP_STATUSES = frozenset({200, 201, 202, 204, 301, 302, 304, 400, 401, 403, 404, 405, 406, 409,
                           411, 413, 415, 422, 429, 500, 502, 503, 504})
"""The ``status`` labels; any other code is ``other``."""

_api_routes: frozenset[str] = frozenset()
CLOSE_REASONS = frozenset({"header_timeout", "body_timeout", "address_limit"})


def set_api_routes(templates: Any) -> None:
    """The route templates the API serves (``vpay.api.app.create_app`` tells):
    the ``route`` label is one of them, ``(no route)`` for a path no route
    matched, or ``other``."""
    global _api_routes
    _api_routes = frozenset(templates) | {"(no route)"}


def api_labels(method: str, route: str | None, status: int) -> tuple[str, str, str]:
    """``(method, route, status)`` mapped into their fixed sets, so nothing a
    client sends (a made-up method, a path, an id) can add a series (issue #27:
    1,000 made-up methods took a scrape from 111 to 17,128 series)."""
    route = route or "(no route)"
    return (method if method in HTTP_METHODS else OTHER,
            route if route in _api_routes else OTHER,
            str(status) if status in HTTP_STATUSES else OTHER)


def api_request(method: str, route: str | None, status: int, seconds: float) -> None:
    """Count one API request by its bounded labels (``api_labels``)."""
    method, route, code = api_labels(method, route, status)
    API_REQUESTS.labels(method, route, code).inc()
    API_SECONDS.labels(method, route).observe(max(0.0, seconds))


def http_connection_closed(reason: str) -> None:
    """Count one connection an HTTP server closed early (``CLOSE_REASONS``)."""
    HTTP_CLOSED.labels(reason if reason in CLOSE_REASONS else OTHER).inc()


# --- the worker's HTTP server -------------------------------------------------


def serve(port: int, bind: str = "127.0.0.1", collector: Any = None):
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
