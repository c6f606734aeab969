"""A local test/demo double of MTN MoMo's Collection API ("request to pay"),
and of the Disbursement API's refunds.

This is **not** MTN's sandbox and never talks to MTN: it is an in-process HTTP
server that answers the public MoMo Collection API closely enough that a real
MoMo client (vpay's MTN adapter, or any client written against
https://momodeveloper.mtn.com/api-documentation) works against it unchanged,
for demos and end-to-end tests. Standard library only.

MoMo endpoints served (``{base}`` is ``SandboxRail.url``)::

    POST {base}/collection/token/                          -> 200 {access_token, token_type, expires_in}
        needs Ocp-Apim-Subscription-Key and Authorization: Basic base64(api_user:api_key)
    POST {base}/collection/v1_0/requesttopay               -> 202, empty body
        needs Authorization: Bearer <token from this server>, Ocp-Apim-Subscription-Key,
        X-Target-Environment, X-Reference-Id (UUIDv4), optional X-Callback-Url; JSON body
        {amount: "string", currency, externalId?, payer: {partyIdType: "MSISDN", partyId},
         payerMessage?, payeeNote?} (messages at most 160 characters)
    GET  {base}/collection/v1_0/requesttopay/{referenceId} -> 200 status body (even for FAILED)
        {amount, currency, financialTransactionId (SUCCESSFUL only), externalId (when sent),
         payer, payerMessage, payeeNote, status, reason (FAILED only)}
    GET  {base}/{product}/v1_0/account/balance[/{currency}]   (product: collection|disbursement)
        -> 200 {availableBalance: "decimal string", currency}: ``opening_balance`` plus the
        SUCCESSFUL collections (Collection) or minus the SUCCESSFUL refunds (Disbursement)
        in ``account_currency`` (EUR); another {currency} -> 500 INVALID_CURRENCY
    GET  {base}/{product}/v1_0/accountholder/{msisdn|email}/{accountHolderId}/active
        -> 200 {"result": true|false}: false for 46733123455 (PAYER_NOT_FOUND) and for a
        payer scripted ``active=False``; 400 BAD_REQUEST for another id type or a bad id
    POST {base}/disbursement/token/                        -> as the collection token, with the
        Disbursement credentials (constructor ``disbursement_*``, default: the Collection ones);
        a Collection token is refused by Disbursement endpoints and vice versa
    POST {base}/disbursement/v1_0/refund                   -> 202, empty body
        needs a Disbursement Bearer token and subscription key, X-Target-Environment,
        X-Reference-Id (UUIDv4, the refund's id); JSON body {amount: "string", currency,
        externalId?, payerMessage?, payeeNote?, referenceIdToRefund (a request-to-pay's
        X-Reference-Id)}; 409 RESOURCE_ALREADY_EXIST for a duplicate X-Reference-Id
    GET  {base}/disbursement/v1_0/refund/{referenceId}     -> 200 refund status body
        {amount, currency, financialTransactionId (SUCCESSFUL only), externalId, payee,
         payerMessage, payeeNote, status, reason (FAILED only)}; 404 RESOURCE_NOT_FOUND

Refunds: a refund of a SUCCESSFUL collection is PENDING until
``success_after_seconds`` after it was accepted, then SUCCESSFUL. A refund
whose ``referenceIdToRefund`` names no collection FAILs at once with reason
``REFUND_TARGET_NOT_FOUND``; one naming a collection that is not SUCCESSFUL
(at the moment the refund arrives) with ``REFUND_TARGET_NOT_SUCCESSFUL``.
Both codes are this sandbox's own: MoMo documents none for these cases. The
amount is not checked against the collection's (vpay checks it before it
asks). A refund is scripted through the refunded collection's payer (below).

The Balance and account-holder endpoints need the product's own token and
subscription key and the target environment, like every other call.

Errors are MoMo-shaped ``{"code": ..., "message": ...}``, with the HTTP
statuses of MTN's common-errors table: 401 bad subscription key / credentials
/ token; 400 ``BAD_REQUEST`` (bad X-Reference-Id, bad body); 409
``RESOURCE_ALREADY_EXIST`` (duplicate X-Reference-Id); 404
``RESOURCE_NOT_FOUND``; 500 ``NOT_ALLOWED_TARGET_ENVIRONMENT`` (an
X-Target-Environment other than ``target_environment``), 500
``INVALID_CURRENCY`` (in the ``sandbox`` target environment, any currency but
EUR: MTN's sandbox is EUR only; nothing is recorded), 500
``INVALID_CALLBACK_URL_HOST`` (callback host not allowed, see
``callback_hosts``).

``reason`` on a FAILED status is a plain string by default
(``"reason": "APPROVAL_REJECTED"``, MTN's published shape);
``reason_shape="object"`` (CLI ``--reason-shape object``) gives
``{code, message}`` instead, a shape some deployments and clients use: vpay's
adapter accepts both.

Default credentials are MTN-shaped (``DEFAULT_SUBSCRIPTION_KEY``: 32 hex
characters, ``DEFAULT_API_USER``: a UUID v4, ``DEFAULT_API_KEY``: 32 hex
characters), so clients that check the shapes accept them.

Default behaviour by payer MSISDN (MTN's published sandbox numbers,
``SANDBOX_FAILURES``): the payers below end FAILED with the given reason,
immediately; every other payer is PENDING until ``success_after_seconds``
after its request-to-pay, then SUCCESSFUL (with a ``financialTransactionId``).

    46733123450 INTERNAL_PROCESSING_ERROR      46733123457 NOT_ALLOWED
    46733123451 APPROVAL_REJECTED              46733123458 NOT_ALLOWED_TARGET_ENVIRONMENT
    46733123452 EXPIRED                        46733123459 INVALID_CALLBACK_URL_HOST
    46733123453 ONGOING                        46733123460 INVALID_CURRENCY
    46733123454 PAYER_DELAYED                  46733123461 INTERNAL_PROCESSING_ERROR
    46733123455 PAYER_NOT_FOUND                46733123462 SERVICE_UNAVAILABLE
    46733123456 PAYEE_NOT_ALLOWED_TO_RECEIVE   46733123463 COULD_NOT_PERFORM_TRANSACTION

ONGOING and PAYER_DELAYED stay FAILED with that reason for ever (vpay reads
them as "still pending").

Scripting, per payer MSISDN, through ``SandboxRail.script(payer, **opts)`` or
``PUT /_sandbox/payers/{msisdn}`` with the same options as a JSON object. A
script replaces the payer's previous one (no options = back to the default)
and applies to every transaction of that payer created after it is set:

* ``pending_reads: int`` - answer PENDING to the first N (non-error) status
  reads of the transaction, then the outcome. When ``pending_reads`` or
  ``outcome`` is given, the read count replaces the success timer.
* ``outcome: "SUCCESSFUL"|"FAILED"|"PENDING"`` - the final status (PENDING =
  never terminal); default: the payer's default outcome.
* ``reason: str`` - the FAILED reason (needs ``outcome="FAILED"``); default:
  the payer's sandbox reason, else ``APPROVAL_REJECTED``.
* ``status_errors: list[int]`` - the first status reads answer these HTTP
  codes in order (e.g. ``[500, 503]``), MoMo-shaped bodies, before normal
  behaviour. Error reads do not count towards ``pending_reads``.
* ``rtp_errors: list[int]`` - the payer's next request-to-pay calls answer
  these codes in order WITHOUT recording the transaction (the rail did not
  take it; a later status read is 404).
* ``rtp_record_then_error: list[int]`` - after ``rtp_errors`` are used up, the
  next request-to-pay calls record the transaction but answer these codes
  (the rail took it and we did not hear; a resend gets 409).
* ``status_delay_seconds: float`` / ``rtp_delay_seconds: float`` - sleep this
  long before answering every status read / request-to-pay (to exceed a
  client's read timeout). A request-to-pay is recorded (or not) before the
  sleep, as a real rail would.
* ``callback: bool`` (default True) - send the callback (below).
* ``active: bool`` - what the account-holder check answers for this payer
  (default: true, false for 46733123455).
* Refunds of this payer's collections, created after the script is set:
  ``refund_pending_reads: int``, ``refund_outcome``, ``refund_reason``,
  ``refund_status_errors: list[int]``, ``refund_status_delay_seconds`` work
  as their request-to-pay twins above; ``refund_errors: list[int]`` and
  ``refund_record_then_error: list[int]`` as ``rtp_errors`` and
  ``rtp_record_then_error`` for the refund call. A refund whose collection
  is unknown or not SUCCESSFUL fails whatever the script says.

Other control endpoints (no authentication: bind to loopback only), each with
a Python twin:

* ``PUT /_sandbox/transactions/{ref}`` ``{"status", "reason"}`` /
  ``set_status(ref, status, reason=None)``: force a transaction's state for
  ever (e.g. make the rail contradict a settled charge).
* ``GET /_sandbox/transactions[/{ref}]`` / ``transactions()``, ``transaction(ref)``.
* ``DELETE /_sandbox/transactions/{ref}`` / ``forget(ref)``: the rail forgets it (404).
* ``GET|PUT|DELETE /_sandbox/refunds[/{ref}]`` / ``refunds()``, ``refund(ref)``,
  ``set_refund_status(ref, status, reason=None)``, ``forget_refund(ref)``: the
  same for refunds.
* ``GET /_sandbox/requests`` / ``requests_log()``: every MoMo request received
  (not control requests) as ``{method, path, reference, status_code, at}``;
  ``count(method=None, path_prefix=None, reference=None)`` counts them.
* ``GET /_sandbox/callbacks`` / ``callbacks()``: callbacks attempted.
* ``PUT|DELETE /_sandbox/payers/{msisdn}`` / ``script()``, ``GET /_sandbox/payers``.
* ``POST /_sandbox/reset`` / ``reset()``: forget transactions, refunds,
  scripts and logs (issued tokens stay valid).

Callback: when a transaction first becomes terminal (SUCCESSFUL or FAILED,
seen at a status read, by its success timer, at creation for the sandbox
failure payers, or through ``set_status``) and it was created with an
``X-Callback-Url``, the status body is sent once to that URL (``POST`` by
default, ``callback_method="PUT"`` possible; MoMo uses both) from a background
thread with a 5 s timeout: never retried, errors logged and swallowed. Like
MoMo's ``INVALID_CALLBACK_URL_HOST`` check, a request-to-pay whose callback
host is not allowed is refused with 500; by default only loopback hosts are
allowed (``callback_hosts``). A scripted transaction (``pending_reads`` or
``outcome``) only becomes terminal at a status read, so its callback follows
that read.

Command line (demo): ``python -m vpay.sandbox.mtn --port 8089`` serves until
Ctrl-C or SIGTERM; see ``--help``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import hmac
import itertools
import json
import logging
import re
import secrets
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterable, Mapping

__all__ = [
    "SandboxRail",
    "SANDBOX_FAILURES",
    "REASON_MESSAGES",
    "DEFAULT_SUBSCRIPTION_KEY",
    "DEFAULT_API_USER",
    "DEFAULT_API_KEY",
    "SANDBOX_CURRENCY",
    "main",
]

from vpay.sandbox import server as _server  # noqa: E402
from vpay.sandbox.server import SandboxHandler, SandboxServer, is_loopback_host  # noqa: E402

log = logging.getLogger("vpay.sandbox.mtn")

# MTN-shaped defaults (docs/sandbox.md "Credentials"): a subscription key is
# 32 hex characters, an API user a UUID version 4, an API key 32 hex
# characters, as MTN's portal and its sandbox provisioning API hand them out.
# They open this local double only: not secrets, never valid at MTN.
DEFAULT_SUBSCRIPTION_KEY = "0f3c5a7e9b1d4f6a8c2e4b6d8f0a1c3e"
DEFAULT_API_USER = "7c1e3f0a-5b2d-4e8a-9c6f-0d1b2a3c4e5f"
DEFAULT_API_KEY = "5d2b8e4f1a7c4e9b8d3f6a2c9e1b7d40"

#: The only currency MTN's sandbox (``X-Target-Environment: sandbox``) takes.
SANDBOX_CURRENCY = "EUR"
#: What each account (Collection, Disbursement) holds before any transaction.
DEFAULT_OPENING_BALANCE = "1000.00"

#: MTN's sandbox payer numbers and the reason each one FAILs with.
SANDBOX_FAILURES: dict[str, str] = {
    "46733123450": "INTERNAL_PROCESSING_ERROR",
    "46733123451": "APPROVAL_REJECTED",
    "46733123452": "EXPIRED",
    "46733123453": "ONGOING",
    "46733123454": "PAYER_DELAYED",
    "46733123455": "PAYER_NOT_FOUND",
    "46733123456": "PAYEE_NOT_ALLOWED_TO_RECEIVE",
    "46733123457": "NOT_ALLOWED",
    "46733123458": "NOT_ALLOWED_TARGET_ENVIRONMENT",
    "46733123459": "INVALID_CALLBACK_URL_HOST",
    "46733123460": "INVALID_CURRENCY",
    "46733123461": "INTERNAL_PROCESSING_ERROR",
    "46733123462": "SERVICE_UNAVAILABLE",
    "46733123463": "COULD_NOT_PERFORM_TRANSACTION",
}

#: Human messages for reason/error codes (MoMo's documented descriptions).
REASON_MESSAGES: dict[str, str] = {
    "PAYEE_NOT_FOUND": "Payee does not exist",
    "PAYER_NOT_FOUND": "Payer does not exist",
    "NOT_ALLOWED": "Authorization failed. Insufficient permissions",
    "NOT_ALLOWED_TARGET_ENVIRONMENT": "Access to target environment is forbidden",
    "INVALID_CALLBACK_URL_HOST": "Callback URL does not match the configured value",
    "INVALID_CURRENCY": "Currency not supported",
    "SERVICE_UNAVAILABLE": "Service temporarily unavailable, try again later",
    "INTERNAL_PROCESSING_ERROR": "An internal error occurred while processing",
    "NOT_ENOUGH_FUNDS": "The payer does not have enough funds",
    "PAYER_LIMIT_REACHED": "The payer's limit has been breached",
    "PAYEE_NOT_ALLOWED_TO_RECEIVE": "The payee is unable to receive funds",
    "PAYMENT_NOT_APPROVED": "Payment was not approved",
    "RESOURCE_NOT_FOUND": "Requested resource was not found",
    "APPROVAL_REJECTED": "The approval was rejected",
    "EXPIRED": "The requested resource has expired",
    "TRANSACTION_CANCELED": "The transaction was canceled by the initiator",
    "RESOURCE_ALREADY_EXIST": "Duplicated reference id. Creation of resource failed",
    "REFUND_TARGET_NOT_FOUND": "referenceIdToRefund names no transaction (sandbox code)",
    "REFUND_TARGET_NOT_SUCCESSFUL": "The transaction to refund is not SUCCESSFUL (sandbox code)",
    "ONGOING": "The transaction is still ongoing",
    "PAYER_DELAYED": "The payer has not yet responded",
    "COULD_NOT_PERFORM_TRANSACTION": "The payer did not approve the transaction in time",
    "BAD_REQUEST": "Request does not follow the specification",
}

PENDING, SUCCESSFUL, FAILED = "PENDING", "SUCCESSFUL", "FAILED"
STATUSES = (PENDING, SUCCESSFUL, FAILED)
_TERMINAL = (SUCCESSFUL, FAILED)
_DEFAULT_DECLINE = "APPROVAL_REJECTED"
_DEFAULT_REFUND_FAILURE = "INTERNAL_PROCESSING_ERROR"

_UUID4_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-4[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$"
)
_AMOUNT_RE = re.compile(r"^[0-9]+(\.[0-9]+)?$")
_MAX_BODY = 1 << 20
_MAX_MESSAGE = 160
_MAX_DELAY = 600.0
_CALLBACK_TIMEOUT = 5.0

_SCRIPT_KEYS = frozenset({
    "pending_reads", "outcome", "reason", "status_errors", "rtp_errors",
    "rtp_record_then_error", "status_delay_seconds", "rtp_delay_seconds", "callback", "active",
    "refund_pending_reads", "refund_outcome", "refund_reason", "refund_status_errors",
    "refund_errors", "refund_record_then_error", "refund_status_delay_seconds",
})

COLLECTION, DISBURSEMENT = "collection", "disbursement"
_RTP_PATH = "/collection/v1_0/requesttopay"
_REFUND_PATH = "/disbursement/v1_0/refund"
_BALANCE_RE = re.compile(r"^/(collection|disbursement)/v1_0/account/balance(?:/([^/]+))?/?$")
_HOLDER_RE = re.compile(r"^/(collection|disbursement)/v1_0/accountholder/([^/]+)/([^/]+)/active/?$")
_MSISDN_RE = re.compile(r"^\+?[0-9]{5,15}$")  # ITU-T E.164: at most 15 digits
_EMAIL_RE = re.compile(r"^[^@\s/]+@[^@\s/]+\.[^@\s/]+$")
REFUND_TARGET_NOT_FOUND = "REFUND_TARGET_NOT_FOUND"
REFUND_TARGET_NOT_SUCCESSFUL = "REFUND_TARGET_NOT_SUCCESSFUL"


# --------------------------------------------------------------------------- state


@dataclass
class _Script:
    pending_reads: int | None = None
    outcome: str | None = None
    reason: str | None = None
    status_errors: list[int] = field(default_factory=list)
    rtp_errors: list[int] = field(default_factory=list)
    rtp_record_then_error: list[int] = field(default_factory=list)
    status_delay_seconds: float = 0.0
    rtp_delay_seconds: float = 0.0
    callback: bool = True
    active: bool | None = None
    refund_pending_reads: int | None = None
    refund_outcome: str | None = None
    refund_reason: str | None = None
    refund_status_errors: list[int] = field(default_factory=list)
    refund_errors: list[int] = field(default_factory=list)
    refund_record_then_error: list[int] = field(default_factory=list)
    refund_status_delay_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "pending_reads": self.pending_reads,
            "outcome": self.outcome,
            "reason": self.reason,
            "status_errors": list(self.status_errors),
            "rtp_errors": list(self.rtp_errors),
            "rtp_record_then_error": list(self.rtp_record_then_error),
            "status_delay_seconds": self.status_delay_seconds,
            "rtp_delay_seconds": self.rtp_delay_seconds,
            "callback": self.callback,
            "active": self.active,
            "refund_pending_reads": self.refund_pending_reads,
            "refund_outcome": self.refund_outcome,
            "refund_reason": self.refund_reason,
            "refund_status_errors": list(self.refund_status_errors),
            "refund_errors": list(self.refund_errors),
            "refund_record_then_error": list(self.refund_record_then_error),
            "refund_status_delay_seconds": self.refund_status_delay_seconds,
        }


@dataclass
class _Txn:
    reference: str
    amount: str
    currency: str
    external_id: str | None  # optional in MTN's request body
    payer: dict[str, str]
    payer_message: str
    payee_note: str
    created_at: float
    callback_url: str | None
    # behaviour fixed at creation
    read_driven: bool
    pending_reads: int
    outcome: str
    outcome_reason: str | None
    status_errors: list[int]
    status_delay: float
    callback_enabled: bool
    # evolving state
    status: str = PENDING
    reason: str | None = None
    financial_transaction_id: str | None = None
    reads: int = 0
    normal_reads: int = 0
    forced: bool = False
    was_terminal: bool = False
    callback_sent: bool = False
    # a refund (Disbursement) instead of a request-to-pay; ``payer`` is then
    # the payee, and ``refund_of`` the refunded request-to-pay's reference
    kind: str = COLLECTION
    refund_of: str | None = None


@dataclass
class _Resp:
    status: int
    body: Any = None
    after: list[Callable[[], None]] = field(default_factory=list)


def _error(status: int, code: str, message: str | None = None, **extra: Any) -> _Resp:
    body = {"code": code, "message": message or REASON_MESSAGES.get(code, code)}
    body.update(extra)
    return _Resp(status, body)


def _error_for_http(status: int) -> _Resp:
    """A MoMo-shaped error body for a scripted HTTP status code."""
    if status == 500:
        return _error(500, "INTERNAL_PROCESSING_ERROR")
    if status == 503:
        return _error(503, "SERVICE_UNAVAILABLE")
    if status == 404:
        return _error(404, "RESOURCE_NOT_FOUND")
    if status == 409:
        return _error(409, "RESOURCE_ALREADY_EXIST")
    if status == 401:
        return _error(401, "ACCESS_DENIED", "Access denied due to invalid token", statusCode=401)
    if status == 429:
        return _error(429, "RATE_LIMIT_EXCEEDED", "Rate limit is exceeded. Try again later", statusCode=429)
    if status == 400:
        return _error(400, "BAD_REQUEST")
    return _error(status, "INTERNAL_PROCESSING_ERROR" if status >= 500 else "BAD_REQUEST",
                  f"Sandbox scripted HTTP {status}")


def _check_codes(name: str, value: Any) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of HTTP status codes")
    out = []
    for c in value:
        if isinstance(c, bool) or not isinstance(c, int) or not 400 <= c <= 599:
            raise ValueError(f"{name}: {c!r} is not an HTTP error code (400-599)")
        out.append(c)
    return out


def _check_delay(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= _MAX_DELAY:
        raise ValueError(f"{name} must be a number of seconds between 0 and {_MAX_DELAY:g}")
    return float(value)


def _parse_outcome(opts: Mapping[str, Any], s: _Script, prefix: str) -> None:
    """``pending_reads``, ``outcome`` and ``reason`` under ``prefix`` ("" for
    collections, "refund_" for refunds) into ``s``."""
    pending, outcome, reason = f"{prefix}pending_reads", f"{prefix}outcome", f"{prefix}reason"
    if opts.get(pending) is not None:
        pr = opts[pending]
        if isinstance(pr, bool) or not isinstance(pr, int) or pr < 0:
            raise ValueError(f"{pending} must be a non-negative integer")
        setattr(s, pending, pr)
    if opts.get(outcome) is not None:
        if opts[outcome] not in STATUSES:
            raise ValueError(f"{outcome} must be one of {', '.join(STATUSES)}")
        setattr(s, outcome, opts[outcome])
    if opts.get(reason) is not None:
        if not isinstance(opts[reason], str) or not opts[reason]:
            raise ValueError(f"{reason} must be a non-empty string")
        if getattr(s, outcome) != FAILED:
            raise ValueError(f"{reason} needs {outcome}='FAILED'")
        setattr(s, reason, opts[reason])


def _parse_script(opts: Mapping[str, Any]) -> _Script:
    unknown = set(opts) - _SCRIPT_KEYS
    if unknown:
        raise ValueError(f"unknown script option(s): {', '.join(sorted(unknown))}")
    s = _Script()
    _parse_outcome(opts, s, "")
    _parse_outcome(opts, s, "refund_")
    for name in ("status_errors", "rtp_errors", "rtp_record_then_error",
                 "refund_status_errors", "refund_errors", "refund_record_then_error"):
        if opts.get(name) is not None:
            setattr(s, name, _check_codes(name, opts[name]))
    for name in ("status_delay_seconds", "rtp_delay_seconds", "refund_status_delay_seconds"):
        if opts.get(name) is not None:
            setattr(s, name, _check_delay(name, opts[name]))
    if opts.get("callback") is not None:
        if not isinstance(opts["callback"], bool):
            raise ValueError("callback must be true or false")
        s.callback = opts["callback"]
    if opts.get("active") is not None:
        if not isinstance(opts["active"], bool):
            raise ValueError("active must be true or false")
        s.active = opts["active"]
    return s


class _Server(SandboxServer):
    rail: "SandboxRail"


class _Handler(SandboxHandler):
    server_version = "vpay-momo-sandbox/1.0"
    http_log = log
    log_label = "sandbox"
    server: _Server

    def handle_one_request(self) -> None:
        if self.server.rail._stopping.is_set():
            self.close_connection = True
            return
        try:
            super().handle_one_request()
        except (ConnectionError, TimeoutError, socket.timeout) as exc:
            log.debug("sandbox: connection dropped: %s", exc)
            self.close_connection = True

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _read_body(self) -> bytes | _Resp:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            return _error(411, "BAD_REQUEST", "Chunked request bodies are not supported; send Content-Length")
        raw = self.headers.get("Content-Length")
        if not raw:
            return b""
        try:
            length = int(raw)
        except ValueError:
            self.close_connection = True
            return _error(400, "BAD_REQUEST", "Invalid Content-Length")
        if length < 0 or length > _MAX_BODY:
            self.close_connection = True
            return _error(413, "BAD_REQUEST", "Request body too large")
        return self.rfile.read(length)

    def _dispatch(self, method: str) -> None:
        rail = self.server.rail
        path = urllib.parse.urlsplit(self.path).path
        body = self._read_body()
        try:
            if isinstance(body, _Resp):
                resp = body
            elif path == "/_sandbox" or path.startswith("/_sandbox/"):
                # No authentication on control: a sandbox bound to 0.0.0.0 must
                # still not let another host script outcomes or reset it.
                if _server.is_loopback_client(self.client_address):
                    resp = rail._control(method, path, body)
                else:
                    resp = _error(403, "NOT_ALLOWED", "sandbox control endpoints answer loopback clients only")
            else:
                resp = rail._momo(method, path, self.headers, body)
        except Exception:  # a bug in the sandbox, not a client error
            log.exception("sandbox: error handling %s %s", method, path)
            resp = _error(500, "INTERNAL_PROCESSING_ERROR", "Sandbox internal error")
        self._send(resp)
        for fn in resp.after:
            fn()

    def _send(self, resp: _Resp) -> None:
        data = b"" if resp.body is None else json.dumps(resp.body).encode("utf-8")
        failed = self.write_answer(resp.status, data,
                                   None if resp.body is None else "application/json;charset=utf-8")
        if failed is not None:
            # Typically a client that gave up after a scripted delay.
            log.debug("sandbox: could not answer %s %s: %s", self.command, self.path, failed)


# --------------------------------------------------------------------------- the rail


class SandboxRail:
    """A local MTN MoMo Collection double (see the module docstring).

    Use as ``with SandboxRail(success_after_seconds=0.2) as rail: ...`` (starts
    a background server on 127.0.0.1 and an ephemeral port; ``rail.url`` is the
    MoMo base URL), or ``start()``/``stop()``, or ``serve_forever()`` from a CLI.
    The socket is bound in the constructor, so ``url`` is valid at once; a
    stopped rail cannot be started again.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        subscription_key: str = DEFAULT_SUBSCRIPTION_KEY,
        api_user: str = DEFAULT_API_USER,
        api_key: str = DEFAULT_API_KEY,
        target_environment: str = "sandbox",
        success_after_seconds: float = 3.0,
        token_ttl_seconds: int = 3600,
        reason_shape: str = "string",
        callback_method: str = "POST",
        callback_hosts: Iterable[str] | None = None,
        max_log_entries: int = 100_000,
        disbursement_subscription_key: str | None = None,
        disbursement_api_user: str | None = None,
        disbursement_api_key: str | None = None,
        opening_balance: str = DEFAULT_OPENING_BALANCE,
        account_currency: str = SANDBOX_CURRENCY,
    ) -> None:
        if reason_shape not in ("object", "string"):
            raise ValueError("reason_shape must be 'object' or 'string'")
        if not isinstance(opening_balance, str) or not _AMOUNT_RE.match(opening_balance):
            raise ValueError("opening_balance must be a non-negative decimal string, e.g. '1000.00'")
        if not re.fullmatch(r"[A-Z]{3}", account_currency or ""):
            raise ValueError("account_currency must be an ISO 4217 code")
        if target_environment == "sandbox" and account_currency != SANDBOX_CURRENCY:
            raise ValueError(f"the sandbox target environment has {SANDBOX_CURRENCY} accounts only")
        if callback_method not in ("POST", "PUT"):
            raise ValueError("callback_method must be 'POST' or 'PUT'")
        if success_after_seconds < 0 or token_ttl_seconds <= 0:
            raise ValueError("success_after_seconds must be >= 0 and token_ttl_seconds > 0")
        self.subscription_key = subscription_key
        self.api_user = api_user
        self.api_key = api_key
        #: the Disbursement product's credentials (refunds); default: the Collection ones
        self.disbursement_subscription_key = disbursement_subscription_key or subscription_key
        self.disbursement_api_user = disbursement_api_user or api_user
        self.disbursement_api_key = disbursement_api_key or api_key
        self.target_environment = target_environment
        self.success_after_seconds = float(success_after_seconds)
        self.token_ttl_seconds = token_ttl_seconds
        self.reason_shape = reason_shape
        #: each account's balance before any transaction (major units, decimal string)
        self.opening_balance = opening_balance
        #: the currency of both accounts (the balance counts transactions in it only)
        self.account_currency = account_currency
        self.callback_method = callback_method
        #: None = loopback hosts only; "*" in the collection = any host.
        self.callback_hosts = None if callback_hosts is None else frozenset(h.lower() for h in callback_hosts)

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._tokens: dict[str, float] = {}  # sha256(token) -> monotonic expiry
        self._disbursement_tokens: dict[str, float] = {}  # the same, for the Disbursement product
        self._txns: dict[str, _Txn] = {}
        self._refunds: dict[str, _Txn] = {}  # refunds by their X-Reference-Id
        self._scripts: dict[str, _Script] = {}
        self._log: deque[dict[str, Any]] = deque(maxlen=max_log_entries)
        self._callbacks: deque[dict[str, Any]] = deque(maxlen=max_log_entries)
        self._timers: list[tuple[float, int, str, _Txn]] = []
        self._seq = itertools.count()
        self._stopping = threading.Event()
        self._serving = False
        self._serve_ident: int | None = None
        self._serve_thread: threading.Thread | None = None
        self._timer_thread: threading.Thread | None = None
        self._closed = False

        self._server = _Server((host, port), _Handler)
        self._server.rail = self

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """The MoMo base URL, e.g. ``http://127.0.0.1:54321`` (no trailing slash)."""
        host, port = self._server.server_address[:2]
        if ":" in str(host):
            host = f"[{host}]"
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> "SandboxRail":
        """Serve in a background daemon thread; returns self."""
        if self._closed or self._serving:
            raise RuntimeError("SandboxRail already started or stopped")
        self._serving = True
        self._start_timer_thread()
        self._serve_thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
            name=f"momo-sandbox-{self.port}", daemon=True,
        )
        self._serve_thread.start()
        log.info("MoMo sandbox listening on %s", self.url)
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until ``stop()`` or KeyboardInterrupt.

        ``stop()`` may be called from a signal handler running in this thread:
        it does not block, and this method returns within a fraction of a second.
        """
        if self._closed or self._serving:
            raise RuntimeError("SandboxRail already started or stopped")
        self._serving = True
        self._serve_ident = threading.get_ident()
        self._start_timer_thread()
        log.info("MoMo sandbox listening on %s", self.url)
        try:
            self._server.serve_forever(poll_interval=0.1)
        except KeyboardInterrupt:
            log.info("MoMo sandbox interrupted")
        finally:
            self._stopping.set()
            self._finish()

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        self._stopping.set()
        # Wake the timer thread. Bounded wait: stop() may run in a signal
        # handler that interrupted a thread holding the lock (the timer thread
        # notices _stopping within a second anyway).
        if self._cond.acquire(timeout=0.2):
            try:
                self._cond.notify_all()
            finally:
                self._cond.release()
        if self._serving and self._serve_ident == threading.get_ident():
            # Called from inside serve_forever's thread (signal handler):
            # shutdown() would wait for ourselves; ask another thread to do it.
            threading.Thread(target=self._server.shutdown, daemon=True).start()
            return
        if self._serving and not self._closed:
            self._server.shutdown()
        self._finish()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.server_close()
        for t in (self._serve_thread, self._timer_thread):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=2)
        log.info("MoMo sandbox on %s stopped", self.url)

    def __enter__(self) -> "SandboxRail":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------ Python control API

    def script(self, payer: str, **opts: Any) -> dict[str, Any]:
        """Script the behaviour of ``payer``'s future transactions (see module
        docstring for the options). No options = back to the default. Returns
        the normalised script. Raises ValueError on a bad option."""
        return self._set_script(payer, opts)

    def _set_script(self, payer: str, opts: Mapping[str, Any]) -> dict[str, Any]:
        s = _parse_script(opts)
        with self._lock:
            if opts:
                self._scripts[payer] = s
            else:
                self._scripts.pop(payer, None)
        log.info("sandbox: payer %s scripted: %s", payer, dict(opts) or "default behaviour")
        return s.as_dict()

    def scripts(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {p: s.as_dict() for p, s in self._scripts.items()}

    def set_status(self, ref: str, status: str, reason: str | None = None, *,
                   amount: str | None = None) -> dict[str, Any]:
        """Force transaction ``ref`` to ``status`` for ever (reads, timers and
        scripts no longer change it); ``amount`` (a major-units string) makes
        the status body report another amount than was asked for. May fire the
        callback if the transaction was never terminal before. Raises KeyError
        for an unknown reference."""
        _check_forced(status, reason)
        if status == FAILED and reason is None:
            reason = _DEFAULT_DECLINE
        _, fire, state = self._force(self._txns, self._txn_state, ref, status, reason, amount)
        log.info("sandbox: %s forced to %s %s", ref, status, reason or "")
        if fire:
            fire()
        return state

    def _force(self, table: dict[str, _Txn], state_of: Callable[[_Txn], dict[str, Any]], ref: str,
               status: str, reason: str | None, amount: str | None
               ) -> tuple[_Txn, Callable[[], None] | None, dict[str, Any]]:
        """``set_status`` / ``set_refund_status``: force ``table[ref]`` to
        ``status`` with ``reason`` as given; returns the entry, the callback
        to fire (if any) and its state. Raises KeyError for an unknown
        reference."""
        with self._lock:
            txn = table[ref]
            txn.forced = True
            if amount is not None:
                txn.amount = amount
            fire = self._become(txn, status, reason)
            return txn, fire, state_of(txn)

    def forget(self, ref: str) -> bool:
        """The rail forgets ``ref`` (status reads answer 404). True if it existed."""
        with self._lock:
            return self._txns.pop(ref, None) is not None

    def transactions(self) -> list[dict[str, Any]]:
        """Current state of every transaction, oldest first."""
        return self._states(self._txns, self._txn_state)

    def transaction(self, ref: str) -> dict[str, Any] | None:
        """One transaction's state by its X-Reference-Id, or None."""
        return self._state(self._txns, self._txn_state, ref)

    def refunds(self) -> list[dict[str, Any]]:
        """Current state of every refund, oldest first."""
        return self._states(self._refunds, self._refund_state)

    def refund(self, ref: str) -> dict[str, Any] | None:
        """One refund's state by its X-Reference-Id, or None."""
        return self._state(self._refunds, self._refund_state, ref)

    def _states(self, table: dict[str, _Txn],
                state_of: Callable[[_Txn], dict[str, Any]]) -> list[dict[str, Any]]:
        self._fire_due_timers()
        with self._lock:
            return [state_of(t) for t in table.values()]

    def _state(self, table: dict[str, _Txn], state_of: Callable[[_Txn], dict[str, Any]],
               ref: str) -> dict[str, Any] | None:
        self._fire_due_timers()
        with self._lock:
            t = table.get(ref)
            return None if t is None else state_of(t)

    def set_refund_status(self, ref: str, status: str, reason: str | None = None, *,
                          amount: str | None = None) -> dict[str, Any]:
        """Force refund ``ref`` to ``status`` for ever (e.g. make the rail
        contradict a settled refund); ``amount`` (a major-units string, any
        text) makes the status body report it instead of the refund's. Raises
        KeyError for an unknown reference."""
        _check_forced(status, reason)
        reason = (reason or _DEFAULT_REFUND_FAILURE) if status == FAILED else None
        txn, _, state = self._force(self._refunds, self._refund_state, ref, status, reason, amount)
        log.info("sandbox: refund %s forced to %s %s", ref, status, txn.reason or "")
        return state

    def forget_refund(self, ref: str) -> bool:
        """The rail forgets refund ``ref`` (status reads answer 404). True if it existed."""
        with self._lock:
            return self._refunds.pop(ref, None) is not None

    def requests_log(self) -> list[dict[str, Any]]:
        """Every MoMo request received, in arrival order: ``{method, path,
        reference, status_code, at}`` (``status_code`` None while in flight,
        ``at`` = arrival, epoch seconds)."""
        with self._lock:
            return [dict(e) for e in self._log]

    def count(self, method: str | None = None, path_prefix: str | None = None,
              reference: str | None = None) -> int:
        """How many logged MoMo requests match all the given filters."""
        with self._lock:
            return sum(
                1 for e in self._log
                if (method is None or e["method"] == method.upper())
                and (path_prefix is None or e["path"].startswith(path_prefix))
                and (reference is None or e["reference"] == reference)
            )

    def callbacks(self) -> list[dict[str, Any]]:
        """Callbacks attempted: ``{reference, url, method, status_code, error, at}``."""
        with self._lock:
            return [dict(e) for e in self._callbacks]

    def reset(self) -> None:
        """Forget transactions, scripts, request and callback logs. Issued
        tokens stay valid."""
        with self._cond:
            self._txns.clear()
            self._refunds.clear()
            self._scripts.clear()
            self._log.clear()
            self._callbacks.clear()
            self._timers.clear()
            self._cond.notify_all()
        log.info("sandbox: reset")

    # ------------------------------------------------------------ state machine (lock held)

    def _become(self, txn: _Txn, status: str, reason: str | None) -> Callable[[], None] | None:
        """Set a state; return the callback sender if this is the first time
        the transaction is terminal and a callback is due."""
        txn.status = status
        txn.reason = reason if status == FAILED else None
        if status == SUCCESSFUL and txn.financial_transaction_id is None:
            txn.financial_transaction_id = str(secrets.randbelow(9 * 10**9) + 10**9)
        if status not in _TERMINAL or txn.was_terminal:
            return None
        txn.was_terminal = True
        log.info("sandbox: %s is %s%s", txn.reference, status, f" ({txn.reason})" if txn.reason else "")
        if txn.callback_url and txn.callback_enabled and not txn.callback_sent:
            txn.callback_sent = True
            url, body, ref = txn.callback_url, self._status_body(txn), txn.reference
            return lambda: self._send_callback(ref, url, body)
        return None

    def _on_read(self, txn: _Txn) -> Callable[[], None] | None:
        if txn.forced or txn.status in _TERMINAL:
            return None
        if not txn.read_driven:
            return None  # timer-driven; the timer thread finalises
        txn.normal_reads += 1
        if txn.normal_reads <= txn.pending_reads or txn.outcome == PENDING:
            return None
        return self._become(txn, txn.outcome, txn.outcome_reason)

    def _status_body(self, txn: _Txn) -> dict[str, Any]:
        body: dict[str, Any] = {"amount": txn.amount, "currency": txn.currency}
        if txn.status == SUCCESSFUL and txn.financial_transaction_id:
            body["financialTransactionId"] = txn.financial_transaction_id
        if txn.external_id is not None:
            body["externalId"] = txn.external_id
        body.update({
            "payer": dict(txn.payer),
            "payerMessage": txn.payer_message,
            "payeeNote": txn.payee_note,
            "status": txn.status,
        })
        if txn.status == FAILED:
            code = txn.reason or _DEFAULT_DECLINE
            body["reason"] = code if self.reason_shape == "string" else {
                "code": code, "message": REASON_MESSAGES.get(code, code)}
        return body

    def _txn_state(self, txn: _Txn) -> dict[str, Any]:
        return {
            "reference": txn.reference,
            "status": txn.status,
            "reason": txn.reason,
            "financialTransactionId": txn.financial_transaction_id if txn.status == SUCCESSFUL else None,
            "amount": txn.amount,
            "currency": txn.currency,
            "externalId": txn.external_id,
            "payer": dict(txn.payer),
            "callbackUrl": txn.callback_url,
            "createdAt": txn.created_at,
            "reads": txn.reads,
            "forced": txn.forced,
            "callbackSent": txn.callback_sent,
        }

    def _refund_body(self, txn: _Txn) -> dict[str, Any]:
        """A refund's status body: the request-to-pay shape, ``payee`` for ``payer``."""
        body = self._status_body(txn)
        body["payee"] = body.pop("payer")
        return body

    def _refund_state(self, txn: _Txn) -> dict[str, Any]:
        state = self._txn_state(txn)
        state["payee"] = state.pop("payer")
        state.pop("callbackUrl", None)
        state.pop("callbackSent", None)
        state["referenceIdToRefund"] = txn.refund_of
        return state

    # ------------------------------------------------------------ success timer

    def _start_timer_thread(self) -> None:
        self._timer_thread = threading.Thread(target=self._timer_loop, name="momo-sandbox-timers", daemon=True)
        self._timer_thread.start()

    def _timer_loop(self) -> None:
        while not self._stopping.is_set():
            with self._cond:
                if self._timers:
                    wait = self._timers[0][0] - time.monotonic()
                else:
                    wait = 1.0
                if wait > 0:
                    self._cond.wait(timeout=min(wait, 1.0))
            self._fire_due_timers()

    def _fire_due_timers(self) -> None:
        fires = []
        now = time.monotonic()
        with self._lock:
            while self._timers and self._timers[0][0] <= now:
                _, _, ref, txn = heapq.heappop(self._timers)
                table = self._refunds if txn.kind == DISBURSEMENT else self._txns
                if table.get(ref) is not txn or txn.forced or txn.status != PENDING:
                    continue
                fire = self._become(txn, SUCCESSFUL, None)
                if fire:
                    fires.append(fire)
        for fire in fires:
            fire()

    # ------------------------------------------------------------ callbacks

    def _send_callback(self, ref: str, url: str, body: dict[str, Any]) -> None:
        def run() -> None:
            entry: dict[str, Any] = {"reference": ref, "url": url, "method": self.callback_method,
                                     "status_code": None, "error": None, "at": time.time()}
            data = json.dumps(body).encode("utf-8")
            req = urllib.request.Request(url, data=data, method=self.callback_method,
                                         headers={"Content-Type": "application/json"})
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            try:
                with opener.open(req, timeout=_CALLBACK_TIMEOUT) as r:
                    entry["status_code"] = r.status
                log.info("sandbox: callback for %s delivered (%s)", ref, entry["status_code"])
            except urllib.error.HTTPError as exc:
                entry["status_code"] = exc.code
                log.warning("sandbox: callback for %s answered HTTP %s (not retried)", ref, exc.code)
            except Exception as exc:  # never retried, never raised
                entry["error"] = f"{type(exc).__name__}: {exc}"
                log.warning("sandbox: callback for %s failed: %s (not retried)", ref, entry["error"])
            with self._lock:
                self._callbacks.append(entry)

        threading.Thread(target=run, name=f"momo-sandbox-callback-{ref[:8]}", daemon=True).start()

    # ------------------------------------------------------------ MoMo endpoints

    def _momo(self, method: str, path: str, headers: Any, body: bytes) -> _Resp:
        reference: str | None = None
        if path.startswith("/collection/v1_0/requesttopay/"):
            reference = urllib.parse.unquote(path[len("/collection/v1_0/requesttopay/"):])
        elif path == "/collection/v1_0/requesttopay":
            reference = headers.get("X-Reference-Id")
        elif path.startswith(_REFUND_PATH + "/"):
            reference = urllib.parse.unquote(path[len(_REFUND_PATH) + 1:])
        elif path == _REFUND_PATH:
            reference = headers.get("X-Reference-Id")
        entry = {"method": method, "path": path, "reference": reference, "status_code": None, "at": time.time()}
        with self._lock:
            self._log.append(entry)
        try:
            balance = _BALANCE_RE.match(path)
            holder = _HOLDER_RE.match(path)
            if balance or holder:
                if method != "GET":
                    resp = _method_not_allowed()
                elif balance:
                    resp = self._balance(headers, balance.group(1), balance.group(2))
                else:
                    resp = self._account_holder(headers, holder.group(1),
                                                urllib.parse.unquote(holder.group(2)),
                                                urllib.parse.unquote(holder.group(3)))
            elif path in ("/collection/token/", "/collection/token"):
                resp = self._token(method, headers) if method == "POST" else _method_not_allowed()
            elif path == "/collection/v1_0/requesttopay":
                resp = self._request_to_pay(headers, body) if method == "POST" else _method_not_allowed()
            elif path in ("/disbursement/token/", "/disbursement/token"):
                resp = (self._token(method, headers, DISBURSEMENT) if method == "POST"
                        else _method_not_allowed())
            elif path == _REFUND_PATH:
                resp = self._refund(headers, body) if method == "POST" else _method_not_allowed()
            elif path.startswith(_REFUND_PATH + "/"):
                resp = (_error(404, "RESOURCE_NOT_FOUND", "Resource not found", statusCode=404)
                        if not reference or "/" in reference
                        else self._refund_status(headers, reference) if method == "GET"
                        else _method_not_allowed())
            elif reference is not None and reference and "/" not in reference:
                resp = self._status(headers, reference) if method == "GET" else _method_not_allowed()
            else:
                resp = _error(404, "RESOURCE_NOT_FOUND", "Resource not found", statusCode=404)
        except Exception:
            with self._lock:
                entry["status_code"] = 500
            raise
        with self._lock:
            entry["status_code"] = resp.status
        if resp.status >= 400:
            log.info("sandbox: %s %s -> %s %s", method, path, resp.status,
                     resp.body.get("code") if isinstance(resp.body, dict) else "")
        return resp

    def _check_subscription(self, headers: Any, product: str = COLLECTION) -> _Resp | None:
        key = headers.get("Ocp-Apim-Subscription-Key")
        expected = self.disbursement_subscription_key if product == DISBURSEMENT else self.subscription_key
        if not key or not hmac.compare_digest(key.encode(), expected.encode()):
            what = "missing" if not key else "invalid"
            return _error(401, "ACCESS_DENIED",
                          f"Access denied due to {what} subscription key. "
                          "Make sure to provide a valid key for an active subscription.",
                          statusCode=401)
        return None

    def _check_bearer(self, headers: Any, product: str = COLLECTION) -> _Resp | None:
        auth = headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _error(401, "ACCESS_DENIED", "Access denied due to missing or invalid access token", statusCode=401)
        digest = hashlib.sha256(token.encode()).hexdigest()
        tokens = self._disbursement_tokens if product == DISBURSEMENT else self._tokens
        with self._lock:
            expiry = tokens.get(digest)
        if expiry is None:
            return _error(401, "ACCESS_DENIED", "Access denied due to invalid access token", statusCode=401)
        if expiry <= time.monotonic():
            return _error(401, "ACCESS_DENIED", "Access token expired", statusCode=401)
        return None

    def _check_target(self, headers: Any) -> _Resp | None:
        # HTTP 500, not 400: MTN's common-errors table (docs/sandbox.md, "Errors").
        if headers.get("X-Target-Environment") != self.target_environment:
            return _error(500, "NOT_ALLOWED_TARGET_ENVIRONMENT")
        return None

    def _check_currency(self, currency: str) -> _Resp | None:
        """MTN's sandbox takes EUR only: another currency is refused with
        500 ``INVALID_CURRENCY`` and nothing is recorded. Other target
        environments take any ISO 4217 code."""
        if self.target_environment == "sandbox" and currency != SANDBOX_CURRENCY:
            return _error(500, "INVALID_CURRENCY",
                          f"Currency {currency} is not supported: the sandbox takes {SANDBOX_CURRENCY} only")
        return None

    def _token(self, method: str, headers: Any, product: str = COLLECTION) -> _Resp:
        err = self._check_subscription(headers, product)
        if err:
            return err
        scheme, _, cred = headers.get("Authorization", "").partition(" ")
        try:
            decoded = base64.b64decode(cred.strip(), validate=True) if scheme.lower() == "basic" else None
        except (binascii.Error, ValueError):
            decoded = None
        if product == DISBURSEMENT:
            expected = f"{self.disbursement_api_user}:{self.disbursement_api_key}".encode()
        else:
            expected = f"{self.api_user}:{self.api_key}".encode()
        if decoded is None or not hmac.compare_digest(decoded, expected):
            return _error(401, "LOGIN_FAILED", "Authentication failed: invalid API user or API key")
        token = secrets.token_urlsafe(32)
        tokens = self._disbursement_tokens if product == DISBURSEMENT else self._tokens
        with self._lock:
            now = time.monotonic()
            # drop expired tokens so the table cannot grow for ever
            for k in [k for k, exp in tokens.items() if exp <= now]:
                del tokens[k]
            tokens[hashlib.sha256(token.encode()).hexdigest()] = now + self.token_ttl_seconds
        return _Resp(200, {"access_token": token, "token_type": "access_token",
                           "expires_in": self.token_ttl_seconds})

    def _request_to_pay(self, headers: Any, raw: bytes) -> _Resp:
        for check in (self._check_subscription, self._check_bearer, self._check_target):
            err = check(headers)
            if err:
                return err
        ref = headers.get("X-Reference-Id") or ""
        if not _UUID4_RE.match(ref):
            return _error(400, "BAD_REQUEST", "X-Reference-Id must be a UUID version 4")
        parsed = _parse_rtp_body(raw)
        if isinstance(parsed, _Resp):
            return parsed
        err = self._check_currency(parsed["currency"])
        if err:
            return err
        callback_url = headers.get("X-Callback-Url") or None
        if callback_url is not None:
            err = self._check_callback_url(callback_url)
            if err:
                return err
        payer_id = parsed["payer"]["partyId"]

        fire = None
        with self._cond:
            script = self._scripts.get(payer_id)
            delay = script.rtp_delay_seconds if script else 0.0
            if script and script.rtp_errors:
                code = script.rtp_errors.pop(0)
                resp = _error_for_http(code)
                log.info("sandbox: request-to-pay %s answered %s without recording (scripted)", ref, code)
            elif ref in self._txns:
                resp = _error(409, "RESOURCE_ALREADY_EXIST")
            else:
                txn = self._new_txn(ref, parsed, callback_url, script)
                self._txns[ref] = txn
                if not txn.read_driven:
                    if payer_id in SANDBOX_FAILURES:
                        fire = self._become(txn, FAILED, SANDBOX_FAILURES[payer_id])
                    else:
                        due = time.monotonic() + self.success_after_seconds
                        heapq.heappush(self._timers, (due, next(self._seq), ref, txn))
                        self._cond.notify_all()
                if script and script.rtp_record_then_error:
                    code = script.rtp_record_then_error.pop(0)
                    resp = _error_for_http(code)
                    log.info("sandbox: request-to-pay %s recorded but answered %s (scripted)", ref, code)
                else:
                    resp = _Resp(202)
                    log.info("sandbox: request-to-pay %s accepted (payer %s, %s %s)",
                             ref, payer_id, parsed["amount"], parsed["currency"])
        if fire:
            resp.after.append(fire)
        if delay:
            self._stopping.wait(delay)
        return resp

    def _new_txn(self, ref: str, body: dict[str, Any], callback_url: str | None,
                 script: _Script | None) -> _Txn:
        payer_id = body["payer"]["partyId"]
        default_reason = SANDBOX_FAILURES.get(payer_id)
        read_driven = bool(script and (script.pending_reads is not None or script.outcome is not None))
        outcome = (script.outcome if script and script.outcome else (FAILED if default_reason else SUCCESSFUL))
        outcome_reason = None
        if outcome == FAILED:
            outcome_reason = (script.reason if script and script.reason else None) or default_reason or _DEFAULT_DECLINE
        return _Txn(
            reference=ref,
            amount=body["amount"],
            currency=body["currency"],
            external_id=body.get("externalId"),
            payer=dict(body["payer"]),
            payer_message=body.get("payerMessage", ""),
            payee_note=body.get("payeeNote", ""),
            created_at=time.time(),
            callback_url=callback_url,
            read_driven=read_driven,
            pending_reads=(script.pending_reads or 0) if script else 0,
            outcome=outcome,
            outcome_reason=outcome_reason,
            status_errors=list(script.status_errors) if script else [],
            status_delay=script.status_delay_seconds if script else 0.0,
            callback_enabled=script.callback if script else True,
        )

    def _check_callback_url(self, url: str) -> _Resp | None:
        try:
            parts = urllib.parse.urlsplit(url)
            host = parts.hostname or ""
        except ValueError:
            return _error(400, "BAD_REQUEST", "X-Callback-Url is not a valid URL")
        if parts.scheme not in ("http", "https") or not host:
            return _error(400, "BAD_REQUEST", "X-Callback-Url must be an http(s) URL")
        allowed = self.callback_hosts
        if allowed is None:
            ok = is_loopback_host(host)
        else:
            ok = "*" in allowed or host.lower() in allowed
        if not ok:
            return _error(500, "INVALID_CALLBACK_URL_HOST",
                          f"Callback host {host!r} is not allowed by this sandbox (see callback_hosts)")
        return None

    def _status(self, headers: Any, ref: str) -> _Resp:
        for check in (self._check_subscription, self._check_bearer, self._check_target):
            err = check(headers)
            if err:
                return err
        with self._lock:
            txn = self._txns.get(ref)
            if txn is None:
                return _error(404, "RESOURCE_NOT_FOUND")
            txn.reads += 1
            delay = txn.status_delay
        if delay:
            self._stopping.wait(delay)
        self._fire_due_timers()  # a due success timer wins over a racing read
        fire = None
        with self._lock:
            if self._txns.get(ref) is not txn:
                return _error(404, "RESOURCE_NOT_FOUND")
            if txn.status_errors:
                code = txn.status_errors.pop(0)
                log.info("sandbox: status read of %s answered %s (scripted)", ref, code)
                return _error_for_http(code)
            fire = self._on_read(txn)
            resp = _Resp(200, self._status_body(txn))
        if fire:
            resp.after.append(fire)
        return resp

    def _refund(self, headers: Any, raw: bytes) -> _Resp:
        """``POST /disbursement/v1_0/refund`` (see the module docstring)."""
        for check in (self._check_subscription, self._check_bearer):
            err = check(headers, DISBURSEMENT)
            if err:
                return err
        err = self._check_target(headers)
        if err:
            return err
        ref = headers.get("X-Reference-Id") or ""
        if not _UUID4_RE.match(ref):
            return _error(400, "BAD_REQUEST", "X-Reference-Id must be a UUID version 4")
        parsed = _parse_refund_body(raw)
        if isinstance(parsed, _Resp):
            return parsed
        err = self._check_currency(parsed["currency"])
        if err:
            return err
        self._fire_due_timers()  # a collection whose success timer is due counts as SUCCESSFUL
        with self._cond:
            original = self._txns.get(parsed["referenceIdToRefund"])
            script = self._scripts.get(original.payer.get("partyId", "")) if original else None
            if script and script.refund_errors:
                code = script.refund_errors.pop(0)
                resp = _error_for_http(code)
                log.info("sandbox: refund %s answered %s without recording (scripted)", ref, code)
            elif ref in self._refunds:
                resp = _error(409, "RESOURCE_ALREADY_EXIST")
            else:
                txn = self._new_refund(ref, parsed, original, script)
                self._refunds[ref] = txn
                if original is None:
                    self._become(txn, FAILED, REFUND_TARGET_NOT_FOUND)
                elif original.status != SUCCESSFUL:
                    self._become(txn, FAILED, REFUND_TARGET_NOT_SUCCESSFUL)
                elif not txn.read_driven:
                    due = time.monotonic() + self.success_after_seconds
                    heapq.heappush(self._timers, (due, next(self._seq), ref, txn))
                    self._cond.notify_all()
                if script and script.refund_record_then_error:
                    code = script.refund_record_then_error.pop(0)
                    resp = _error_for_http(code)
                    log.info("sandbox: refund %s recorded but answered %s (scripted)", ref, code)
                else:
                    resp = _Resp(202)
                    log.info("sandbox: refund %s of %s accepted (%s %s)", ref,
                             parsed["referenceIdToRefund"], parsed["amount"], parsed["currency"])
        return resp

    def _product_checks(self, headers: Any, product: str) -> _Resp | None:
        """Subscription key and Bearer token of ``product``, then the target environment."""
        for check in (self._check_subscription, self._check_bearer):
            err = check(headers, product)
            if err:
                return err
        return self._check_target(headers)

    def _balance(self, headers: Any, product: str, currency: str | None) -> _Resp:
        """``GET /{product}/v1_0/account/balance[/{currency}]`` -> 200
        ``{availableBalance: "decimal string", currency}``: the opening balance
        plus the SUCCESSFUL collections (Collection account) or minus the
        SUCCESSFUL refunds (Disbursement account) in ``account_currency``.
        Another ``currency`` in the path: 500 ``INVALID_CURRENCY`` (MTN's
        "Currency not supported on the requested account")."""
        err = self._product_checks(headers, product)
        if err:
            return err
        if currency is not None and urllib.parse.unquote(currency) != self.account_currency:
            return _error(500, "INVALID_CURRENCY", "Currency not supported on the requested account")
        return _Resp(200, {"availableBalance": self.balance(product), "currency": self.account_currency})

    def balance(self, product: str = COLLECTION) -> str:
        """The ``availableBalance`` the balance endpoint of ``product``
        (``"collection"`` or ``"disbursement"``) answers now, as a decimal string."""
        if product not in (COLLECTION, DISBURSEMENT):
            raise ValueError("product must be 'collection' or 'disbursement'")
        self._fire_due_timers()
        total = Decimal(self.opening_balance)
        with self._lock:
            table, sign = (self._txns, 1) if product == COLLECTION else (self._refunds, -1)
            for txn in table.values():
                if txn.status == SUCCESSFUL and txn.currency == self.account_currency:
                    try:
                        total += sign * Decimal(txn.amount)
                    except InvalidOperation:  # an amount forced through set_status
                        continue
        return str(total)

    def _account_holder(self, headers: Any, product: str, id_type: str, holder: str) -> _Resp:
        """``GET /{product}/v1_0/accountholder/{accountHolderIdType}/{accountHolderId}/active``
        -> 200 ``{"result": bool}``. ``accountHolderIdType`` is ``msisdn``
        (E.164 digits) or ``email``, in small letters as MTN's docs require;
        anything else is 400 ``BAD_REQUEST``. ``result`` is false for MTN's
        PAYER_NOT_FOUND sandbox number (46733123455) and for a payer scripted
        ``active=False``; true otherwise (a script's ``active=True`` wins)."""
        err = self._product_checks(headers, product)
        if err:
            return err
        if id_type == "msisdn":
            if not _MSISDN_RE.match(holder):
                return _error(400, "BAD_REQUEST", "accountHolderId must be an MSISDN (ITU-T E.164)")
            holder = holder.lstrip("+")
        elif id_type == "email":
            if not _EMAIL_RE.match(holder):
                return _error(400, "BAD_REQUEST", "accountHolderId must be an e-mail address")
        else:
            return _error(400, "BAD_REQUEST", "accountHolderIdType must be msisdn or email (small letters)")
        with self._lock:
            script = self._scripts.get(holder)
            scripted = script.active if script else None
        active = scripted if scripted is not None else SANDBOX_FAILURES.get(holder) != "PAYER_NOT_FOUND"
        return _Resp(200, {"result": active})

    def _new_refund(self, ref: str, body: dict[str, Any], original: _Txn | None,
                    script: _Script | None) -> _Txn:
        read_driven = bool(script and (script.refund_pending_reads is not None
                                       or script.refund_outcome is not None))
        outcome = script.refund_outcome if script and script.refund_outcome else SUCCESSFUL
        outcome_reason = None
        if outcome == FAILED:
            outcome_reason = (script.refund_reason if script else None) or _DEFAULT_REFUND_FAILURE
        return _Txn(
            reference=ref,
            amount=body["amount"],
            currency=body["currency"],
            external_id=body.get("externalId"),
            payer=dict(original.payer) if original else {"partyIdType": "MSISDN", "partyId": ""},
            payer_message=body.get("payerMessage", ""),
            payee_note=body.get("payeeNote", ""),
            created_at=time.time(),
            callback_url=None,
            read_driven=read_driven,
            pending_reads=(script.refund_pending_reads or 0) if script else 0,
            outcome=outcome,
            outcome_reason=outcome_reason,
            status_errors=list(script.refund_status_errors) if script else [],
            status_delay=script.refund_status_delay_seconds if script else 0.0,
            callback_enabled=False,
            kind=DISBURSEMENT,
            refund_of=body["referenceIdToRefund"],
        )

    def _refund_status(self, headers: Any, ref: str) -> _Resp:
        """``GET /disbursement/v1_0/refund/{referenceId}``."""
        for check in (self._check_subscription, self._check_bearer):
            err = check(headers, DISBURSEMENT)
            if err:
                return err
        err = self._check_target(headers)
        if err:
            return err
        with self._lock:
            txn = self._refunds.get(ref)
            if txn is None:
                return _error(404, "RESOURCE_NOT_FOUND")
            txn.reads += 1
            delay = txn.status_delay
        if delay:
            self._stopping.wait(delay)
        self._fire_due_timers()  # a due success timer wins over a racing read
        with self._lock:
            if self._refunds.get(ref) is not txn:
                return _error(404, "RESOURCE_NOT_FOUND")
            if txn.status_errors:
                code = txn.status_errors.pop(0)
                log.info("sandbox: status read of refund %s answered %s (scripted)", ref, code)
                return _error_for_http(code)
            self._on_read(txn)
            return _Resp(200, self._refund_body(txn))

    # ------------------------------------------------------------ control endpoints

    def _control(self, method: str, path: str, raw: bytes) -> _Resp:
        parts = [urllib.parse.unquote(p) for p in path.split("/")[2:] if p]
        try:
            if parts == ["reset"] and method == "POST":
                self.reset()
                return _Resp(204)
            if parts == ["requests"] and method == "GET":
                return _Resp(200, self.requests_log())
            if parts == ["callbacks"] and method == "GET":
                return _Resp(200, self.callbacks())
            if parts == ["transactions"] and method == "GET":
                return _Resp(200, self.transactions())
            if parts == ["payers"] and method == "GET":
                return _Resp(200, self.scripts())
            if parts == ["refunds"] and method == "GET":
                return _Resp(200, self.refunds())
            # /_sandbox/transactions/{ref} and /_sandbox/refunds/{ref}: read, force, forget
            records = {"transactions": (self.transaction, self.set_status, self.forget),
                       "refunds": (self.refund, self.set_refund_status, self.forget_refund)}
            if len(parts) == 2 and parts[0] in records:
                ref, (read, force, forget) = parts[1], records[parts[0]]
                if method == "GET":
                    state = read(ref)
                    return _Resp(200, state) if state else _error(404, "RESOURCE_NOT_FOUND")
                if method == "PUT":
                    opts = _json_object(raw)
                    extra = set(opts) - {"status", "reason"}
                    if extra:
                        raise ValueError(f"unknown field(s): {', '.join(sorted(extra))}")
                    try:
                        return _Resp(200, force(ref, opts.get("status"), opts.get("reason")))
                    except KeyError:
                        return _error(404, "RESOURCE_NOT_FOUND")
                if method == "DELETE":
                    return _Resp(204) if forget(ref) else _error(404, "RESOURCE_NOT_FOUND")
            if len(parts) == 2 and parts[0] == "payers":
                if method == "PUT":
                    opts = _json_object(raw, allow_empty=True)
                    return _Resp(200, {"payer": parts[1], "script": self._set_script(parts[1], opts)})
                if method == "DELETE":
                    self._set_script(parts[1], {})
                    return _Resp(204)
        except ValueError as exc:
            return _error(400, "BAD_REQUEST", str(exc))
        return _error(404, "RESOURCE_NOT_FOUND", f"No sandbox control endpoint {method} {path}")


def _check_forced(status: str, reason: str | None) -> None:
    """Arguments of ``set_status`` / ``set_refund_status``: ValueError unless
    ``status`` is one of ``STATUSES`` and ``reason`` is None or a non-empty string."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}")
    if reason is not None and (not isinstance(reason, str) or not reason):
        raise ValueError("reason must be a non-empty string")


def _method_not_allowed() -> _Resp:
    return _error(405, "METHOD_NOT_ALLOWED", "Method not allowed", statusCode=405)


def _json_object(raw: bytes, allow_empty: bool = False) -> dict[str, Any]:
    if not raw.strip():
        if allow_empty:
            return {}
        raise ValueError("a JSON object body is required")
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("body must be a JSON object")
    return obj


def _parse_money_body(raw: bytes, extra: Callable[[dict[str, Any]], str | None]) -> dict[str, Any] | _Resp:
    """The checks a request-to-pay and a refund body share (``amount`` as a
    positive decimal string, ``currency``, ``externalId`` a string when
    present, messages of at most 160 characters), then ``extra(body)``: an
    error text, or None."""
    def bad(msg: str) -> _Resp:
        return _error(400, "BAD_REQUEST", msg)

    try:
        body = json.loads(raw) if raw.strip() else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return bad("Body is not valid JSON")
    if not isinstance(body, dict):
        return bad("Body must be a JSON object")
    amount = body.get("amount")
    if not isinstance(amount, str) or not _AMOUNT_RE.match(amount) or float(amount) <= 0:
        return bad("amount must be a positive decimal number in a string")
    currency = body.get("currency")
    if not isinstance(currency, str) or not re.fullmatch(r"[A-Z]{3}", currency):
        return bad("currency must be an ISO 4217 code")
    # Optional: MTN's published schema requires none of the body's fields,
    # and the client libraries send externalId only when given.
    if "externalId" in body and not isinstance(body["externalId"], str):
        return bad("externalId must be a string")
    problem = extra(body)
    if problem:
        return bad(problem)
    for name in ("payerMessage", "payeeNote"):
        v = body.get(name)
        if v is not None and (not isinstance(v, str) or len(v) > _MAX_MESSAGE):
            return bad(f"{name} must be a string of at most {_MAX_MESSAGE} characters")
    return body


def _parse_rtp_body(raw: bytes) -> dict[str, Any] | _Resp:
    """The request-to-pay body: the shared checks and ``payer``."""
    def payer_problem(body: dict[str, Any]) -> str | None:
        payer = body.get("payer")
        if (not isinstance(payer, dict) or payer.get("partyIdType") not in ("MSISDN", "EMAIL", "PARTY_CODE")
                or not isinstance(payer.get("partyId"), str) or not payer["partyId"]):
            return "payer must be {partyIdType: MSISDN|EMAIL|PARTY_CODE, partyId}"
        return None
    return _parse_money_body(raw, payer_problem)


def _parse_refund_body(raw: bytes) -> dict[str, Any] | _Resp:
    """The refund body: the shared checks and ``referenceIdToRefund`` (UUID)."""
    def target_problem(body: dict[str, Any]) -> str | None:
        target = body.get("referenceIdToRefund")
        if not isinstance(target, str) or not _UUID4_RE.match(target):
            return "referenceIdToRefund must be the UUID of the transaction to refund"
        return None
    return _parse_money_body(raw, target_problem)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """``python -m vpay.sandbox.mtn [--port N]``: run a sandbox until Ctrl-C / SIGTERM."""
    import argparse
    import signal

    p = argparse.ArgumentParser(description="Local MTN MoMo Collection sandbox (test/demo double).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8089)
    p.add_argument("--subscription-key", default=DEFAULT_SUBSCRIPTION_KEY)
    p.add_argument("--api-user", default=DEFAULT_API_USER)
    p.add_argument("--api-key", default=DEFAULT_API_KEY)
    p.add_argument("--target-environment", default="sandbox")
    p.add_argument("--success-after", type=float, default=3.0, help="seconds until a payment succeeds")
    p.add_argument("--reason-shape", choices=("string", "object"), default="string",
                   help="a FAILED status's reason: a plain string (MTN's published shape) or {code, message}")
    p.add_argument("--callback-host", action="append", default=None, metavar="HOST",
                   help="allow callbacks to HOST (repeatable; '*' = any); default: loopback only")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rail = SandboxRail(args.host, args.port, subscription_key=args.subscription_key,
                       api_user=args.api_user, api_key=args.api_key,
                       target_environment=args.target_environment,
                       success_after_seconds=args.success_after, reason_shape=args.reason_shape,
                       callback_hosts=args.callback_host)
    signal.signal(signal.SIGTERM, lambda *_: rail.stop())
    rail.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
