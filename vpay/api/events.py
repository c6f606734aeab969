"""The merchant's events: ``GET /v1/events`` (a list page, newest first) and
``GET /v1/events/{id}``: how a merchant catches up on the webhooks it missed
(docs/api.md, "Recover missed events").

An event reads as its webhook's body (``vpay.webhooks.signing.payload``:
``id``, ``type``, ``created``, ``data``) plus ``object: "event"`` and its
``payment_intent``. Filters: ``type`` (one type, or a family such as
``refund.*``) and ``delivery_success`` (``false``: the events of which some
webhook delivery to one of the merchant's endpoints did not arrive, i.e.
is pending, retrying, skipped or given up; ``true``: every delivery arrived).

Retention: delivered events older than ``VPAY_RETENTION_DAYS`` (default 90)
are deleted by the hourly sweep. Every list answer says it
(``retention_days``), and a cursor that names no event (it may have aged
out) is 404 with a message that says so.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import falcon
from psycopg.rows import dict_row

from vpay.api.errors import invalid, not_found
from vpay.api.lists import Listing, parse_page, run_page
from vpay.api.wire import answer
from vpay.base.queries import Q

EVENT_TYPES = ("payment_intent.processing", "payment_intent.succeeded", "payment_intent.payment_failed",
               "refund.succeeded", "refund.failed")
"""Every event type (contract: "Tables", ``events.type``)."""
EVENT_FAMILIES = ("payment_intent.*", "refund.*")
EVENT_ID = re.compile(r"^evt_[A-Za-z0-9]{1,64}$")


def event_body(row: dict[str, Any]) -> dict[str, Any]:
    """An ``events`` row as the merchant reads it: the webhook body's fields
    (``created`` in UTC with ``Z``), ``object`` and ``payment_intent``."""
    created = row["created_at"]
    if isinstance(created, datetime):
        created = created.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return {"id": row["id"], "object": "event", "type": row["type"], "created": created,
            "payment_intent": row["payment_intent_id"], "data": row["data"]}


def _type_like(value: str) -> str:
    if value in EVENT_TYPES:
        return value
    if value in EVENT_FAMILIES:
        return value[:-1] + "%"
    raise invalid("parameter_invalid", "type must be one of: " + ", ".join(EVENT_TYPES + EVENT_FAMILIES),
                  "type")


def _boolean(value: str) -> bool:
    if value not in ("true", "false"):
        raise invalid("parameter_invalid", "delivery_success must be true or false.", "delivery_success")
    return value == "true"


class EventsResource:
    """``GET /v1/events``."""

    merchant_api = True

    def __init__(self, db, retention_days: int):
        self.db = db
        self.retention_days = retention_days
        hint = (f" Delivered events are kept {retention_days} days (VPAY_RETENTION_DAYS); an older "
                "cursor may have been deleted: list with created[gte] instead."
                if retention_days else "")
        self.listing = Listing(noun="event", cursor="api_event_cursor", older="api_list_events_older",
                               newer="api_list_events_newer", view=event_body, missing_hint=hint)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        page = parse_page(req, "evt", {"type": _type_like, "delivery_success": _boolean})
        with self.db.connection() as conn:
            body = run_page(conn, self.listing, page, {
                "merchant_id": req.context.merchant_id,
                "type_like": page.filters["type"] or "%",
                "delivered": page.filters["delivery_success"]}, "/v1/events")
        answer(resp, 200, body | {"retention_days": self.retention_days})


class EventResource:
    """``GET /v1/events/{id}``: the merchant's own events only."""

    merchant_api = True

    def __init__(self, db):
        self.db = db

    def on_get(self, req: falcon.Request, resp: falcon.Response, event_id: str) -> None:
        row = None
        if EVENT_ID.match(event_id):
            with self.db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                row = cur.execute(Q["api_load_event"], {"id": event_id,
                                                        "merchant_id": req.context.merchant_id}).fetchone()
        if row is None:
            raise not_found("No such event.", "id")
        answer(resp, 200, event_body(row))
