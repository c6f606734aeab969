"""Orange Money Web Payment adapter: the ``Rail`` port spoken over Orange's
"OM WebPay" HTTP API.

Orange Money Web Payment is a redirect flow: we initialise a payment, Orange
answers with a ``payment_url`` the payer must be sent to (the merchant shows
it: the intent's ``next_action`` is ``redirect_to_url``), and the payer
identifies and confirms on Orange's side. The MSISDN a charge carries is not
sent to Orange; the payer is whoever opens the page.

Sources for every rule below (checked with the project's ``search`` tool):

* ``design/rails.md``, section "Orange Money Web Payment" (token, init,
  status and notification shapes; "an abandoned payment stays INITIATED for
  ever"; "the only proof is notif_token matching the one returned at init").
* Orange Developer, "Orange Money WebPay Dev - Getting started" (copy at
  scribd.com/document/638670689): token, Web Payment API, Transaction Status
  API, the ``dev`` path segment of the sandbox.
* docs.sandpay.dev/fr/operators/orange: token by
  ``grant_type=client_credentials`` as a form body with Basic
  ``client_id:client_secret``, then Bearer on the webpay calls; the init
  answer carries ``pay_token`` and ``payment_url``.
* afro.tools/providers/orangemoney-mali: ``amount`` is an integer in the
  currency's unit (XOF has no sub-unit); ``order_id`` must be unique and a
  reused one is refused with HTTP 403; the notification to ``notif_url`` is
  not retried; the path is ``/orange-money-webpay/{country}/v1/webpayment``.
* docs.4pay.online (Orange Money provider): the status vocabulary
  ``INITIATED | PENDING | SUCCESS | FAILED | EXPIRED``.
* The design page, "Callbacks are hints": a callback yields identifiers only;
  only the authenticated status query moves money.

Shape of the adapter (the same as ``vpay.rails.mtn``; the transport, retries,
backpressure and "no answer" value are ``vpay.rails.http``, shared by both):

* ``request_to_pay``, ``status`` and ``parse_callback``'s callers never see an
  exception for anything Orange (or the network) does: every answer becomes a
  ``Submit`` / ``RailStatus`` value, and anything unreadable is ``NO_ANSWER``,
  never a decline.
* Every call (token fetch, transport retries and a 401's one retry included)
  runs under one total deadline (``vpay.base.http_deadline.Deadline``,
  ``VPAY_ORANGE_TOTAL_TIMEOUT_SECONDS``, default 20 s), however Orange
  trickles; each HTTP exchange also has (connect, read) timeouts and a
  bounded number of attempts (``MAX_ATTEMPTS``).
* A 401 on an operation drops the token, fetches a new one and retries once,
  within the same call. A 429 or 503 with ``Retry-After`` closes the
  adapter's ``RailGate`` (capped, ``VPAY_ORANGE_MAX_PAUSE_SECONDS``): calls
  raise ``RailPaused`` without sending anything until it opens.
* Credentials, the access token, ``pay_token`` and ``notif_token`` are never
  logged and never put in an exception or a ``detail`` text.
* Unreadable is not unreported: a status field present but not of Orange's
  documented shape is listed in ``RailStatus.unreadable`` and never read as
  agreement (``_status_from_body`` has the rule per field).
* Configuration is not a decline (design/rails.md, "Rail errors that mean
  *our* configuration is wrong"): the token endpoint refusing our client
  credentials (401/403) and a 403 to the init (Orange's answer to a
  merchant_key it does not know) are MISCONFIGURED, never REJECTED; any 403
  to a status read too. Orange documents no error code that tells an unknown
  merchant_key from a reused order_id (both 403, afro.tools): on a FIRST send
  the order_id is fresh, so a 403 can only be the merchant key
  (MISCONFIGURED); on a re-send (``ChargeRequest.resend``) it stays NO_ANSWER.
  What a payment does then is docs/flows/reconciler.md, "Configuration is
  not a decline".
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import requests
from vpay.money.currency import exponent
from vpay.base.http_deadline import Deadline, new_session
from vpay.rails.gate import DEFAULT_MAX_PAUSE_SECONDS, RailGate
from vpay.rails.calls import rail_call
from vpay.rails.http import MAX_ATTEMPTS, RETRY_BUDGET_SECONDS, RETRY_TRANSPORT_AND_5XX, RETRY_UNSENT_ONLY, RETRY_WAITS, NoAnswer, exchange, json_object, lifetime_seconds
from vpay.rails.port import CallbackIds, reported_currency, ChargeRequest, MalformedCallback, RailError, RailPaused, RailStatus, RefundRequest, StatusKind, Submit, SubmitKind, http_url_problem, tuning_from_env

log = logging.getLogger("vpay.rails.orange")

ORDER_ID_MAX_CHARS = 30          # Orange's limit on order_id (design/rails.md)
_HINT_MAX_CHARS = 128            # identifiers copied from a callback body, for logs
_NOTIF_TOKEN_MAX_CHARS = 256     # a longer "token" is not one of Orange's: ignored
_URL_MAX_CHARS = 2048            # a payment_url longer than this is not stored

# Transport retries inside one call (MAX_ATTEMPTS, RETRY_WAITS,
# RETRY_BUDGET_SECONDS, vpay.rails.http; status reads and the token only: see
# ``OrangeMoney._exchange`` for why the init is not retried).
DEFAULT_TOTAL_TIMEOUT_SECONDS = 20.0
"""One call's whole time (``VPAY_ORANGE_TOTAL_TIMEOUT_SECONDS``)."""

# A cached token is dropped this many seconds before Orange says it expires.
TOKEN_SAFETY_MARGIN_SECONDS = 60.0

# Orange status -> port kind (design/rails.md; docs.4pay.online).
WAITING = "INITIATED"            # the payer has not confirmed (for ever, if they walked away)
CONFIRMED = "PENDING"            # the payer confirmed; Orange is processing
SUCCESS, FAILED, EXPIRED = "SUCCESS", "FAILED", "EXPIRED"

# rail_data keys handed back by ``request_to_pay`` (``Submit.rail_data``).
PAY_TOKEN, PAYMENT_URL, NOTIF_TOKEN = "pay_token", "payment_url", "notif_token"

_UUID_RE = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE
)
_COUNTRY_RE = re.compile(r"^[a-z]{2,3}$")   # cm, ci, sn, ml, ..., or dev (the sandbox)
_WORD_RE = re.compile(r"^[A-Za-z_]{1,32}$")
_CODE_RE = re.compile(r"^[A-Za-z0-9_.]{1,64}$")   # an error code worth keeping as a reason

_ENV = {
    "base_url": "VPAY_ORANGE_BASE_URL",
    "client_id": "VPAY_ORANGE_CLIENT_ID",
    "client_secret": "VPAY_ORANGE_CLIENT_SECRET",
    "merchant_key": "VPAY_ORANGE_MERCHANT_KEY",
    "country": "VPAY_ORANGE_COUNTRY",
    "notif_url": "VPAY_ORANGE_NOTIF_URL",
    "return_url": "VPAY_ORANGE_RETURN_URL",
    "cancel_url": "VPAY_ORANGE_CANCEL_URL",
}
_ENV_OPTIONAL = {"lang": "VPAY_ORANGE_LANG", "reference": "VPAY_ORANGE_REFERENCE"}
_ENV_TIMEOUTS = {"connect_timeout": "VPAY_ORANGE_CONNECT_TIMEOUT_SECONDS",
                 "read_timeout": "VPAY_ORANGE_READ_TIMEOUT_SECONDS",
                 "total_timeout": "VPAY_ORANGE_TOTAL_TIMEOUT_SECONDS"}
_ENV_MAX_PAUSE = "VPAY_ORANGE_MAX_PAUSE_SECONDS"


def order_id_for(rail_reference: str) -> str:
    """Orange's ``order_id`` for a charge: the first 30 of the 32 hex digits
    of ``rail_reference`` (a UUIDv4), lower-case, no dashes.

    Orange limits ``order_id`` to 30 characters (design/rails.md) and refuses
    a reused one (HTTP 403, afro.tools). The derivation is deterministic, so
    a re-sent init for the same charge reuses its order id and can never
    create a second payment; it keeps 114 of the UUID's 122 random bits, so
    two charges do not collide in practice (``charges`` is unique on
    ``(rail, rail_reference)``). Only hex digits: no character Orange could
    refuse. Raises ``ValueError`` for a reference that is not a UUID.
    """
    if not isinstance(rail_reference, str) or not _UUID_RE.match(rail_reference.strip()):
        raise ValueError("rail_reference must be a UUID")
    return rail_reference.strip().lower().replace("-", "")[:ORDER_ID_MAX_CHARS]


def notif_url_with_reference(notif_url: str, reference: str) -> str:
    """``notif_url`` with ``ref=<reference>`` in its query string (an existing
    ``ref`` is replaced; other parameters kept). Orange's notification body
    carries no order id (design/rails.md), so this is how the callback route
    finds the charge."""
    parts = urlsplit(notif_url)
    params = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "ref"]
    params.append(("ref", reference))
    return urlunsplit(parts._replace(query=urlencode(params)))


class OrangeMoney:
    """The Orange Money Web Payment rail (``code = "orange"``), implementing
    ``Rail``.

    One instance is shared by the worker's threads: the access-token cache is
    guarded by a lock, and ``requests.Session`` is used only for its
    thread-safe connection pool.
    """

    code = "orange"
    resend_safe = True  # the same order_id again: "already have it" (Rail.resend_safe)
    refunds_supported = False  # Web Payment has no refund call (docs/flows/orange.md, "Refunds")

    def __init__(
        self,
        base_url: str,
        client_id: str,
        client_secret: str,
        merchant_key: str,
        country: str,
        notif_url: str,
        return_url: str,
        cancel_url: str,
        lang: str = "fr",
        reference: str = "vpay",
        connect_timeout: float = 3.05,
        read_timeout: float = 10.0,
        session: requests.Session | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        total_timeout: float = DEFAULT_TOTAL_TIMEOUT_SECONDS,
        max_pause: float = DEFAULT_MAX_PAUSE_SECONDS,
    ) -> None:
        """Build the adapter from explicit settings.

        ``base_url`` is Orange's API root (``https://api.orange.com``, or the
        Orange sandbox double's URL); ``client_id`` / ``client_secret`` are the
        OAuth credentials of the Orange Developer application;
        ``merchant_key`` is the Web Payment merchant key (sent in the init
        body); ``country`` is the path segment (``cm``, ``ci``, ``sn``, ...,
        or ``dev`` for Orange's sandbox). ``notif_url`` is our public
        ``…/provider/orange/callback`` (``ref=<rail_reference>`` is appended
        per charge); ``return_url`` / ``cancel_url`` are where Orange sends
        the payer's browser afterwards. ``lang`` and ``reference`` (the
        merchant name shown on Orange's page) go in the init body. Timeouts
        are in seconds and apply to every request.

        Time bound of one call: ``total_timeout`` seconds whatever Orange
        does (``vpay.base.http_deadline``). Within it, at most four exchanges
        (token, the operation, and after a 401 a new token and the operation
        once more); a status read or token exchange makes at most
        ``MAX_ATTEMPTS`` attempts with ``RETRY_WAITS`` between them and none
        after ``RETRY_BUDGET_SECONDS``; the init makes one attempt (plus
        retries of a connection that was never established).

        ``clock`` (monotonic seconds) and ``sleep`` exist for tests.

        Raises ``RailError`` naming (never showing) a missing or invalid
        setting.
        """
        required = {
            "base_url": base_url, "client_id": client_id, "client_secret": client_secret,
            "merchant_key": merchant_key, "country": country, "notif_url": notif_url,
            "return_url": return_url, "cancel_url": cancel_url,
        }
        missing = [name for name, value in required.items() if not value]
        if missing:
            raise RailError(f"Orange Money adapter: missing setting(s): {', '.join(missing)}")
        for name in ("base_url", "notif_url", "return_url", "cancel_url"):
            problem = http_url_problem(required[name])
            if problem:
                raise RailError(f"Orange Money adapter: {name} {problem}")
        if not _COUNTRY_RE.match(country):
            raise RailError("Orange Money adapter: country must be a path segment such as "
                            "'cm', 'ci', 'sn' or 'dev'")
        self.base_url = base_url.rstrip("/")
        self.country = country
        self.notif_url = notif_url
        self.return_url = return_url
        self.cancel_url = cancel_url
        self.lang = lang or "fr"
        self.reference = (reference or "vpay")[:64]
        self.timeout = (connect_timeout, read_timeout)
        self.total_timeout = float(total_timeout)
        self.gate = RailGate(self.code, max_pause)
        self._client_basic = "Basic " + base64.b64encode(
            f"{client_id}:{client_secret}".encode()).decode("ascii")
        self._merchant_key = merchant_key
        self._token: tuple[str, float] | None = None   # (access_token, expires_at per clock)
        self._token_lock = threading.Lock()
        self._session = session or new_session()
        self._clock = clock
        self._sleep = sleep

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **kwargs: Any) -> "OrangeMoney":
        """Build the adapter from the environment.

        Required: ``VPAY_ORANGE_BASE_URL``, ``VPAY_ORANGE_CLIENT_ID``,
        ``VPAY_ORANGE_CLIENT_SECRET``, ``VPAY_ORANGE_MERCHANT_KEY``,
        ``VPAY_ORANGE_COUNTRY`` (path segment: ``cm``, ``dev``, ...),
        ``VPAY_ORANGE_NOTIF_URL`` (our public ``…/provider/orange/callback``),
        ``VPAY_ORANGE_RETURN_URL`` and ``VPAY_ORANGE_CANCEL_URL`` (Orange's
        init needs all three URLs). Optional: ``VPAY_ORANGE_LANG`` (default
        ``fr``), ``VPAY_ORANGE_REFERENCE`` (merchant name on Orange's page,
        default ``vpay``), ``VPAY_ORANGE_CONNECT_TIMEOUT_SECONDS`` and
        ``VPAY_ORANGE_READ_TIMEOUT_SECONDS``, ``VPAY_ORANGE_TOTAL_TIMEOUT_SECONDS``
        (one call's whole time, default 20, at most 600) and
        ``VPAY_ORANGE_MAX_PAUSE_SECONDS`` (the longest backpressure pause,
        default 300, at most 3600). ``kwargs`` go to the constructor and win.

        Raises ``RailError`` naming every missing variable (names only,
        never values), or a URL variable that ``port.http_url_problem``
        refuses (whitespace, control characters, not http/https).
        """
        missing = [name for name in _ENV.values() if not environ.get(name)]
        if missing:
            raise RailError("Orange Money adapter: missing environment variable(s): "
                            + ", ".join(missing))
        for key in ("base_url", "notif_url", "return_url", "cancel_url"):
            problem = http_url_problem(environ[_ENV[key]])
            if problem:  # named by its variable, never shown
                raise RailError(f"Orange Money adapter: {_ENV[key]} {problem}")
        tuning_from_env(environ, kwargs, _ENV_TIMEOUTS, _ENV_MAX_PAUSE, _ENV_OPTIONAL)
        return cls(**{key: environ[name] for key, name in _ENV.items()}, **kwargs)

    def __repr__(self) -> str:
        # Deliberately omits every credential.
        return f"OrangeMoney(base_url={self.base_url!r}, country={self.country!r})"

    @property
    def _webpay(self) -> str:
        return f"{self.base_url}/orange-money-webpay/{self.country}/v1"

    # --- Rail: request-to-pay ----------------------------------------------

    @rail_call("request_to_pay")
    def request_to_pay(self, charge: ChargeRequest) -> Submit:
        """Initialise a web payment:
        ``POST {base}/orange-money-webpay/{country}/v1/webpayment``.

        Body: ``merchant_key``, ``currency``, ``order_id`` (``order_id_for``),
        ``amount`` (an int in major units, which for XOF/XAF and every other
        currency of ISO 4217 exponent 0 equals ``charge.amount`` in minor
        units), ``return_url``, ``cancel_url``, ``notif_url`` (ours with
        ``ref=<rail_reference>``), ``lang``, ``reference``.

        Mapping (design/rails.md; afro.tools):

        * currency whose ISO 4217 exponent is not 0 → REJECTED
          ``UNSUPPORTED_CURRENCY``, nothing sent (Orange takes a whole amount).
        * 201 (or 200) with ``pay_token``, ``payment_url`` (http(s)) and
          ``notif_token`` → ACCEPTED, ``rail_data`` = those three strings. The
          caller stores ``pay_token`` and ``payment_url`` and only a hash of
          ``notif_token`` (``vpay.money.payments.submit``).
        * 400 → REJECTED (``BAD_REQUEST`` or Orange's code): the request as
          such was refused, sending it again cannot help.
        * 403 ``FORBIDDEN``: Orange answers 403 to a merchant_key it does
          not know, and also to a reused ``order_id`` (an earlier send of
          this very charge got there and its answer was lost). On a first
          send (``charge.resend`` False) the order id is fresh, so it is the
          merchant key: MISCONFIGURED. On a re-send it is NO_ANSWER. Never a
          decline.
        * the token endpoint refusing our client credentials (401/403) →
          MISCONFIGURED.
        * 401 on the init (token dropped), 5xx, other statuses, timeouts,
          connection errors, a 201 without the three fields → NO_ANSWER.

        Safe to repeat: the same charge always sends the same ``order_id``, so
        Orange never holds two payments for it. Never raises for Orange's
        answers.
        """
        if exponent(charge.currency) != 0:
            log.info("orange request_to_pay charge=%s reference=%s -> rejected: currency %s "
                     "has minor units (Orange takes a whole amount)",
                     charge.charge_id, charge.rail_reference, charge.currency)
            return Submit(SubmitKind.REJECTED, reason="UNSUPPORTED_CURRENCY")
        body = {
            "merchant_key": self._merchant_key,
            "currency": charge.currency,
            "order_id": order_id_for(charge.rail_reference),
            "amount": _whole_amount(charge.amount),
            "return_url": self.return_url,
            "cancel_url": self.cancel_url,
            "notif_url": notif_url_with_reference(self.notif_url, charge.rail_reference),
            "lang": self.lang,
            "reference": self.reference,
        }
        try:
            response, token = self._call("POST", f"{self._webpay}/webpayment", json_body=body,
                                         retry_sent=False)
        except NoAnswer as no:
            self._log_no_answer("request_to_pay", charge, no)
            return no.submit()

        submit = self._submit_from_response(response, token, charge.resend)
        return submit

    def _submit_from_response(self, response: requests.Response, token: str, resend: bool) -> Submit:
        http = response.status_code
        if http in (200, 201):
            payload = json_object(response.content) or {}
            data = {key: payload.get(key) for key in (PAY_TOKEN, PAYMENT_URL, NOTIF_TOKEN)}
            if all(isinstance(v, str) and v.strip() for v in data.values()) \
                    and _usable_url(data[PAYMENT_URL]) \
                    and len(data[NOTIF_TOKEN]) <= _NOTIF_TOKEN_MAX_CHARS:
                return Submit(SubmitKind.ACCEPTED, http_status=http,
                              rail_data={k: v.strip() for k, v in data.items()})
            return Submit(SubmitKind.NO_ANSWER, reason="MALFORMED_INIT_ANSWER", http_status=http)
        code = _error_code(response)
        if http == 400:
            return Submit(SubmitKind.REJECTED, reason=code or "BAD_REQUEST", http_status=http)
        if http == 401:
            self._drop_token(token)
            return Submit(SubmitKind.NO_ANSWER, reason="UNAUTHORIZED", http_status=http)
        if http == 403 and resend:
            log.warning("orange webpayment answered 403 to a re-send: the order id was used by an "
                        "earlier send that got there (or the merchant key is refused); not a decline")
            return Submit(SubmitKind.NO_ANSWER, reason="FORBIDDEN", http_status=http)
        if http == 403:
            log.error("orange webpayment answered 403 to a first send: the merchant key is refused "
                      "(VPAY_ORANGE_MERCHANT_KEY); not a decline")
            return Submit(SubmitKind.MISCONFIGURED, reason="FORBIDDEN", http_status=http)
        return Submit(SubmitKind.NO_ANSWER, reason=code or f"HTTP_{http}", http_status=http)

    # --- Rail: status ------------------------------------------------------

    @rail_call("status")
    def status(self, charge: ChargeRequest) -> RailStatus:
        """The authenticated status query:
        ``POST {base}/orange-money-webpay/{country}/v1/transactionstatus``
        with ``{order_id, amount, pay_token}``; ``pay_token`` comes from
        ``charge.rail_data`` (stored from the init's answer).

        Mapping (design/rails.md; docs.4pay.online):

        * 201 (or 200) ``INITIATED`` (waiting for the payer) or ``PENDING``
          (payer confirmed, Orange processing) → PENDING, ``reason`` = that
          status; ``SUCCESS`` → SUCCEEDED with ``txnid``; ``FAILED`` → FAILED
          (reason ``FAILED``); ``EXPIRED`` → FAILED with reason ``EXPIRED``.
        * No ``pay_token`` stored → NOT_FOUND ``NO_PAY_TOKEN`` without asking:
          the init's answer never reached us, so no payer holds a payment URL
          for this charge (the poll then re-sends the init, see
          ``vpay.handlers.poll``).
        * 404 → NOT_FOUND.
        * 403, or the token endpoint refusing our client credentials →
          MISCONFIGURED: the read was refused, which says nothing about the
          payment.
        * 401 (token dropped), 400, 5xx, other statuses, timeouts, an
          unreadable body, an unknown status, or an ``order_id`` in the answer
          that is not ours → NO_ANSWER, never a decline.
        * Fields present but unreadable on a terminal status are listed in
          ``unreadable`` (rules: ``_status_from_body``).

        Never raises for Orange's answers.
        """
        pay_token = (charge.rail_data or {}).get(PAY_TOKEN)
        if not isinstance(pay_token, str) or not pay_token:
            return RailStatus(StatusKind.NOT_FOUND, reason="NO_PAY_TOKEN",
                              detail="no pay_token stored: the init's answer never reached us")
        if exponent(charge.currency) != 0:
            return RailStatus(StatusKind.NOT_FOUND, reason="UNSUPPORTED_CURRENCY",
                              detail="a currency with minor units is never sent to Orange")
        order_id = order_id_for(charge.rail_reference)
        body = {"order_id": order_id, "amount": _whole_amount(charge.amount), "pay_token": pay_token}
        try:
            response, token = self._call("POST", f"{self._webpay}/transactionstatus", json_body=body)
        except NoAnswer as no:
            self._log_no_answer("status", charge, no)
            return no.status()

        result = self._status_from_response(response, token, order_id, charge.currency)
        return result

    def _status_from_response(self, response: requests.Response, token: str,
                              order_id: str, currency: str) -> RailStatus:
        http = response.status_code
        if http in (200, 201):
            return _status_from_body(response.content, http, order_id, currency)
        if http == 403:
            log.error("orange transactionstatus answered 403: our configuration was refused")
            return RailStatus(StatusKind.MISCONFIGURED, reason=_error_code(response) or "FORBIDDEN",
                              http_status=http, detail="HTTP 403: the rail refused our configuration")
        if http == 404:
            return RailStatus(StatusKind.NOT_FOUND, reason=_error_code(response) or "NOT_FOUND",
                              http_status=http)
        if http == 401:
            self._drop_token(token)
            return RailStatus(StatusKind.NO_ANSWER, reason="UNAUTHORIZED", http_status=http,
                              detail="HTTP 401: access token refused, dropped")
        return RailStatus(StatusKind.NO_ANSWER, reason=_error_code(response), http_status=http,
                          detail=f"HTTP {http} from status query")

    # --- Rail: refunds (not offered) --------------------------------------

    @rail_call("refund")
    def refund(self, refund: RefundRequest) -> Submit:
        """Orange Money Web Payment offers no refund call to this adapter:
        always REJECTED ``REFUND_NOT_SUPPORTED``, nothing sent. Not reached
        from ``refunds.create_and_submit``, which refuses such a refund
        before writing it (``refunds_supported``); kept for a refund written
        some other way, which then fails at once."""
        return Submit(SubmitKind.REJECTED, reason="REFUND_NOT_SUPPORTED")

    @rail_call("refund_status")
    def refund_status(self, refund: RefundRequest) -> RailStatus:
        """No refund is ever sent to Orange: NOT_FOUND, nothing asked."""
        return RailStatus(StatusKind.NOT_FOUND, reason="REFUND_NOT_SUPPORTED")

    # --- Rail: callback ----------------------------------------------------

    def parse_callback(self, query: Mapping[str, str], body: bytes) -> CallbackIds:
        """Extract identifiers from an Orange notification; never its status.

        ``query`` is the callback URL's query as a mapping: ``ref`` is the
        ``rail_reference`` we appended to ``notif_url`` (Orange's body carries
        no order id, design/rails.md) and must be a UUID; it is returned
        lower-cased. ``body`` is the raw body, Orange's JSON
        ``{status, notif_token, txnid}``. ``notif_token`` (a string of at most
        256 characters) and ``txnid`` (truncated) go to ``hints``;
        ``status`` is never read (design page, "Callbacks are hints").

        ``hints["notif_token"]`` is a secret for the route to check against
        the stored hash, never to log. A missing or unusable token is simply
        absent from ``hints`` (the route treats that as a wrong token).

        Raises ``MalformedCallback`` when ``ref`` is missing or not a UUID, or
        a non-empty body is not a JSON object.
        """
        reference = query.get("ref")
        if not isinstance(reference, str) or not reference.strip():
            raise MalformedCallback("callback query has no ref parameter")
        reference = reference.strip()
        if not _UUID_RE.match(reference):
            raise MalformedCallback("callback ref is not a UUID")
        return CallbackIds(rail_reference=reference.lower(), hints=_callback_hints(body))

    # --- Token -------------------------------------------------------------

    def _access_token(self, deadline: Deadline) -> str:
        """A bearer token from the cache or ``POST {base}/oauth/v3/token``.
        The lock is held during the fetch: threads finding the cache empty
        wait for one fetch, for at most what is left of their own deadline."""
        if not self._token_lock.acquire(timeout=max(deadline.remaining(), 0.001)):
            raise NoAnswer("TIMEOUT", "deadline passed waiting for another call's token fetch")
        try:
            now = self._clock()
            if self._token is not None and now < self._token[1]:
                return self._token[0]
            token, lifetime = self._fetch_token(deadline)
            margin = min(TOKEN_SAFETY_MARGIN_SECONDS, lifetime / 2)
            self._token = (token, now + lifetime - margin)
            return token
        finally:
            self._token_lock.release()

    def _fetch_token(self, deadline: Deadline) -> tuple[str, float]:
        """``(access_token, expires_in seconds)``; raises ``NoAnswer``."""
        response = self._exchange(
            "POST", f"{self.base_url}/oauth/v3/token",
            headers={"Authorization": self._client_basic, "Accept": "application/json"},
            form_body={"grant_type": "client_credentials"}, deadline=deadline,
        )
        if response.status_code != 200:
            refused = response.status_code in (401, 403)   # fresh client credentials refused
            if refused:
                log.error("orange token endpoint refused our client credentials (HTTP %s): an "
                          "operator must fix VPAY_ORANGE_CLIENT_ID / _SECRET", response.status_code)
            raise NoAnswer(reason=f"TOKEN_HTTP_{response.status_code}",
                            detail=f"token endpoint answered HTTP {response.status_code}",
                            http_status=response.status_code, misconfigured=refused)
        payload = json_object(response.content)
        token = payload.get("access_token") if payload else None
        if not isinstance(token, str) or not token:
            raise NoAnswer(reason="TOKEN_MALFORMED", detail="token endpoint body has no access_token",
                            http_status=200)
        return token, lifetime_seconds(payload.get("expires_in"))

    def _drop_token(self, token: str) -> None:
        """Forget ``token`` after a 401 (only that one: another thread may
        already have replaced it)."""
        with self._token_lock:
            if self._token is not None and self._token[0] == token:
                self._token = None
        log.warning("orange access token refused (HTTP 401); dropped, the next call fetches a new one")

    # --- Transport ---------------------------------------------------------

    def _api_headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def _call(self, method: str, url: str, *, json_body: Any = None,
              retry_sent: bool = True) -> tuple[requests.Response, str]:
        """One authenticated call: ``(response, token used)``. Raises
        ``RailPaused`` (nothing sent) while the gate is closed; then, under
        one ``Deadline(total_timeout)``: a token, the exchange, and on a 401
        a new token and the exchange once more (a 401 means Orange did not
        act on the request, so re-sending the init is safe). Raises
        ``NoAnswer`` when no response came, ``RailPaused`` for a 429/503
        with ``Retry-After``."""
        self.gate.check()
        with Deadline(self.total_timeout) as deadline:
            token = self._access_token(deadline)
            response = self._exchange(method, url, headers=self._api_headers(token),
                                      json_body=json_body, retry_sent=retry_sent, deadline=deadline)
            if response.status_code == 401:
                self._drop_token(token)
                token = self._access_token(deadline)
                response = self._exchange(method, url, headers=self._api_headers(token),
                                          json_body=json_body, retry_sent=retry_sent,
                                          deadline=deadline)
                log.info("orange: retried once with a new access token -> HTTP %s",
                         response.status_code)
        return response, token

    def _exchange(self, method: str, url: str, *, headers: Mapping[str, str],
                  json_body: Any = None, form_body: Mapping[str, str] | None = None,
                  retry_sent: bool = True, deadline: Deadline) -> requests.Response:
        """One HTTP exchange with bounded transport retries.

        With ``retry_sent`` (token, status reads: both without effect),
        connection errors, timeouts and HTTP 502/503/504 are retried. Without
        it (the init: a second init with the same ``order_id`` is refused
        with 403, and the first one's answer would be lost), only a
        connection that timed out before it was established is retried: the
        request never left. Returns the last response; raises ``NoAnswer``
        when no response came, and ``RailPaused`` (after closing the gate)
        for a 429 or 503 carrying ``Retry-After`` (such a 503 is not retried).
        No attempt starts once ``deadline`` has passed.
        """
        kwargs: dict[str, Any] = {"headers": dict(headers)}
        if json_body is not None:
            kwargs["json"] = json_body
        if form_body is not None:
            kwargs["data"] = dict(form_body)
        return exchange(self._session, method, url, rail=self.code, gate=self.gate,
                        deadline=deadline, timeout=self.timeout, sleep=self._sleep,
                        retry=RETRY_TRANSPORT_AND_5XX if retry_sent else RETRY_UNSENT_ONLY,
                        **kwargs)

    def _log_no_answer(self, operation: str, charge: ChargeRequest, no: NoAnswer) -> None:
        log.warning("orange %s charge=%s reference=%s -> %s: %s (reason %s)",
                    operation, charge.charge_id, charge.rail_reference,
                    "refused for our configuration" if no.misconfigured else "no answer", no.detail, no.reason)


# --- Helpers (pure) ----------------------------------------------------------


def _whole_amount(amount: int) -> int:
    """``amount`` in minor units as Orange's integer ``amount``; only called
    for currencies of exponent 0, where minor and major units are the same.
    Raises ``TypeError`` / ``ValueError`` for a non-int or non-positive amount
    (our bug, found before anything is sent)."""
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError(f"amount must be an int in minor units, got {type(amount).__name__}")
    if amount <= 0:
        raise ValueError("amount must be positive")
    return amount


_VISIBLE_ID = re.compile(r"[\x21-\x7e]+")


def _status_from_body(content: bytes, http: int, order_id: str, currency: str) -> RailStatus:
    """Map a 200/201 status body to a ``RailStatus`` (see ``OrangeMoney.status``).

    Unreadable is not unreported: on a terminal status (SUCCESS, FAILED,
    EXPIRED), each field below that is PRESENT but not of Orange's documented
    shape is listed in ``RailStatus.unreadable`` (the poll then settles
    nothing and raises one ``rail_contradiction`` alert); an absent field is
    not reported. ``null`` is present.

    * ``amount``: Orange's amounts are JSON integers in the currency's unit
      (design/rails.md: init ``amount (int)``; afro.tools: "sending a decimal
      is rejected"), and only currencies of ISO 4217 exponent 0 reach Orange,
      so the integer is the amount in minor units of ``currency``'s exponent.
      Unreadable: a string (even ``"1500"``: not Orange's shape), a
      fractional or exponent number (``1500.5``, ``1e3``, which JSON reads as
      a float), a negative number, a bool, ``null``.
    * ``currency``: three ASCII letters (upper-cased); anything else.
    * ``txnid`` (SUCCESS): a string of 1-128 visible ASCII characters (e.g.
      ``MP220915.1234.A12345``); never truncated.

    The status body documented by Orange carries neither amount nor currency
    (``{status, order_id, txnid}``); they are read when present.
    """
    body = json_object(content)
    if body is None:
        return RailStatus(StatusKind.NO_ANSWER, http_status=http, detail="status body is not a JSON object")
    answered_order = body.get("order_id")
    if answered_order is not None and answered_order != order_id:
        return RailStatus(StatusKind.NO_ANSWER, http_status=http,
                          detail="status body names another order_id")
    status = body.get("status")
    if status in (WAITING, CONFIRMED):
        return RailStatus(StatusKind.PENDING, reason=status, http_status=http)
    if status not in (SUCCESS, FAILED, EXPIRED):
        # Echo only what looks like a status word: a rail echoing a token must not reach a log.
        shown = status if isinstance(status, str) and _WORD_RE.match(status) else type(status).__name__
        return RailStatus(StatusKind.NO_ANSWER, http_status=http,
                          detail=f"status body has no known status ({shown})")
    unreadable: list[str] = []
    reported = reported_currency(body, unreadable)
    amount = None
    if "amount" in body:
        raw = body["amount"]
        if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
            amount = raw * 10 ** exponent(reported or currency)
        else:
            unreadable.append("amount")
    txnid = None
    if status == SUCCESS and "txnid" in body:
        raw = body["txnid"]
        if isinstance(raw, str) and len(raw.strip()) <= _HINT_MAX_CHARS and _VISIBLE_ID.fullmatch(raw.strip()):
            txnid = raw.strip()
        else:
            unreadable.append("financial_transaction_id")
    detail = f"unreadable: {', '.join(unreadable)}" if unreadable else None
    kind = StatusKind.SUCCEEDED if status == SUCCESS else StatusKind.FAILED
    return RailStatus(kind, reason=None if status == SUCCESS else status, http_status=http,
                      financial_transaction_id=txnid, amount=amount, currency=reported,
                      unreadable=tuple(unreadable), detail=detail)


def _error_code(response: requests.Response) -> str | None:
    """Orange's error ``code`` (``{code, message, description}``), as a short
    string, when the body has one."""
    body = json_object(response.content)
    code = body.get("code") if body else None
    if isinstance(code, bool) or not isinstance(code, (str, int)):
        return None
    code = str(code).strip()
    return code if _CODE_RE.match(code) else None


def _usable_url(value: str) -> bool:
    return len(value) <= _URL_MAX_CHARS and urlsplit(value.strip()).scheme in ("http", "https")


def _short_id(value: Any) -> str | None:
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
        return str(value)[:_HINT_MAX_CHARS]
    return None


def _callback_hints(body: bytes) -> dict[str, str]:
    """``notif_token`` and ``txnid`` from a notification body; never the status."""
    if isinstance(body, str):
        body = body.encode()
    if not bytes(body).strip():
        return {}
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise MalformedCallback("callback body is not JSON") from None
    if not isinstance(payload, dict):
        raise MalformedCallback("callback body is not a JSON object")
    hints: dict[str, str] = {}
    token = payload.get(NOTIF_TOKEN)
    if isinstance(token, str) and 0 < len(token) <= _NOTIF_TOKEN_MAX_CHARS:
        hints[NOTIF_TOKEN] = token
    txnid = _short_id(payload.get("txnid"))
    if txnid is not None:
        hints["txnid"] = txnid
    return hints
