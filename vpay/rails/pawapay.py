"""pawaPay adapter: the ``Rail`` port spoken over pawaPay's Merchant API v2,
an aggregator over many operators' mobile money.

Sources (docs/flows/pawapay.md has the facts with their addresses):

* docs.pawapay.io/v2/api-reference (openapi_v2.yaml): ``POST /v2/deposits``
  with ``{depositId (UUIDv4, ours), amount (a decimal string), currency,
  payer: {type: "MMO", accountDetails: {phoneNumber, provider}}}``, answering
  ``{depositId, status: ACCEPTED | REJECTED | DUPLICATE_IGNORED, created,
  failureReason: {failureCode, failureMessage}}``; "idempotent: a duplicate
  depositId is ignored with DUPLICATE_IGNORED". ``GET
  /v2/deposits/{depositId}`` answers ``{status: FOUND, data: {..., status,
  amount, currency, providerTransactionId, failureReason}}`` or ``{status:
  NOT_FOUND}``. Refunds: ``POST /v2/refunds`` ``{refundId, depositId,
  amount, currency}``, ``GET /v2/refunds/{refundId}``, the same shapes.
* docs.pawapay.io/deposits: ``ACCEPTED``, ``SUBMITTED`` (and v2's
  ``PROCESSING``, ``IN_RECONCILIATION``) are not final; ``COMPLETED`` and
  ``FAILED`` are.
* docs.pawapay.io/v2/docs/failure_codes and /testing_the_api: the failure
  codes; the payer's (``PAYER_NOT_FOUND``, ``PAYMENT_NOT_APPROVED``,
  ``INSUFFICIENT_BALANCE``, ``PAYER_LIMIT_REACHED``, ...) and ours
  (authentication, signatures, a provider or currency we may not use,
  deposits not enabled on our account).

Shape: the rules of the other adapters (``vpay.rails.http``: deadline,
bounded retries, backpressure; never raise for pawaPay's answers; unreadable
is not unreported; configuration is not a decline; the API token is never
logged). ``depositId`` is ``charges.rail_reference``, so a re-send is safe
(``DUPLICATE_IGNORED`` is "already have it", accepted). The provider and
currency of a payer come from configuration (``VPAY_PAWAPAY_PROVIDERS``), by
the payer's country calling code; a pairing not configured is refused at
creation (``payment_problem``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from typing import Any, Callable, Mapping

import requests

from vpay.base.http_deadline import Deadline, new_session
from vpay.money.currency import major_string_to_minor, minor_to_major_string
from vpay.rails.calls import rail_call
from vpay.rails.gate import DEFAULT_MAX_PAUSE_SECONDS, RailGate
from vpay.rails.http import NoAnswer, exchange, json_object, refusal_after_send
from vpay.rails.port import (CallbackIds, ChargeRequest, MalformedCallback, RailError, RailStatus, RefundRequest, tuning_from_env,
                             StatusKind, Submit, SubmitKind, http_url_problem, reported_currency)

log = logging.getLogger("vpay.rails.pawapay")

PENDING_STATUSES = frozenset({"ACCEPTED", "SUBMITTED", "PROCESSING", "IN_RECONCILIATION"})
CONFIGURATION_CODES = frozenset({
    "NO_AUTHENTICATION", "AUTHENTICATION_ERROR", "AUTHORISATION_ERROR", "HTTP_SIGNATURE_ERROR",
    "INVALID_INPUT", "MISSING_PARAMETER", "UNSUPPORTED_PARAMETER", "INVALID_PARAMETER",
    "INVALID_CURRENCY", "INVALID_PROVIDER", "INVALID_COUNTRY", "DEPOSITS_NOT_ALLOWED",
    "REFUNDS_NOT_ALLOWED", "WALLET_LIMIT_REACHED", "DUPLICATE_METADATA_FIELD",
})
"""Failure codes that blame OUR configuration or integration, never the
payer: at creation MISCONFIGURED; on a FAILED deposit ``configuration``."""
TRANSIENT_CODES = frozenset({"PROVIDER_TEMPORARILY_UNAVAILABLE", "UNKNOWN_ERROR"})
"""A refusal at creation that says nothing final: NO_ANSWER (re-sent)."""

_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
_CODE_RE = re.compile(r"[A-Z0-9_]{1,64}")
_ID_RE = re.compile(r"[\x21-\x7e]{1,128}")
_PROVIDER_RE = re.compile(r"[A-Z0-9_]{3,40}")
DEFAULT_TOTAL_TIMEOUT_SECONDS = 20.0

_ENV = {"base_url": "VPAY_PAWAPAY_BASE_URL", "api_token": "VPAY_PAWAPAY_API_TOKEN",
        "providers": "VPAY_PAWAPAY_PROVIDERS"}
_ENV_TIMEOUTS = {"connect_timeout": "VPAY_PAWAPAY_CONNECT_TIMEOUT_SECONDS",
                 "read_timeout": "VPAY_PAWAPAY_READ_TIMEOUT_SECONDS",
                 "total_timeout": "VPAY_PAWAPAY_TOTAL_TIMEOUT_SECONDS"}
_ENV_MAX_PAUSE = "VPAY_PAWAPAY_MAX_PAUSE_SECONDS"


def parse_providers(text: str) -> dict[str, tuple[str, str]]:
    """``VPAY_PAWAPAY_PROVIDERS``: ``PREFIX=PROVIDER:CURRENCY`` pairs
    separated by commas, e.g. ``260=MTN_MOMO_ZMB:ZMW,250=MTN_MOMO_RWA:RWF``:
    a payer whose MSISDN starts with PREFIX (a country calling code, or a
    longer operator prefix) pays through PROVIDER in CURRENCY. Raises
    ``RailError`` naming the bad pair (the text is not secret)."""
    table: dict[str, tuple[str, str]] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        prefix, _, rest = part.partition("=")
        provider, _, currency = rest.partition(":")
        prefix, provider, currency = prefix.strip(), provider.strip().upper(), currency.strip().upper()
        if not (re.fullmatch(r"[0-9]{1,6}", prefix) and _PROVIDER_RE.fullmatch(provider)
                and re.fullmatch(r"[A-Z]{3}", currency)) or prefix in table:
            raise RailError(f"pawaPay adapter: VPAY_PAWAPAY_PROVIDERS entry {part!r} is not "
                            "PREFIX=PROVIDER:CURRENCY (e.g. 260=MTN_MOMO_ZMB:ZMW), or repeats a prefix")
        table[prefix] = (provider, currency)
    if not table:
        raise RailError("pawaPay adapter: VPAY_PAWAPAY_PROVIDERS names no provider")
    return table


class PawaPay:
    """The pawaPay rail (``code = "pawapay"``), implementing ``Rail``:
    deposits collect, refunds give back; thread-safe (no mutable state but
    the gate)."""

    code = "pawapay"
    resend_safe = True  # the same depositId again: DUPLICATE_IGNORED (Rail.resend_safe)

    def __init__(self, base_url: str, api_token: str, providers: Mapping[str, tuple[str, str]] | str,
                 connect_timeout: float = 3.05, read_timeout: float = 10.0,
                 session: requests.Session | None = None, *, sleep: Callable[[float], None] = time.sleep,
                 total_timeout: float = DEFAULT_TOTAL_TIMEOUT_SECONDS,
                 max_pause: float = DEFAULT_MAX_PAUSE_SECONDS) -> None:
        """``base_url`` (``https://api.sandbox.pawapay.io``, ``https://api.pawapay.io``
        or the sandbox double), ``api_token`` (the Bearer token of the
        pawaPay dashboard: a secret), ``providers`` (``parse_providers``'s
        table or its text). Raises ``RailError`` naming a bad setting."""
        if not base_url or not api_token:
            raise RailError("pawaPay adapter: missing setting(s): "
                            + ", ".join(n for n, v in (("base_url", base_url), ("api_token", api_token)) if not v))
        problem = http_url_problem(base_url)
        if problem:
            raise RailError(f"pawaPay adapter: base_url {problem}")
        self.base_url = base_url.rstrip("/")
        self.providers = parse_providers(providers) if isinstance(providers, str) else dict(providers)
        self.timeout = (connect_timeout, read_timeout)
        self.total_timeout = float(total_timeout)
        self.gate = RailGate(self.code, max_pause)
        self._token = api_token
        self._session = session or new_session()
        self._sleep = sleep

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **kwargs: Any) -> "PawaPay":
        """Build from ``VPAY_PAWAPAY_BASE_URL``, ``VPAY_PAWAPAY_API_TOKEN``,
        ``VPAY_PAWAPAY_PROVIDERS`` (required) and the optional
        ``VPAY_PAWAPAY_{CONNECT,READ,TOTAL}_TIMEOUT_SECONDS`` and
        ``VPAY_PAWAPAY_MAX_PAUSE_SECONDS``. Raises ``RailError`` naming
        missing variables (names only)."""
        missing = [name for name in _ENV.values() if not environ.get(name)]
        if missing:
            raise RailError("pawaPay adapter: missing environment variable(s): " + ", ".join(missing))
        problem = http_url_problem(environ[_ENV["base_url"]])
        if problem:
            raise RailError(f"pawaPay adapter: VPAY_PAWAPAY_BASE_URL {problem}")
        tuning_from_env(environ, kwargs, _ENV_TIMEOUTS, _ENV_MAX_PAUSE)
        return cls(**{key: environ[name] for key, name in _ENV.items()}, **kwargs)

    def __repr__(self) -> str:
        return f"PawaPay(base_url={self.base_url!r}, providers={sorted(self.providers)!r})"

    # --- Creation check ----------------------------------------------------

    def provider_for(self, payer: str) -> tuple[str, str] | None:
        """``(provider, currency)`` configured for ``payer`` (the longest
        matching prefix), or ``None``."""
        digits = payer.lstrip("+")
        for prefix in sorted(self.providers, key=len, reverse=True):
            if digits.startswith(prefix):
                return self.providers[prefix]
        return None

    def payment_problem(self, amount: int, currency: str, payer: str) -> tuple[str, str] | None:
        """A payer whose country has no provider configured, or a currency
        that is not that provider's (``port.creation_problem``)."""
        found = self.provider_for(payer)
        if found is None:
            return "payer", ("no pawaPay provider is configured for this payer's country "
                             "(VPAY_PAWAPAY_PROVIDERS)")
        if currency.upper() != found[1]:
            return "currency", (f"pawaPay's provider {found[0]} for this payer takes {found[1]}, "
                                f"not {currency.upper()}")
        return None

    # --- Rail ------------------------------------------------------------------

    @rail_call("request_to_pay")
    def request_to_pay(self, charge: ChargeRequest) -> Submit:
        """``POST /v2/deposits`` with ``depositId`` = ``rail_reference``.

        ACCEPTED and DUPLICATE_IGNORED ("already have it") → ACCEPTED;
        REJECTED with a code in ``CONFIGURATION_CODES`` (or any 401/403) →
        MISCONFIGURED; with ``TRANSIENT_CODES`` → NO_ANSWER; with another
        code (the payer's number, the amount's bounds) → REJECTED; 400 →
        MISCONFIGURED (our request is malformed: our integration, not the
        payer); 5xx, timeouts, unreadable → NO_ANSWER. An unconfigured
        pairing is REJECTED ``UNSUPPORTED_PAIRING`` without a request."""
        found = self.provider_for(charge.payer)
        if found is None or found[1] != charge.currency.upper():
            return Submit(SubmitKind.REJECTED, reason="UNSUPPORTED_PAIRING")
        body = {"depositId": charge.rail_reference,
                "amount": minor_to_major_string(charge.amount, charge.currency),
                "currency": charge.currency.upper(),
                "payer": {"type": "MMO", "accountDetails": {"phoneNumber": charge.payer, "provider": found[0]}}}
        return self._initiate("/v2/deposits", "depositId", charge.rail_reference, body)

    @rail_call("status")
    def status(self, charge: ChargeRequest) -> RailStatus:
        """``GET /v2/deposits/{depositId}``: ``ACCEPTED``, ``SUBMITTED``,
        ``PROCESSING``, ``IN_RECONCILIATION`` → PENDING; ``COMPLETED`` →
        SUCCEEDED with amount, currency and ``providerTransactionId``;
        ``FAILED`` → FAILED with ``failureCode`` (``configuration`` when it
        blames us); ``NOT_FOUND`` → NOT_FOUND (the poll reads it as "no
        answer" for a deposit pawaPay accepted, and re-sends one it never
        confirmed); 401/403 → MISCONFIGURED; the rest → NO_ANSWER."""
        return self._read(f"/v2/deposits/{charge.rail_reference}", "depositId", charge.rail_reference,
                          charge.currency)

    @rail_call("refund")
    def refund(self, refund: RefundRequest) -> Submit:
        """``POST /v2/refunds`` ``{refundId, depositId, amount, currency}``,
        read as a deposit's initiation (``DUPLICATE_IGNORED`` accepted)."""
        body = {"refundId": refund.rail_reference, "depositId": refund.charge_rail_reference,
                "amount": minor_to_major_string(refund.amount, refund.currency),
                "currency": refund.currency.upper()}
        return self._initiate("/v2/refunds", "refundId", refund.rail_reference, body)

    @rail_call("refund_status")
    def refund_status(self, refund: RefundRequest) -> RailStatus:
        """``GET /v2/refunds/{refundId}``, read as a deposit's status."""
        return self._read(f"/v2/refunds/{refund.rail_reference}", "refundId", refund.rail_reference,
                          refund.currency)

    def parse_callback(self, query: Mapping[str, str], body: bytes) -> CallbackIds:
        """Identifiers only: pawaPay's callback URL is set once in its
        dashboard, so the reference is the body's ``depositId`` (ours, a
        UUID), or a ``ref`` query parameter when the URL carries one; the
        body's ``status`` is never read. Raises ``MalformedCallback``."""
        raw = body.encode() if isinstance(body, str) else bytes(body)
        payload: Any = {}
        if raw.strip():
            try:
                payload = json.loads(raw)
            except (ValueError, RecursionError):
                raise MalformedCallback("callback body is not JSON") from None
            if not isinstance(payload, dict):
                raise MalformedCallback("callback body is not a JSON object")
        reference = query.get("ref") if isinstance(query.get("ref"), str) else payload.get("depositId")
        if not isinstance(reference, str) or not _UUID_RE.match(reference.strip()):
            raise MalformedCallback("callback names no depositId UUID")
        hints = {}
        txid = payload.get("providerTransactionId")
        if isinstance(txid, str) and _ID_RE.fullmatch(txid):
            hints["providerTransactionId"] = txid
        return CallbackIds(rail_reference=reference.strip().lower(), hints=hints)

    # --- Transport and answers ------------------------------------------------

    def _send(self, method: str, path: str, body: Any = None) -> requests.Response:
        self.gate.check()
        kwargs: dict[str, Any] = {"headers": {"Authorization": f"Bearer {self._token}"}}
        if body is not None:
            kwargs["json"] = body
        with Deadline(self.total_timeout) as deadline:
            return exchange(self._session, method, f"{self.base_url}{path}", rail=self.code, gate=self.gate,
                            deadline=deadline, timeout=self.timeout, sleep=self._sleep, **kwargs)

    def _initiate(self, path: str, id_key: str, ident: str, body: dict) -> Submit:
        # Retrying the POST is safe: pawaPay is idempotent on our id.
        try:
            response = self._send("POST", path, body)
        except NoAnswer as no:
            log.warning("pawapay %s %s=%s -> %s: %s", path, id_key, ident,
                        "refused for our configuration" if no.misconfigured else "no answer", no.detail)
            return no.submit()
        # a refusal after an earlier attempt that may have got through is no answer
        return refusal_after_send(self._submit_from(response, id_key, ident), response)

    def _submit_from(self, response: requests.Response, id_key: str, ident: str) -> Submit:
        """The port's ``Submit`` for a deposit's or refund's initiation answer."""
        http = response.status_code
        payload = json_object(response.content) or {}
        code = _failure_code(payload)
        if http in (401, 403):
            log.error("pawapay refused our API token or account (HTTP %s, %s): not a decline", http, code)
            return Submit(SubmitKind.MISCONFIGURED, reason=code or f"HTTP_{http}", http_status=http)
        if http == 400:
            return Submit(SubmitKind.MISCONFIGURED, reason=code or "BAD_REQUEST", http_status=http)
        if http != 200:
            return Submit(SubmitKind.NO_ANSWER, reason=code or f"HTTP_{http}", http_status=http)
        status = payload.get("status")
        if payload.get(id_key) not in (None, ident):
            return Submit(SubmitKind.NO_ANSWER, reason="OTHER_ID", http_status=http)
        if status in ("ACCEPTED", "DUPLICATE_IGNORED"):
            return Submit(SubmitKind.ACCEPTED, reason=None if status == "ACCEPTED" else status, http_status=http)
        if status == "REJECTED":
            if code in CONFIGURATION_CODES:
                log.error("pawapay rejected the request for our configuration (%s): not a decline", code)
                return Submit(SubmitKind.MISCONFIGURED, reason=code, http_status=http)
            if code in TRANSIENT_CODES or code is None:
                return Submit(SubmitKind.NO_ANSWER, reason=code or "REJECTED_WITHOUT_CODE", http_status=http)
            return Submit(SubmitKind.REJECTED, reason=code, http_status=http)
        return Submit(SubmitKind.NO_ANSWER, reason="UNKNOWN_STATUS", http_status=http)

    def _read(self, path: str, id_key: str, ident: str, currency: str) -> RailStatus:
        try:
            response = self._send("GET", path)
        except NoAnswer as no:
            log.warning("pawapay GET %s -> %s: %s", path,
                        "refused for our configuration" if no.misconfigured else "no answer", no.detail)
            return no.status()
        http = response.status_code
        payload = json_object(response.content)
        if http in (401, 403):
            return RailStatus(StatusKind.MISCONFIGURED, reason=_failure_code(payload or {}) or f"HTTP_{http}",
                              http_status=http, detail=f"HTTP {http}: our API token or account refused")
        if http == 404:
            return RailStatus(StatusKind.NOT_FOUND, reason="NOT_FOUND", http_status=http)
        if http != 200 or payload is None:
            return RailStatus(StatusKind.NO_ANSWER, http_status=http, detail=f"HTTP {http} from the status read")
        if payload.get("status") == "NOT_FOUND":
            return RailStatus(StatusKind.NOT_FOUND, reason="NOT_FOUND", http_status=http)
        data = payload.get("data")
        if payload.get("status") != "FOUND" or not isinstance(data, dict) or data.get(id_key) != ident:
            return RailStatus(StatusKind.NO_ANSWER, http_status=http, detail="status body is not a FOUND answer for ours")
        return _status_from_data(data, http, currency)


def _failure_code(payload: Mapping[str, Any]) -> str | None:
    reason = payload.get("failureReason") if isinstance(payload, Mapping) else None
    code = reason.get("failureCode") if isinstance(reason, Mapping) else None
    return code if isinstance(code, str) and _CODE_RE.fullmatch(code) else None


def _status_from_data(data: dict, http: int, currency: str) -> RailStatus:
    """A FOUND deposit's (or refund's) ``data`` as a ``RailStatus``; fields
    present but unreadable on a terminal status are listed, never dropped."""
    status = data.get("status")
    if status in PENDING_STATUSES:
        return RailStatus(StatusKind.PENDING, reason=status, http_status=http)
    if status not in ("COMPLETED", "FAILED"):
        shown = status if isinstance(status, str) and _CODE_RE.fullmatch(status) else "unreadable"
        return RailStatus(StatusKind.NO_ANSWER, http_status=http, detail=f"unknown status {shown}")
    unreadable: list[str] = []
    reported = reported_currency(data, unreadable)
    amount = None
    if "amount" in data:
        amount = major_string_to_minor(data["amount"], reported or currency)
        if amount is None:
            unreadable.append("amount")
    detail = f"unreadable: {', '.join(unreadable)}" if unreadable else None
    if status == "COMPLETED":
        txid = None
        if "providerTransactionId" in data:
            raw = data["providerTransactionId"]
            txid = raw.strip() if isinstance(raw, str) and _ID_RE.fullmatch(raw.strip()) else None
            if txid is None:
                unreadable.append("financial_transaction_id")
                detail = f"unreadable: {', '.join(unreadable)}"
        return RailStatus(StatusKind.SUCCEEDED, http_status=http, financial_transaction_id=txid, amount=amount,
                          currency=reported, unreadable=tuple(unreadable), detail=detail)
    code = _failure_code(data)
    if "failureReason" in data and code is None:
        unreadable.append("reason")
        detail = f"unreadable: {', '.join(unreadable)}"
    return RailStatus(StatusKind.FAILED, reason=code, http_status=http, amount=amount, currency=reported,
                      unreadable=tuple(unreadable), detail=detail, configuration=code in CONFIGURATION_CODES)
