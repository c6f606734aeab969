"""The MoMo sandbox's Disbursement product: refunds of request-to-pay.

    POST {base}/disbursement/v1_0/refund                   -> 202, empty body
        needs a Disbursement Bearer token and subscription key, X-Target-Environment,
        X-Reference-Id (UUIDv4, the refund's id); JSON body {amount: "string", currency,
        externalId?, payerMessage?, payeeNote?, referenceIdToRefund (a request-to-pay's
        X-Reference-Id)}; 409 RESOURCE_ALREADY_EXIST for a duplicate X-Reference-Id
    GET  {base}/disbursement/v1_0/refund/{referenceId}     -> 200 refund status body
        {amount, currency, financialTransactionId (SUCCESSFUL only), externalId, payee,
         payerMessage, payeeNote, status, reason (FAILED only)}; 404 RESOURCE_NOT_FOUND

A refund of a SUCCESSFUL collection is PENDING until ``success_after_seconds``
after it was accepted, then SUCCESSFUL. A refund whose ``referenceIdToRefund``
names no collection FAILs at once with reason ``REFUND_TARGET_NOT_FOUND``;
one naming a collection that is not SUCCESSFUL (at the moment the refund
arrives) with ``REFUND_TARGET_NOT_SUCCESSFUL``. Both codes are this
sandbox's own: MoMo documents none for these cases. The amount is not
checked against the collection's (vpay checks it before it asks). A refund
is scripted through the refunded collection's payer (``refund_*`` options),
and sends no callback. The call and the read are ``transactions.py``'s."""

from __future__ import annotations

from typing import Any

from vpay.sandbox.server import Answer
from vpay.sandbox.mtn.codes import DEFAULT_REFUND_FAILURE, DISBURSEMENT, FAILED, REFUND_TARGET_NOT_FOUND, REFUND_TARGET_NOT_SUCCESSFUL, SUCCESSFUL, UUID4_RE
from vpay.sandbox.mtn.transactions import Kind, new_txn, parse_money_body

REFUND_PATH = "/disbursement/v1_0/refund"


def _parse_refund_body(raw: bytes) -> dict[str, Any] | Answer:
    """The refund body: the shared checks and ``referenceIdToRefund`` (UUID)."""
    def target_problem(body: dict[str, Any]) -> str | None:
        target = body.get("referenceIdToRefund")
        if not isinstance(target, str) or not UUID4_RE.match(target):
            return "referenceIdToRefund must be the UUID of the transaction to refund"
        return None
    return parse_money_body(raw, target_problem)


def _prepare(rail: Any, headers: Any, body: dict[str, Any]) -> dict[str, Any]:
    rail._fire_due_timers()  # a collection whose success timer is due counts as SUCCESSFUL
    return {}


def _script_for(rail: Any, body: dict[str, Any]):
    original = rail._txns.get(body["referenceIdToRefund"])
    script = rail._scripts.get(original.payer.get("partyId", "")) if original else None
    return script, {"original": original}


def _new(rail: Any, ref: str, body: dict[str, Any], script, context: dict[str, Any]):
    original = context["original"]
    return new_txn(REFUND, ref, body, script,
                   payer=dict(original.payer) if original else {"partyIdType": "MSISDN", "partyId": ""},
                   default_reason=None, fallback_reason=DEFAULT_REFUND_FAILURE,
                   refund_of=body["referenceIdToRefund"])


def _open(rail: Any, txn, context: dict[str, Any]):
    original = context["original"]
    if original is None:
        rail._become(txn, FAILED, REFUND_TARGET_NOT_FOUND)
    elif original.status != SUCCESSFUL:
        rail._become(txn, FAILED, REFUND_TARGET_NOT_SUCCESSFUL)
    elif not txn.read_driven:
        rail._schedule_success(txn)
    return None  # a refund sends no callback


def _accepted(ref: str, body: dict[str, Any]) -> str:
    return f"refund {ref} of {body['referenceIdToRefund']} accepted ({body['amount']} {body['currency']})"


REFUND = Kind(
    name="refund", product=DISBURSEMENT, path=REFUND_PATH, table="_refunds",
    call_prefix="refund_", status_prefix="refund_", noun="refund ", parse_body=_parse_refund_body,
    prepare=_prepare, script_for=_script_for, new=_new, open=_open, accepted=_accepted,
)
