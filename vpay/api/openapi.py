"""The OpenAPI 3.1 document of every route, served at ``/openapi.json``.
tests/integration/test_api_fuzz.py keeps it true: the app's routes and methods equal the
document's, and every status a fuzzed request gets is documented for its
operation."""

from __future__ import annotations

from typing import Any

from vpay.api.wire import MAX_BODY_BYTES


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
            "post": {
                "operationId": "createPaymentIntent",
                "summary": "Create and confirm a payment intent",
                "description": (
                    "Creates the intent (processing), its charge (pending) and sends the payer a "
                    "mobile-money prompt. With `Idempotency-Key`, the same key and body replay the "
                    "first answer (`Idempotent-Replayed: true`) for 24 h; another body is 409 "
                    "`idempotency_key_reused`; a concurrent request with the key is 409 "
                    "`idempotency_key_in_use` (retry after a second)."),
                "parameters": [
                    {"name": "Idempotency-Key", "in": "header", "required": False,
                     "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"}},
                ],
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
