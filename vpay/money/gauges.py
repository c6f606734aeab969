"""The gauges read from the database at scrape (docs/observability.md):
queue depth by lane and state, open alerts by kind, charges by status,
disabled webhook endpoints, rails paused fleet-wide, live workers, whether
commits are synchronous (``vpay.base.replication``). One bounded query (``metrics_snapshot`` in
``sql/queries/metrics.sql``), its answer reused for ``CACHE_SECONDS``. Only
the worker registers it (``vpay.base.metrics.serve``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable

from prometheus_client.core import GaugeMetricFamily

from vpay.base import metrics
from vpay.base import replication
from vpay.money.alert_kinds import ALERT_KINDS
from vpay.rails.port import KNOWN_RAILS

log = logging.getLogger("vpay.metrics")

CACHE_SECONDS = 5.0
"""How long one snapshot of the database gauges is reused (seconds)."""
STATEMENT_TIMEOUT_MS = 2000
"""The snapshot query's bound; past it the scrape reports vpay_database_up 0."""

KNOWN_STATES = ("due", "leased", "dead")
CHARGE_STATUSES = ("pending", "succeeded", "failed", "unresolved")
# ALERT_KINDS (vpay/money/alert_kinds.py) are reported as 0 when absent, so an alert
# on ``> 0`` resolves instead of its series vanishing.


class DatabaseCollector:
    """The gauges read from the database at scrape: ``vpay_queue_jobs{lane,
    state}``, ``vpay_alerts_open{kind}``, ``vpay_charges{status}``,
    ``vpay_webhook_endpoints_disabled``, ``vpay_rail_paused_seconds{rail}``
    (seconds left of the rail's fleet-wide pause, table ``rail_pauses``; 0
    when none), ``vpay_workers_live``, ``vpay_database_synchronous_commit``
    (1 when commits wait for a synchronous standby: ``vpay.base.replication``;
    read at every snapshot, so it follows a failover) and
    ``vpay_database_up`` (1 when the snapshot query answered within its
    bound and no statement of this worker failed in the last
    ``metrics.DATABASE_ERROR_WINDOW_SECONDS``, else 0).
    When the snapshot did not answer, the other families are empty: a
    number from an unanswered query would be a lie; when it answered but
    the worker's own statements fail (a database that answers one query
    and breaks the next: a transaction-pooling bouncer with prepared
    statements, issue 25), its numbers are reported and ``up`` is still 0.

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
        from vpay.base.queries import Q
        try:
            with self.pool.connection(timeout=2.0) as conn, conn.transaction():
                conn.execute(f"SET LOCAL statement_timeout = {int(STATEMENT_TIMEOUT_MS)}")
                rows = conn.execute(Q["metrics_snapshot"]).fetchall()
                mode = replication.read(conn)
                return rows + [("synchronous_commit", None, None, 1 if mode.synchronous else 0)]
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
        paused = GaugeMetricFamily("vpay_rail_paused_seconds", "Seconds left of the rail's pause "
                                   "asked by its 429/503 Retry-After, honoured by every process "
                                   "(rail_pauses); 0 when not paused.", labels=["rail"])
        live = GaugeMetricFamily("vpay_workers_live", "Workers whose heartbeat is within their "
                                 "VPAY_WORKER_DEAD_AFTER_SECONDS (the workers table).")
        up = GaugeMetricFamily("vpay_database_up", "1 when the scrape's database snapshot answered "
                               f"within {STATEMENT_TIMEOUT_MS} ms and no statement of this worker failed "
                               f"in the last {metrics.DATABASE_ERROR_WINDOW_SECONDS:g} s "
                               "(vpay_database_errors), else 0.")
        synchronous = GaugeMetricFamily(
            "vpay_database_synchronous_commit", "1 when the database's commits wait for a synchronous "
            "standby (synchronous_standby_names set, synchronous_commit on, remote_write or "
            "remote_apply), else 0: a failover can then lose committed payments.")
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
            for rail in KNOWN_RAILS:
                values[("rail_paused_seconds", rail, None)] = 0
            values[("workers_live", None, None)] = 0
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
                elif family == "rail_paused_seconds":
                    paused.add_metric([a], n)
                elif family == "workers_live":
                    live.add_metric([], n)
                elif family == "synchronous_commit":
                    synchronous.add_metric([], n)
        up.add_metric([], 0 if rows is None or metrics.database_failed_recently() else 1)
        return [queue, alerts, charges, disabled, paused, live, up, synchronous]


