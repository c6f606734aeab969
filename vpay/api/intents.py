"""The merchant's payment intents: ``POST /v1/payment_intents`` (create and
confirm), ``GET /v1/payment_intents`` (a list page, newest first) and
``GET /v1/payment_intents/{id}`` (the merchant's own only).

Create: ``{amount, currency, payment_method: {type: "mtn_momo" |
"orange_money" | "mpesa" | "pawapay", msisdn}, description?}``, amount an integer in minor units.
The request is checked whole before anything is written (400: not a JSON
object, a missing or unknown parameter; 422: a parameter's value, with
``param``), then ``vpay.money.payments.create_and_submit`` commits the intent
(``processing``), the charge (``pending``) and its poll job, and sends the
request-to-pay, waiting on the rail at most ``VPAY_API_RAIL_TIMEOUT_SECONDS``
(3 s) and only while one of the process's rail slots is free; otherwise the
intent is answered ``processing`` at once and the worker's resubmit job
sends it (docs/api.md, "Creates never wait on a slow rail"). 201 with the intent, whose ``next_action`` is ``{type:
"mobile_money_prompt", expires_at}`` while the payer's prompt is live (Orange:
``{type: "redirect_to_url", url, expires_at}``, the page where the payer
confirms). A rail that refuses the
request outright still gives 201: the intent then reads
``requires_payment_method``.

Idempotency-Key (docs/api.md): ``vpay.api.idempotency``, shared with
``POST /v1/refunds``: the same key and body replay the first answer byte for
byte; a key never creates two intents, even after a request died half-way.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import falcon
from psycopg.rows import dict_row

from vpay.money import charges
from vpay.money.payments import create_and_submit
from vpay.base.queries import Q
from vpay.rails.port import RailError
from vpay.api import idempotency
from vpay.api.errors import ApiError, invalid, not_found, unauthorized
from vpay.api.lists import Listing, one_of, parse_page, run_page
from vpay.api.wire import MAX_BODY_BYTES, answer, read_body

log = logging.getLogger("vpay.api.intents")

INTENT_ID = re.compile(r"^pi_[A-Za-z0-9]{1,64}$")

PAYMENT_METHODS = {"mtn_momo": "mtn", "orange_money": "orange", "mpesa": "mpesa", "pawapay": "pawapay"}
"""``payment_method.type`` → rail code. For ``orange_money`` the MSISDN is kept
on the charge but not sent: Orange's payer identifies on Orange's page, which
``next_action`` (``redirect_to_url``) points to. ``mpesa`` is an STK Push
prompt (whole KES, a 2547 MSISDN); ``pawapay`` a prompt through the
operator pawaPay's configuration names for the payer's country."""
FIELDS = ("amount", "currency", "payment_method", "description")
REQUIRED = ("amount", "currency", "payment_method")
METHOD_FIELDS = ("type", "msisdn")
# charges.InvalidPayment.param → the request's parameter name
_PARAMS = {"amount": "amount", "currency": "currency", "payer": "payment_method[msisdn]",
           "rail": "payment_method[type]", "description": "description"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class NewPayment:
    """A checked create request (amount in minor units, currency upper-case,
    payer digits only) and ``fingerprint``, sha256 hex of its canonical JSON."""

    amount: int
    currency: str
    rail: str
    payer: str
    description: str | None
    fingerprint: str


def _shown(name: Any) -> str:
    return str(name)[:64]


def parse_new_payment(body: bytes, merchant_id: str) -> NewPayment:
    """Check a create request's body. Raises ``ApiError`` 400 (not a JSON
    object; missing or unknown parameter) or 422 (a parameter's value; the
    rules are ``charges.validate``'s), each naming ``param``."""
    if not body.strip():
        raise invalid("parameter_missing", "A JSON object body is required.")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise invalid("invalid_json", "The request body is not valid JSON.") from None
    if not isinstance(doc, dict):
        raise invalid("invalid_json", "The request body must be a JSON object.")
    for name in doc:
        if name not in FIELDS:
            raise invalid("parameter_unknown", f"Received unknown parameter: {_shown(name)}",
                          _shown(name))
    for name in REQUIRED:
        if name not in doc:
            raise invalid("parameter_missing", f"Missing required parameter: {name}", name)
    method = doc["payment_method"]
    if not isinstance(method, dict):
        raise invalid("parameter_invalid", "payment_method must be an object "
                      "{type, msisdn}.", "payment_method", status=422)
    for name in method:
        if name not in METHOD_FIELDS:
            raise invalid("parameter_unknown", f"Received unknown parameter: payment_method[{_shown(name)}]",
                          f"payment_method[{_shown(name)}]")
    for name in METHOD_FIELDS:
        if name not in method:
            raise invalid("parameter_missing", f"Missing required parameter: payment_method[{name}]",
                          f"payment_method[{name}]")
    rail = PAYMENT_METHODS.get(method["type"]) if isinstance(method["type"], str) else None
    if rail is None:
        raise invalid("parameter_invalid", "payment_method[type] must be one of: "
                      + ", ".join(PAYMENT_METHODS), "payment_method[type]", status=422)
    description = doc.get("description")
    if description is not None and (not isinstance(description, str) or _CONTROL.search(description)
                                    or not _encodable(description)):
        raise invalid("parameter_invalid", "description must be text without control characters.",
                      "description", status=422)
    if description is not None and len(description) > 160:
        raise invalid("parameter_invalid", "description must be at most 160 characters.",
                      "description", status=422)
    try:
        _, amount, currency, rail, payer = charges.validate(merchant_id, doc["amount"], doc["currency"],
                                                          rail, method["msisdn"])
    except charges.InvalidPayment as exc:
        raise invalid("parameter_invalid", str(exc), _PARAMS.get(exc.param, exc.param), status=422) from None
    return NewPayment(amount, currency, rail, payer, description,
                      idempotency.fingerprint("POST /v1/payment_intents", doc))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
        return False
    return True


def rail_unavailable(rail: str) -> ApiError:
    """422 ``payment_method_unavailable``: the payment method's rail has no
    configuration on this deployment (``VPAY_<RAIL>_*``). Nothing is written;
    retrying does not help until the operator configures the rail."""
    method = next((m for m, code in PAYMENT_METHODS.items() if code == rail), rail)
    return invalid("payment_method_unavailable",
                   f"Payment method {method} is not available on this deployment.",
                   "payment_method[type]", status=422)


def intent_body(view: dict[str, Any], latest_charge: str | None) -> dict[str, Any]:
    """The merchant-facing intent: ``charges.intent_view`` plus the id of its
    latest charge."""
    return {**view, "latest_charge": latest_charge}


def load_intent_body(conn, merchant_id: str, intent_id: str) -> dict[str, Any] | None:
    """The merchant's own intent as answered by the API, or ``None``."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["api_load_intent"], {"id": intent_id, "merchant_id": merchant_id}).fetchone()
    return intent_body(charges.intent_view(row), row["latest_charge"]) if row else None


class IntentsResource:
    """``POST /v1/payment_intents`` (create and confirm) and ``GET
    /v1/payment_intents`` (the merchant's intents, a list page: docs/api.md,
    "Lists"; ``status`` filters)."""

    merchant_api = True

    def __init__(self, db, rails, settings, submit_slots=None):
        self.db = db
        self.rails = rails
        self.settings = settings
        self.submit_slots = submit_slots

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        page = parse_page(req, "pi", {"status": one_of("status", STATUSES)})
        status = page.filters["status"]
        with self.db.connection() as conn:
            body = run_page(conn, LISTING, page, {
                "merchant_id": req.context.merchant_id,
                "statuses": [status] if status else list(STATUSES)}, "/v1/payment_intents")
        answer(resp, 200, body)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        merchant_id = req.context.merchant_id
        key = idempotency.header_key(req)
        payment = parse_new_payment(read_body(req, MAX_BODY_BYTES), merchant_id)
        if key is None:
            answer(resp, 201, self._create(merchant_id, payment, None))
            return
        idempotency.run(self.db, resp, merchant_id=merchant_id, key=key,
                        request_sha256=payment.fingerprint, prefix="pi",
                        load=lambda conn, intent_id: load_intent_body(conn, merchant_id, intent_id),
                        create=lambda intent_id: self._create(merchant_id, payment, intent_id))

    def _create(self, merchant_id: str, payment: NewPayment, intent_id: str | None) -> dict[str, Any]:
        try:
            result = create_and_submit(self.db.pool(), self.rails, merchant_id=merchant_id,
                                       amount=payment.amount, currency=payment.currency,
                                       rail=payment.rail, payer=payment.payer,
                                       description=payment.description,
                                       prompt_ttl_seconds=self.settings.prompt_ttl_seconds,
                                       intent_id=intent_id, slots=self.submit_slots)
        except charges.InvalidPayment as exc:
            if exc.param == "merchant":  # the key's merchant vanished after authentication
                raise unauthorized() from None
            raise invalid("parameter_invalid", str(exc), _PARAMS.get(exc.param, exc.param),
                          status=422) from None
        except RailError:
            # The operator's to fix, not the merchant's to retry: a 503 with
            # Retry-After would be retried for ever (issue 13).
            log.warning("payment refused: rail not configured on this deployment",
                        extra={"rail": payment.rail, "merchant": merchant_id})
            raise rail_unavailable(payment.rail) from None
        return intent_body(result["payment_intent"], result["charge"]["id"])


class IntentResource:
    merchant_api = True

    def __init__(self, db):
        self.db = db

    def on_get(self, req: falcon.Request, resp: falcon.Response, intent_id: str) -> None:
        found = None
        if INTENT_ID.match(intent_id):
            with self.db.connection() as conn:
                found = load_intent_body(conn, req.context.merchant_id, intent_id)
        if found is None:  # another merchant's intent reads exactly like a missing one
            raise not_found("No such payment_intent.", "id")
        answer(resp, 200, found)


STATUSES = ("requires_confirmation", "processing", "succeeded", "requires_payment_method", "canceled")
LISTING = Listing(noun="payment_intent", cursor="api_intent_cursor", older="api_list_intents_older",
                  newer="api_list_intents_newer",
                  view=lambda row: intent_body(charges.intent_view(row), row["latest_charge"]))
"""How ``GET /v1/payment_intents`` pages (``vpay.api.lists``)."""
