"""Serving a sandbox rail over HTTP, shared by every rail double (``mtn/``
for MoMo, ``orange.py`` for Orange Money): the threaded server that never
blocks ``stop()`` on a handler, the request handler that reads a body, asks
the double for an ``Answer`` and writes it, the start/serve/stop lifecycle
(``ServedDouble``), the loopback check of the callback rules and the
loopback-client check of the control endpoints.

A new rail double is one module: a ``ServedDouble`` subclass with an
``answer(method, path, headers, body)`` method and a ``SandboxHandler``
subclass naming its ``_read_body`` rules and its internal-error answer."""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import sys
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

log = logging.getLogger("vpay.sandbox.server")

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback_host(host: str | None) -> bool:
    """True for ``localhost`` and its aliases and for any loopback address
    (``127.0.0.0/8``, ``::1``, bracketed or not)."""
    host = (host or "").strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_client(client_address: Any) -> bool:
    """True when a request's peer (``client_address`` as a socketserver
    handler has it: ``(host, port, ...)``) is a loopback address, an
    IPv4-mapped one (``::ffff:127.0.0.1``) included. The control endpoints
    (``/_sandbox/*``) have no authentication and answer only such clients,
    whatever address the sandbox is bound to (docs/sandbox.md)."""
    host = client_address[0] if isinstance(client_address, (tuple, list)) and client_address else ""
    try:
        address = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


@dataclass
class Answer:
    """One HTTP answer of a sandbox: ``status``; ``body`` None (no body),
    bytes (sent as they are) or a JSON value; ``after``: functions run once
    the answer is written (a callback that must not overtake its answer);
    ``content_type``: None = the handler's ``json_type``."""

    status: int
    body: Any = None
    after: list[Callable[[], None]] = field(default_factory=list)
    content_type: str | None = None


class SandboxServer(ThreadingHTTPServer):
    """Daemon handler threads; close does not join them, so a handler sleeping
    for a scripted delay, or a client holding a keep-alive connection, cannot
    block ``stop()``. A client going away is logged at debug, anything else
    with its traceback. ``rail`` is the double it serves."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    rail: "ServedDouble"

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
            log.debug("sandbox: client %s went away: %s", client_address, exc)
        else:
            log.exception("sandbox: unexpected error serving %s", client_address)


class SandboxHandler(BaseHTTPRequestHandler):
    """The request handler every sandbox rail builds on: HTTP/1.1 keep-alive
    (idle connections dropped after ``timeout`` seconds; none served once the
    double is stopping), no Nagle delay (headers and body go out as separate
    writes), access lines at debug on ``http_log`` as ``"<log_label> http:
    ..."``. Every method goes through ``_dispatch``: ``_read_body()`` (the
    subclass's: bytes, or the ``Answer`` refusing the body), then
    ``answer(method, path, body)`` (default: the double's ``answer``), then
    ``_send`` and the answer's ``after`` functions. An exception there is a
    bug in the sandbox: logged, answered ``internal_error()``."""

    protocol_version = "HTTP/1.1"
    sys_version = ""
    timeout = 30  # idle keep-alive connections are dropped after this
    disable_nagle_algorithm = True  # headers and body go out as separate writes
    http_log = log
    log_label = "sandbox"
    json_type = "application/json"
    server: SandboxServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        self.http_log.debug("%s http: %s - %s", self.log_label, self.address_string(), format % args)

    def handle_one_request(self) -> None:
        if self.server.rail._stopping.is_set():
            self.close_connection = True
            return
        try:
            super().handle_one_request()
        except (ConnectionError, TimeoutError, socket.timeout) as exc:
            self.http_log.debug("%s: connection dropped: %s", self.log_label, exc)
            self.close_connection = True

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    max_body = 1 << 20
    """Bytes of a request body the sandbox reads at most."""

    def _read_body(self) -> bytes | Answer:
        """The request body, or ``bad_length()`` (and the connection closed)
        when its Content-Length is not a number from 0 to ``max_body``. A
        request without one has an empty body."""
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if not 0 <= length <= self.max_body:
            self.close_connection = True
            return self.bad_length()
        return self.rfile.read(length) if length else b""

    def bad_length(self) -> Answer:
        """The rail's own answer to a missing, invalid or oversized body length."""
        raise NotImplementedError

    def internal_error(self) -> Answer:
        """The answer to a request the sandbox failed on (a bug in it)."""
        raise NotImplementedError

    def answer(self, method: str, path: str, body: bytes) -> Answer:
        return self.server.rail.answer(method, path, self.headers, body)

    def _dispatch(self, method: str) -> None:
        path = urllib.parse.urlsplit(self.path).path
        body = self._read_body()
        if isinstance(body, Answer):
            resp = body
        else:
            try:
                resp = self.answer(method, path, body)
            except Exception:  # a bug in the sandbox, not a client error
                self.http_log.exception("%s: error handling %s %s", self.log_label, method, path)
                resp = self.internal_error()
        self._send(resp)
        for fn in resp.after:
            fn()

    def _send(self, resp: Answer) -> None:
        if resp.body is None:
            data = b""
        elif isinstance(resp.body, bytes):
            data = resp.body
        else:
            data = json.dumps(resp.body).encode("utf-8")
        failed = self.write_answer(resp.status, data, (resp.content_type or self.json_type) if data else None)
        if failed is not None:
            # Typically a client that gave up after a scripted delay.
            self.http_log.debug("%s: could not answer %s %s: %s", self.log_label, self.command, self.path, failed)

    def write_answer(self, status: int, data: bytes, content_type: str | None) -> Exception | None:
        """Send ``status`` with body ``data`` (``Content-Type`` when
        ``content_type`` is given, ``Content-Length`` always, ``Connection:
        close`` when the connection is to be closed). A client that went away
        (typically after a scripted delay) closes the connection and is
        returned, not raised."""
        try:
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if data:
                self.wfile.write(data)
            self.wfile.flush()
        except (ConnectionError, TimeoutError, socket.timeout) as exc:
            self.close_connection = True
            return exc
        return None


class ServedDouble:
    """The lifecycle of a sandbox rail: the socket is bound by ``_bind`` (in
    the constructor, so ``url`` is valid at once); ``start()`` serves in a
    background daemon thread, ``serve_forever()`` in the calling thread,
    ``stop()`` ends either (idempotent, safe from a signal handler); a
    stopped double cannot be started again. ``with Double() as d:`` starts
    and stops it. Subclasses name themselves (``label`` for log lines,
    ``thread_prefix`` for thread names), define ``answer(method, path,
    headers, body) -> Answer``, and may run helper threads (``_start_helpers``,
    ``_wake_helpers``, ``_helper_threads``: MoMo's success timers)."""

    label = "sandbox"
    thread_prefix = "sandbox"
    lifecycle_log = log

    def _bind(self, host: str, port: int, handler: type[SandboxHandler],
              server_class: type[SandboxServer] = SandboxServer) -> None:
        self._stopping = threading.Event()
        self._serving = False
        self._serve_ident: int | None = None
        self._serve_thread: threading.Thread | None = None
        self._closed = False
        self._server = server_class((host, port), handler)
        self._server.rail = self

    def answer(self, method: str, path: str, headers: Any, body: bytes) -> Answer:
        raise NotImplementedError

    def _start_helpers(self) -> None:
        """Start the double's own threads (none by default)."""

    def _wake_helpers(self) -> None:
        """Wake the double's own threads so they see ``_stopping`` (no-op by default)."""

    def _helper_threads(self) -> tuple[threading.Thread | None, ...]:
        return ()

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:54321`` (no trailing slash)."""
        host, port = self._server.server_address[:2]
        if ":" in str(host):
            host = f"[{host}]"
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self):
        """Serve in a background daemon thread; returns self."""
        if self._closed or self._serving:
            raise RuntimeError(f"{type(self).__name__} already started or stopped")
        self._serving = True
        self._start_helpers()
        self._serve_thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
            name=f"{self.thread_prefix}-{self.port}", daemon=True,
        )
        self._serve_thread.start()
        self.lifecycle_log.info("%s listening on %s", self.label, self.url)
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until ``stop()`` or KeyboardInterrupt.

        ``stop()`` may be called from a signal handler running in this thread:
        it does not block, and this method returns within a fraction of a second.
        """
        if self._closed or self._serving:
            raise RuntimeError(f"{type(self).__name__} already started or stopped")
        self._serving = True
        self._serve_ident = threading.get_ident()
        self._start_helpers()
        self.lifecycle_log.info("%s listening on %s", self.label, self.url)
        try:
            self._server.serve_forever(poll_interval=0.1)
        except KeyboardInterrupt:
            self.lifecycle_log.info("%s interrupted", self.label)
        finally:
            self._stopping.set()
            self._finish()

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        self._stopping.set()
        self._wake_helpers()
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
        for t in (self._serve_thread, *self._helper_threads()):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=2)
        self.lifecycle_log.info("%s on %s stopped", self.label, self.url)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
