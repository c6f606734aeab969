"""A local test/demo double of pawaPay's Merchant API v2 (deposits and
refunds), with scripted payers: ``PawaPaySandbox``.

The shapes are pawaPay's published OpenAPI v2 as recorded in
docs/flows/pawapay.md (with sources)::

    POST {base}/v2/deposits           Bearer <api token>
         {depositId, amount: "15.00", currency, payer: {type: "MMO",
          accountDetails: {phoneNumber, provider}}}
         200 {depositId, status: ACCEPTED | REJECTED | DUPLICATE_IGNORED, created,
              failureReason?: {failureCode, failureMessage}}
    GET  {base}/v2/deposits/{depositId}
         200 {status: "FOUND", data: {depositId, status, amount, currency, country,
              payer, created, providerTransactionId?, failureReason?}}
         200 {status: "NOT_FOUND"}
    POST {base}/v2/refunds            {refundId, depositId, amount, currency}
    GET  {base}/v2/refunds/{refundId}  (the same shapes, ``refundId``)
    A missing or wrong token: 401 NO_AUTHENTICATION / 403 AUTHENTICATION_ERROR.

Scripted payers (``script_payer(msisdn, outcome, in_flight=0,
lag_reads=0)`` or ``set_default``): ``approve`` (COMPLETED), ``decline``
(FAILED ``INSUFFICIENT_BALANCE``), ``expire`` (FAILED
``PAYMENT_NOT_APPROVED``: the payer let the prompt lapse), ``never``
(SUBMITTED for ever, as pawaPay's "no callback" test numbers);
``in_flight=N``: N status reads see ACCEPTED/SUBMITTED first;
``lag_reads=N``: the first N reads of an accepted deposit answer NOT_FOUND
(pawaPay's read lagging its write). ``providers``: provider → (currency,
country prefix) the double accepts (any other: REJECTED ``INVALID_PROVIDER``,
a currency not the provider's: ``INVALID_CURRENCY``).
``lose_next_answers(*codes)``: creations recorded but answered with these
HTTP codes (the answer lost; a re-send is ``DUPLICATE_IGNORED``). Refunds of a COMPLETED
deposit complete after ``refund_in_flight`` reads.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from vpay.sandbox.server import Answer, SandboxHandler, ServedDouble

log = logging.getLogger("vpay.sandbox.pawapay")

DEFAULT_TOKEN = "pawapay-sandbox-token"
DEFAULT_PROVIDERS = {"MTN_MOMO_ZMB": ("ZMW", "260"), "MTN_MOMO_RWA": ("RWF", "250"),
                     "MPESA_KEN": ("KES", "254"), "AIRTEL_OAPI_UGA": ("UGX", "256")}
OUTCOMES = {"approve": ("COMPLETED", None), "decline": ("FAILED", "INSUFFICIENT_BALANCE"),
            "expire": ("FAILED", "PAYMENT_NOT_APPROVED"), "never": ("SUBMITTED", None)}
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
_MAX_BODY = 64 * 1024


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _failure(status: int, code: str, message: str) -> Answer:
    return Answer(status, {"status": "REJECTED", "failureReason": {"failureCode": code, "failureMessage": message}})


@dataclass
class _Txn:
    kind: str          # "deposit" | "refund"
    ident: str
    body: dict
    outcome: str
    in_flight: int
    lag_reads: int = 0
    reads: int = 0
    created: str = field(default_factory=_now)
    provider_txn: str = field(default_factory=lambda: secrets.token_hex(5).upper())

    def state(self) -> tuple[str, str | None]:
        if self.reads <= self.in_flight:
            return ("ACCEPTED" if self.reads <= 1 else "SUBMITTED"), None
        return OUTCOMES[self.outcome]

    def view(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.ident, "outcome": self.outcome, "reads": self.reads,
                "in_flight": self.in_flight, "body": self.body, "provider_transaction_id": self.provider_txn}


class _Handler(SandboxHandler):
    server_version = "vpay-pawapay-sandbox/1.0"
    http_log = log
    log_label = "pawapay sandbox"

    max_body = _MAX_BODY

    def bad_length(self) -> Answer:
        return _failure(400, "INVALID_INPUT", "Content-Length missing, invalid or too large")

    def internal_error(self) -> Answer:
        return _failure(500, "UNKNOWN_ERROR", "Internal error")


class PawaPaySandbox(ServedDouble):
    """The pawaPay double (module docstring). ``env(providers=...)`` gives the
    ``VPAY_PAWAPAY_*`` that point vpay's adapter at it."""

    label = "pawaPay sandbox"
    thread_prefix = "pawapay-sandbox"
    lifecycle_log = log

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, api_token: str = DEFAULT_TOKEN,
                 providers: dict[str, tuple[str, str]] | None = None, refund_in_flight: int = 1) -> None:
        self.api_token = api_token
        self.providers = dict(providers or DEFAULT_PROVIDERS)
        self.refund_in_flight = refund_in_flight
        self._lock = threading.Lock()
        self._txns: dict[tuple[str, str], _Txn] = {}
        self._scripts: dict[str, tuple[str, int, int]] = {}
        self._default: tuple[str, int, int] = ("approve", 0, 0)
        self._lost: list[int] = []
        self._log: deque[dict[str, Any]] = deque(maxlen=100_000)
        self._bind(host, port, _Handler)

    def env(self, **extra: str) -> dict[str, str]:
        """``VPAY_PAWAPAY_*`` for vpay's adapter: every provider the double
        knows, by its country prefix."""
        providers = ",".join(f"{prefix}={name}:{currency}" for name, (currency, prefix) in self.providers.items())
        return {"VPAY_PAWAPAY_BASE_URL": self.url, "VPAY_PAWAPAY_API_TOKEN": self.api_token,
                "VPAY_PAWAPAY_PROVIDERS": providers, **extra}

    # --- control -------------------------------------------------------------

    def script_payer(self, msisdn: str, outcome: str, in_flight: int = 0, lag_reads: int = 0) -> None:
        """Every later deposit from ``msisdn`` follows this script (module
        docstring). Raises ``ValueError`` for an unknown outcome."""
        self._scripts[msisdn] = self._check(outcome, in_flight, lag_reads)

    def set_default(self, outcome: str, in_flight: int = 0, lag_reads: int = 0) -> None:
        self._default = self._check(outcome, in_flight, lag_reads)

    @staticmethod
    def _check(outcome: str, in_flight: int, lag_reads: int) -> tuple[str, int, int]:
        if outcome not in OUTCOMES or min(in_flight, lag_reads) < 0:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}; counts >= 0")
        return outcome, in_flight, lag_reads

    def lose_next_answers(self, *codes: int) -> None:
        """The next deposit or refund creations are recorded (pawaPay took
        them) but answered with these HTTP codes: the caller never hears,
        and a re-send with the same id meets ``DUPLICATE_IGNORED``."""
        with self._lock:
            self._lost.extend(codes)

    def reset(self) -> None:
        with self._lock:
            self._lost.clear()
            self._txns.clear()
            self._scripts.clear()
            self._default = ("approve", 0, 0)
            self._log.clear()

    def deposit(self, deposit_id: str) -> dict[str, Any] | None:
        with self._lock:
            txn = self._txns.get(("deposit", deposit_id.lower()))
            return txn.view() if txn else None

    def refund(self, refund_id: str) -> dict[str, Any] | None:
        with self._lock:
            txn = self._txns.get(("refund", refund_id.lower()))
            return txn.view() if txn else None

    def count(self, method: str | None = None, path_prefix: str | None = None, ident: str | None = None) -> int:
        with self._lock:
            return sum(1 for e in self._log if (method is None or e["method"] == method)
                       and (path_prefix is None or e["path"].startswith(path_prefix))
                       and (ident is None or e.get("id") == ident.lower()))

    def requests_log(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._log)

    # --- HTTP --------------------------------------------------------------------

    def answer(self, method: str, path: str, headers: Any, body: bytes) -> Answer:
        entry: dict[str, Any] = {"method": method, "path": path, "at": time.time()}
        resp = self._route(method, path, headers, body, entry)
        entry["status_code"] = resp.status
        with self._lock:
            self._log.append(entry)
        return resp

    def _route(self, method: str, path: str, headers: Any, body: bytes, entry: dict) -> Answer:
        auth = headers.get("Authorization") or ""
        if not auth.startswith("Bearer "):
            return _failure(401, "NO_AUTHENTICATION", "No API token in the request headers")
        if auth.removeprefix("Bearer ") != self.api_token:
            return _failure(403, "AUTHENTICATION_ERROR", "The API token is not valid")
        for kind, base in (("deposit", "/v2/deposits"), ("refund", "/v2/refunds")):
            if method == "POST" and path == base:
                return self._create(kind, body, entry)
            if method == "GET" and path.startswith(base + "/"):
                return self._read(kind, path[len(base) + 1:], entry)
        return Answer(404, {"failureReason": {"failureCode": "NOT_FOUND", "failureMessage": "no such route"}})

    def _create(self, kind: str, body: bytes, entry: dict) -> Answer:
        try:
            req = json.loads(body)
        except ValueError:
            return _failure(400, "INVALID_INPUT", "We were unable to parse the payload")
        if not isinstance(req, dict):
            return _failure(400, "INVALID_INPUT", "We were unable to parse the payload")
        id_key = f"{kind}Id"
        ident = req.get(id_key)
        if not isinstance(ident, str) or not _UUID.fullmatch(ident):
            return _failure(400, "INVALID_PARAMETER", f"{id_key} must be a UUID")
        ident = ident.lower()
        entry["id"] = ident
        try:
            amount = Decimal(req.get("amount"))
        except (TypeError, InvalidOperation):
            return _failure(400, "INVALID_PARAMETER", "amount must be a decimal string")
        if not isinstance(req.get("amount"), str) or amount <= 0:
            return _failure(400, "INVALID_PARAMETER", "amount must be a positive decimal string")
        with self._lock:
            if (kind, ident) in self._txns:
                return Answer(200, {id_key: ident, "status": "DUPLICATE_IGNORED", "created": _now()})
        if kind == "deposit":
            payer = req.get("payer") or {}
            details = payer.get("accountDetails") if isinstance(payer, dict) else None
            if not isinstance(details, dict) or payer.get("type") != "MMO":
                return _failure(400, "MISSING_PARAMETER", "payer.type MMO and payer.accountDetails are required")
            provider, phone = details.get("provider"), str(details.get("phoneNumber") or "")
            if provider not in self.providers:
                return Answer(200, {id_key: ident, "status": "REJECTED", "failureReason": {
                    "failureCode": "INVALID_PROVIDER", "failureMessage": "The provider is not valid"}})
            currency, prefix = self.providers[provider]
            if req.get("currency") != currency:
                return Answer(200, {id_key: ident, "status": "REJECTED", "failureReason": {
                    "failureCode": "INVALID_CURRENCY", "failureMessage": "The currency is not supported"}})
            if not re.fullmatch(rf"{prefix}[0-9]{{6,12}}", phone):
                return Answer(200, {id_key: ident, "status": "REJECTED", "failureReason": {
                    "failureCode": "INVALID_PHONE_NUMBER", "failureMessage": "Not in the MSISDN format"}})
            outcome, in_flight, lag = self._scripts.get(phone, self._default)
        else:
            deposit_id = str(req.get("depositId") or "").lower()
            with self._lock:
                deposit = self._txns.get(("deposit", deposit_id))
            if deposit is None or deposit.state()[0] != "COMPLETED":
                return Answer(200, {id_key: ident, "status": "REJECTED", "failureReason": {
                    "failureCode": "DEPOSIT_NOT_FOUND", "failureMessage": "No completed deposit to refund"}})
            if amount > Decimal(deposit.body["amount"]) or req.get("currency") != deposit.body["currency"]:
                return Answer(200, {id_key: ident, "status": "REJECTED", "failureReason": {
                    "failureCode": "AMOUNT_OUT_OF_BOUNDS", "failureMessage": "More than the deposit"}})
            outcome, in_flight, lag = "approve", self.refund_in_flight, 0
        with self._lock:
            self._txns[(kind, ident)] = _Txn(kind, ident, req, outcome, in_flight, lag)
            lost = self._lost.pop(0) if self._lost else None
        if lost is not None:
            return Answer(lost, {"failureReason": {"failureCode": "UNKNOWN_ERROR", "failureMessage": "lost"}})
        return Answer(200, {id_key: ident, "status": "ACCEPTED", "created": _now()})

    def _read(self, kind: str, ident: str, entry: dict) -> Answer:
        ident = ident.lower()
        entry["id"] = ident
        with self._lock:
            txn = self._txns.get((kind, ident))
            if txn is None:
                return Answer(200, {"status": "NOT_FOUND", "data": None})
            if txn.lag_reads > 0:
                txn.lag_reads -= 1
                return Answer(200, {"status": "NOT_FOUND", "data": None})
            txn.reads += 1
            status, failure = txn.state()
            data = {f"{kind}Id": ident, "status": status, "amount": txn.body["amount"],
                    "currency": txn.body["currency"], "created": txn.created}
            if kind == "deposit":
                data |= {"country": "", "payer": txn.body["payer"]}
            else:
                data["depositId"] = txn.body["depositId"]
            if status == "COMPLETED":
                data["providerTransactionId"] = txn.provider_txn
            if failure:
                data["failureReason"] = {"failureCode": failure, "failureMessage": failure.replace("_", " ").lower()}
            return Answer(200, {"status": "FOUND", "data": data})
