"""What the console's overview shows, read in a few bounded queries: the
queue per lane (due, leased, dead, the oldest due job's age), payments by
status, open alerts by kind, disabled webhook endpoints, and the last 24
hours of samples (``console_samples``, written once a minute by the worker's
``sample:overview`` job). Also the retention of the console's own tables."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from vpay.base.queries import Q
from vpay.engine import lanes


def lane_depth(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """``[{lane, due, leased, dead, oldest_due_seconds}]`` for every lane."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["console_lane_depth"], {"lanes": list(lanes.LANES)}).fetchall()


def sample(conn: psycopg.Connection) -> int:
    """Write one sample per lane (now); delete samples past two days.
    Answers the number of lanes sampled."""
    rows = lane_depth(conn)
    with conn.transaction():
        conn.execute(Q["console_sample_insert"], {"rows": Jsonb(rows)})
        conn.execute("DELETE FROM console_samples WHERE sampled_at < now() - interval '2 days'")
    return len(rows)


def snapshot(conn: psycopg.Connection) -> dict[str, Any]:
    """The overview: ``{lanes, charges_by_status, alerts_by_kind,
    disabled_endpoints, samples}``."""
    with conn.cursor(row_factory=dict_row) as cur:
        by_status = {s: cur.execute("SELECT count(*) AS n FROM charges WHERE status = %s", (s,)).fetchone()["n"]
                     for s in ("pending", "unresolved", "succeeded", "failed")}
        return {
            "lanes": lane_depth(conn),
            "charges_by_status": by_status,
            "alerts_by_kind": cur.execute(Q["console_open_alerts_by_kind"]).fetchall(),
            "disabled_endpoints": cur.execute(Q["console_disabled_endpoints"]).fetchall(),
            "samples": cur.execute(Q["console_samples_recent"]).fetchall(),
        }


def prune(conn: psycopg.Connection, days: float) -> dict[str, int]:
    """Retention of ``rail_calls`` and ``login_failures`` (older than
    ``days``) and of ``console_samples`` (two days). Answers the counts."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        return dict(cur.execute(Q["console_prune"], {"days": float(days)}).fetchone())
