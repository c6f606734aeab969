"""What the console's overview shows, read in a few bounded queries: the
queue per lane (due, leased, dead, the oldest due job's age), payments by
status, open alerts by kind, disabled webhook endpoints, rails paused and
why (the pauses every process honours, ``rail_pauses``, with the 429/503
answers in ``rail_calls`` that asked for them, the last 15 minutes'
throttling and errors, open ``rail_misconfigured`` alerts),
workers (``console_workers``: the ``workers`` table), and the last 24 hours of samples
(``console_samples`` per lane and ``console_figures``: poll lateness, settle
time, workers; written once a minute by the worker's ``sample:overview``
job). Also the retention of the console's own tables."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from vpay.base.metrics import POLL_KINDS
from vpay.base.queries import Q
from vpay.engine import lanes


def lane_depth(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """``[{lane, due, leased, dead, oldest_due_seconds}]`` for every lane."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["console_lane_depth"], {"lanes": list(lanes.LANES)}).fetchall()


def workers(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The workers table (``vpay.engine.workers``): ``[{worker_id, host, pid,
    lanes, version, started_at, heartbeat_age, state, leases,
    lease_until}]``, live first (at most 100): live workers, dead ones heard
    from in the last 24 hours, and those stopped in the last hour. ``state`` is ``live``, ``dead`` (its
    heartbeat older than its bound: its leases are reaped) or ``stopped``."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["console_workers"]).fetchall()


def sample(conn: psycopg.Connection) -> int:
    """Write one sample per lane and the minute's figures (now); delete
    samples past two days. Answers the number of lanes sampled."""
    rows = lane_depth(conn)
    alive = sum(1 for w in workers(conn) if w["state"] == "live")
    with conn.transaction():
        conn.execute(Q["console_sample_insert"], {"rows": Jsonb(rows)})
        conn.execute(Q["console_figures_insert"], {"poll_kinds": sorted(POLL_KINDS), "workers": alive})
        conn.execute(Q["console_samples_prune"])
    return len(rows)


def snapshot(conn: psycopg.Connection) -> dict[str, Any]:
    """The overview: ``{lanes, charges_by_status, alerts_by_kind,
    disabled_endpoints, samples, figures, workers, rails_paused,
    rail_health, rails_misconfigured}``. ``charges_by_status``: ``pending``
    and ``unresolved`` now, ``succeeded`` and ``failed`` settled in the last
    24 hours (``console_charges_by_status``: a count of every terminal
    charge would read the table whole)."""
    with conn.cursor(row_factory=dict_row) as cur:
        by_status = cur.execute(Q["console_charges_by_status"]).fetchone()
        return {
            "lanes": lane_depth(conn),
            "charges_by_status": by_status,
            "alerts_by_kind": cur.execute(Q["console_open_alerts_by_kind"]).fetchall(),
            "disabled_endpoints": cur.execute(Q["console_disabled_endpoints"]).fetchall(),
            "samples": cur.execute(Q["console_samples_recent"]).fetchall(),
            "figures": cur.execute(Q["console_figures_recent"]).fetchall(),
            "workers": workers(conn),
            "rails_paused": cur.execute(Q["console_rails_paused"]).fetchall(),
            "rail_health": cur.execute(Q["console_rail_health"]).fetchall(),
            "rails_misconfigured": cur.execute(Q["console_rails_misconfigured"]).fetchall(),
        }


def prune(conn: psycopg.Connection, days: float) -> dict[str, int]:
    """Retention of ``rail_calls`` and ``login_failures`` (older than
    ``days``) and of ``console_samples`` (two days). Answers the counts."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        return dict(cur.execute(Q["console_prune"], {"days": float(days)}).fetchone())
