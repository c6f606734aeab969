"""A local test/demo double of Orange Money's Web Payment API ("OM WebPay").

This is **not** Orange's sandbox and never talks to Orange: it is an
in-process HTTP server that answers the shapes recorded in
``design/rails.md`` ("Orange Money Web Payment") closely enough that vpay's
Orange adapter (``vpay.rails.orange``) works against it unchanged, for
end-to-end tests and demos. Standard library only.

Endpoints (``{base}`` is ``OrangeSandbox.url``, ``{cc}`` its ``country``)::

    POST {base}/oauth/v3/token
        Authorization: Basic base64(client_id:client_secret), form body
        grant_type=client_credentials -> 200 {token_type: "Bearer", access_token, expires_in}
        bad credentials -> 401 {error: "invalid_client"}; other grant -> 400
    POST {base}/orange-money-webpay/{cc}/v1/webpayment
        Authorization: Bearer <token from this server>; JSON body {merchant_key, currency,
        order_id (1-30 chars), amount (int > 0), return_url, cancel_url, notif_url, lang,
        reference} -> 201 {status: 201, message: "OK", pay_token, payment_url, notif_token}
        401 bad token; 404 another country; 400 a bad body; 403 a wrong merchant_key or an
        order_id used before (Orange refuses a reused order_id with 403, afro.tools)
    POST {base}/orange-money-webpay/{cc}/v1/transactionstatus
        Bearer; JSON {order_id, amount, pay_token} -> 201 {status, order_id, txnid}
        status INITIATED | PENDING | EXPIRED | SUCCESS | FAILED (txnid when SUCCESS);
        404 unknown pay_token; 400 order_id or amount not the payment's
    GET  {base}/payment/{pay_token}
        the "payment page" payment_url points to (a line of HTML; nothing to do there)

Errors are ``{code, message, description}`` (the shape Orange's API gateway
uses); ``code`` is the HTTP status.

A payment starts ``INITIATED`` and stays so for ever unless scripted or
forced (design/rails.md: "an abandoned payment stays INITIATED for ever").
The payer is identified on Orange's page, so scripting is per order, not per
payer; an order is named by its ``order_id`` or by the vpay
``rail_reference`` it was derived from (``vpay.rails.orange.order_id_for``):

* ``script_order(order_or_ref, **opts)`` / ``set_default(**opts)`` (orders
  without a script of their own). Options:

  - ``pending_reads: int`` and ``outcome: str``: the first N (non-error)
    status reads answer ``waiting_status`` (``INITIATED`` by default, or
    ``PENDING``: the payer confirmed), then ``outcome`` for good.
    ``outcome`` alone is ``pending_reads=0``.
  - ``status_errors: list[int]``: the next status reads answer these HTTP
    codes, in order, before normal behaviour (not counted as reads).
  - ``status_delay_seconds: float``: sleep before every status answer.
  - ``notify: bool`` (default: the constructor's ``auto_notify``): post the
    notification when the payment becomes SUCCESS or FAILED.
  - ``notify_token: "right" | "wrong" | "missing"``: what that automatic
    notification carries as ``notif_token``.

* ``fail_next_inits(*codes)``: the next webpayment calls answer these HTTP
  codes without recording a payment. ``lose_next_init_answers(*codes)``:
  after those, the next calls record the payment but answer these codes
  (Orange took it and we never heard; a re-send then gets 403).
* ``set_status(order_or_ref, status)``: force a status for ever (posts the
  notification when it is SUCCESS or FAILED and notifications are on).
* ``notify(order_or_ref, token="right", status=None)``: post a notification
  now, synchronously; ``token`` is ``"right"``, ``"wrong"``, ``"missing"`` or
  any literal string; answers the HTTP status our server gave (or None).

Notifications are ``POST notif_url`` with JSON ``{status, notif_token,
txnid}`` (no order id: design/rails.md), sent once, never retried (Orange does
not retry, afro.tools), with a 5 s timeout. Only loopback ``notif_url`` hosts
are accepted at init (a test double must not be an open relay): 400 otherwise.

Inspection: ``payments()``, ``payment(order_or_ref)`` (including
``notif_token`` and ``pay_token``: it is a test double), ``requests_log()``
(every API request as ``{method, path, order_id, status_code, at}``),
``count(method=None, path_suffix=None, order_id=None)``, ``notifications()``.
``reset()`` forgets payments, scripts and logs (tokens stay valid).

Command line: ``python -m vpay.sandbox.orange --port 8091``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import re
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["OrangeSandbox", "DEFAULT_CLIENT_ID", "DEFAULT_CLIENT_SECRET", "DEFAULT_MERCHANT_KEY",
           "STATUSES", "main"]

from vpay.sandbox.server import SandboxHandler, SandboxServer, is_loopback_host  # noqa: E402

log = logging.getLogger("vpay.sandbox.orange")

DEFAULT_CLIENT_ID = "orange-sandbox-client"
DEFAULT_CLIENT_SECRET = "orange-sandbox-secret"
DEFAULT_MERCHANT_KEY = "orange-sandbox-merchant-key"

INITIATED, PENDING, EXPIRED, SUCCESS, FAILED = "INITIATED", "PENDING", "EXPIRED", "SUCCESS", "FAILED"
STATUSES = (INITIATED, PENDING, EXPIRED, SUCCESS, FAILED)
_TERMINAL = (EXPIRED, SUCCESS, FAILED)
_NOTIFIED = (SUCCESS, FAILED)
_TOKEN_KINDS = ("right", "wrong", "missing")
_SCRIPT_KEYS = frozenset({"pending_reads", "outcome", "waiting_status", "status_errors",
                          "status_delay_seconds", "notify", "notify_token"})
_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_MAX_BODY = 1 << 20
_MAX_DELAY = 600.0
_NOTIFY_TIMEOUT = 5.0
_ORDER_ID_MAX = 30


def order_of(order_or_ref: str) -> str:
    """The order id an argument names: a UUID is a vpay ``rail_reference``
    (its order id is derived as ``vpay.rails.orange.order_id_for`` does);
    anything else is an order id already."""
    if _UUID_RE.match(order_or_ref):
        return order_or_ref.lower().replace("-", "")[:_ORDER_ID_MAX]
    return order_or_ref


@dataclass
class _Script:
    pending_reads: int = 0
    outcome: str | None = None          # None: stay waiting for ever
    waiting_status: str = INITIATED
    status_errors: list[int] = field(default_factory=list)
    status_delay_seconds: float = 0.0
    notify: bool | None = None          # None: the sandbox's auto_notify
    notify_token: str = "right"

    def as_dict(self) -> dict[str, Any]:
        return {"pending_reads": self.pending_reads, "outcome": self.outcome,
                "waiting_status": self.waiting_status, "status_errors": list(self.status_errors),
                "status_delay_seconds": self.status_delay_seconds, "notify": self.notify,
                "notify_token": self.notify_token}


def _parse_script(opts: Mapping[str, Any]) -> _Script:
    unknown = set(opts) - _SCRIPT_KEYS
    if unknown:
        raise ValueError(f"unknown script option(s): {', '.join(sorted(unknown))}")
    s = _Script()
    if opts.get("pending_reads") is not None:
        n = opts["pending_reads"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError("pending_reads must be a non-negative integer")
        s.pending_reads = n
    if opts.get("outcome") is not None:
        if opts["outcome"] not in STATUSES:
            raise ValueError(f"outcome must be one of {', '.join(STATUSES)}")
        s.outcome = opts["outcome"]
    if opts.get("waiting_status") is not None:
        if opts["waiting_status"] not in (INITIATED, PENDING):
            raise ValueError("waiting_status must be INITIATED or PENDING")
        s.waiting_status = opts["waiting_status"]
    if opts.get("status_errors") is not None:
        codes = opts["status_errors"]
        if not isinstance(codes, (list, tuple)) or not all(
                isinstance(c, int) and not isinstance(c, bool) and 400 <= c <= 599 for c in codes):
            raise ValueError("status_errors must be a list of HTTP error codes (400-599)")
        s.status_errors = list(codes)
    if opts.get("status_delay_seconds") is not None:
        d = opts["status_delay_seconds"]
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= _MAX_DELAY:
            raise ValueError(f"status_delay_seconds must be between 0 and {_MAX_DELAY:g}")
        s.status_delay_seconds = float(d)
    if opts.get("notify") is not None:
        if not isinstance(opts["notify"], bool):
            raise ValueError("notify must be true or false")
        s.notify = opts["notify"]
    if opts.get("notify_token") is not None:
        if opts["notify_token"] not in _TOKEN_KINDS:
            raise ValueError(f"notify_token must be one of {', '.join(_TOKEN_KINDS)}")
        s.notify_token = opts["notify_token"]
    return s


@dataclass
class _Payment:
    order_id: str
    amount: int
    currency: str
    pay_token: str
    notif_token: str
    payment_url: str
    notif_url: str
    return_url: str
    cancel_url: str
    lang: str
    reference: str
    created_at: float
    status: str = INITIATED
    txnid: str | None = None
    reads: int = 0              # answered status reads (errors excluded)
    forced: bool = False
    notified: bool = False

    def view(self) -> dict[str, Any]:
        return {"order_id": self.order_id, "amount": self.amount, "currency": self.currency,
                "pay_token": self.pay_token, "notif_token": self.notif_token,
                "payment_url": self.payment_url, "notif_url": self.notif_url,
                "return_url": self.return_url, "cancel_url": self.cancel_url, "lang": self.lang,
                "reference": self.reference, "status": self.status, "txnid": self.txnid,
                "reads": self.reads, "forced": self.forced, "notified": self.notified}


@dataclass
class _Resp:
    status: int
    body: Any = None
    content_type: str = "application/json"
    after: list = field(default_factory=list)


def _error(status: int, message: str, description: str = "") -> _Resp:
    return _Resp(status, {"code": status, "message": message, "description": description or message})


class _Server(SandboxServer):
    sandbox: "OrangeSandbox"


class _Handler(SandboxHandler):
    server_version = "vpay-orange-sandbox/1.0"
    http_log = log
    log_label = "orange sandbox"
    server: _Server

    def _dispatch(self, method: str) -> None:
        sandbox = self.server.sandbox
        path = urllib.parse.urlsplit(self.path).path
        raw = self.headers.get("Content-Length") or "0"
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY:
            self.close_connection = True
            resp = _error(400, "Bad request", "Content-Length missing, invalid or too large")
        else:
            body = self.rfile.read(length) if length else b""
            try:
                resp = sandbox._handle(method, path, self.headers, body)
            except Exception:  # a bug in the sandbox, not a client error
                log.exception("orange sandbox: error handling %s %s", method, path)
                resp = _error(500, "Internal error")
        self._send(resp)
        for fn in resp.after:
            fn()

    def _send(self, resp: _Resp) -> None:
        if resp.body is None:
            data = b""
        elif isinstance(resp.body, bytes):
            data = resp.body
        else:
            data = json.dumps(resp.body).encode("utf-8")
        self.write_answer(resp.status, data, resp.content_type if data else None)


class OrangeSandbox:
    """A local Orange Money Web Payment double (see the module docstring).

    ``with OrangeSandbox() as orange: ...`` serves on 127.0.0.1 and an
    ephemeral port in a background thread; ``orange.url`` is the API root to
    give the adapter as ``VPAY_ORANGE_BASE_URL``, with ``client_id``,
    ``client_secret``, ``merchant_key`` and ``country``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 client_id: str = DEFAULT_CLIENT_ID, client_secret: str = DEFAULT_CLIENT_SECRET,
                 merchant_key: str = DEFAULT_MERCHANT_KEY, country: str = "dev",
                 token_ttl_seconds: int = 3600, auto_notify: bool = True,
                 max_log_entries: int = 100_000) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.merchant_key = merchant_key
        self.country = country
        self.token_ttl_seconds = token_ttl_seconds
        self.auto_notify = auto_notify
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}        # access token -> monotonic expiry
        self._payments: dict[str, _Payment] = {}   # by order_id
        self._by_pay_token: dict[str, str] = {}    # pay_token -> order_id
        self._scripts: dict[str, _Script] = {}     # by order_id
        self._default = _Script()
        self._init_errors: list[int] = []
        self._init_lost: list[int] = []
        self._log: deque[dict[str, Any]] = deque(maxlen=max_log_entries)
        self._notifications: deque[dict[str, Any]] = deque(maxlen=max_log_entries)
        self._thread: threading.Thread | None = None
        self._server = _Server((host, port), _Handler)
        self._server.sandbox = self

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "OrangeSandbox":
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1}, daemon=True,
                                        name=f"orange-sandbox-{self._server.server_address[1]}")
        self._thread.start()
        log.info("Orange sandbox listening on %s", self.url)
        return self

    def serve_forever(self) -> None:
        log.info("Orange sandbox listening on %s", self.url)
        try:
            self._server.serve_forever(poll_interval=0.1)
        finally:
            self._server.server_close()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=2)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> "OrangeSandbox":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def env(self, notif_url: str, **extra: str) -> dict[str, str]:
        """``VPAY_ORANGE_*`` pointing vpay's adapter at this sandbox;
        ``notif_url`` is the API's ``…/provider/orange/callback``."""
        return {"VPAY_ORANGE_BASE_URL": self.url, "VPAY_ORANGE_CLIENT_ID": self.client_id,
                "VPAY_ORANGE_CLIENT_SECRET": self.client_secret,
                "VPAY_ORANGE_MERCHANT_KEY": self.merchant_key, "VPAY_ORANGE_COUNTRY": self.country,
                "VPAY_ORANGE_NOTIF_URL": notif_url,
                "VPAY_ORANGE_RETURN_URL": "http://127.0.0.1/shop/return",
                "VPAY_ORANGE_CANCEL_URL": "http://127.0.0.1/shop/cancel", **extra}

    # ------------------------------------------------------------ scripting

    def script_order(self, order_or_ref: str, **opts: Any) -> dict[str, Any]:
        """Script one order (before or after its init); no options = back to
        the default. Raises ``ValueError`` for a bad option."""
        script = _parse_script(opts)
        with self._lock:
            self._scripts[order_of(order_or_ref)] = script
        return script.as_dict()

    def set_default(self, **opts: Any) -> dict[str, Any]:
        """The script of every order without one of its own."""
        script = _parse_script(opts)
        with self._lock:
            self._default = script
        return script.as_dict()

    def fail_next_inits(self, *codes: int) -> None:
        """The next webpayment calls answer these HTTP codes, recording nothing."""
        with self._lock:
            self._init_errors.extend(int(c) for c in codes)

    def lose_next_init_answers(self, *codes: int) -> None:
        """The next webpayment calls (after ``fail_next_inits``'s) record the
        payment, then answer these HTTP codes."""
        with self._lock:
            self._init_lost.extend(int(c) for c in codes)

    def set_status(self, order_or_ref: str, status: str) -> dict[str, Any]:
        """Force an order's status for ever. Raises ``KeyError`` for an unknown
        order, ``ValueError`` for an unknown status."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}")
        with self._lock:
            payment = self._payments[order_of(order_or_ref)]
            payment.forced = True
            fire = self._become(payment, status)
            view = payment.view()
        if fire:
            threading.Thread(target=fire, daemon=True).start()
        return view

    def notify(self, order_or_ref: str, token: str = "right", status: str | None = None) -> int | None:
        """Post a notification for an order now and answer our server's HTTP
        status (None when it could not be reached). ``token``: ``"right"``,
        ``"wrong"``, ``"missing"`` or a literal string; ``status``: what the
        body claims (default: the order's status)."""
        with self._lock:
            payment = self._payments[order_of(order_or_ref)]
        return self._post_notification(payment, token, status)

    def reset(self) -> None:
        with self._lock:
            self._payments.clear()
            self._by_pay_token.clear()
            self._scripts.clear()
            self._default = _Script()
            self._init_errors.clear()
            self._init_lost.clear()
            self._log.clear()
            self._notifications.clear()

    # ------------------------------------------------------------ inspection

    def payments(self) -> list[dict[str, Any]]:
        with self._lock:
            return [p.view() for p in self._payments.values()]

    def payment(self, order_or_ref: str) -> dict[str, Any] | None:
        with self._lock:
            p = self._payments.get(order_of(order_or_ref))
            return p.view() if p else None

    def requests_log(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._log)

    def count(self, method: str | None = None, path_suffix: str | None = None,
              order_id: str | None = None) -> int:
        """API requests received matching every given filter; ``order_id``
        may be a vpay ``rail_reference``."""
        wanted = order_of(order_id) if order_id else None
        with self._lock:
            return sum(1 for r in self._log
                       if (method is None or r["method"] == method)
                       and (path_suffix is None or r["path"].endswith(path_suffix))
                       and (wanted is None or r["order_id"] == wanted))

    def notifications(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._notifications)

    # ------------------------------------------------------------ the API

    def _handle(self, method: str, path: str, headers: Any, body: bytes) -> _Resp:
        order_id = None
        prefix = f"/orange-money-webpay/{self.country}/v1/"
        if method == "POST" and path == "/oauth/v3/token":
            resp = self._token(headers, body)
        elif method == "GET" and path.startswith("/payment/"):
            return self._page(path[len("/payment/"):])
        elif method == "POST" and path.startswith("/orange-money-webpay/"):
            if not path.startswith(prefix):
                resp = _error(404, "Resource not found", "unknown country segment")
            elif path == prefix + "webpayment":
                resp, order_id = self._init(headers, body)
            elif path == prefix + "transactionstatus":
                resp, order_id = self._status(headers, body)
            else:
                resp = _error(404, "Resource not found")
        else:
            resp = _error(404, "Resource not found")
        with self._lock:
            self._log.append({"method": method, "path": path, "order_id": order_id,
                              "status_code": resp.status, "at": time.time()})
        return resp

    def _token(self, headers: Any, body: bytes) -> _Resp:
        auth = headers.get("Authorization") or ""
        expected = f"{self.client_id}:{self.client_secret}".encode()
        given = b""
        if auth.startswith("Basic "):
            try:
                given = base64.b64decode(auth[6:].strip(), validate=True)
            except (binascii.Error, ValueError):
                given = b""
        if not hmac.compare_digest(given, expected):
            return _Resp(401, {"error": "invalid_client", "error_description": "Client authentication failed"})
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        if form.get("grant_type") != ["client_credentials"]:
            return _Resp(400, {"error": "unsupported_grant_type"})
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = time.monotonic() + self.token_ttl_seconds
        return _Resp(200, {"token_type": "Bearer", "access_token": token,
                           "expires_in": self.token_ttl_seconds})

    def _bearer_ok(self, headers: Any) -> bool:
        auth = headers.get("Authorization") or ""
        if not auth.startswith("Bearer "):
            return False
        with self._lock:
            expiry = self._tokens.get(auth[7:].strip())
        return expiry is not None and time.monotonic() < expiry

    def _authorized_body(self, headers: Any, raw: bytes) -> Any:
        """The JSON value of an init or status body (None when it is not
        JSON), or the 401 ``_Resp`` to answer when the Bearer token is
        missing, unknown or expired."""
        if not self._bearer_ok(headers):
            return _error(401, "Invalid credentials", "Bearer token missing, unknown or expired")
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def _init(self, headers: Any, raw: bytes) -> tuple[_Resp, str | None]:
        body = self._authorized_body(headers, raw)
        if isinstance(body, _Resp):
            return body, None
        if not isinstance(body, dict):
            return _error(400, "Bad request", "body must be a JSON object"), None
        order_id = body.get("order_id")
        problem = _init_problem(body)
        if problem:
            return _error(400, "Bad request", problem), order_id if isinstance(order_id, str) else None
        if not hmac.compare_digest(str(body["merchant_key"]).encode(), self.merchant_key.encode()):
            return _error(403, "Forbidden", "merchant_key not allowed"), order_id
        with self._lock:
            if self._init_errors:
                code = self._init_errors.pop(0)
                return _error(code, "Scripted error", f"sandbox scripted HTTP {code}"), order_id
            if order_id in self._payments:
                return _error(403, "Forbidden", "order_id already used"), order_id
            pay_token = secrets.token_hex(16)
            payment = _Payment(order_id=order_id, amount=body["amount"], currency=body["currency"],
                               pay_token=pay_token, notif_token=secrets.token_hex(16),
                               payment_url=f"{self.url}/payment/{pay_token}",
                               notif_url=body["notif_url"], return_url=body["return_url"],
                               cancel_url=body["cancel_url"], lang=str(body.get("lang", "")),
                               reference=str(body.get("reference", "")), created_at=time.time())
            self._payments[order_id] = payment
            self._by_pay_token[pay_token] = order_id
            if self._init_lost:
                code = self._init_lost.pop(0)
                log.info("orange sandbox: order %s initiated, answer lost (HTTP %s)", order_id, code)
                return _error(code, "Scripted error", f"sandbox scripted HTTP {code}"), order_id
        log.info("orange sandbox: order %s initiated (%s %s)", order_id, payment.amount, payment.currency)
        return _Resp(201, {"status": 201, "message": "OK", "pay_token": payment.pay_token,
                           "payment_url": payment.payment_url,
                           "notif_token": payment.notif_token}), order_id

    def _status(self, headers: Any, raw: bytes) -> tuple[_Resp, str | None]:
        body = self._authorized_body(headers, raw)
        if isinstance(body, _Resp):
            return body, None
        if not isinstance(body, dict) or not isinstance(body.get("pay_token"), str):
            return _error(400, "Bad request", "body must be {order_id, amount, pay_token}"), None
        with self._lock:
            order_id = self._by_pay_token.get(body["pay_token"])
            payment = self._payments.get(order_id) if order_id else None
            if payment is None:
                return _error(404, "Resource not found", "unknown pay_token"), None
            if body.get("order_id") != payment.order_id or body.get("amount") != payment.amount:
                return _error(400, "Bad request", "order_id or amount is not the payment's"), order_id
            script = self._scripts.get(order_id, self._default)
            delay = script.status_delay_seconds
        if delay:
            time.sleep(delay)
        fire = None
        with self._lock:
            if script.status_errors:
                code = script.status_errors.pop(0)
                return _error(code, "Scripted error", f"sandbox scripted HTTP {code}"), order_id
            payment.reads += 1
            if not payment.forced and payment.status not in _TERMINAL:
                if script.outcome is not None and payment.reads > script.pending_reads:
                    fire = self._become(payment, script.outcome)
                else:
                    payment.status = script.waiting_status
            answer = {"status": payment.status, "order_id": payment.order_id}
            if payment.status == SUCCESS:
                answer["txnid"] = payment.txnid
        resp = _Resp(201, answer)
        if fire:
            resp.after.append(fire)
        return resp, order_id

    def _page(self, pay_token: str) -> _Resp:
        with self._lock:
            order_id = self._by_pay_token.get(pay_token)
            payment = self._payments.get(order_id) if order_id else None
        if payment is None:
            return _error(404, "Resource not found")
        html = (f"<!doctype html><title>Orange Money sandbox</title><p>Order {payment.order_id}: "
                f"{payment.amount} {payment.currency} ({payment.status}). This sandbox has no payer: "
                f"the test decides the outcome.</p>")
        return _Resp(200, html.encode(), content_type="text/html; charset=utf-8")

    # ------------------------------------------------------------ state and notifications

    def _become(self, payment: _Payment, status: str):
        """Set ``status`` (lock held); answer the notification to post once the
        lock is released, or None."""
        payment.status = status
        if status == SUCCESS and payment.txnid is None:
            payment.txnid = "MP" + secrets.token_hex(6).upper()
        script = self._scripts.get(payment.order_id, self._default)
        enabled = self.auto_notify if script.notify is None else script.notify
        if status in _NOTIFIED and enabled and not payment.notified:
            payment.notified = True
            kind = script.notify_token
            return lambda: self._post_notification(payment, kind, None)
        return None

    def _post_notification(self, payment: _Payment, token: str, status: str | None) -> int | None:
        body: dict[str, Any] = {"status": status or payment.status, "txnid": payment.txnid}
        if token == "right":
            body["notif_token"] = payment.notif_token
        elif token == "wrong":
            body["notif_token"] = secrets.token_hex(16)
        elif token != "missing":
            body["notif_token"] = token
        request = urllib.request.Request(payment.notif_url, data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        entry: dict[str, Any] = {"order_id": payment.order_id, "url": payment.notif_url,
                                 "status_claimed": body["status"], "token": token if token in
                                 _TOKEN_KINDS else "literal", "status_code": None, "error": None,
                                 "at": time.time()}
        try:
            with urllib.request.urlopen(request, timeout=_NOTIFY_TIMEOUT) as resp:
                entry["status_code"] = resp.status
                entry["body"] = resp.read()
        except urllib.error.HTTPError as exc:
            entry["status_code"] = exc.code
            entry["body"] = exc.read()
        except (urllib.error.URLError, OSError) as exc:
            entry["error"] = type(exc).__name__
        with self._lock:
            self._notifications.append(entry)
        log.info("orange sandbox: notification for %s (%s, token %s) -> %s", payment.order_id,
                 body["status"], entry["token"], entry["status_code"] or entry["error"])
        return entry["status_code"]


def _init_problem(body: Mapping[str, Any]) -> str | None:
    """What is wrong with a webpayment body, or None."""
    for name in ("merchant_key", "currency", "order_id", "return_url", "cancel_url", "notif_url"):
        if not isinstance(body.get(name), str) or not body[name]:
            return f"{name} is required"
    if not re.fullmatch(r"[A-Z]{3}", body["currency"]):
        return "currency must be an ISO 4217 code"
    if len(body["order_id"]) > _ORDER_ID_MAX:
        return f"order_id must be at most {_ORDER_ID_MAX} characters"
    amount = body.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        return "amount must be a positive integer"
    for name in ("return_url", "cancel_url", "notif_url"):
        if urllib.parse.urlsplit(body[name]).scheme not in ("http", "https"):
            return f"{name} must be an http(s) URL"
    if not is_loopback_host(urllib.parse.urlsplit(body["notif_url"]).hostname):
        return "notif_url must be a loopback URL in this sandbox"
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m vpay.sandbox.orange [--port N]``: serve until Ctrl-C."""
    import argparse

    p = argparse.ArgumentParser(description="Local Orange Money Web Payment sandbox (test/demo double).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--country", default="dev")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sandbox = OrangeSandbox(args.host, args.port, country=args.country)
    try:
        sandbox.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
