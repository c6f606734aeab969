"""MTN MoMo adapter: the ``Rail`` port spoken over MoMo's HTTP API.

Two MoMo products, each with its own subscription key, API user and token:
Collection (request-to-pay and its status) and Disbursement (refunds of a
collected payment and their status). Both share one token cache shape, one
transport with bounded retries and one error mapping (``_Product``,
``_exchange``, ``_submit_from_response``, ``_status_from_response``).

Sources for every rule below:

* MoMo Collection API (momodeveloper.mtn.com, product "Collection":
  CreateAccessToken, RequesttoPay, RequesttoPayTransactionStatus), as
  summarised in ``design/rails.md`` section "MTN MoMo, Collection product".
* MoMo Disbursement API (product "Disbursement": CreateAccessToken
  ``POST /disbursement/token/``, Refund V1 ``POST /disbursement/v1_0/refund``
  with body ``{amount, currency, externalId, payerMessage, payeeNote,
  referenceIdToRefund}``, GetRefundStatus ``GET
  /disbursement/v1_0/refund/{referenceId}``), field names checked against
  MTN's own SDKs (MTN-Group/MoMoAPIs_Php_sdk ``API.php``, ``RefundModel``).
* The design page, section "Callbacks are hints": a callback yields
  identifiers only; only the authenticated status query moves money.

Shape of the adapter:

* ``request_to_pay``, ``status``, ``refund`` and ``refund_status`` never raise for anything the rail (or the
  network) does: every answer becomes a ``Submit`` / ``RailStatus`` value, and
  anything we cannot read is ``NO_ANSWER``, never a decline.
* Every call (token fetch, transport retries and a 401's one retry included)
  runs under one total deadline (``vpay.base.http_deadline.Deadline``,
  ``VPAY_MTN_TOTAL_TIMEOUT_SECONDS``, default 20 s), however the rail
  trickles; each HTTP exchange also has (connect, read) timeouts and at most
  ``MAX_ATTEMPTS`` attempts (see ``MtnMomo.__init__``).
* A 401 on an operation (token revoked early) drops the token, fetches a new
  one and retries once, within the same call (design/rails.md).
* Backpressure: a 429 or 503 with ``Retry-After`` closes the adapter's
  ``RailGate`` for that long (capped, ``VPAY_MTN_MAX_PAUSE_SECONDS``); every
  call then raises ``RailPaused`` without sending anything until it opens.
* Credentials and the access token live only in private attributes and in
  request headers; they are never logged and never put in an exception or a
  ``detail`` text.
* Unreadable is not unreported: a status field that is present but not of
  MoMo's documented shape is listed in ``RailStatus.unreadable`` and never
  read as agreement (``_status_from_body`` has the rule per field).
* Configuration is not a decline: an answer that blames our credentials,
  callback host, target environment, currency setup or subscription
  (``CONFIGURATION_CODES``, a token-endpoint 401, any 403) is MISCONFIGURED,
  never REJECTED or FAILED; a FAILED status whose reason blames it carries
  ``configuration=True``. The adapter only classifies; what the payment does
  then is the caller's (docs/flows/reconciler.md, "Configuration is not a
  decline"). A 401 on an API call with a cached token is NO_ANSWER (the token
  is dropped and the next call fetches a fresh one); only a 401 on a token
  fetched for that very call (``fresh_token=True``, the refresh-and-retry)
  or on the token endpoint itself is MISCONFIGURED.
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
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import requests
from vpay.base.http_deadline import Deadline, new_session
from vpay.rails.gate import DEFAULT_MAX_PAUSE_SECONDS, RailGate

from vpay.rails.http import MAX_ATTEMPTS, RETRY_BUDGET_SECONDS, RETRY_WAITS, NoAnswer, exchange, json_object, lifetime_seconds, not_a_refusal, refusal_after_send
from vpay.rails.port import CallbackIds, reported_currency, ChargeRequest, MalformedCallback, RailError, RailPaused, RailStatus, RefundRequest, StatusKind, Submit, SubmitKind, http_url_problem, tuning_from_env

from vpay.money.currency import major_string_to_minor, minor_to_major_string  # noqa: E402  (re-exported)
from vpay.rails.calls import rail_call

log = logging.getLogger("vpay.rails.mtn")

# Amounts: minor units to MoMo's decimal string live in vpay.money.currency (one table
# of ISO 4217 exponents for the whole project).


# --- Rail vocabulary -------------------------------------------------------

# Request-to-pay error codes that mean "refused for good" because of the
# payment itself: resending the same request cannot succeed. Any other error is
# NO_ANSWER (we do not know), or MISCONFIGURED (below).
REJECTING_CODES = frozenset({
    "PAYEE_NOT_ALLOWED_TO_RECEIVE",
    "PAYER_NOT_FOUND",
})

# Error codes that blame OUR configuration, never the payer (design/rails.md,
# "Rail errors that mean *our* configuration is wrong"; MoMo's common-errors
# table, momodeveloper.mtn.com "Common Error Codes"): the callback host is not
# the one registered for the API user, the X-Target-Environment is wrong, the
# account does not take the currency, the subscription lacks the product. On
# any call (token, create, status) they are MISCONFIGURED; so are a 401 from
# the token endpoint (fresh credentials refused: API user, API key or
# subscription key wrong) and any 403.
CONFIGURATION_CODES = frozenset({
    "INVALID_CALLBACK_URL_HOST",
    "NOT_ALLOWED_TARGET_ENVIRONMENT",
    "INVALID_CURRENCY",
    "NOT_ALLOWED",
})

# FAILED reasons of a status read that blame our configuration (the sandbox
# payers 46733123458/459/460): the transaction ended, and no payer was asked
# for money, so the charge may end, but as ``configuration`` and never as a
# payer decline. FAILED/NOT_ALLOWED (payer 457) stays a decline: as a reason
# on a transaction MoMo uses it for the payer's account.
CONFIGURATION_FAILURE_REASONS = frozenset({
    "INVALID_CALLBACK_URL_HOST",
    "NOT_ALLOWED_TARGET_ENVIRONMENT",
    "INVALID_CURRENCY",
})

# FAILED reasons that are not final in spirit (design/rails.md): the payer may
# still approve, so we keep polling instead of settling the charge as failed.
NOT_FINAL_FAILURE_REASONS = frozenset({"ONGOING", "PAYER_DELAYED"})

MESSAGE_MAX_CHARS = 160         # payerMessage / payeeNote limit (MoMo)
_HINT_MAX_CHARS = 128           # identifiers copied from a callback body, for logs
_CODE_MAX_CHARS = 64            # error/reason codes copied from a rail body; a longer one is unreadable
_ID_MAX_CHARS = 128             # a longer financialTransactionId is unreadable, never truncated

# Transport retries inside one call (MAX_ATTEMPTS, RETRY_WAITS,
# RETRY_BUDGET_SECONDS): the rules of vpay.rails.http, shared with Orange.

DEFAULT_TOTAL_TIMEOUT_SECONDS = 20.0
"""One call's whole time (``VPAY_MTN_TOTAL_TIMEOUT_SECONDS``): token fetch,
connects, every byte of every answer, retries and their waits."""
_ENV_TOTAL_TIMEOUT = "VPAY_MTN_TOTAL_TIMEOUT_SECONDS"
_ENV_MAX_PAUSE = "VPAY_MTN_MAX_PAUSE_SECONDS"

# A cached token is dropped this many seconds before MoMo says it expires, so
# that a request sent just before expiry does not arrive with a dead token.
TOKEN_SAFETY_MARGIN_SECONDS = 60.0
TOKEN_FAILURE_MEMORY_SECONDS = 15.0
"""How long a failed token fetch is remembered: calls within it answer
NO_ANSWER without contacting the token endpoint."""

# Our references are UUIDv4 strings in canonical 8-4-4-4-12 form.
_UUID_RE = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE
)

_ENV_BASE_URL = "VPAY_MTN_BASE_URL"
_ENV_SUBSCRIPTION_KEY = "VPAY_MTN_SUBSCRIPTION_KEY"
_ENV_API_USER = "VPAY_MTN_API_USER"
_ENV_API_KEY = "VPAY_MTN_API_KEY"
_ENV_TARGET_ENVIRONMENT = "VPAY_MTN_TARGET_ENVIRONMENT"
_ENV_CALLBACK_URL = "VPAY_MTN_CALLBACK_URL"
# Disbursement credentials (constructor keyword -> variable); each one unset
# falls back to its Collection twin (the constructor does the falling back).
_ENV_DISBURSEMENT = {
    "disbursement_subscription_key": "VPAY_MTN_DISBURSEMENT_SUBSCRIPTION_KEY",
    "disbursement_api_user": "VPAY_MTN_DISBURSEMENT_API_USER",
    "disbursement_api_key": "VPAY_MTN_DISBURSEMENT_API_KEY",
}

COLLECTION = "collection"
DISBURSEMENT = "disbursement"


class _Product:
    """One MoMo product's credentials and access-token cache. ``name`` is
    the URL segment (``collection``, ``disbursement``): its token lives at
    ``{base}/{name}/token/``. Tokens are product-scoped at MoMo, so each
    product caches its own. Holds credentials: never logged (no repr of
    them)."""

    __slots__ = ("name", "subscription_key", "basic_auth", "lock", "token", "failed")

    def __init__(self, name: str, subscription_key: str, api_user: str, api_key: str) -> None:
        self.name = name
        self.subscription_key = subscription_key
        self.basic_auth = "Basic " + base64.b64encode(f"{api_user}:{api_key}".encode()).decode("ascii")
        self.lock = threading.Lock()
        self.token: tuple[str, float] | None = None  # (access_token, expires_at per clock)
        self.failed: tuple["NoAnswer", float] | None = None  # (the failure, until per clock)

    def __repr__(self) -> str:
        return f"_Product({self.name!r})"


class MtnMomo:
    """The MTN MoMo rail (``code = "mtn"``), implementing ``Rail``: payments
    through Collection, refunds through Disbursement.

    One instance is shared by the worker's threads: each product's
    access-token cache is guarded by its own lock, and ``requests.Session`` is used only for its
    thread-safe connection pool.
    """

    code = "mtn"
    resend_safe = True  # the same X-Reference-Id again: 409, "already have it" (Rail.resend_safe)

    def __init__(
        self,
        base_url: str,
        subscription_key: str,
        api_user: str,
        api_key: str,
        target_environment: str = "sandbox",
        callback_url: str | None = None,
        connect_timeout: float = 3.05,
        read_timeout: float = 10.0,
        session: requests.Session | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        disbursement_subscription_key: str | None = None,
        disbursement_api_user: str | None = None,
        disbursement_api_key: str | None = None,
        total_timeout: float = DEFAULT_TOTAL_TIMEOUT_SECONDS,
        max_pause: float = DEFAULT_MAX_PAUSE_SECONDS,
    ) -> None:
        """Build the adapter from explicit settings.

        ``base_url`` is the MoMo API root (``https://sandbox.momodeveloper.mtn.com``,
        or the sandbox rail's URL); ``subscription_key``, ``api_user`` and
        ``api_key`` are the MoMo credentials; ``target_environment`` is sent as
        ``X-Target-Environment``; ``callback_url`` (optional) is our public
        callback route, sent as ``X-Callback-Url`` with ``ref=<rail_reference>``
        appended. Timeouts are in seconds and apply to every request.

        Time bound of one call: ``total_timeout`` seconds, whatever the rail
        does (``vpay.base.http_deadline``: the sockets are shut when it passes and
        the call answers NO_ANSWER ``TIMEOUT``). Within it, each HTTP exchange
        makes at most ``MAX_ATTEMPTS`` attempts, each bounded by the two
        timeouts, with ``RETRY_WAITS`` between them, and starts no new
        attempt once ``RETRY_BUDGET_SECONDS`` have passed; a call makes at
        most four exchanges (token, the operation, and after a 401 a new
        token and the operation once more).

        ``max_pause`` caps the pause one ``Retry-After`` imposes (seconds).

        ``clock`` (monotonic seconds) and ``sleep`` exist for tests: the token
        cache reads ``clock``; retry waits go through ``sleep``.

        ``disbursement_subscription_key``, ``disbursement_api_user`` and
        ``disbursement_api_key`` are the Disbursement product's credentials
        (refunds); each one left empty falls back to its Collection twin.

        Raises ``RailError`` when the base URL or a credential is empty (the
        message names the parameter, never its value).
        """
        required = {
            "base_url": base_url,
            "subscription_key": subscription_key,
            "api_user": api_user,
            "api_key": api_key,
            "target_environment": target_environment,
        }
        missing = [name for name, value in required.items() if not value]
        if missing:
            raise RailError(f"MTN MoMo adapter: missing setting(s): {', '.join(missing)}")
        for name, url in (("base_url", base_url), ("callback_url", callback_url)):
            problem = http_url_problem(url) if url else None
            if problem:
                raise RailError(f"MTN MoMo adapter: {name} {problem}")

        self.base_url = base_url.rstrip("/")
        self.target_environment = target_environment
        self.callback_url = callback_url or None
        self.timeout = (connect_timeout, read_timeout)
        self.total_timeout = float(total_timeout)
        self.gate = RailGate(self.code, max_pause)
        self._collection = _Product(COLLECTION, subscription_key, api_user, api_key)
        self._disbursement = _Product(
            DISBURSEMENT,
            disbursement_subscription_key or subscription_key,
            disbursement_api_user or api_user,
            disbursement_api_key or api_key,
        )
        self._session = session or new_session()
        self._clock = clock
        self._sleep = sleep

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **kwargs: Any) -> "MtnMomo":
        """Build the adapter from the environment (design/contract.md, "Configuration").

        Reads ``VPAY_MTN_BASE_URL``, ``VPAY_MTN_SUBSCRIPTION_KEY``,
        ``VPAY_MTN_API_USER``, ``VPAY_MTN_API_KEY`` (all required),
        ``VPAY_MTN_TARGET_ENVIRONMENT`` (default ``sandbox``) and
        ``VPAY_MTN_CALLBACK_URL`` (optional), ``VPAY_MTN_CONNECT_TIMEOUT_SECONDS``
        and ``VPAY_MTN_READ_TIMEOUT_SECONDS`` (optional, seconds),
        ``VPAY_MTN_TOTAL_TIMEOUT_SECONDS`` (one call's whole time, default 20,
        at most 600) and ``VPAY_MTN_MAX_PAUSE_SECONDS`` (the longest
        backpressure pause, default 300, at most 3600), and the
        Disbursement product's ``VPAY_MTN_DISBURSEMENT_SUBSCRIPTION_KEY``,
        ``VPAY_MTN_DISBURSEMENT_API_USER``, ``VPAY_MTN_DISBURSEMENT_API_KEY``
        (optional, each falling back to its Collection twin). ``kwargs`` go
        to the constructor (timeouts, session, clock, sleep) and win.

        Raises ``RailError`` naming every missing or empty required variable
        (names only, never values), a URL that ``port.http_url_problem``
        refuses (whitespace, control characters, a scheme other than
        http/https), or a timeout that is not a number of seconds in range.
        """
        names = (_ENV_BASE_URL, _ENV_SUBSCRIPTION_KEY, _ENV_API_USER, _ENV_API_KEY)
        missing = [name for name in names if not environ.get(name)]
        if missing:
            raise RailError(
                "MTN MoMo adapter: missing environment variable(s): " + ", ".join(missing)
            )
        tuning_from_env(environ, kwargs, {"connect_timeout": "VPAY_MTN_CONNECT_TIMEOUT_SECONDS",
                                          "read_timeout": "VPAY_MTN_READ_TIMEOUT_SECONDS",
                                          "total_timeout": _ENV_TOTAL_TIMEOUT}, _ENV_MAX_PAUSE)
        for name in (_ENV_BASE_URL, _ENV_CALLBACK_URL):
            problem = http_url_problem(environ[name]) if environ.get(name) else None
            if problem:  # named by its variable (never shown: it may carry a token)
                raise RailError(f"MTN MoMo adapter: {name} {problem}")
        for key, name in _ENV_DISBURSEMENT.items():
            if key not in kwargs and environ.get(name):
                kwargs[key] = environ[name]
        return cls(
            base_url=environ[_ENV_BASE_URL],
            subscription_key=environ[_ENV_SUBSCRIPTION_KEY],
            api_user=environ[_ENV_API_USER],
            api_key=environ[_ENV_API_KEY],
            target_environment=environ.get(_ENV_TARGET_ENVIRONMENT) or "sandbox",
            callback_url=environ.get(_ENV_CALLBACK_URL) or None,
            **kwargs,
        )

    def __repr__(self) -> str:
        # Deliberately omits every credential.
        return f"MtnMomo(base_url={self.base_url!r}, target_environment={self.target_environment!r})"

    # --- Rail: request-to-pay ----------------------------------------------

    @rail_call("request_to_pay")
    def request_to_pay(self, charge: ChargeRequest) -> Submit:
        """Ask the payer to pay: ``POST {base}/collection/v1_0/requesttopay``.

        ``charge.rail_reference`` is sent as ``X-Reference-Id`` (it becomes
        MoMo's resource id), so a resend of the same charge is idempotent:
        MoMo answers 409 ``RESOURCE_ALREADY_EXIST``, read as ACCEPTED.

        Mapping (MoMo Collection API, RequesttoPay; design/rails.md):

        * 202 → ACCEPTED; 409 → ACCEPTED (reason ``RESOURCE_ALREADY_EXIST``).
        * a body code in ``CONFIGURATION_CODES`` (any HTTP status), any 403,
          the token endpoint refusing our credentials (401), or a 3xx to
          any call (a redirect, never followed: ``vpay.rails.http.exchange``)
          → MISCONFIGURED with the rail's code (``HTTP_403``, ``HTTP_302``
          etc. when none).
        * 400 or 500 whose body code is in ``REJECTING_CODES`` → REJECTED with
          that code; any other 400 → REJECTED with its code (or
          ``BAD_REQUEST``): MoMo refused the request itself, resending it
          unchanged cannot help.
        * 401 with a cached token (token dropped), other 5xx, other statuses,
          timeouts, connection errors → NO_ANSWER with a short reason.

        Never raises for the rail's answers. Raises ``TypeError`` /
        ``ValueError`` only for an invalid ``charge.amount`` (our bug, found
        before anything is sent).
        """
        body = self._request_to_pay_body(charge)
        product = self._collection
        try:
            response, token, fresh = self._call(
                product, "POST", f"{self.base_url}/collection/v1_0/requesttopay",
                headers=lambda token: self._request_to_pay_headers(token, charge.rail_reference),
                json_body=body,
            )
        except NoAnswer as no:
            self._log_no_answer("request_to_pay", "charge", charge.charge_id, charge.rail_reference, no)
            return no.submit()

        # a refusal after an earlier attempt that may have got through is no answer
        submit = refusal_after_send(
            self._submit_from_response(response, product, token, fresh_token=fresh), response)
        return submit

    def _request_to_pay_body(self, charge: ChargeRequest) -> dict[str, Any]:
        payer_message = charge.description or f"Payment {charge.charge_id}"
        return {
            "amount": minor_to_major_string(charge.amount, charge.currency),
            "currency": charge.currency,
            "externalId": charge.charge_id,
            "payer": {"partyIdType": "MSISDN", "partyId": charge.payer},
            "payerMessage": payer_message[:MESSAGE_MAX_CHARS],
            "payeeNote": charge.charge_id[:MESSAGE_MAX_CHARS],
        }

    def _request_to_pay_headers(self, token: str, reference: str) -> dict[str, str]:
        headers = self._api_headers(self._collection, token)
        headers["X-Reference-Id"] = reference
        if self.callback_url:
            # MoMo's callback body carries no reference id: the URL must.
            headers["X-Callback-Url"] = callback_url_with_reference(self.callback_url, reference)
        return headers

    def _submit_from_response(self, response: requests.Response, product: _Product,
                              token: str, *, fresh_token: bool = False) -> Submit:
        """The port's ``Submit`` for a create call of either product
        (request-to-pay, refund): see ``request_to_pay`` for the mapping.
        ``fresh_token``: the token was fetched for this very call (the retry
        after a 401), so a 401 now refuses our credentials, not a stale token."""
        http = response.status_code
        code = _error_code(response)
        if http == 202:
            return Submit(SubmitKind.ACCEPTED, http_status=http)
        if http == 409:
            # Our reference already exists at MoMo: an earlier send got there.
            return Submit(SubmitKind.ACCEPTED, reason=code or "RESOURCE_ALREADY_EXIST", http_status=http)
        if _blames_configuration(http, code, fresh_token):
            self._log_misconfigured(product, http, code)
            return Submit(SubmitKind.MISCONFIGURED, reason=code or f"HTTP_{http}", http_status=http)
        if http in (400, 500) and code in REJECTING_CODES:
            return Submit(SubmitKind.REJECTED, reason=code, http_status=http)
        if http == 400:
            return Submit(SubmitKind.REJECTED, reason=code or "BAD_REQUEST", http_status=http)
        if http == 401:
            self._drop_token(product, token)
            return Submit(SubmitKind.NO_ANSWER, reason=code or "UNAUTHORIZED", http_status=http)
        return Submit(SubmitKind.NO_ANSWER, reason=code or f"HTTP_{http}", http_status=http)

    def _log_misconfigured(self, product: _Product, http: int, code: str | None) -> None:
        log.error("mtn %s refused our configuration (HTTP %s, code %s): an operator must fix the "
                  "VPAY_MTN_* settings or the MoMo account; never a payer decline",
                  product.name, http, code)

    # --- Rail: status ------------------------------------------------------

    @rail_call("status")
    def status(self, charge: ChargeRequest) -> RailStatus:
        """The authenticated status query:
        ``GET {base}/collection/v1_0/requesttopay/{rail_reference}``.

        Mapping (MoMo Collection API, RequesttoPayTransactionStatus;
        design/rails.md):

        * 200 ``PENDING`` → PENDING; ``SUCCESSFUL`` → SUCCEEDED with
          ``financialTransactionId``, ``amount`` (minor units) and
          ``currency``; ``FAILED`` → FAILED with ``reason``,
          except reasons ``ONGOING`` and ``PAYER_DELAYED`` → PENDING (not final
          in spirit). ``reason`` may be ``"CODE"`` or ``{"code", "message"}``;
          both become the code string. Fields present but unreadable are
          listed in ``unreadable`` (rules: ``_status_from_body``).
        * 404 → NOT_FOUND.
        * a code in ``CONFIGURATION_CODES``, any 403, the token endpoint
          refusing our credentials, or a 3xx (a redirect, never followed) →
          MISCONFIGURED: the read was refused, which says nothing about the
          payment.
        * 401 with a cached token (token dropped), 5xx, other statuses,
          timeouts, connection errors, a non-JSON 200 or one without a known
          ``status`` → NO_ANSWER with a short credential-free ``detail``.

        Never raises for the rail's answers.
        """
        return self._read_status(self._collection, "collection/v1_0/requesttopay", "status", "charge",
                                 charge.charge_id, charge.rail_reference, charge.currency)

    def _read_status(self, product: _Product, resource: str, op: str, noun: str, our_id: str,
                     reference: str, currency: str) -> RailStatus:
        """``GET {base}/{resource}/{reference}`` with ``product``'s token, mapped
        to the port's ``RailStatus``: the one status read of both products
        (collection: ``status``; disbursement: ``refund_status``), so a charge
        and a refund can never be read by different rules. ``op``, ``noun``
        and ``our_id`` name the call in the no-answer log line; ``currency`` is the one
        we asked for (its exponent reads an amount reported without a
        currency). Never raises for the rail's answers."""
        url = f"{self.base_url}/{resource}/{quote(reference, safe='')}"
        try:
            response, token, fresh = self._call(product, "GET", url)
        except NoAnswer as no:
            self._log_no_answer(op, noun, our_id, reference, no)
            return no.status()

        result = self._status_from_response(response, product, token, currency, fresh_token=fresh)
        return result

    def _status_from_response(self, response: requests.Response, product: _Product,
                              token: str, currency: str, *, fresh_token: bool = False) -> RailStatus:
        """The port's ``RailStatus`` for a status read of either product
        (request-to-pay, refund): see ``status`` for the mapping.
        ``currency`` is the one we asked for (its exponent reads an amount
        the body reports without a currency); ``fresh_token`` as for
        ``_submit_from_response``."""
        http = response.status_code
        if http == 200:
            return _status_from_body(response.content, currency)
        code = _error_code(response)
        if _blames_configuration(http, code, fresh_token):
            self._log_misconfigured(product, http, code)
            return RailStatus(StatusKind.MISCONFIGURED, reason=code or f"HTTP_{http}", http_status=http,
                              detail=f"HTTP {http}: the rail refused our configuration")
        if http == 404:
            return RailStatus(StatusKind.NOT_FOUND, reason=code or "RESOURCE_NOT_FOUND", http_status=http)
        if http == 401:
            self._drop_token(product, token)
            return RailStatus(StatusKind.NO_ANSWER, reason=code or "UNAUTHORIZED",
                              http_status=http, detail="HTTP 401: access token refused, dropped")
        return RailStatus(StatusKind.NO_ANSWER, reason=code, http_status=http,
                          detail=f"HTTP {http} from status query")

    # --- Rail: refunds (Disbursement product) -----------------------------

    @rail_call("refund")
    def refund(self, refund: RefundRequest) -> Submit:
        """Give back a collected payment: ``POST {base}/disbursement/v1_0/refund``.

        ``refund.rail_reference`` is sent as ``X-Reference-Id`` (the refund's
        own resource id at MoMo), so a resend is idempotent: 409 is ACCEPTED.
        Body: ``amount`` (major units as a string), ``currency``,
        ``externalId`` (our ``re_…``), ``payerMessage``, ``payeeNote`` and
        ``referenceIdToRefund`` (the charge's ``X-Reference-Id``). No
        ``X-Callback-Url`` is sent: the callback route knows charges only,
        and only the status read settles a refund anyway.

        Uses the Disbursement product's token and subscription key. Answers
        map exactly as for ``request_to_pay`` (202/409 ACCEPTED; 400, or a
        500 with a code in ``REJECTING_CODES``, REJECTED; 401, other 5xx,
        timeouts NO_ANSWER). Never raises for the rail's answers; raises
        ``TypeError`` / ``ValueError`` only for an invalid ``refund.amount``
        (before anything is sent).
        """
        body = {
            "amount": minor_to_major_string(refund.amount, refund.currency),
            "currency": refund.currency,
            "externalId": refund.refund_id,
            "payerMessage": f"Refund {refund.refund_id}"[:MESSAGE_MAX_CHARS],
            "payeeNote": refund.refund_id[:MESSAGE_MAX_CHARS],
            "referenceIdToRefund": refund.charge_rail_reference,
        }
        product = self._disbursement
        try:
            response, token, fresh = self._call(
                product, "POST", f"{self.base_url}/disbursement/v1_0/refund",
                headers=lambda token: self._api_headers(product, token)
                | {"X-Reference-Id": refund.rail_reference},
                json_body=body)
        except NoAnswer as no:
            self._log_no_answer("refund", "refund", refund.refund_id, refund.rail_reference, no)
            return no.submit()

        # a refusal after an earlier attempt that may have got through is no answer
        submit = refusal_after_send(
            self._submit_from_response(response, product, token, fresh_token=fresh), response)
        return submit

    @rail_call("refund_status")
    def refund_status(self, refund: RefundRequest) -> RailStatus:
        """The authenticated refund status query:
        ``GET {base}/disbursement/v1_0/refund/{rail_reference}``.

        Same mapping as ``status``: 200 ``PENDING`` / ``SUCCESSFUL`` (with
        ``financialTransactionId``) / ``FAILED`` (with ``reason``, either
        shape); 404 → NOT_FOUND; 401 (token dropped), 5xx, timeouts and
        unreadable bodies → NO_ANSWER, never a decline. Never raises.
        """
        return self._read_status(self._disbursement, "disbursement/v1_0/refund", "refund_status",
                                 "refund", refund.refund_id, refund.rail_reference, refund.currency)

    # --- Rail: callback ----------------------------------------------------

    def parse_callback(self, query: Mapping[str, str], body: bytes) -> CallbackIds:
        """Extract identifiers from a MoMo callback; never its status.

        ``query`` is the callback URL's query string as a mapping: ``ref`` is
        the ``rail_reference`` we appended to ``X-Callback-Url`` (MoMo's body
        carries no reference id) and must be a UUID in canonical form; it is
        returned lower-cased, as ``uuid.uuid4()`` writes it. ``body`` is the
        raw request body (bytes): MoMo's status body as JSON, possibly empty.
        Its ``externalId`` and ``financialTransactionId`` (strings only,
        truncated) go to ``hints`` for logs. ``status``, ``reason`` and
        ``amount`` are never read: a callback is a hint (design page,
        "Callbacks are hints").

        Raises ``MalformedCallback`` when ``ref`` is missing or not a UUID, or
        when a non-empty body is not a JSON object.
        """
        reference = query.get("ref")
        if not isinstance(reference, str) or not reference:
            raise MalformedCallback("callback query has no ref parameter")
        reference = reference.strip()
        if not _UUID_RE.match(reference):
            raise MalformedCallback("callback ref is not a UUID")
        return CallbackIds(rail_reference=reference.lower(), hints=_callback_hints(body))

    # --- Token -------------------------------------------------------------

    def _access_token(self, product: _Product, deadline: Deadline) -> str:
        """A valid bearer token for ``product``, from its cache or
        ``POST {base}/{product}/token/``.

        The lock is held during the fetch on purpose: threads that find the
        cache empty wait for one fetch instead of each making their own. A
        failed fetch is remembered for ``TOKEN_FAILURE_MEMORY_SECONDS``: the
        threads that waited behind it answer "no answer" at once instead of
        each trying again in turn (a hung token endpoint would otherwise hold
        every claim loop for minutes, and the watchdog would kill the worker).
        """
        # Waiting for another thread's fetch counts against this call's deadline.
        if not product.lock.acquire(timeout=max(deadline.remaining(), 0.001)):
            raise NoAnswer("TIMEOUT", "deadline passed waiting for another call's token fetch")
        try:
            now = self._clock()
            if product.token is not None and now < product.token[1]:
                return product.token[0]
            if product.failed is not None and now < product.failed[1]:
                raise product.failed[0]
            try:
                token, lifetime = self._fetch_token(product, deadline)
            except NoAnswer as failure:
                product.failed = (failure, self._clock() + TOKEN_FAILURE_MEMORY_SECONDS)
                raise
            product.failed = None
            margin = min(TOKEN_SAFETY_MARGIN_SECONDS, lifetime / 2)
            product.token = (token, now + lifetime - margin)
            return token
        finally:
            product.lock.release()

    def _fetch_token(self, product: _Product, deadline: Deadline) -> tuple[str, float]:
        """``(access_token, expires_in seconds)``; raises ``NoAnswer``."""
        response = self._exchange(
            "POST",
            f"{self.base_url}/{product.name}/token/",
            headers={
                "Authorization": product.basic_auth,
                "Ocp-Apim-Subscription-Key": product.subscription_key,
            },
            deadline=deadline,
        )
        if response.status_code != 200:
            code = _error_code(response)
            # Fresh credentials refused: no retry or new token can help.
            refused = response.status_code in (401, 403) or code in CONFIGURATION_CODES
            if refused:
                self._log_misconfigured(product, response.status_code, code)
            raise NoAnswer(
                reason=code or f"TOKEN_HTTP_{response.status_code}",
                detail=f"token endpoint answered HTTP {response.status_code}",
                http_status=response.status_code,
                misconfigured=refused,
            )
        payload = json_object(response.content)
        token = payload.get("access_token") if payload else None
        if not isinstance(token, str) or not token:
            raise NoAnswer(reason="TOKEN_MALFORMED", detail="token endpoint body has no access_token",
                            http_status=200)
        return token, lifetime_seconds(payload.get("expires_in"))

    def _drop_token(self, product: _Product, token: str) -> None:
        """Forget ``token`` after a 401, so the next call fetches a new one.
        Only that token: another thread may already have replaced it."""
        with product.lock:
            if product.token is not None and product.token[0] == token:
                product.token = None
        log.warning("mtn %s access token refused (HTTP 401); dropped, the next call fetches a new one",
                    product.name)

    # --- Transport ---------------------------------------------------------

    def _api_headers(self, product: _Product, token: str) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {token}",
            "X-Target-Environment": self.target_environment,
            "Ocp-Apim-Subscription-Key": product.subscription_key,
        }

    def _call(
        self,
        product: _Product,
        method: str,
        url: str,
        *,
        headers: Callable[[str], Mapping[str, str]] | None = None,
        json_body: Any = None,
    ) -> tuple[requests.Response, str, bool]:
        """One authenticated call of ``product``: ``(response, token used,
        fresh)``; ``fresh`` when that token was fetched after a 401 in this
        call (so another 401 refuses our credentials, not a stale token).

        Raises ``RailPaused`` (nothing sent) while the rail's gate is closed.
        Then, under one ``Deadline(total_timeout)``: a token (cached or
        fetched), the exchange, and on a 401 (a token revoked before its
        ``expires_in``) the token is dropped, a new one fetched and the
        exchange made once more, before anything else (design/rails.md).
        ``headers(token)`` builds the request headers (default: the product's
        API headers). Raises ``NoAnswer`` when no response came (the deadline
        passed: reason ``TIMEOUT``), and ``RailPaused`` when the answer was a
        429/503 with ``Retry-After``.
        """
        self.gate.check()
        build = headers or (lambda token: self._api_headers(product, token))
        with Deadline(self.total_timeout) as deadline:
            token = self._access_token(product, deadline)
            response = self._exchange(method, url, headers=build(token), json_body=json_body,
                                      deadline=deadline)
            if response.status_code == 401:
                # An attempt before the 401 may have reached MoMo (a 504 passed
                # through): then no refusal from here on proves no payer was asked.
                earlier = getattr(response, "sent_before", False)
                self._drop_token(product, token)
                try:
                    token = self._access_token(product, deadline)
                    response = self._exchange(method, url, headers=build(token), json_body=json_body,
                                              deadline=deadline)
                except NoAnswer as no:
                    raise (not_a_refusal(no) if earlier else no) from None
                response.sent_before = response.sent_before or earlier
                log.info("mtn %s: retried once with a new access token -> HTTP %s",
                         product.name, response.status_code)
                return response, token, True
        return response, token, False

    def _exchange(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        json_body: Any = None,
        deadline: Deadline,
    ) -> requests.Response:
        """One HTTP exchange with bounded transport retries, inside ``deadline``.

        Retries connection errors, timeouts and HTTP 502/503/504 (a 503 only
        without ``Retry-After``) only, and starts no attempt once the deadline
        has passed; any other answer is returned at once. Retrying a POST is
        safe here: the token call has no effect, and request-to-pay and
        refund are idempotent by ``X-Reference-Id`` (a duplicate gets 409).
        Returns the last response (possibly a 503); raises ``NoAnswer`` when
        no response came, and ``RailPaused`` (after closing the gate) for a
        429 or 503 carrying ``Retry-After``.
        """
        return exchange(self._session, method, url, rail=self.code, gate=self.gate,
                        deadline=deadline, timeout=self.timeout, sleep=self._sleep,
                        detail_suffix=" after retries", headers=dict(headers), json=json_body)

    def _log_no_answer(self, operation: str, label: str, ident: str, reference: str,
                       no: NoAnswer) -> None:
        log.warning(
            "mtn %s %s=%s reference=%s -> %s: %s (reason %s)",
            operation, label, ident, reference,
            "refused for our configuration" if no.misconfigured else "no answer", no.detail, no.reason,
        )


# --- Helpers (pure) ----------------------------------------------------------


def callback_url_with_reference(callback_url: str, reference: str) -> str:
    """``callback_url`` with ``ref=<reference>`` added to its query string.

    Existing query parameters are kept, except an existing ``ref`` which is
    replaced: the reference must be ours. MoMo's callback body carries no
    reference id (design/rails.md, "Callback"), so this is how
    ``parse_callback`` finds the charge.
    """
    parts = urlsplit(callback_url)
    params = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "ref"]
    params.append(("ref", reference))
    return urlunsplit(parts._replace(query=urlencode(params)))


def _blames_configuration(http: int, code: str | None, fresh_token: bool) -> bool:
    """Whether an error answer (not 2xx, not 404/409) refuses OUR
    configuration: a code in ``CONFIGURATION_CODES`` (MoMo sends them with
    400, 403 or 500), any 403, or a 401 on a token fetched for this very call."""
    return code in CONFIGURATION_CODES or http == 403 or (http == 401 and fresh_token)


_PRINTABLE_ID = re.compile(r"[\x21-\x7e]+")   # visible ASCII, no spaces
_PRINTABLE_CODE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")   # inner spaces allowed


def _status_from_body(content: bytes, currency: str) -> RailStatus:
    """Map a 200 status body (collection or refund) to a ``RailStatus``.

    ``status`` must be one of ``PENDING | SUCCESSFUL | FAILED`` (anything
    else, or no JSON object: NO_ANSWER, never a decline). Unreadable is not
    unreported: on a terminal status, each field below that is PRESENT but not
    of MoMo's documented shape is listed in ``RailStatus.unreadable`` (the
    poll then settles nothing and raises one ``rail_contradiction`` alert); a
    field that is absent is simply not reported. ``null`` is present.

    * ``amount`` (SUCCESSFUL and FAILED): a string of the major-unit decimal
      (MoMo: ``"amount": "15.00"``); read with ``currency.major_string_to_minor``
      by the reported currency's ISO 4217 exponent (the asked ``currency``
      when the body reports none). Unreadable: a JSON number (MoMo sends a
      string, so a number is not its shape), ``null``, ``""``, ``"fifteen"``,
      ``"1e3"``, ``"-15"``, ``"1,500"``, ``" 15"``, and more decimals than
      the exponent unless they are zeros (``"15.001"`` EUR).
    * ``currency`` (SUCCESSFUL and FAILED): three ASCII letters (ISO 4217),
      upper-cased; anything else is unreadable.
    * ``reason`` (FAILED): ``"CODE"`` or ``{"code": "CODE", ...}`` where
      CODE is 1-64 printable ASCII characters; anything else (a number,
      ``null``, ``""``, a longer text, an object without a string ``code``) is
      unreadable. A FAILED without a ``reason`` key is a decline with no
      reason. ONGOING / PAYER_DELAYED are PENDING (not final in spirit).
    * ``financialTransactionId`` (SUCCESSFUL): a string of 1-128 visible
      ASCII characters; never truncated.

    A FAILED whose reason is in ``CONFIGURATION_FAILURE_REASONS`` carries
    ``configuration=True``.
    """
    body = json_object(content)
    if body is None:
        return RailStatus(StatusKind.NO_ANSWER, http_status=200, detail="status body is not a JSON object")
    status = body.get("status")
    if status == "PENDING":
        return RailStatus(StatusKind.PENDING, reason=_reason_code(body.get("reason")), http_status=200)
    if status not in ("SUCCESSFUL", "FAILED"):
        shown = status[:_CODE_MAX_CHARS] if isinstance(status, str) else type(status).__name__
        return RailStatus(StatusKind.NO_ANSWER, http_status=200,
                          detail=f"status body has no known status ({shown})")
    unreadable: list[str] = []
    reason = None
    if status == "FAILED" and "reason" in body:
        reason = _reason_code(body["reason"])
        if reason is None:
            unreadable.append("reason")
        elif reason in NOT_FINAL_FAILURE_REASONS:
            return RailStatus(StatusKind.PENDING, reason=reason, http_status=200,
                              detail=f"FAILED/{reason} is not final; keep polling")
    reported = reported_currency(body, unreadable)
    amount = None
    if "amount" in body:
        amount = major_string_to_minor(body["amount"], reported or currency)
        if amount is None:
            unreadable.append("amount")
    transaction_id = None
    if status == "SUCCESSFUL" and "financialTransactionId" in body:
        transaction_id = _visible_id(body["financialTransactionId"])
        if transaction_id is None:
            unreadable.append("financial_transaction_id")
    detail = f"unreadable: {', '.join(unreadable)}" if unreadable else None
    if status == "SUCCESSFUL":
        return RailStatus(StatusKind.SUCCEEDED, http_status=200, financial_transaction_id=transaction_id,
                          amount=amount, currency=reported, unreadable=tuple(unreadable),
                          detail=detail)
    return RailStatus(StatusKind.FAILED, reason=reason, http_status=200, amount=amount,
                      currency=reported, unreadable=tuple(unreadable), detail=detail,
                      configuration=reason in CONFIGURATION_FAILURE_REASONS)


def _reason_code(reason: Any) -> str | None:
    """MoMo's ``reason`` as a code string: ``"CODE"`` or ``{"code": "CODE", ...}``;
    ``None`` when it is neither, or CODE is empty, longer than 64 characters
    or not visible ASCII (an error body's ``code`` is read the same way)."""
    if isinstance(reason, dict):
        reason = reason.get("code")
    if isinstance(reason, str) and len(reason.strip()) <= _CODE_MAX_CHARS \
            and _PRINTABLE_CODE.fullmatch(reason.strip()):
        return reason.strip()
    return None


def _visible_id(value: Any) -> str | None:
    """A rail transaction id: a string of 1-128 visible ASCII characters
    (surrounding spaces dropped), else ``None``."""
    if isinstance(value, str) and len(value.strip()) <= _ID_MAX_CHARS and _PRINTABLE_ID.fullmatch(value.strip()):
        return value.strip()
    return None


def _error_code(response: requests.Response) -> str | None:
    """The ``code`` of a MoMo error body ``{code, message}``, when there is one."""
    body = json_object(response.content)
    return _reason_code(body.get("code")) if body else None


def _short_id(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value[:_HINT_MAX_CHARS]
    return None


def _callback_hints(body: bytes) -> dict[str, str]:
    """Identifiers from a callback body, for logs; never the status."""
    if isinstance(body, str):
        body = body.encode()
    if not bytes(body).strip():
        return {}
    try:
        payload = json.loads(body)
    except ValueError:
        raise MalformedCallback("callback body is not JSON") from None
    if not isinstance(payload, dict):
        raise MalformedCallback("callback body is not a JSON object")
    hints = {}
    for key in ("externalId", "financialTransactionId"):
        value = _short_id(payload.get(key))
        if value is not None:
            hints[key] = value
    return hints
