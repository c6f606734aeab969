"""The OpenAPI 3.1 document of every route, served at ``/openapi.json``.
tests/integration/test_api_fuzz.py keeps it true: the app's routes and methods equal the
document's, and every status a fuzzed request gets is documented for its
operation."""

from __future__ import annotations

from typing import Any

from vpay.api.events import EVENT_TYPES
from vpay.api.lists import DEFAULT_LIMIT, MAX_LIMIT
from vpay.api.wire import MAX_BODY_BYTES
from vpay.webhooks.endpoints import MAX_ENDPOINTS_PER_MERCHANT


def _json(schema_ref: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}}


def _error(description: str) -> dict[str, Any]:
    return _json("Error", description)


_CALLBACK = {
    "summary": "A rail's callback: a hint that a charge may have moved",
    "description": (
        "Identifiers only: the reference is the `ref` query parameter we appended to the "
        "callback URL given to the rail (MoMo's `X-Callback-Url`, Orange's `notif_url`); the "
        "body's status is never read. Orange: the body's `notif_token` must match the one "
        "Orange returned at init (only its SHA-256 is stored; compared in constant time); a "
        "missing or wrong token is answered and logged exactly like an unknown reference and "
        "writes nothing. It may pull the "
        "charge's status poll forward (only if parked more than 10 s out, unleased, not "
        "dead-lettered, and the charge was not read within 10 s) or enqueue one. Only the "
        "worker's authenticated status query moves money. The answer is the same 202 whether "
        "or not the reference names a charge."),
    "parameters": [
        {"name": "code", "in": "path", "required": True, "schema": {"type": "string", "enum": ["mtn", "orange", "mpesa", "pawapay"]},
         "description": "The rail's code."},
        {"name": "ref", "in": "query", "required": True, "schema": {"type": "string", "format": "uuid"},
         "description": "Our charge reference (rail_reference), as put in the callback URL."},
    ],
    "requestBody": {"required": False, "description": f"The rail's status body, at most {MAX_BODY_BYTES} bytes.",
                    "content": {"application/json": {"schema": {"type": "object"}}}},
    "responses": {
        "202": _json("CallbackReceived", "Received (whether or not the reference names a charge)."),
        "400": _error("The callback could not be read (no or bad `ref`, body not a JSON object)."),
        "404": _error("Unknown rail code, or a rail this deployment has not configured."),
        "413": _error(f"Body larger than {MAX_BODY_BYTES} bytes."),
        "503": _error("The database did not answer in time (whatever the reference)."),
    },
}

_AUTH_ERRORS = {"401": _error("Missing, malformed, unknown or revoked API key. Nothing was written.")}
_UNAVAILABLE = {"503": _error("The database did not answer in time; retry.")}

_LIST_PARAMETERS = [
    {"name": "limit", "in": "query", "required": False,
     "description": f"Objects per page, 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT}).",
     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
    {"name": "starting_after", "in": "query", "required": False,
     "description": "The next page: objects older than this id (the last `data` item's).",
     "schema": {"type": "string"}},
    {"name": "ending_before", "in": "query", "required": False,
     "description": "The previous page: objects newer than this id (the first `data` item's).",
     "schema": {"type": "string"}},
    {"name": "created[gte]", "in": "query", "required": False,
     "description": "Only objects created at or after: Unix seconds or ISO 8601 with an offset.",
     "schema": {"type": "string"}},
    {"name": "created[lte]", "in": "query", "required": False,
     "description": "Only objects created at or before: Unix seconds or ISO 8601 with an offset.",
     "schema": {"type": "string"}},
]
_ENDPOINT_ID = {"name": "endpoint_id", "in": "path", "required": True,
                "schema": {"type": "string", "pattern": "^we_[A-Za-z0-9]+$"}}


def _list_responses(schema: str) -> dict[str, Any]:
    return {
        "200": _json(schema, "A page, newest first; `has_more` tells whether another follows."),
        "400": _error("An unknown parameter, a bad value (`param` names it), or both cursors."),
        **_AUTH_ERRORS,
        "404": _error("The cursor names no object of yours."),
        **_UNAVAILABLE,
    }

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "vpay API",
        "version": "1",
        "description": ("Mobile-money payments: merchants create and read payment intents; rails "
                        "send callbacks, which are hints only. Amounts are integers in the "
                        "currency's minor unit. Errors are `{error: {type, code, message, param?}}`."),
    },
    "servers": [{"url": "http://127.0.0.1:8080"}],
    "paths": {
        "/provider/{code}/callback": {
            "post": {**_CALLBACK, "operationId": "providerCallbackPost", "security": []},
            "put": {**_CALLBACK, "operationId": "providerCallbackPut", "security": []},
        },
        "/v1/payment_intents": {
            "get": {
                "operationId": "listPaymentIntents",
                "summary": "List your payment intents, newest first",
                "parameters": [*_LIST_PARAMETERS,
                               {"name": "status", "in": "query", "required": False,
                                "description": "Only intents in this status.",
                                "schema": {"enum": ["requires_confirmation", "processing", "succeeded",
                                                    "requires_payment_method", "canceled"]}}],
                "responses": _list_responses("PaymentIntentList"),
            },
            "post": {
                "operationId": "createPaymentIntent",
                "summary": "Create and confirm a payment intent",
                "description": (
                    "Creates the intent (processing), its charge (pending) and sends the payer a "
                    "mobile-money prompt. With `Idempotency-Key`, the same key and body replay the "
                    "first answer (`Idempotent-Replayed: true`) for 24 h; another body is 409 "
                    "`idempotency_key_reused`; a concurrent request with the key is 409 "
                    "`idempotency_key_in_use` (retry after a second)."),
                "parameters": [{"$ref": "#/components/parameters/IdempotencyKey"}],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/CreatePaymentIntent"}}}},
                "responses": {
                    "201": _json("PaymentIntent", "Created (or a replay of the key's first answer)."),
                    "400": _error("Not a JSON object, a missing or unknown parameter, or a bad Idempotency-Key."),
                    **_AUTH_ERRORS,
                    "409": _error("idempotency_key_reused or idempotency_key_in_use."),
                    "413": _error(f"Body larger than {MAX_BODY_BYTES} bytes."),
                    "422": _error("A parameter's value is invalid (`parameter_invalid`; `param` names "
                                  "it), or the payment method's rail is not configured on this "
                                  "deployment (`payment_method_unavailable`, `param` "
                                  "`payment_method[type]`; retrying does not help)."),
                    **_UNAVAILABLE,
                },
            },
        },
        "/v1/payment_intents/{intent_id}": {
            "get": {
                "operationId": "getPaymentIntent",
                "summary": "Read one of your payment intents",
                "parameters": [{"name": "intent_id", "in": "path", "required": True,
                                "schema": {"type": "string", "pattern": "^pi_[A-Za-z0-9]+$"}}],
                "responses": {
                    "200": _json("PaymentIntent", "The intent."),
                    **_AUTH_ERRORS,
                    "404": _error("No such intent among yours (another merchant's reads the same)."),
                    **_UNAVAILABLE,
                },
            },
        },
        "/v1/refunds": {
            "post": {
                "operationId": "createRefund",
                "summary": "Refund a payment, in whole or in part",
                "description": (
                    "Name the payment by `payment_intent` (its succeeded charge) or `charge`, one of the "
                    "two. `amount` (minor units) defaults to all that is left to refund. The charge is "
                    "locked while its refunds are summed, so concurrent requests never give back more "
                    "than it took. The refund is created `pending` and the rail asked at once; the "
                    "worker polls it to `succeeded` or `failed` and sends `refund.succeeded` / "
                    "`refund.failed`. `Idempotency-Key` as for payment intents."),
                "parameters": [{"$ref": "#/components/parameters/IdempotencyKey"}],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/CreateRefund"},
                    "examples": {"partial": {"value": {"payment_intent": "pi_3kQ9xV2bM7nR0aLz8YpT1cWd",
                                                       "amount": 500, "reason": "one item returned"}},
                                 "full": {"value": {"charge": "ch_8WbT2xQ0nLk5Jr3Vd9sYmP1a"}}}}}},
                "responses": {
                    "201": _json("Refund", "Created `pending` (or a replay of the key's first answer)."),
                    "400": _error("Not a JSON object, an unknown parameter, neither or both of "
                                  "payment_intent and charge, or a bad Idempotency-Key."),
                    **_AUTH_ERRORS,
                    "404": _error("No such payment_intent or charge among yours."),
                    "409": _error("idempotency_key_reused or idempotency_key_in_use."),
                    "413": _error(f"Body larger than {MAX_BODY_BYTES} bytes."),
                    "422": _error("Refused; nothing written: `charge_not_refundable` (not succeeded), "
                                  "`charge_already_refunded`, `amount_exceeds_refundable`, "
                                  "`refunds_unsupported` (the payment's rail gives no refunds: Orange "
                                  "Money), `rail_unavailable`, `parameter_invalid`."),
                    **_UNAVAILABLE,
                },
            },
            "get": {
                "operationId": "listRefunds",
                "summary": "List your refunds, newest first",
                "parameters": [*_LIST_PARAMETERS,
                               {"name": "payment_intent", "in": "query", "required": False,
                                "description": "Only the refunds of this payment intent.",
                                "schema": {"type": "string", "pattern": "^pi_[A-Za-z0-9]+$"}}],
                "responses": _list_responses("RefundList"),
            },
        },
        "/v1/refunds/{refund_id}": {
            "get": {
                "operationId": "getRefund",
                "summary": "Read one of your refunds",
                "parameters": [{"name": "refund_id", "in": "path", "required": True,
                                "schema": {"type": "string", "pattern": "^re_[A-Za-z0-9]+$"}}],
                "responses": {
                    "200": _json("Refund", "The refund."),
                    **_AUTH_ERRORS,
                    "404": _error("No such refund among yours (another merchant's reads the same)."),
                    **_UNAVAILABLE,
                },
            },
        },
        "/v1/events": {
            "get": {
                "operationId": "listEvents",
                "summary": "List your events, newest first: recover the webhooks you missed",
                "description": (
                    "Every event is also sent to your webhook endpoints; this list is how you catch up "
                    "after an outage (`delivery_success=false`, or `created[gte]` from when it began). "
                    "Delivered events older than the deployment's retention (`VPAY_RETENTION_DAYS`, "
                    "default 90; `retention_days` in every answer) are deleted; a cursor naming one "
                    "is 404."),
                "parameters": [*_LIST_PARAMETERS,
                               {"name": "type", "in": "query", "required": False,
                                "description": "One event type, or a family (`payment_intent.*`, `refund.*`).",
                                "schema": {"enum": [*EVENT_TYPES, "payment_intent.*", "refund.*"]}},
                               {"name": "delivery_success", "in": "query", "required": False,
                                "description": ("`false`: events of which a webhook delivery to one of your "
                                                "endpoints has not arrived (pending, retrying, skipped or "
                                                "given up); `true`: every delivery arrived."),
                                "schema": {"enum": ["true", "false"]}}],
                "responses": _list_responses("EventList"),
            },
        },
        "/v1/events/{event_id}": {
            "get": {
                "operationId": "getEvent",
                "summary": "Read one of your events",
                "parameters": [{"name": "event_id", "in": "path", "required": True,
                                "schema": {"type": "string", "pattern": "^evt_[A-Za-z0-9]+$"}}],
                "responses": {
                    "200": _json("Event", "The event, as its webhook's body with `object` and `payment_intent`."),
                    **_AUTH_ERRORS,
                    "404": _error("No such event among yours (or it aged out of the retention)."),
                    **_UNAVAILABLE,
                },
            },
        },
        "/v1/webhook_endpoints": {
            "post": {
                "operationId": "createWebhookEndpoint",
                "summary": "Register a webhook endpoint",
                "description": (
                    "The URL must be https and resolve to public addresses only (checked now and at "
                    "every delivery). The answer holds the signing `secret`, shown this once. At most "
                    f"{MAX_ENDPOINTS_PER_MERCHANT} endpoints per merchant."),
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/CreateWebhookEndpoint"},
                    "example": {"url": "https://shop.example/hooks/vpay",
                                "enabled_events": ["payment_intent.succeeded", "refund.succeeded"]}}}},
                "responses": {
                    "201": _json("WebhookEndpoint", "Registered; `secret` is shown only here."),
                    "400": _error("Not a JSON object, or a missing or unknown parameter."),
                    **_AUTH_ERRORS,
                    "413": _error(f"Body larger than {MAX_BODY_BYTES} bytes."),
                    "422": _error("`url_refused` (the URL policy), `webhook_endpoint_limit`, or "
                                  "`parameter_invalid`. Nothing written."),
                    **_UNAVAILABLE,
                },
            },
            "get": {
                "operationId": "listWebhookEndpoints",
                "summary": "List your webhook endpoints (one page: there are few)",
                "responses": {
                    "200": _json("WebhookEndpointList", "Your endpoints, newest first, without secrets."),
                    "400": _error("An unknown parameter."),
                    **_AUTH_ERRORS, **_UNAVAILABLE,
                },
            },
        },
        "/v1/webhook_endpoints/{endpoint_id}": {
            "get": {
                "operationId": "getWebhookEndpoint",
                "summary": "Read one of your webhook endpoints (never its secret)",
                "parameters": [_ENDPOINT_ID],
                "responses": {
                    "200": _json("WebhookEndpoint", "The endpoint."),
                    **_AUTH_ERRORS,
                    "404": _error("No such endpoint among yours."),
                    **_UNAVAILABLE,
                },
            },
            "delete": {
                "operationId": "deleteWebhookEndpoint",
                "summary": "Delete one of your webhook endpoints",
                "description": "Deliveries still queued for it end without a request.",
                "parameters": [_ENDPOINT_ID],
                "responses": {
                    "200": _json("DeletedWebhookEndpoint", "Deleted."),
                    **_AUTH_ERRORS,
                    "404": _error("No such endpoint among yours."),
                    **_UNAVAILABLE,
                },
            },
        },
        "/v1/webhook_endpoints/{endpoint_id}/rotate_secret": {
            "post": {
                "operationId": "rotateWebhookEndpointSecret",
                "summary": "Give an endpoint a new signing secret",
                "description": (
                    "The new `secret` is shown once, in this answer. For `overlap_seconds` (default "
                    "86400; 0 revokes the old secret at once) every delivery is signed with both "
                    "secrets (`webhook-signature` holds two `v1,` signatures), so you switch without "
                    "failing a delivery."),
                "parameters": [_ENDPOINT_ID],
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/RotateSecret"},
                    "example": {"overlap_seconds": 3600}}}},
                "responses": {
                    "200": _json("WebhookEndpoint", "Rotated; `secret` is the new one, shown only here."),
                    "400": _error("Not a JSON object, or an unknown parameter."),
                    **_AUTH_ERRORS,
                    "404": _error("No such endpoint among yours."),
                    "413": _error(f"Body larger than {MAX_BODY_BYTES} bytes."),
                    "422": _error("overlap_seconds out of range."),
                    **_UNAVAILABLE,
                },
            },
        },
        "/healthz": {
            "get": {
                "operationId": "health", "security": [],
                "summary": "Liveness and database reachability",
                "responses": {"200": _json("Health", "The database answers."),
                              "503": _json("Health", "The database does not answer.")},
            },
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi", "security": [],
                "summary": "This document",
                "responses": {"200": {"description": "The OpenAPI 3.1 document.",
                                      "content": {"application/json": {"schema": {"type": "object"}}}}},
            },
        },
    },
    "security": [{"secretKey": []}],
    "components": {
        "securitySchemes": {
            "secretKey": {"type": "http", "scheme": "bearer",
                          "description": "A merchant secret key `sk_…` from `vpay-server merchants create`."},
        },
        "schemas": {
            "Error": {
                "type": "object", "required": ["error"],
                "properties": {"error": {
                    "type": "object", "required": ["type", "code", "message"],
                    "properties": {
                        "type": {"type": "string", "enum": ["invalid_request_error", "authentication_error",
                                                            "idempotency_error", "api_error"]},
                        "code": {"type": "string"},
                        "message": {"type": "string"},
                        "param": {"type": "string"},
                    }}},
            },
            "CallbackReceived": {"type": "object", "required": ["received"],
                                 "properties": {"received": {"const": True}}},
            "Health": {"type": "object", "required": ["status", "database"],
                       "properties": {"status": {"enum": ["ok", "unavailable"]},
                                      "database": {"enum": ["ok", "unreachable"]}}},
            "CreatePaymentIntent": {
                "type": "object", "additionalProperties": False,
                "required": ["amount", "currency", "payment_method"],
                "properties": {
                    "amount": {"type": "integer", "minimum": 1, "maximum": 10**12,
                               "description": "Minor units (1050 = 10.50 EUR; 5000 = 5000 XAF)."},
                    "currency": {"type": "string", "pattern": "^[A-Za-z]{3}$"},
                    "payment_method": {
                        "type": "object", "additionalProperties": False, "required": ["type", "msisdn"],
                        "properties": {"type": {"enum": ["mtn_momo", "orange_money", "mpesa", "pawapay"],
                                                "description": "mtn_momo: a prompt on the payer's "
                                                "phone. orange_money: Orange Money Web Payment; the "
                                                "payer confirms on the page next_action points to "
                                                "(the msisdn is kept, not sent). Orange takes only "
                                                "currencies without minor units (XOF, XAF, ...); "
                                                "another is refused (intent requires_payment_method). "
                                                "mpesa: an M-Pesa STK Push prompt, whole KES from a "
                                                "2547XXXXXXXX payer (else 400 at creation). pawapay: a "
                                                "prompt through the provider configured for the payer's "
                                                "country (an unconfigured country or currency: 400)."},
                                       "msisdn": {"type": "string", "pattern": "^\\+?[0-9]{8,15}$"}}},
                    "description": {"type": ["string", "null"], "maxLength": 160},
                },
            },
            "PaymentIntent": {
                "type": "object",
                "required": ["id", "object", "amount", "currency", "status", "next_action",
                             "merchant", "created", "updated", "latest_charge"],
                "properties": {
                    "id": {"type": "string", "pattern": "^pi_"},
                    "object": {"const": "payment_intent"},
                    "amount": {"type": "integer"},
                    "currency": {"type": "string"},
                    "status": {"enum": ["requires_confirmation", "processing", "succeeded",
                                        "requires_payment_method", "canceled"]},
                    "next_action": {"oneOf": [
                        {"type": "null"},
                        {"type": "object", "required": ["type", "expires_at"],
                         "properties": {"type": {"const": "mobile_money_prompt"},
                                        "expires_at": {"type": "string", "format": "date-time"}}},
                        {"type": "object", "required": ["type", "url", "expires_at"],
                         "description": "Orange Money: send the payer to `url` to confirm.",
                         "properties": {"type": {"const": "redirect_to_url"},
                                        "url": {"type": "string", "format": "uri"},
                                        "expires_at": {"type": "string", "format": "date-time"}}}]},
                    "description": {"type": ["string", "null"]},
                    "merchant": {"type": "string"},
                    "created": {"type": "string", "format": "date-time"},
                    "updated": {"type": "string", "format": "date-time"},
                    "latest_charge": {"type": ["string", "null"], "pattern": "^ch_"},
                },
            },
        },
    },
}


def _list_of(item: str) -> dict[str, Any]:
    return {"type": "object", "required": ["object", "url", "has_more", "data"],
            "properties": {"object": {"const": "list"}, "url": {"type": "string"},
                           "has_more": {"type": "boolean"},
                           "data": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}}}}


_TIME = {"type": "string", "format": "date-time"}
_MAYBE_TIME = {"type": ["string", "null"], "format": "date-time"}
_MAYBE_TEXT = {"type": ["string", "null"]}

_MORE_SCHEMAS: dict[str, Any] = {
    "PaymentIntentList": _list_of("PaymentIntent"),
    "CreateRefund": {
        "type": "object", "additionalProperties": False,
        "description": "Exactly one of payment_intent and charge.",
        "properties": {
            "payment_intent": {"type": "string", "pattern": "^pi_[A-Za-z0-9]+$"},
            "charge": {"type": "string", "pattern": "^ch_[A-Za-z0-9]+$"},
            "amount": {"type": "integer", "minimum": 1, "maximum": 10**12,
                       "description": "Minor units; default all that is left to refund."},
            "reason": {"type": ["string", "null"], "maxLength": 160},
        },
    },
    "Refund": {
        "type": "object",
        "required": ["id", "object", "amount", "currency", "status", "charge_id", "payment_intent",
                     "failure_code", "reason", "created_at"],
        "properties": {
            "id": {"type": "string", "pattern": "^re_"}, "object": {"const": "refund"},
            "amount": {"type": "integer"}, "currency": {"type": "string"},
            "status": {"enum": ["pending", "succeeded", "failed", "unresolved"],
                       "description": "unresolved: the rail has not answered for 24 h; it is still polled."},
            "charge_id": {"type": "string", "pattern": "^ch_"},
            "payment_intent": {"type": "string", "pattern": "^pi_"},
            "rail": {"type": "string"}, "rail_reference": {"type": "string"},
            "failure_code": _MAYBE_TEXT, "rail_transaction_id": _MAYBE_TEXT, "reason": _MAYBE_TEXT,
            "created_at": _TIME, "submitted_at": _MAYBE_TIME, "settled_at": _MAYBE_TIME,
            "unresolved_at": _MAYBE_TIME, "last_polled_at": _MAYBE_TIME,
        },
        "example": {"id": "re_5TgH2kLq9ZxB1nVc7MwR3pYe", "object": "refund", "amount": 500,
                    "currency": "EUR", "status": "pending", "charge_id": "ch_8WbT2xQ0nLk5Jr3Vd9sYmP1a",
                    "payment_intent": "pi_3kQ9xV2bM7nR0aLz8YpT1cWd", "rail": "mtn",
                    "rail_reference": "9f0c7c1e-3d2a-4c55-9a51-1f2b3c4d5e6f", "failure_code": None,
                    "rail_transaction_id": None, "reason": "one item returned",
                    "created_at": "2026-11-30T12:00:00+00:00", "submitted_at": "2026-11-30T12:00:00+00:00",
                    "settled_at": None, "unresolved_at": None, "last_polled_at": None},
    },
    "RefundList": _list_of("Refund"),
    "Event": {
        "type": "object", "required": ["id", "object", "type", "created", "payment_intent", "data"],
        "properties": {
            "id": {"type": "string", "pattern": "^evt_"}, "object": {"const": "event"},
            "type": {"enum": list(EVENT_TYPES)}, "created": _TIME,
            "payment_intent": {"type": "string", "pattern": "^pi_"},
            "data": {"type": "object", "description": "`object`: the payment intent then; `charge`; "
                     "`refund` for refund events; `failure_code` and `failure_kind` for failures."},
        },
        "example": {"id": "evt_7HqL0sVb3Kx9WmT2nR5cYd8P", "object": "event", "type": "payment_intent.succeeded",
                    "created": "2026-11-30T12:01:05.123456Z", "payment_intent": "pi_3kQ9xV2bM7nR0aLz8YpT1cWd",
                    "data": {"object": {"id": "pi_3kQ9xV2bM7nR0aLz8YpT1cWd", "object": "payment_intent",
                                        "status": "succeeded"}}},
    },
    "EventList": {**_list_of("Event"),
                  "properties": {**_list_of("Event")["properties"],
                                 "retention_days": {"type": "integer", "minimum": 0,
                                                    "description": "Delivered events older than this many "
                                                    "days are deleted (0: kept)."}}},
    "CreateWebhookEndpoint": {
        "type": "object", "additionalProperties": False, "required": ["url"],
        "properties": {
            "url": {"type": "string", "format": "uri", "maxLength": 2048},
            "enabled_events": {"type": "array", "minItems": 1, "maxItems": 16, "uniqueItems": True,
                               "items": {"enum": [*EVENT_TYPES, "*"]},
                               "description": "The event types it receives; default [\"*\"], all."},
            "description": {"type": ["string", "null"], "maxLength": 160},
        },
    },
    "WebhookEndpoint": {
        "type": "object",
        "required": ["id", "object", "url", "enabled_events", "status", "created"],
        "properties": {
            "id": {"type": "string", "pattern": "^we_"}, "object": {"const": "webhook_endpoint"},
            "url": {"type": "string"}, "description": _MAYBE_TEXT,
            "enabled_events": {"type": "array", "items": {"type": "string"}},
            "status": {"enum": ["enabled", "disabled"]}, "disabled_reason": _MAYBE_TEXT,
            "previous_secret_expires_at": _MAYBE_TIME, "created": _TIME,
            "secret": {"type": "string", "pattern": "^whsec_",
                       "description": "Only in the answers of create and rotate_secret."},
        },
        "example": {"id": "we_2NcV8xQ1bK7mT0rL5sYh3WdP", "object": "webhook_endpoint",
                    "url": "https://shop.example/hooks/vpay", "description": None,
                    "enabled_events": ["*"], "status": "enabled", "disabled_reason": None,
                    "previous_secret_expires_at": None, "created": "2026-11-30T12:00:00Z",
                    "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
    },
    "WebhookEndpointList": _list_of("WebhookEndpoint"),
    "DeletedWebhookEndpoint": {"type": "object", "required": ["id", "object", "deleted"],
                               "properties": {"id": {"type": "string"}, "object": {"const": "webhook_endpoint"},
                                              "deleted": {"const": True}}},
    "RotateSecret": {"type": "object", "additionalProperties": False,
                     "properties": {"overlap_seconds": {"type": "integer", "minimum": 0,
                                                        "maximum": 7 * 24 * 3600}}},
}
DOCUMENT["components"]["schemas"].update(_MORE_SCHEMAS)
DOCUMENT["components"]["parameters"] = {
    "IdempotencyKey": {"name": "Idempotency-Key", "in": "header", "required": False,
                       "description": "Replays the first answer for the same body for 24 h (docs/api.md).",
                       "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"}},
}
