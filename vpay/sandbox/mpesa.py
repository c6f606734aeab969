"""A local test/demo double of M-Pesa Daraja's STK Push ("M-Pesa Express")
and STK Push Query, with scripted payers: ``MpesaSandbox``.

The shapes are Daraja's as recorded in docs/flows/mpesa.md (with sources)::

    GET  {base}/oauth/v1/generate?grant_type=client_credentials   Basic key:secret
         200 {"access_token", "expires_in": "3599"}
    POST {base}/mpesa/stkpush/v1/processrequest                    Bearer
         200 {MerchantRequestID, CheckoutRequestID, ResponseCode: "0",
              ResponseDescription, CustomerMessage}
         400 {requestId, errorCode: "400.002.02", errorMessage: "Bad Request - Invalid <Field>"}
    POST {base}/mpesa/stkpushquery/v1/query                        Bearer
         200 {ResponseCode: "0", ResponseDescription, MerchantRequestID,
              CheckoutRequestID, ResultCode, ResultDesc}
         500 {requestId, errorCode: "500.001.1001",
              errorMessage: "The transaction is being processed"}   (in flight)
    A token that is unknown or expired: 401 {requestId, errorCode: "404.001.03",
    errorMessage: "Invalid Access Token"}.

Scripted payers (``script_payer(msisdn, outcome, in_flight=0)``, or
``set_default``): ``approve`` (ResultCode 0), ``decline`` (1032, cancelled by
the payer), ``expire`` (1037, unreachable; ``timeout`` is 1019),
``insufficient`` (1), ``wrong_pin`` (2001), ``never`` (in flight for ever);
``in_flight=N`` answers 500.001.1001 to the first N queries first. The
outcome is fixed when the push is made. ``expire_tokens()`` revokes every
token before its ``expires_in`` (Daraja does); ``fail_next(*codes)`` answers
the next calls (push or query) with Daraja's busy/limit errors (500
``500.003.02``, 429 spike arrest). ``lose_next_answers(*codes)`` takes the
next pushes but answers them with these codes (the CheckoutRequestID never
reaches the caller). ``notify(checkout_or_ref)`` posts the STK callback to
the push's CallBackURL (a hint: vpay reads ``ref`` and, as an identifier
only, ``CheckoutRequestID``).
Inspection: ``pushes()``, ``push(checkout_or_ref)``, ``count(path_suffix)``.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import re
import secrets
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from vpay.sandbox.server import Answer, SandboxHandler, ServedDouble

log = logging.getLogger("vpay.sandbox.mpesa")

DEFAULT_CONSUMER_KEY = "mpesa-sandbox-key"
DEFAULT_CONSUMER_SECRET = "mpesa-sandbox-secret"
DEFAULT_SHORTCODE = "174379"
DEFAULT_PASSKEY = "mpesa-sandbox-passkey"
IN_FLIGHT = "500.001.1001"
OUTCOMES = {"approve": ("0", "The service request is processed successfully."),
            "decline": ("1032", "Request cancelled by user"),
            "expire": ("1037", "DS timeout user cannot be reached"),
            "timeout": ("1019", "Transaction has expired"),
            "insufficient": ("1", "The balance is insufficient for the transaction"),
            "wrong_pin": ("2001", "The initiator information is invalid."),
            "never": (None, None)}
_MAX_BODY = 64 * 1024


def _error(status: int, code: str, message: str) -> Answer:
    return Answer(status, {"requestId": secrets.token_hex(6), "errorCode": code, "errorMessage": message})


@dataclass
class _Push:
    checkout: str
    merchant: str
    reference: str | None
    msisdn: str
    amount: int
    callback_url: str
    account_reference: str
    outcome: str
    in_flight: int
    queries: int = 0
    receipt: str = field(default_factory=lambda: "S" + secrets.token_hex(5).upper())

    def view(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("checkout", "merchant", "reference", "msisdn", "amount",
                                              "callback_url", "account_reference", "outcome", "in_flight",
                                              "queries", "receipt")}


class _Handler(SandboxHandler):
    server_version = "vpay-mpesa-sandbox/1.0"
    http_log = log
    log_label = "mpesa sandbox"

    max_body = _MAX_BODY

    def bad_length(self) -> Answer:
        return _error(400, "400.002.05", "Invalid Request Payload")

    def internal_error(self) -> Answer:
        return _error(500, "500.000.000", "Internal Server Error")


class MpesaSandbox(ServedDouble):
    """The Daraja double (module docstring). ``env(callback_url)`` gives the
    ``VPAY_MPESA_*`` that point vpay's adapter at it."""

    label = "M-Pesa sandbox"
    thread_prefix = "mpesa-sandbox"
    lifecycle_log = log

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, consumer_key: str = DEFAULT_CONSUMER_KEY,
                 consumer_secret: str = DEFAULT_CONSUMER_SECRET, shortcode: str = DEFAULT_SHORTCODE,
                 passkey: str = DEFAULT_PASSKEY, token_ttl_seconds: int = 3599) -> None:
        self.consumer_key, self.consumer_secret = consumer_key, consumer_secret
        self.shortcode, self.passkey = shortcode, passkey
        self.token_ttl_seconds = token_ttl_seconds
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}
        self._pushes: dict[str, _Push] = {}
        self._scripts: dict[str, tuple[str, int]] = {}
        self._default: tuple[str, int] = ("approve", 0)
        self._failures: list[int] = []
        self._lost: list[int] = []
        self._log: deque[dict[str, Any]] = deque(maxlen=100_000)
        self._ids = itertools.count(1)
        self._bind(host, port, _Handler)

    def env(self, callback_url: str, **extra: str) -> dict[str, str]:
        """``VPAY_MPESA_*`` for vpay's adapter; ``callback_url`` is the API's
        ``…/provider/mpesa/callback``."""
        return {"VPAY_MPESA_BASE_URL": self.url, "VPAY_MPESA_CONSUMER_KEY": self.consumer_key,
                "VPAY_MPESA_CONSUMER_SECRET": self.consumer_secret, "VPAY_MPESA_SHORTCODE": self.shortcode,
                "VPAY_MPESA_PASSKEY": self.passkey, "VPAY_MPESA_CALLBACK_URL": callback_url, **extra}

    # --- control -------------------------------------------------------------

    def script_payer(self, msisdn: str, outcome: str, in_flight: int = 0) -> None:
        """Every later push to ``msisdn`` ends with ``outcome`` after
        ``in_flight`` in-flight answers. Raises ``ValueError`` for an unknown
        outcome or a negative count."""
        self._scripts[msisdn] = self._check(outcome, in_flight)

    def set_default(self, outcome: str, in_flight: int = 0) -> None:
        """The script of payers without one (default ``approve``, 0)."""
        self._default = self._check(outcome, in_flight)

    @staticmethod
    def _check(outcome: str, in_flight: int) -> tuple[str, int]:
        if outcome not in OUTCOMES or not isinstance(in_flight, int) or in_flight < 0:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)} and in_flight >= 0")
        return outcome, in_flight

    def expire_tokens(self) -> None:
        """Revoke every issued token now (before its ``expires_in``)."""
        with self._lock:
            self._tokens.clear()

    def fail_next(self, *codes: int) -> None:
        """The next push or query calls answer these HTTP codes (500: system
        busy ``500.003.02``; 429: spike arrest) without doing anything."""
        with self._lock:
            self._failures.extend(codes)

    def lose_next_answers(self, *codes: int) -> None:
        """The next pushes are taken (the prompt goes to the payer, the
        push is recorded with its CheckoutRequestID) but answered with these
        HTTP codes and no CheckoutRequestID: the caller never learns it
        (docs/flows/mpesa.md, "A lost answer"). ``notify`` still names it."""
        with self._lock:
            self._lost.extend(codes)

    def reset(self) -> None:
        """Forget pushes, scripts, failures and the log (tokens stay valid)."""
        with self._lock:
            self._pushes.clear()
            self._scripts.clear()
            self._default = ("approve", 0)
            self._failures.clear()
            self._lost.clear()
            self._log.clear()

    def pushes(self) -> list[dict[str, Any]]:
        with self._lock:
            return [p.view() for p in self._pushes.values()]

    def push(self, checkout_or_ref: str) -> dict[str, Any] | None:
        """A push by CheckoutRequestID or by vpay's reference (the ``ref`` of
        its CallBackURL); the latest one for a reference pushed twice."""
        with self._lock:
            found = [p for p in self._pushes.values() if checkout_or_ref in (p.checkout, p.reference)]
            return found[-1].view() if found else None

    def count(self, path_suffix: str | None = None, reference: str | None = None) -> int:
        """Requests logged whose path ends with ``path_suffix`` (and that
        name ``reference``'s pushes, when given)."""
        with self._lock:
            checkouts = {p.checkout for p in self._pushes.values() if p.reference == reference}
            return sum(1 for e in self._log if (path_suffix is None or e["path"].endswith(path_suffix))
                       and (reference is None or e.get("reference") == reference or e.get("checkout") in checkouts))

    def requests_log(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._log)

    def notify(self, checkout_or_ref: str) -> int | None:
        """POST Daraja's STK callback for a push to its CallBackURL; answers
        the HTTP status, or ``None`` when it could not be sent."""
        push = self.push(checkout_or_ref)
        if push is None:
            return None
        code, desc = OUTCOMES[push["outcome"]]
        body = {"Body": {"stkCallback": {"MerchantRequestID": push["merchant"], "CheckoutRequestID": push["checkout"],
                                         "ResultCode": int(code or 0), "ResultDesc": desc or ""}}}
        request = urllib.request.Request(push["callback_url"], data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:  # noqa: S310 (a test double)
                return resp.status
        except OSError:
            return None

    def statement_csv(self) -> bytes:
        """The double's organisation statement: one line per push whose
        outcome has been read (a query answered it), in the columns of
        vpay's ``mpesa`` statement profile, times in Kenya time. Failed
        pushes are listed as ``Failed`` with no money in."""
        import csv
        import io
        kenya = time.gmtime(time.time() + 3 * 3600)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(["Receipt No.", "Completion Time", "Initiation Time", "Details", "Transaction Status",
                         "Paid In", "Withdrawn", "Balance", "Reason Type", "A/C No."])
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", kenya)
        with self._lock:
            for push in self._pushes.values():
                code, desc = OUTCOMES[push.outcome]
                if code is None or push.queries <= push.in_flight:
                    continue
                ok = code == "0"
                writer.writerow([push.receipt, stamp, stamp, f"Pay Bill from {push.msisdn}",
                                 "Completed" if ok else "Failed", f"{push.amount}.00" if ok else "", "", "",
                                 "Pay Bill Online" if ok else desc, push.account_reference])
        return out.getvalue().encode()

    # --- HTTP --------------------------------------------------------------------

    def answer(self, method: str, path: str, headers: Any, body: bytes) -> Answer:
        entry: dict[str, Any] = {"method": method, "path": path, "at": time.time()}
        try:
            resp = self._route(method, path, headers, body, entry)
        finally:
            with self._lock:
                self._log.append(entry)
        entry["status_code"] = resp.status
        return resp

    def _route(self, method: str, path: str, headers: Any, body: bytes, entry: dict) -> Answer:
        if method == "GET" and path == "/oauth/v1/generate":
            return self._token(headers)
        if method != "POST" or path not in ("/mpesa/stkpush/v1/processrequest", "/mpesa/stkpushquery/v1/query"):
            return _error(404, "404.001.01", "Resource not found")
        token = (headers.get("Authorization") or "").removeprefix("Bearer ")
        with self._lock:
            if self._tokens.get(token, 0) < time.monotonic():
                return _error(401, "404.001.03", "Invalid Access Token")
            failure = self._failures.pop(0) if self._failures else None
        if failure == 429:
            return Answer(429, {"fault": {"faultstring": "Spike arrest violation"}})
        if failure is not None:
            return _error(failure, "500.003.02", "System is busy. Please try again in few minutes.")
        try:
            req = json.loads(body)
        except ValueError:
            req = None
        if not isinstance(req, dict):
            return _error(400, "400.002.05", "Invalid Request Payload")
        problem = self._credentials_problem(req)
        if problem:
            return _error(400, "400.002.02", f"Bad Request - Invalid {problem}")
        if path.endswith("/processrequest"):
            return self._push(req, entry)
        return self._query(req, entry)

    def _token(self, headers: Any) -> Answer:
        expected = "Basic " + base64.b64encode(f"{self.consumer_key}:{self.consumer_secret}".encode()).decode()
        if headers.get("Authorization") != expected:
            return _error(400, "400.008.01", "Invalid Authentication passed")
        token = secrets.token_urlsafe(18)
        with self._lock:
            self._tokens[token] = time.monotonic() + self.token_ttl_seconds
        return Answer(200, {"access_token": token, "expires_in": str(self.token_ttl_seconds)})

    def _credentials_problem(self, req: dict) -> str | None:
        if str(req.get("BusinessShortCode")) != self.shortcode:
            return "BusinessShortCode"
        stamp = req.get("Timestamp")
        if not isinstance(stamp, str) or not re.fullmatch(r"[0-9]{14}", stamp):
            return "Timestamp"
        expected = base64.b64encode(f"{self.shortcode}{self.passkey}{stamp}".encode()).decode()
        if req.get("Password") != expected:
            return "Password"
        return None

    def _push(self, req: dict, entry: dict) -> Answer:
        for name, ok in (
            ("TransactionType", req.get("TransactionType") in ("CustomerPayBillOnline", "CustomerBuyGoodsOnline")),
            ("Amount", isinstance(req.get("Amount"), int) and not isinstance(req.get("Amount"), bool)
             and req.get("Amount") > 0),
            ("PhoneNumber", isinstance(req.get("PhoneNumber"), str) and re.fullmatch(r"2547[0-9]{8}", req["PhoneNumber"])
             is not None and req.get("PartyA") == req.get("PhoneNumber")),
            ("PartyB", str(req.get("PartyB") or "").isdigit()),
            ("CallBackURL", isinstance(req.get("CallBackURL"), str)
             and urlsplit(req["CallBackURL"]).scheme in ("http", "https")),
            ("AccountReference", isinstance(req.get("AccountReference"), str) and 0 < len(req["AccountReference"]) <= 12),
            ("TransactionDesc", isinstance(req.get("TransactionDesc"), str) and 0 < len(req["TransactionDesc"]) <= 13),
        ):
            if not ok:
                return _error(400, "400.002.02", f"Bad Request - Invalid {name}")
        reference = (parse_qs(urlsplit(req["CallBackURL"]).query).get("ref") or [None])[0]
        outcome, in_flight = self._scripts.get(req["PhoneNumber"], self._default)
        n = next(self._ids)
        push = _Push(checkout=f"ws_CO_{time.strftime('%d%m%Y%H%M%S')}{n:06d}", merchant=f"{29115 + n}-{n}-1",
                     reference=reference, msisdn=req["PhoneNumber"], amount=req["Amount"],
                     callback_url=req["CallBackURL"], account_reference=req["AccountReference"],
                     outcome=outcome, in_flight=in_flight)
        with self._lock:
            self._pushes[push.checkout] = push
            lost = self._lost.pop(0) if self._lost else None
        entry.update(reference=reference, checkout=push.checkout)
        if lost is not None:
            return _error(lost, "500.003.02", "System is busy. Please try again in few minutes.")
        return Answer(200, {"MerchantRequestID": push.merchant, "CheckoutRequestID": push.checkout,
                            "ResponseCode": "0", "ResponseDescription": "Success. Request accepted for processing",
                            "CustomerMessage": "Success. Request accepted for processing"})

    def _query(self, req: dict, entry: dict) -> Answer:
        checkout = req.get("CheckoutRequestID")
        with self._lock:
            push = self._pushes.get(checkout) if isinstance(checkout, str) else None
            if push is None:
                return _error(400, "400.002.02", "Bad Request - Invalid CheckoutRequestID")
            entry.update(reference=push.reference, checkout=push.checkout)
            push.queries += 1
            code, desc = OUTCOMES[push.outcome]
            if push.queries <= push.in_flight or code is None:
                return _error(500, IN_FLIGHT, "The transaction is being processed")
            return Answer(200, {"ResponseCode": "0",
                                "ResponseDescription": "The service request has been accepted successsfully",
                                "MerchantRequestID": push.merchant, "CheckoutRequestID": push.checkout,
                                "ResultCode": code, "ResultDesc": desc})
