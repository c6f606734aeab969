"""The MoMo sandbox's HTTP face: which handler a path goes to (the route
table, built from the products' transaction kinds and token paths), the
request log every MoMo call lands in, the ``/_sandbox/*`` control routes
(loopback clients only: 403 ``NOT_ALLOWED`` otherwise) and the request
handler's MoMo rules (chunked bodies refused with 411, bodies over 1 MiB with
413, PUT and DELETE for the control API, a sandbox bug answered 500
``INTERNAL_PROCESSING_ERROR``). An unknown path is 404 ``RESOURCE_NOT_FOUND``,
a known one with another method 405 ``METHOD_NOT_ALLOWED``.

The ``Routes`` mixin needs every other part of the rail."""

from __future__ import annotations

import logging
import time
import urllib.parse
from typing import Any, Callable

from vpay.sandbox import server as _server
from vpay.sandbox.server import Answer, SandboxHandler
from vpay.sandbox.mtn.accounts import BALANCE_RE, HOLDER_RE
from vpay.sandbox.mtn.codes import COLLECTION, DISBURSEMENT, _error, _method_not_allowed, _not_found
from vpay.sandbox.mtn.collection import REQUEST_TO_PAY
from vpay.sandbox.mtn.disbursement import REFUND

log = logging.getLogger("vpay.sandbox.mtn")

_MAX_BODY = 1 << 20
#: Every kind of transaction the rail takes; a new product adds its kind here.
KINDS = (REQUEST_TO_PAY, REFUND)
PRODUCTS = (COLLECTION, DISBURSEMENT)

_Route = tuple["Callable[[Any, bytes], Answer] | None", "str | None", "str | None"]


class Routes:
    """Path -> handler, and the request log."""

    def _route(self, path: str, headers: Any) -> _Route:
        """``(handler(headers, body), its method, the transaction reference
        the request names)``; handler None: no such resource."""
        if m := BALANCE_RE.match(path):
            return (lambda h, b: self._balance(h, m.group(1), m.group(2))), "GET", None
        if m := HOLDER_RE.match(path):
            return (lambda h, b: self._account_holder(h, m.group(1), urllib.parse.unquote(m.group(2)),
                                                      urllib.parse.unquote(m.group(3)))), "GET", None
        for product in PRODUCTS:
            if path in (f"/{product}/token/", f"/{product}/token"):
                return (lambda h, b: self._token("POST", h, product)), "POST", None
        for kind in KINDS:
            if path == kind.path:
                return (lambda h, b: self._create(kind, h, b)), "POST", headers.get("X-Reference-Id")
            if path.startswith(kind.path + "/"):
                ref = urllib.parse.unquote(path[len(kind.path) + 1:])
                if not ref or "/" in ref:
                    return None, None, ref
                return (lambda h, b: self._read(kind, h, ref)), "GET", ref
        return None, None, None

    def _momo(self, method: str, path: str, headers: Any, body: bytes) -> Answer:
        """A MoMo API request: logged, routed, answered."""
        handler, allowed, reference = self._route(path, headers)
        entry = {"method": method, "path": path, "reference": reference, "status_code": None, "at": time.time()}
        with self._lock:
            self._log.append(entry)
        try:
            if handler is None:
                resp = _not_found()
            elif method != allowed:
                resp = _method_not_allowed()
            else:
                resp = handler(headers, body)
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


class _Handler(SandboxHandler):
    """The MoMo sandbox's request handler."""

    server_version = "vpay-momo-sandbox/1.0"
    http_log = log
    log_label = "sandbox"
    json_type = "application/json;charset=utf-8"

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def answer(self, method: str, path: str, body: bytes) -> Answer:
        rail = self.server.rail
        # No authentication on control: a sandbox bound to 0.0.0.0 must still
        # not let another host script outcomes or reset it. Looked up at call
        # time (a test makes 127.0.0.1 count as foreign).
        if path == "/_sandbox" or path.startswith("/_sandbox/"):
            if _server.is_loopback_client(self.client_address):
                return rail._control(method, path, body)
            return _error(403, "NOT_ALLOWED", "sandbox control endpoints answer loopback clients only")
        return rail._momo(method, path, self.headers, body)

    def internal_error(self) -> Answer:
        return _error(500, "INTERNAL_PROCESSING_ERROR", "Sandbox internal error")

    def _read_body(self) -> bytes | Answer:
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
