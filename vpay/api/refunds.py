"""The merchant's refunds: ``POST /v1/refunds``, ``GET /v1/refunds`` (a list
page, ``payment_intent`` filters) and ``GET /v1/refunds/{id}``.

Create: ``{payment_intent | charge, amount?, reason?}`` (exactly one of the
first two; an intent means its succeeded charge), amount in minor units,
default all that is left to refund. The charge is looked up among the key's
merchant's (another merchant's reads like a missing one: 404), then the one
refund path of the CLI runs, ``vpay.money.refunds.create_and_submit``: the
charge row is locked before its refunds are summed, so concurrent requests
never refund more than the charge's amount; the refund and its
``refund_poll:`` job commit together and the rail is asked after; the worker
polls it to its end and the ``refund.succeeded`` / ``refund.failed`` event
is webhooked like any other. A rail without refunds (Orange Money Web
Payment) is 422 ``refunds_unsupported`` and nothing is written.
``Idempotency-Key`` is honoured as for intents (``vpay.api.idempotency``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import falcon
from psycopg.rows import dict_row

from vpay.api import idempotency
from vpay.api.errors import invalid, not_found
from vpay.api.lists import Listing, parse_page, run_page
from vpay.api.wire import MAX_BODY_BYTES, answer, read_body
from vpay.base.queries import Q
from vpay.money import refunds
from vpay.rails.port import RailError

FIELDS = ("payment_intent", "charge", "amount", "reason")
REFUND_ID = re.compile(r"^re_[A-Za-z0-9]{1,64}$")
_OBJECT_ID = {"payment_intent": re.compile(r"^pi_[A-Za-z0-9]{1,64}$"),
              "charge": re.compile(r"^ch_[A-Za-z0-9]{1,64}$")}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def refund_body(row: dict[str, Any]) -> dict[str, Any]:
    """The merchant-facing refund: ``refunds.refund_view`` plus its intent."""
    return refunds.refund_view(row) | {"payment_intent": row["payment_intent_id"]}


def load_refund_body(conn, merchant_id: str, refund_id: str) -> dict[str, Any] | None:
    """The merchant's own refund as answered, or None (another merchant's too)."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["api_load_refund"], {"id": refund_id, "merchant_id": merchant_id}).fetchone()
    return refund_body(row) if row else None


def parse_create(body: bytes) -> dict[str, Any]:
    """A create request's fields, checked for shape (400: not a JSON object,
    unknown parameter, neither or both of payment_intent/charge; 422: a
    value). The money rules (succeeded charge, what is left) are
    ``refunds.create_refund``'s."""
    try:
        doc = json.loads(body) if body.strip() else None
    except (ValueError, RecursionError):
        raise invalid("invalid_json", "The request body is not valid JSON.") from None
    if not isinstance(doc, dict):
        raise invalid("invalid_json", "The request body must be a JSON object.")
    for name in doc:
        if name not in FIELDS:
            raise invalid("parameter_unknown", f"Received unknown parameter: {str(name)[:64]}",
                          str(name)[:64])
    named = [n for n in ("payment_intent", "charge") if n in doc]
    if len(named) != 1:
        raise invalid("parameter_missing", "Give exactly one of payment_intent or charge.",
                      "payment_intent")
    target = named[0]
    if not isinstance(doc[target], str) or not _OBJECT_ID[target].match(doc[target]):
        raise invalid("parameter_invalid", f"{target} must be an id ({target[:2]}_…).", target, status=422)
    amount = doc.get("amount")
    if amount is not None and (isinstance(amount, bool) or not isinstance(amount, int)
                               or not 1 <= amount <= 10**12):
        raise invalid("parameter_invalid", "amount must be a positive whole number of minor units.",
                      "amount", status=422)
    reason = doc.get("reason")
    if reason is not None and (not isinstance(reason, str) or _CONTROL.search(reason)
                               or len(reason) > refunds.REASON_MAX_CHARS or not _encodable(reason)):
        raise invalid("parameter_invalid", f"reason must be text of at most {refunds.REASON_MAX_CHARS} "
                      "characters without control characters.", "reason", status=422)
    return {"target": target, "id": doc[target], "amount": amount, "reason": reason,
            "fingerprint": idempotency.fingerprint("POST /v1/refunds", doc)}


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_REFUSALS = {  # InvalidRefund.code → (answered code, param or None for the target)
    "charge_not_found": ("resource_missing", None),
    "charge_not_succeeded": ("charge_not_refundable", None),
    "nothing_to_refund": ("charge_already_refunded", None),
    "refunds_unsupported": ("refunds_unsupported", None),
    "invalid_amount": ("parameter_invalid", "amount"),
    "amount_exceeds_refundable": ("amount_exceeds_refundable", "amount"),
    "invalid_reason": ("parameter_invalid", "reason"),
}

LISTING = Listing(noun="refund", cursor="api_refund_cursor", older="api_list_refunds_older",
                  newer="api_list_refunds_newer", view=refund_body)
"""How ``GET /v1/refunds`` pages (``vpay.api.lists``)."""


class RefundsResource:
    """``POST /v1/refunds`` and ``GET /v1/refunds``."""

    merchant_api = True

    def __init__(self, db, rails):
        self.db = db
        self.rails = rails

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        def intent(value: str) -> str:
            if not _OBJECT_ID["payment_intent"].match(value):
                raise invalid("parameter_invalid", "payment_intent must be an id (pi_…).", "payment_intent")
            return value
        page = parse_page(req, "re", {"payment_intent": intent})
        with self.db.connection() as conn:
            body = run_page(conn, LISTING, page, {
                "merchant_id": req.context.merchant_id,
                "payment_intent": page.filters["payment_intent"] or ""}, "/v1/refunds")
        answer(resp, 200, body)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        merchant_id = req.context.merchant_id
        key = idempotency.header_key(req)
        request = parse_create(read_body(req, MAX_BODY_BYTES))
        with self.db.connection() as conn:
            charge = conn.execute(Q["api_charge_to_refund"], {
                "merchant_id": merchant_id,
                "charge_id": request["id"] if request["target"] == "charge" else None,
                "payment_intent_id": request["id"] if request["target"] == "payment_intent" else None,
            }).fetchone()
        if charge is None:  # another merchant's reads exactly like a missing one
            raise not_found(f"No such {request['target']}: {request['id']}.", request["target"])
        if key is None:
            answer(resp, 201, self._create(merchant_id, charge[0], request, None))
            return
        idempotency.run(self.db, resp, merchant_id=merchant_id, key=key,
                        request_sha256=request["fingerprint"], prefix="re",
                        load=lambda conn, refund_id: load_refund_body(conn, merchant_id, refund_id),
                        create=lambda refund_id: self._create(merchant_id, charge[0], request, refund_id))

    def _create(self, merchant_id: str, charge_id: str, request: dict[str, Any],
                refund_id: str | None) -> dict[str, Any]:
        try:
            created = refunds.create_and_submit(self.db.pool(), self.rails, charge_id=charge_id,
                                                amount=request["amount"], reason=request["reason"],
                                                refund_id=refund_id)
        except refunds.InvalidRefund as exc:
            code, param = _REFUSALS.get(exc.code, ("parameter_invalid", None))
            status = 404 if code == "resource_missing" else 422
            raise invalid(code, str(exc), param or request["target"], status=status) from None
        except RailError:
            raise invalid("rail_unavailable", "The rail of this payment is not configured on this "
                          "deployment; the refund was not made.", request["target"], status=422) from None
        with self.db.connection() as conn:
            found = load_refund_body(conn, merchant_id, created["refund"]["id"])
        return found


class RefundResource:
    """``GET /v1/refunds/{id}``: the merchant's own refunds only."""

    merchant_api = True

    def __init__(self, db):
        self.db = db

    def on_get(self, req: falcon.Request, resp: falcon.Response, refund_id: str) -> None:
        found = None
        if REFUND_ID.match(refund_id):
            with self.db.connection() as conn:
                found = load_refund_body(conn, req.context.merchant_id, refund_id)
        if found is None:
            raise not_found("No such refund.", "id")
        answer(resp, 200, found)
