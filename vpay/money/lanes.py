"""The money domain's lanes and which of its job kinds go where (contract:
"Lanes"; docs/flows/reconciler.md, "Lanes").

The job engine knows only ``housekeeping`` (``vpay.engine.lanes``); this
module registers the rest when the money layer is imported:

=============  ==================================================================
lane           kinds
=============  ==================================================================
``mtn``        ``poll``, ``resubmit``, ``refund_poll`` of charges/refunds on MTN
``orange``     the same on Orange Money (one lane per ``KNOWN_RAILS``)
``webhooks``   ``fanout``, ``deliver``
``housekeeping`` ``scan``, ``sweep`` (the engine's default lane)
=============  ==================================================================

The two SQL statements that insert jobs without Python (``scan_live`` in
sql/queries/money.sql: a poll's lane is its charge's rail;
``fanout_deliveries`` in sql/queries/webhooks.sql: ``webhooks``) follow the
same rule; tests check they agree. A new lane also needs the ``jobs.lane``
CHECK widened by a migration.
"""

from __future__ import annotations

from typing import Any

from vpay.base.queries import Q
from vpay.engine import lanes
from vpay.rails.port import KNOWN_RAILS

RAIL_PRIORITY = 100
"""Rail lanes are dealt spare loops first, in ``KNOWN_RAILS`` order."""
WEBHOOKS_PRIORITY = 500
"""Then ``webhooks``; ``housekeeping`` (the engine's) last."""

ROUTED_KINDS = ("poll", "resubmit", "refund_poll")
"""Kinds that call a rail for one charge or refund: their lane is its rail."""
WEBHOOK_KINDS = ("fanout", "deliver")


def job_rail(conn: Any, payload: dict) -> str | None:
    """The rail of the charge (``payload["charge_id"]``) or refund
    (``payload["refund_id"]``) a routed job works on, read on ``conn`` (so a
    row created in the caller's transaction is seen); ``None`` when neither
    exists."""
    return conn.execute(Q["job_rail"], {"charge_id": payload.get("charge_id"),
                                        "refund_id": payload.get("refund_id")}).fetchone()[0]


def register() -> None:
    """Register the rail lanes, ``webhooks`` and the domain's kinds with the
    engine (idempotent). Called when ``vpay.money`` is imported."""
    for i, rail in enumerate(KNOWN_RAILS):
        lanes.register_lane(rail, RAIL_PRIORITY + i, routed=True, fair=True)
    lanes.register_lane("webhooks", WEBHOOKS_PRIORITY, fair=True)
    for kind in ROUTED_KINDS:
        lanes.register_kind(kind, resolve=job_rail)
    for kind in WEBHOOK_KINDS:
        lanes.register_kind(kind, "webhooks")


register()
