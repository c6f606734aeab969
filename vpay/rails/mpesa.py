"""M-Pesa Daraja adapter (Safaricom, Lipa Na M-Pesa Online / "STK Push"):
the ``Rail`` port spoken over Daraja's HTTP API.

Sources (docs/flows/mpesa.md has the facts with their addresses):

* Daraja "M-Pesa Express" (developer.safaricom.co.ke/apis/MpesaExpressSimulate,
  the copy in JacksCodeVault/mpesa-daraja-mcp): ``POST
  /mpesa/stkpush/v1/processrequest`` with ``BusinessShortCode, Password,
  Timestamp, TransactionType, Amount, PartyA, PartyB, PhoneNumber,
  CallBackURL, AccountReference, TransactionDesc``; the answer carries
  ``MerchantRequestID, CheckoutRequestID, ResponseCode ("0" accepted),
  ResponseDescription, CustomerMessage``. ``Password`` is
  base64(shortcode + passkey + timestamp), ``Timestamp`` YYYYMMDDHHMMSS.
* Daraja "M-Pesa Express Query": ``POST /mpesa/stkpushquery/v1/query`` with
  ``BusinessShortCode, Password, Timestamp, CheckoutRequestID``; the answer
  carries ``ResponseCode, ResponseDescription, MerchantRequestID,
  CheckoutRequestID, ResultCode, ResultDesc`` (jeffnyauke/mpesa-sdk-kotlin's
  ``StkPushQueryResponse``): ResultCode 0 success, 1032 cancelled by the
  payer, 1037 payer unreachable, 1 insufficient funds, 2001 wrong PIN, 1019
  expired (paylod.dev/docs/errors; ronnyabuto/daraja-error-codes). While the
  payment is in flight the query answers an error body ``{requestId,
  errorCode: "500.001.1001", errorMessage: "The transaction is being
  processed"}``: PENDING, never a failure.
* OAuth: ``GET /oauth/v1/generate?grant_type=client_credentials`` with Basic
  consumer key:secret, answering ``{access_token, expires_in}`` (seconds, a
  string).

Shape of the adapter (the rules of ``vpay.rails.mtn`` and ``orange``; the
transport, retries, backpressure and "no answer" are ``vpay.rails.http``):

* The rail assigns the reference: ``CheckoutRequestID`` is the key of the
  status read. ``request_to_pay`` hands it back in ``Submit.rail_data``
  (``checkout_request_id``), which ``payments.submit`` stores in
  ``charges.rail_data``; ``charges.rail_reference`` stays the UUID we chose,
  sent as ``ref`` in the CallBackURL (and its first 12 hex digits as
  ``AccountReference``, Daraja's limit), so the callback route and the
  statement find the charge. A charge with no stored CheckoutRequestID is
  NOT_FOUND without asking (the init's answer never reached us).
* Amounts are whole KES on the wire: a charge in another currency, or of a
  number of cents that is not whole shillings, is refused at creation
  (``payment_problem``) and never sent. Payers are ``2547XXXXXXXX``.
* Only the STK Push Query moves money. Daraja's Transaction Status API
  answers through a callback only: it is not a status read and nothing here
  calls it. Callbacks are hints (identifiers only).
* Refunds are refused: Daraja's reversal is asynchronous (its result comes
  only to a callback), so nothing could settle one (docs/status.md).
* Credentials, the passkey, the password and the token are never logged.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import requests

from vpay.base.http_deadline import Deadline, new_session
from vpay.rails.calls import rail_call
from vpay.rails.gate import DEFAULT_MAX_PAUSE_SECONDS, RailGate
from vpay.rails.http import RETRY_TRANSPORT_AND_5XX, RETRY_UNSENT_ONLY, NoAnswer, exchange, json_object, lifetime_seconds
from vpay.rails.port import (CallbackIds, ChargeRequest, MalformedCallback, RailError, RailStatus, RefundRequest, tuning_from_env,
                             StatusKind, Submit, SubmitKind, http_url_problem)

log = logging.getLogger("vpay.rails.mpesa")

KENYA = dt.timezone(dt.timedelta(hours=3), "EAT")
"""Kenya time (UTC+3, no daylight saving): Daraja's ``Timestamp`` is local."""

CHECKOUT_REQUEST_ID = "checkout_request_id"
MERCHANT_REQUEST_ID = "merchant_request_id"

IN_FLIGHT = "500.001.1001"
"""The query's error code while the payer has not finished: pending."""
INVALID_TOKEN = "404.001.03"
"""Daraja's "Invalid Access Token": the token is dropped and fetched again."""

SUCCESS_RESULT = "0"
DECLINE_RESULTS = {
    "1": "insufficient funds",
    "1001": "subscriber busy with another transaction",
    "1019": "transaction expired",
    "1025": "push could not be sent",
    "1032": "cancelled by the payer",
    "1037": "payer unreachable",
    "2001": "wrong PIN",
    "9999": "push could not be sent",
}
"""ResultCodes that end a payment without money moving (the payer's side,
or no prompt reached them). Any other non-zero ResultCode is not understood
here: NO_ANSWER, never a decline (the 24-hour escalation brings a human)."""

# Fields of a processrequest 400 whose refusal blames OUR configuration, not
# the payer: Daraja names the field in errorMessage ("Bad Request - Invalid
# BusinessShortCode").
_CONFIG_FIELDS = ("BusinessShortCode", "Password", "Timestamp", "CallBackURL", "PartyB",
                  "TransactionType", "Initiator")

MSISDN = re.compile(r"2547[0-9]{8}")
_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
_ID_RE = re.compile(r"[\x21-\x7e]{1,128}")
_CODE_RE = re.compile(r"[0-9A-Za-z_.]{1,32}")
ACCOUNT_REFERENCE_CHARS = 12     # Daraja's limit on AccountReference
TRANSACTION_DESC_CHARS = 13      # Daraja's limit on TransactionDesc
DEFAULT_TOTAL_TIMEOUT_SECONDS = 20.0
TOKEN_SAFETY_MARGIN_SECONDS = 60.0
TOKEN_FAILURE_MEMORY_SECONDS = 15.0
"""How long a failed token fetch is remembered: calls within it answer at
once without asking again (as MoMo's adapter: a hung token endpoint must not
hold every claim loop in turn)."""

_ENV = {"base_url": "VPAY_MPESA_BASE_URL", "consumer_key": "VPAY_MPESA_CONSUMER_KEY",
        "consumer_secret": "VPAY_MPESA_CONSUMER_SECRET", "shortcode": "VPAY_MPESA_SHORTCODE",
        "passkey": "VPAY_MPESA_PASSKEY", "callback_url": "VPAY_MPESA_CALLBACK_URL"}
_ENV_OPTIONAL = {"party_b": "VPAY_MPESA_PARTY_B", "transaction_type": "VPAY_MPESA_TRANSACTION_TYPE"}
_ENV_TIMEOUTS = {"connect_timeout": "VPAY_MPESA_CONNECT_TIMEOUT_SECONDS",
                 "read_timeout": "VPAY_MPESA_READ_TIMEOUT_SECONDS",
                 "total_timeout": "VPAY_MPESA_TOTAL_TIMEOUT_SECONDS"}
_ENV_MAX_PAUSE = "VPAY_MPESA_MAX_PAUSE_SECONDS"
TRANSACTION_TYPES = ("CustomerPayBillOnline", "CustomerBuyGoodsOnline")


def timestamp(now: dt.datetime | None = None) -> str:
    """Daraja's ``Timestamp``: ``YYYYMMDDHHMMSS`` in Kenya time (``now``, an
    aware datetime, default the current time)."""
    return (now or dt.datetime.now(dt.timezone.utc)).astimezone(KENYA).strftime("%Y%m%d%H%M%S")


def password(shortcode: str, passkey: str, stamp: str) -> str:
    """Daraja's ``Password``: base64(shortcode + passkey + timestamp). A
    secret: never logged."""
    return base64.b64encode(f"{shortcode}{passkey}{stamp}".encode()).decode("ascii")


def account_reference(rail_reference: str) -> str:
    """``AccountReference`` for a charge: the first 12 hex digits of its
    UUID (Daraja's limit is 12 characters; the organisation statement shows
    it as "A/C No.")."""
    return rail_reference.replace("-", "").lower()[:ACCOUNT_REFERENCE_CHARS]


def with_reference(url: str, reference: str) -> str:
    """``url`` with ``ref=<reference>`` in its query (an existing ``ref``
    replaced): Daraja's callback body names only its own ids."""
    parts = urlsplit(url)
    params = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "ref"]
    params.append(("ref", reference))
    return urlunsplit(parts._replace(query=urlencode(params)))


class MpesaDaraja:
    """The M-Pesa rail (``code = "mpesa"``), implementing ``Rail`` over
    Daraja's STK Push and STK Push Query. One instance is shared by the
    worker's threads (the token cache has a lock)."""

    code = "mpesa"
    # STK Push has no idempotency key of ours: a second send is a second
    # prompt (docs/flows/mpesa.md, "A lost answer"; ``Rail.resend_safe``).
    resend_safe = False

    def __init__(self, base_url: str, consumer_key: str, consumer_secret: str, shortcode: str,
                 passkey: str, callback_url: str, party_b: str | None = None,
                 transaction_type: str = "CustomerPayBillOnline", connect_timeout: float = 3.05,
                 read_timeout: float = 10.0, session: requests.Session | None = None, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 now: Callable[[], dt.datetime] | None = None,
                 total_timeout: float = DEFAULT_TOTAL_TIMEOUT_SECONDS,
                 max_pause: float = DEFAULT_MAX_PAUSE_SECONDS) -> None:
        """Build from explicit settings: ``base_url`` (``https://sandbox.safaricom.co.ke``,
        ``https://api.safaricom.co.ke`` or the sandbox double), the Daraja
        app's ``consumer_key`` / ``consumer_secret``, the Lipa Na M-Pesa
        ``shortcode`` and ``passkey``, our public ``callback_url``
        (``…/provider/mpesa/callback``), ``party_b`` (default the shortcode;
        a till number for ``CustomerBuyGoodsOnline``), ``transaction_type``.
        Timeouts in seconds; ``clock``, ``sleep`` and ``now`` are for tests.
        Raises ``RailError`` naming (never showing) a missing or bad setting."""
        required = {"base_url": base_url, "consumer_key": consumer_key, "consumer_secret": consumer_secret,
                    "shortcode": shortcode, "passkey": passkey, "callback_url": callback_url}
        missing = [name for name, value in required.items() if not value]
        if missing:
            raise RailError(f"M-Pesa adapter: missing setting(s): {', '.join(missing)}")
        for name in ("base_url", "callback_url"):
            problem = http_url_problem(required[name])
            if problem:
                raise RailError(f"M-Pesa adapter: {name} {problem}")
        if not re.fullmatch(r"[0-9]{5,7}", shortcode) or (party_b and not re.fullmatch(r"[0-9]{5,7}", party_b)):
            raise RailError("M-Pesa adapter: shortcode and party_b must be 5 to 7 digits")
        if transaction_type not in TRANSACTION_TYPES:
            raise RailError(f"M-Pesa adapter: transaction_type must be one of {', '.join(TRANSACTION_TYPES)}")
        self.base_url = base_url.rstrip("/")
        self.shortcode = shortcode
        self.party_b = party_b or shortcode
        self.transaction_type = transaction_type
        self.callback_url = callback_url
        self.timeout = (connect_timeout, read_timeout)
        self.total_timeout = float(total_timeout)
        self.gate = RailGate(self.code, max_pause)
        self._basic = "Basic " + base64.b64encode(f"{consumer_key}:{consumer_secret}".encode()).decode("ascii")
        self._passkey = passkey
        self._token: tuple[str, float] | None = None
        self._token_failed: tuple[NoAnswer, float] | None = None
        self._token_lock = threading.Lock()
        self._session = session or new_session()
        self._clock = clock
        self._sleep = sleep
        self._now = now

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **kwargs: Any) -> "MpesaDaraja":
        """Build from ``VPAY_MPESA_*`` (contract, "New rails"). Required:
        ``VPAY_MPESA_BASE_URL``, ``VPAY_MPESA_CONSUMER_KEY``,
        ``VPAY_MPESA_CONSUMER_SECRET``, ``VPAY_MPESA_SHORTCODE``,
        ``VPAY_MPESA_PASSKEY``, ``VPAY_MPESA_CALLBACK_URL``. Optional:
        ``VPAY_MPESA_PARTY_B``, ``VPAY_MPESA_TRANSACTION_TYPE``,
        ``VPAY_MPESA_{CONNECT,READ,TOTAL}_TIMEOUT_SECONDS``,
        ``VPAY_MPESA_MAX_PAUSE_SECONDS``. ``kwargs`` win. Raises ``RailError``
        naming every missing variable (names only, never values)."""
        missing = [name for name in _ENV.values() if not environ.get(name)]
        if missing:
            raise RailError("M-Pesa adapter: missing environment variable(s): " + ", ".join(missing))
        for key in ("base_url", "callback_url"):
            problem = http_url_problem(environ[_ENV[key]])
            if problem:
                raise RailError(f"M-Pesa adapter: {_ENV[key]} {problem}")
        tuning_from_env(environ, kwargs, _ENV_TIMEOUTS, _ENV_MAX_PAUSE, _ENV_OPTIONAL)
        return cls(**{key: environ[name] for key, name in _ENV.items()}, **kwargs)

    def __repr__(self) -> str:
        return f"MpesaDaraja(base_url={self.base_url!r}, shortcode={self.shortcode!r})"

    # --- Creation check ----------------------------------------------------

    def payment_problem(self, amount: int, currency: str, payer: str) -> tuple[str, str] | None:
        """What M-Pesa can never carry (``port.creation_problem``): another
        currency than KES, an amount that is not whole shillings (Daraja's
        ``Amount`` is an integer of KES: cents cannot be sent, and rounding
        would charge another amount), a payer that is not ``2547XXXXXXXX``."""
        if currency.upper() != "KES":
            return "currency", f"M-Pesa collects KES only, not {currency.upper()}"
        if amount % 100:
            return "amount", (f"M-Pesa takes whole shillings: {amount} minor units is "
                              f"{amount // 100}.{amount % 100:02d} KES (use a multiple of 100)")
        if not MSISDN.fullmatch(payer.lstrip("+")):
            return "payer", "an M-Pesa payer is a Safaricom number 2547XXXXXXXX"
        return None

    # --- Rail: request-to-pay ----------------------------------------------

    @rail_call("request_to_pay")
    def request_to_pay(self, charge: ChargeRequest) -> Submit:
        """STK Push: ``POST {base}/mpesa/stkpush/v1/processrequest``.

        * Not KES, not whole shillings, not a 2547 MSISDN → REJECTED
          (``UNSUPPORTED_AMOUNT`` / ``UNSUPPORTED_PAYER``), nothing sent
          (creation refuses these first; this is the backstop).
        * 200 with ``ResponseCode`` "0" and a ``CheckoutRequestID`` →
          ACCEPTED, ``rail_data`` = ``checkout_request_id`` (the status
          read's key) and ``merchant_request_id``.
        * 400 naming one of our settings (BusinessShortCode, Password,
          Timestamp, CallBackURL, PartyB, TransactionType), any 403, the
          token endpoint refusing our consumer key → MISCONFIGURED.
        * Any other 400 (an invalid PhoneNumber, Amount) → REJECTED.
        * 401 / ``404.001.03`` after a fresh token, 5xx (``500.001.1001``
          "unable to lock subscriber", ``500.003.02`` system busy, spike
          arrest), timeouts, a 200 without a CheckoutRequestID → NO_ANSWER.

        Not idempotent at Daraja (no key of ours; ``resend_safe`` is False):
        the init is not retried once it may have left, and a NO_ANSWER says
        ``unsent`` only when no push can have reached Daraja (the token
        could not be had, the connection was never made); any other lost
        answer leaves a prompt we can read only once a callback names its
        CheckoutRequestID (docs/flows/mpesa.md, "A lost answer")."""
        problem = self.payment_problem(charge.amount, charge.currency, charge.payer)
        if problem:
            reason = "UNSUPPORTED_PAYER" if problem[0] == "payer" else "UNSUPPORTED_AMOUNT"
            return Submit(SubmitKind.REJECTED, reason=reason)
        stamp = timestamp(self._now() if self._now else None)
        body = {
            "BusinessShortCode": self.shortcode,
            "Password": password(self.shortcode, self._passkey, stamp),
            "Timestamp": stamp,
            "TransactionType": self.transaction_type,
            "Amount": charge.amount // 100,
            "PartyA": charge.payer,
            "PartyB": self.party_b,
            "PhoneNumber": charge.payer,
            "CallBackURL": with_reference(self.callback_url, charge.rail_reference),
            "AccountReference": account_reference(charge.rail_reference),
            "TransactionDesc": (charge.description or "Payment")[:TRANSACTION_DESC_CHARS],
        }
        try:
            response = self._call("POST", "/mpesa/stkpush/v1/processrequest", body, retry_sent=False)
        except NoAnswer as no:
            log.warning("mpesa request_to_pay charge=%s -> %s: %s", charge.charge_id,
                        "refused for our configuration" if no.misconfigured else "no answer", no.detail)
            return no.submit()
        http = response.status_code
        payload = json_object(response.content) or {}
        if http == 200:
            checkout = _ident(payload.get("CheckoutRequestID"))
            if str(payload.get("ResponseCode")) == "0" and checkout:
                data = {CHECKOUT_REQUEST_ID: checkout}
                merchant = _ident(payload.get("MerchantRequestID"))
                if merchant:
                    data[MERCHANT_REQUEST_ID] = merchant
                return Submit(SubmitKind.ACCEPTED, http_status=http, rail_data=data)
            return Submit(SubmitKind.NO_ANSWER, reason="MALFORMED_INIT_ANSWER", http_status=http)
        code = _code(payload.get("errorCode"))
        message = payload.get("errorMessage") if isinstance(payload.get("errorMessage"), str) else ""
        if http == 403 or (http == 400 and any(f.lower() in message.lower() for f in _CONFIG_FIELDS)):
            log.error("mpesa processrequest refused our configuration (HTTP %s, %s): not a decline",
                      http, code)
            return Submit(SubmitKind.MISCONFIGURED, reason=code or f"HTTP_{http}", http_status=http)
        if http == 400:
            return Submit(SubmitKind.REJECTED, reason=code or "BAD_REQUEST", http_status=http)
        return Submit(SubmitKind.NO_ANSWER, reason=code or f"HTTP_{http}", http_status=http)

    # --- Rail: status ------------------------------------------------------

    @rail_call("status")
    def status(self, charge: ChargeRequest) -> RailStatus:
        """STK Push Query: ``POST {base}/mpesa/stkpushquery/v1/query`` with
        the stored ``CheckoutRequestID``.

        * No CheckoutRequestID stored → NOT_FOUND ``NO_CHECKOUT_REQUEST_ID``
          without asking (the init's answer never reached us).
        * 200 with ``ResultCode`` 0 → SUCCEEDED (the query reports no amount
          and no receipt: the charge's own amount is what was asked);
          ``DECLINE_RESULTS`` → FAILED, reason ``MPESA_<code>``; another
          ResultCode, a ``CheckoutRequestID`` that is not ours, no
          ResultCode → NO_ANSWER.
        * An error ``500.001.1001`` ("The transaction is being processed")
          → PENDING, never a failure.
        * 400 naming the CheckoutRequestID as invalid → NOT_FOUND.
        * 403, the token endpoint refusing our consumer key → MISCONFIGURED.
        * 401 / ``404.001.03`` (token dropped), other 5xx (system busy),
          429 and spike arrest (rate limits), timeouts → NO_ANSWER."""
        checkout = (charge.rail_data or {}).get(CHECKOUT_REQUEST_ID)
        if not isinstance(checkout, str) or not checkout:
            return RailStatus(StatusKind.NOT_FOUND, reason="NO_CHECKOUT_REQUEST_ID",
                              detail="no CheckoutRequestID stored: the init's answer never reached us")
        stamp = timestamp(self._now() if self._now else None)
        body = {"BusinessShortCode": self.shortcode,
                "Password": password(self.shortcode, self._passkey, stamp),
                "Timestamp": stamp, "CheckoutRequestID": checkout}
        try:
            response = self._call("POST", "/mpesa/stkpushquery/v1/query", body)
        except NoAnswer as no:
            log.warning("mpesa status charge=%s -> %s: %s", charge.charge_id,
                        "refused for our configuration" if no.misconfigured else "no answer", no.detail)
            return no.status()
        return _status_from_response(response, checkout)

    # --- Rail: refunds (refused) --------------------------------------------

    @rail_call("refund")
    def refund(self, refund: RefundRequest) -> Submit:
        """Refused: Daraja's reversal answers only through a callback, so no
        status read could ever settle it. REJECTED ``REFUND_NOT_SUPPORTED``,
        nothing sent (``refunds.create_refund`` refuses M-Pesa first)."""
        return Submit(SubmitKind.REJECTED, reason="REFUND_NOT_SUPPORTED")

    @rail_call("refund_status")
    def refund_status(self, refund: RefundRequest) -> RailStatus:
        """No refund is ever sent to M-Pesa: NOT_FOUND, nothing asked."""
        return RailStatus(StatusKind.NOT_FOUND, reason="REFUND_NOT_SUPPORTED")

    # --- Rail: callback ----------------------------------------------------

    def parse_callback(self, query: Mapping[str, str], body: bytes) -> CallbackIds:
        """Identifiers only: ``ref`` (our UUID, from the CallBackURL we gave)
        and, for logs, ``Body.stkCallback``'s ``MerchantRequestID`` and
        ``CheckoutRequestID``; its ``ResultCode`` is never read. The
        ``CheckoutRequestID`` is also offered as ``status_keys``
        (``checkout_request_id``): the key of the STK Push Query, which the
        callback route stores only for a charge whose push answer was lost
        (``charges.adopt_status_keys``). Raises
        ``MalformedCallback`` for a missing or non-UUID ``ref`` or a
        non-empty body that is not a JSON object."""
        reference = (query.get("ref") or "").strip() if isinstance(query.get("ref"), str) else ""
        if not _UUID_RE.match(reference):
            raise MalformedCallback("callback ref is missing or not a UUID")
        hints: dict[str, str] = {}
        raw = body.encode() if isinstance(body, str) else bytes(body)
        if raw.strip():
            try:
                payload = json.loads(raw)
            except (ValueError, RecursionError):
                raise MalformedCallback("callback body is not JSON") from None
            if not isinstance(payload, dict):
                raise MalformedCallback("callback body is not a JSON object")
            stk = (payload.get("Body") or {}).get("stkCallback") if isinstance(payload.get("Body"), dict) else None
            if isinstance(stk, dict):
                for key in ("MerchantRequestID", "CheckoutRequestID"):
                    value = _ident(stk.get(key))
                    if value:
                        hints[key] = value
        keys = {CHECKOUT_REQUEST_ID: hints["CheckoutRequestID"]} if "CheckoutRequestID" in hints else {}
        return CallbackIds(rail_reference=reference.lower(), hints=hints, status_keys=keys)

    # --- Token and transport --------------------------------------------------

    def _access_token(self, deadline: Deadline) -> str:
        if not self._token_lock.acquire(timeout=max(deadline.remaining(), 0.001)):
            raise NoAnswer("TIMEOUT", "deadline passed waiting for another call's token fetch")
        try:
            now = self._clock()
            if self._token is not None and now < self._token[1]:
                return self._token[0]
            if self._token_failed is not None and now < self._token_failed[1]:
                raise self._token_failed[0]
            try:
                token, lifetime = self._fetch_token(deadline)
            except NoAnswer as failure:
                self._token_failed = (failure, self._clock() + TOKEN_FAILURE_MEMORY_SECONDS)
                raise
            self._token_failed = None
            self._token = (token, now + lifetime - min(TOKEN_SAFETY_MARGIN_SECONDS, lifetime / 2))
            return token
        finally:
            self._token_lock.release()

    def _fetch_token(self, deadline: Deadline) -> tuple[str, float]:
        """``(access_token, expires_in seconds)`` from Daraja's OAuth
        endpoint; raises ``NoAnswer`` (MISCONFIGURED when our consumer key
        is refused)."""
        response = exchange(self._session, "GET",
                            f"{self.base_url}/oauth/v1/generate?grant_type=client_credentials",
                            rail=self.code, gate=self.gate, deadline=deadline, timeout=self.timeout,
                            sleep=self._sleep, headers={"Authorization": self._basic})
        if response.status_code != 200:
            refused = response.status_code in (400, 401, 403)  # our consumer key/secret refused
            if refused:
                log.error("mpesa token endpoint refused our consumer key (HTTP %s): an operator "
                          "must fix VPAY_MPESA_CONSUMER_KEY / _SECRET", response.status_code)
            raise NoAnswer(f"TOKEN_HTTP_{response.status_code}",
                           f"token endpoint answered HTTP {response.status_code}",
                           http_status=response.status_code, misconfigured=refused)
        payload = json_object(response.content) or {}
        token = payload.get("access_token")
        if not isinstance(token, str) or not token:
            raise NoAnswer("TOKEN_MALFORMED", "token endpoint body has no access_token", http_status=200)
        return token, lifetime_seconds(payload.get("expires_in"))

    def _drop_token(self, token: str) -> None:
        with self._token_lock:
            if self._token is not None and self._token[0] == token:
                self._token = None
        log.warning("mpesa access token refused; dropped, fetching a new one")

    def _call(self, method: str, path: str, body: Any, *, retry_sent: bool = True) -> requests.Response:
        """One authenticated call under one deadline; on a 401 or Daraja's
        ``404.001.03`` (a token revoked before its ``expires_in``) the token
        is dropped and the call made once more with a fresh one (Daraja did
        not act on a request it refused for its token). Raises ``NoAnswer``
        (a refused fresh token: MISCONFIGURED) and ``RailPaused``."""
        self.gate.check()
        retry = RETRY_TRANSPORT_AND_5XX if retry_sent else RETRY_UNSENT_ONLY
        with Deadline(self.total_timeout) as deadline:
            for attempt in (1, 2):
                try:
                    token = self._access_token(deadline)
                except NoAnswer as no:
                    # No call was made with this token: Daraja cannot have
                    # acted on it (a first attempt refused for its token was
                    # not acted on either).
                    no.unsent = True
                    raise
                response = exchange(self._session, method, f"{self.base_url}{path}", rail=self.code,
                                    gate=self.gate, deadline=deadline, timeout=self.timeout,
                                    sleep=self._sleep, retry=retry, json=body,
                                    headers={"Authorization": f"Bearer {token}"})
                if not _token_refused(response):
                    return response
                self._drop_token(token)
            raise NoAnswer("TOKEN_REFUSED", "a fresh access token was refused", http_status=response.status_code,
                           misconfigured=True)


def _token_refused(response: requests.Response) -> bool:
    if response.status_code == 401:
        return True
    payload = json_object(response.content) if response.status_code in (400, 404) else None
    return bool(payload) and payload.get("errorCode") == INVALID_TOKEN


def _status_from_response(response: requests.Response, checkout: str) -> RailStatus:
    """Map an STK Push Query answer (see ``MpesaDaraja.status``)."""
    http = response.status_code
    payload = json_object(response.content)
    if payload is None:
        return RailStatus(StatusKind.NO_ANSWER, http_status=http, detail=f"HTTP {http}, body not a JSON object")
    code = _code(payload.get("errorCode"))
    if code == IN_FLIGHT:
        return RailStatus(StatusKind.PENDING, reason=IN_FLIGHT, http_status=http,
                          detail="the transaction is being processed")
    if http == 200 and "ResultCode" in payload:
        answered = payload.get("CheckoutRequestID")
        if answered is not None and answered != checkout:
            return RailStatus(StatusKind.NO_ANSWER, http_status=http, detail="answer names another CheckoutRequestID")
        result = payload.get("ResultCode")
        result = str(result).strip() if isinstance(result, (str, int)) and not isinstance(result, bool) else None
        if result == SUCCESS_RESULT:
            return RailStatus(StatusKind.SUCCEEDED, http_status=http)
        if result in DECLINE_RESULTS:
            return RailStatus(StatusKind.FAILED, reason=f"MPESA_{result}", http_status=http,
                              detail=DECLINE_RESULTS[result])
        shown = result if result and _CODE_RE.fullmatch(result) else "unreadable"
        return RailStatus(StatusKind.NO_ANSWER, http_status=http, detail=f"ResultCode {shown} not understood")
    message = payload.get("errorMessage") if isinstance(payload.get("errorMessage"), str) else ""
    if http == 403:
        return RailStatus(StatusKind.MISCONFIGURED, reason=code or "FORBIDDEN", http_status=http,
                          detail="HTTP 403: the rail refused our configuration")
    if http == 400 and "checkoutrequestid" in message.lower():
        return RailStatus(StatusKind.NOT_FOUND, reason=code or "INVALID_CHECKOUT_REQUEST_ID", http_status=http)
    if http == 400 and any(f.lower() in message.lower() for f in _CONFIG_FIELDS):
        return RailStatus(StatusKind.MISCONFIGURED, reason=code or "BAD_REQUEST", http_status=http,
                          detail="HTTP 400 naming one of our settings")
    return RailStatus(StatusKind.NO_ANSWER, reason=code, http_status=http, detail=f"HTTP {http} from the query")


def _ident(value: Any) -> str | None:
    if isinstance(value, str) and _ID_RE.fullmatch(value.strip()):
        return value.strip()
    return None


def _code(value: Any) -> str | None:
    if isinstance(value, (str, int)) and not isinstance(value, bool) and _CODE_RE.fullmatch(str(value).strip()):
        return str(value).strip()
    return None
