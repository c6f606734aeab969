"""The merchant's payment intents: ``POST /v1/payment_intents`` (create and
confirm) and ``GET /v1/payment_intents/{id}`` (the merchant's own only).

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

Idempotency-Key (docs/api.md): per merchant, kept 24 h. The same key and the
same body replay the first answer byte for byte (``Idempotent-Replayed:
true``); the same key with another body is 409 ``idempotency_key_reused``.
Before creating, an "in progress" row is inserted in its own transaction;
the table's primary key makes one of two concurrent requests the owner and
the other gets 409 ``idempotency_key_in_use`` at once (``Retry-After: 1``;
it does not wait). Requests that fail validation store nothing.

The in-progress row names the intent id before the intent exists, so a
request that died half-way is recovered: once its attempt is older than
``STALE_SECONDS`` (far beyond any request's duration), the next request with
the key takes it over and answers from the intent if it was committed, or
creates it under that same id if it was not. A key never creates two intents.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import falcon
from psycopg.rows import dict_row

from vpay.money import charges
from vpay.money.ids import new_id
from vpay.money.payments import create_and_submit
from vpay.base.queries import Q
from vpay.rails.port import RailError
from vpay.api.errors import IDEMPOTENCY, ApiError, dump, invalid, not_found, unauthorized
from vpay.api.wire import MAX_BODY_BYTES, answer, read_body

log = logging.getLogger("vpay.api.intents")

KEEP_SECONDS = 24 * 3600
"""Idempotency-Key records are honoured for 24 h from their first use."""
STALE_SECONDS = 300
"""An in-progress attempt older than this is presumed dead: a request is
bounded well below it (rail calls are bounded at about 30 s each)."""
IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
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
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return NewPayment(amount, currency, rail, payer, description,
                      hashlib.sha256(b"POST /v1/payment_intents\n" + canonical.encode()).hexdigest())


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


def _in_use() -> ApiError:
    return ApiError(409, IDEMPOTENCY, "idempotency_key_in_use",
                    "Another request with this Idempotency-Key is in progress; retry shortly.",
                    headers={"Retry-After": "1"})


class IntentsResource:
    merchant_api = True

    def __init__(self, db, rails, settings, submit_slots=None):
        self.db = db
        self.rails = rails
        self.settings = settings
        self.submit_slots = submit_slots

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        merchant_id = req.context.merchant_id
        key = req.get_header("Idempotency-Key")
        if key is not None and not IDEMPOTENCY_KEY.match(key):
            raise invalid("idempotency_key_invalid", "Idempotency-Key must be 1 to 255 printable "
                          "ASCII characters without spaces.")
        payment = parse_new_payment(read_body(req, MAX_BODY_BYTES), merchant_id)
        if key is None:
            answer(resp, 201, self._create(merchant_id, payment, None))
            return
        self._idempotent(resp, merchant_id, key, payment)

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

    # --- Idempotency-Key ----------------------------------------------------

    def _idempotent(self, resp: falcon.Response, merchant_id: str, key: str,
                    payment: NewPayment) -> None:
        ident = {"merchant_id": merchant_id, "key": key}
        owned: tuple[str, bool] | None = None  # (intent id, fresh)
        for _ in range(3):  # a record may expire or be swept between two reads
            with self.db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                claimed = cur.execute(Q["idempotency_claim"], ident | {
                    "request_sha256": payment.fingerprint, "payment_intent_id": new_id("pi"),
                    "keep": KEEP_SECONDS}).fetchone()
                if claimed is not None:
                    owned = (claimed["payment_intent_id"], True)
                    break
                found = cur.execute(Q["idempotency_find"], ident | {
                    "keep": KEEP_SECONDS, "stale": STALE_SECONDS}).fetchone()
                if found is None:
                    continue
                if found["request_sha256"] != payment.fingerprint:
                    raise ApiError(409, IDEMPOTENCY, "idempotency_key_reused",
                                   "Keys for idempotent requests can only be used with the same "
                                   "parameters they were first used with.")
                if found["status_code"] is not None:
                    answer(resp, found["status_code"], found["response_body"].encode("utf-8"),
                           {"Idempotent-Replayed": "true"})
                    return
                if not found["stale"]:
                    raise _in_use()
                taken = cur.execute(Q["idempotency_take_over"], ident | {
                    "locked_at": found["locked_at"]}).fetchone()
                if taken is None:
                    raise _in_use()
                log.warning("idempotency: taking over a stale attempt",
                            extra={"merchant": merchant_id, "payment_intent": found["payment_intent_id"]})
                owned = (found["payment_intent_id"], False)
                break
        if owned is None:
            raise _in_use()
        intent_id, fresh = owned
        body = dump(self._run_owned(merchant_id, key, intent_id, fresh, payment))
        try:
            with self.db.connection() as conn:
                conn.execute(Q["idempotency_complete"], ident | {
                    "payment_intent_id": intent_id, "status_code": 201,
                    "response_body": body.decode("utf-8")})
        except Exception:  # the intent exists; a retry after STALE_SECONDS recovers the record
            log.exception("idempotency: could not record the answer",
                          extra={"merchant": merchant_id, "payment_intent": intent_id})
        answer(resp, 201, body)

    def _run_owned(self, merchant_id: str, key: str, intent_id: str, fresh: bool,
                   payment: NewPayment) -> dict[str, Any]:
        """Create under ``intent_id`` unless it exists. On failure, forget the
        key if nothing was committed; if the intent exists, answer it."""
        ident = {"merchant_id": merchant_id, "key": key, "payment_intent_id": intent_id}
        if not fresh:
            with self.db.connection() as conn:
                existing = load_intent_body(conn, merchant_id, intent_id)
            if existing is not None:
                return existing
        try:
            return self._create(merchant_id, payment, intent_id)
        except Exception as exc:
            try:
                with self.db.connection() as conn:
                    existing = load_intent_body(conn, merchant_id, intent_id)
                    if existing is None:
                        conn.execute(Q["idempotency_release"], ident)
            except Exception:
                log.exception("idempotency: outcome unknown; the key stays in progress",
                              extra={"merchant": merchant_id, "payment_intent": intent_id})
                raise exc from None
            if existing is None:
                raise
            log.warning("payment created but its request failed afterwards; answering the intent",
                        extra={"merchant": merchant_id, "payment_intent": intent_id,
                               "error": type(exc).__name__})
            return existing


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
