"""The merchant's webhook endpoints: ``POST /v1/webhook_endpoints``,
``GET /v1/webhook_endpoints``, ``GET|DELETE /v1/webhook_endpoints/{id}``,
``POST /v1/webhook_endpoints/{id}/rotate_secret``.

Everything goes through ``vpay.webhooks.endpoints`` (the one module that
reads and writes secrets). Create: ``{url, enabled_events?, description?}``;
the URL policy (SSRF) is applied now and again at every delivery; a merchant
has at most ``MAX_ENDPOINTS_PER_MERCHANT`` endpoints (422
``webhook_endpoint_limit``). The secret is in the create's and the
rotation's answer only. Rotation keeps the old secret signing beside the new
one for ``overlap_seconds`` (default 24 h, as ``vpay-server webhooks
rotate-secret``), so a receiver switches without failing a delivery.
``enabled_events`` (default ``["*"]``): the fan-out creates deliveries only
for those types. Another merchant's endpoint reads exactly like a missing one.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

import logging

import falcon

from vpay.api.errors import API_ERROR, ApiError, invalid, not_found
from vpay.base.db import ConfigError
from vpay.api.events import EVENT_TYPES
from vpay.api.wire import MAX_BODY_BYTES, answer, read_body
from vpay.webhooks import endpoints
from vpay.webhooks.policy import MAX_URL_LENGTH, UrlRefused

log = logging.getLogger("vpay.api")


def _cannot_seal(exc: ConfigError) -> ApiError:
    """503: this process cannot seal a webhook secret the workers could open
    (no ``VPAY_SECRET_KEYS``, or keys that open none of the stored secrets).
    Logged at error for the operator; the merchant's request wrote nothing."""
    log.error("webhook secret not stored: this API's keys are wrong", extra={"error": str(exc)[:300]})
    return ApiError(503, API_ERROR, "service_misconfigured",
                    "Webhook endpoints cannot be changed right now; nothing was changed. Retry later.")

ENDPOINT_ID = re.compile(r"^we_[A-Za-z0-9]{1,64}$")
FIELDS = ("url", "enabled_events", "description")
MAX_OVERLAP_SECONDS = 7 * 24 * 3600
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _iso(value) -> str | None:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return value


def endpoint_body(row: dict[str, Any]) -> dict[str, Any]:
    """An endpoint as the merchant reads it (the secret only when ``row`` has
    one: the create's and the rotation's answers)."""
    body = {"id": row["id"], "object": "webhook_endpoint", "url": row["url"],
            "enabled_events": list(row.get("enabled_events") or ["*"]),
            "description": row.get("description"),
            "status": "enabled" if row["enabled"] else "disabled",
            "disabled_reason": row.get("disabled_reason"),
            "previous_secret_expires_at": _iso(row.get("previous_secret_expires_at")),
            "created": _iso(row["created_at"])}
    if "secret" in row:
        body["secret"] = row["secret"]
    return body


def _body(req: falcon.Request, required: bool) -> dict[str, Any]:
    raw = read_body(req, MAX_BODY_BYTES)
    if not raw.strip():
        if required:
            raise invalid("parameter_missing", "A JSON object body is required.")
        return {}
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise invalid("invalid_json", "The request body is not valid JSON.") from None
    if not isinstance(doc, dict):
        raise invalid("invalid_json", "The request body must be a JSON object.")
    return doc


def parse_create(doc: dict[str, Any]) -> dict[str, Any]:
    """A create request checked: 400 for an unknown or missing parameter,
    422 for a value (``param`` names it)."""
    for name in doc:
        if name not in FIELDS:
            raise invalid("parameter_unknown", f"Received unknown parameter: {str(name)[:64]}",
                          str(name)[:64])
    if "url" not in doc:
        raise invalid("parameter_missing", "Missing required parameter: url", "url")
    url = doc["url"]
    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH or _CONTROL.search(url):
        raise invalid("parameter_invalid", f"url must be an http(s) URL of at most {MAX_URL_LENGTH} "
                      "characters.", "url", status=422)
    events = doc.get("enabled_events", ["*"])
    if (not isinstance(events, list) or not 1 <= len(events) <= 16
            or any(e not in EVENT_TYPES + ("*",) for e in events) or len(set(events)) != len(events)):
        raise invalid("parameter_invalid", "enabled_events must be a list of distinct event types ("
                      + ", ".join(EVENT_TYPES) + ") or [\"*\"] for all.", "enabled_events", status=422)
    if "*" in events:
        events = ["*"]
    description = doc.get("description")
    if description is not None and (not isinstance(description, str) or len(description) > 160
                                    or _CONTROL.search(description)):
        raise invalid("parameter_invalid", "description must be text of at most 160 characters.",
                      "description", status=422)
    return {"url": url, "enabled_events": events, "description": description}


class EndpointsResource:
    """``POST`` and ``GET /v1/webhook_endpoints``."""

    merchant_api = True

    def __init__(self, db):
        self.db = db

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        fields = parse_create(_body(req, required=True))
        try:
            with self.db.connection() as conn:
                row = endpoints.add_endpoint(conn, req.context.merchant_id, fields["url"],
                                             enabled_events=fields["enabled_events"],
                                             description=fields["description"])
        except UrlRefused as exc:
            raise invalid("url_refused", f"This URL may not receive webhooks: {exc}", "url",
                          status=422) from None
        except ConfigError as exc:
            raise _cannot_seal(exc) from None
        except endpoints.EndpointLimitReached:
            raise invalid("webhook_endpoint_limit", "You have the most webhook endpoints allowed "
                          f"({endpoints.MAX_ENDPOINTS_PER_MERCHANT}); delete one first.",
                          "url", status=422) from None
        answer(resp, 201, endpoint_body(row))

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.params:  # at most MAX_ENDPOINTS_PER_MERCHANT: one page, no cursors
            name = next(iter(req.params))[:64]
            raise invalid("parameter_unknown", f"Received unknown parameter: {name}", name)
        with self.db.connection() as conn:
            rows = endpoints.list_endpoints(conn, req.context.merchant_id)
        rows.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)
        answer(resp, 200, {"object": "list", "url": "/v1/webhook_endpoints", "has_more": False,
                           "data": [endpoint_body(r) for r in rows]})


class EndpointResource:
    """``GET`` and ``DELETE /v1/webhook_endpoints/{id}``."""

    merchant_api = True

    def __init__(self, db):
        self.db = db

    def on_get(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        row = None
        if ENDPOINT_ID.match(endpoint_id):
            with self.db.connection() as conn:
                row = endpoints.get_endpoint(conn, req.context.merchant_id, endpoint_id)
        if row is None:
            raise not_found("No such webhook_endpoint.", "id")
        answer(resp, 200, endpoint_body(row))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        gone = False
        if ENDPOINT_ID.match(endpoint_id):
            with self.db.connection() as conn:
                gone = endpoints.delete_endpoint(conn, req.context.merchant_id, endpoint_id)
        if not gone:
            raise not_found("No such webhook_endpoint.", "id")
        answer(resp, 200, {"id": endpoint_id, "object": "webhook_endpoint", "deleted": True})


class RotateSecretResource:
    """``POST /v1/webhook_endpoints/{id}/rotate_secret`` ``{overlap_seconds?}``:
    a new secret, shown once; the old one keeps signing for the overlap
    (default 24 h, at most 7 days, 0 revokes it at once)."""

    merchant_api = True

    def __init__(self, db):
        self.db = db

    def on_post(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        doc = _body(req, required=False)
        for name in doc:
            if name != "overlap_seconds":
                raise invalid("parameter_unknown", f"Received unknown parameter: {str(name)[:64]}",
                              str(name)[:64])
        overlap = doc.get("overlap_seconds", 24 * 3600)
        if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap <= MAX_OVERLAP_SECONDS:
            raise invalid("parameter_invalid", f"overlap_seconds must be a whole number from 0 to "
                          f"{MAX_OVERLAP_SECONDS}.", "overlap_seconds", status=422)
        row = None
        if ENDPOINT_ID.match(endpoint_id):
            try:
                with self.db.connection() as conn:
                    row = endpoints.rotate_secret(conn, endpoint_id, float(overlap),
                                                  merchant_id=req.context.merchant_id)
            except ConfigError as exc:
                raise _cannot_seal(exc) from None
        if row is None:
            raise not_found("No such webhook_endpoint.", "id")
        answer(resp, 200, endpoint_body(row))
