"""The Orange sandbox's HTTP API, the shapes recorded in ``design/rails.md``
("Orange Money Web Payment") (``{base}`` is ``OrangeSandbox.url``, ``{cc}``
its ``country``)::

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
uses); ``code`` is the HTTP status. Only loopback ``notif_url`` hosts are
accepted at init (a test double must not be an open relay): 400 otherwise.

The ``WebPay`` mixin needs the sandbox's credentials, ``country``, tables,
scripts and ``_become`` (``notify.py``)."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import re
import secrets
import time
import urllib.parse
from typing import Any, Mapping

from vpay.sandbox.server import Answer, SandboxHandler, is_loopback_host
from vpay.sandbox.orange.orders import ORDER_ID_MAX, SUCCESS, TERMINAL, _Payment

log = logging.getLogger("vpay.sandbox.orange")

_MAX_BODY = 1 << 20


def _error(status: int, message: str, description: str = "") -> Answer:
    return Answer(status, {"code": status, "message": message, "description": description or message})


class _Handler(SandboxHandler):
    """The Orange sandbox's request handler (GET and POST only)."""

    server_version = "vpay-orange-sandbox/1.0"
    http_log = log
    log_label = "orange sandbox"

    max_body = _MAX_BODY

    def bad_length(self) -> Answer:
        return _error(400, "Bad request", "Content-Length missing, invalid or too large")

    def internal_error(self) -> Answer:
        return _error(500, "Internal error")


def _init_problem(body: Mapping[str, Any]) -> str | None:
    """What is wrong with a webpayment body, or None."""
    for name in ("merchant_key", "currency", "order_id", "return_url", "cancel_url", "notif_url"):
        if not isinstance(body.get(name), str) or not body[name]:
            return f"{name} is required"
    if not re.fullmatch(r"[A-Z]{3}", body["currency"]):
        return "currency must be an ISO 4217 code"
    if len(body["order_id"]) > ORDER_ID_MAX:
        return f"order_id must be at most {ORDER_ID_MAX} characters"
    amount = body.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        return "amount must be a positive integer"
    for name in ("return_url", "cancel_url", "notif_url"):
        if urllib.parse.urlsplit(body[name]).scheme not in ("http", "https"):
            return f"{name} must be an http(s) URL"
    if not is_loopback_host(urllib.parse.urlsplit(body["notif_url"]).hostname):
        return "notif_url must be a loopback URL in this sandbox"
    return None


class WebPay:
    """Token, webpayment, transaction status and the payment page."""

    def answer(self, method: str, path: str, headers: Any, body: bytes) -> Answer:
        """Any request: routed, answered, logged (the page is not logged)."""
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

    def _token(self, headers: Any, body: bytes) -> Answer:
        auth = headers.get("Authorization") or ""
        expected = f"{self.client_id}:{self.client_secret}".encode()
        given = b""
        if auth.startswith("Basic "):
            try:
                given = base64.b64decode(auth[6:].strip(), validate=True)
            except (binascii.Error, ValueError):
                given = b""
        if not hmac.compare_digest(given, expected):
            return Answer(401, {"error": "invalid_client", "error_description": "Client authentication failed"})
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        if form.get("grant_type") != ["client_credentials"]:
            return Answer(400, {"error": "unsupported_grant_type"})
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = time.monotonic() + self.token_ttl_seconds
        return Answer(200, {"token_type": "Bearer", "access_token": token,
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
        JSON), or the 401 ``Answer`` to give when the Bearer token is
        missing, unknown or expired."""
        if not self._bearer_ok(headers):
            return _error(401, "Invalid credentials", "Bearer token missing, unknown or expired")
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def _init(self, headers: Any, raw: bytes) -> tuple[Answer, str | None]:
        body = self._authorized_body(headers, raw)
        if isinstance(body, Answer):
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
        return Answer(201, {"status": 201, "message": "OK", "pay_token": payment.pay_token,
                            "payment_url": payment.payment_url,
                            "notif_token": payment.notif_token}), order_id

    def _status(self, headers: Any, raw: bytes) -> tuple[Answer, str | None]:
        body = self._authorized_body(headers, raw)
        if isinstance(body, Answer):
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
            if not payment.forced and payment.status not in TERMINAL:
                if script.outcome is not None and payment.reads > script.pending_reads:
                    fire = self._become(payment, script.outcome)
                else:
                    payment.status = script.waiting_status
            answer = {"status": payment.status, "order_id": payment.order_id}
            if payment.status == SUCCESS:
                answer["txnid"] = payment.txnid
        resp = Answer(201, answer)
        if fire:
            resp.after.append(fire)
        return resp, order_id

    def _page(self, pay_token: str) -> Answer:
        with self._lock:
            order_id = self._by_pay_token.get(pay_token)
            payment = self._payments.get(order_id) if order_id else None
        if payment is None:
            return _error(404, "Resource not found")
        html = (f"<!doctype html><title>Orange Money sandbox</title><p>Order {payment.order_id}: "
                f"{payment.amount} {payment.currency} ({payment.status}). This sandbox has no payer: "
                f"the test decides the outcome.</p>")
        return Answer(200, html.encode(), content_type="text/html; charset=utf-8")
