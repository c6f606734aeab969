"""The MoMo sandbox's Collection product: request to pay.

    POST {base}/collection/v1_0/requesttopay               -> 202, empty body
        needs Authorization: Bearer <Collection token>, Ocp-Apim-Subscription-Key,
        X-Target-Environment, X-Reference-Id (UUIDv4), optional X-Callback-Url; JSON body
        {amount: "string", currency, externalId?, payer: {partyIdType: "MSISDN", partyId},
         payerMessage?, payeeNote?} (messages at most 160 characters)
    GET  {base}/collection/v1_0/requesttopay/{referenceId} -> 200 status body (even for FAILED)
        {amount, currency, financialTransactionId (SUCCESSFUL only), externalId (when sent),
         payer, payerMessage, payeeNote, status, reason (FAILED only)}

The call and the read are ``transactions.py``'s; this module says what is
particular to a request-to-pay: its ``payer``, its callback URL (like MoMo's
``INVALID_CALLBACK_URL_HOST`` check, a host not allowed is refused with 500;
by default only loopback hosts are, see ``callback_hosts``), its script (the
payer's) and its start (a ``SANDBOX_FAILURES`` payer FAILs at once)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from vpay.sandbox.server import Answer, is_loopback_host
from vpay.sandbox.mtn.codes import COLLECTION, DEFAULT_DECLINE, FAILED, SANDBOX_FAILURES, _error
from vpay.sandbox.mtn.transactions import Kind, new_txn, parse_money_body

RTP_PATH = "/collection/v1_0/requesttopay"


def _parse_rtp_body(raw: bytes) -> dict[str, Any] | Answer:
    """The request-to-pay body: the shared checks and ``payer``."""
    def payer_problem(body: dict[str, Any]) -> str | None:
        payer = body.get("payer")
        if (not isinstance(payer, dict) or payer.get("partyIdType") not in ("MSISDN", "EMAIL", "PARTY_CODE")
                or not isinstance(payer.get("partyId"), str) or not payer["partyId"]):
            return "payer must be {partyIdType: MSISDN|EMAIL|PARTY_CODE, partyId}"
        return None
    return parse_money_body(raw, payer_problem)


def _check_callback_url(rail: Any, url: str) -> Answer | None:
    """``X-Callback-Url``: an http(s) URL whose host ``rail.callback_hosts``
    allows (None: loopback hosts only; ``"*"``: any)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return _error(400, "BAD_REQUEST", "X-Callback-Url is not a valid URL")
    if parts.scheme not in ("http", "https") or not host:
        return _error(400, "BAD_REQUEST", "X-Callback-Url must be an http(s) URL")
    allowed = rail.callback_hosts
    if allowed is None:
        ok = is_loopback_host(host)
    else:
        ok = "*" in allowed or host.lower() in allowed
    if not ok:
        return _error(500, "INVALID_CALLBACK_URL_HOST",
                      f"Callback host {host!r} is not allowed by this sandbox (see callback_hosts)")
    return None


def _prepare(rail: Any, headers: Any, body: dict[str, Any]) -> dict[str, Any] | Answer:
    callback_url = headers.get("X-Callback-Url") or None
    if callback_url is not None:
        err = _check_callback_url(rail, callback_url)
        if err:
            return err
    return {"callback_url": callback_url}


def _script_for(rail: Any, body: dict[str, Any]):
    return rail._scripts.get(body["payer"]["partyId"]), {}


def _new(rail: Any, ref: str, body: dict[str, Any], script, context: dict[str, Any]):
    return new_txn(REQUEST_TO_PAY, ref, body, script, payer=dict(body["payer"]),
                   default_reason=SANDBOX_FAILURES.get(body["payer"]["partyId"]),
                   fallback_reason=DEFAULT_DECLINE, callback_url=context["callback_url"],
                   callback_enabled=script.callback if script else True)


def _open(rail: Any, txn, context: dict[str, Any]):
    if txn.read_driven:
        return None
    payer_id = txn.payer["partyId"]
    if payer_id in SANDBOX_FAILURES:
        return rail._become(txn, FAILED, SANDBOX_FAILURES[payer_id])
    rail._schedule_success(txn)
    return None


def _accepted(ref: str, body: dict[str, Any]) -> str:
    return (f"request-to-pay {ref} accepted (payer {body['payer']['partyId']}, "
            f"{body['amount']} {body['currency']})")


REQUEST_TO_PAY = Kind(
    name="request-to-pay", product=COLLECTION, path=RTP_PATH, table="_txns",
    call_prefix="rtp_", status_prefix="", noun="", parse_body=_parse_rtp_body,
    prepare=_prepare, script_for=_script_for, new=_new, open=_open, accepted=_accepted,
)
