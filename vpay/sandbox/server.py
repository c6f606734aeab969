"""HTTP plumbing shared by the sandbox rails (``mtn.py`` for MoMo,
``orange.py`` for Orange Money): a threaded server that never blocks
``stop()`` on a handler, the loopback check their callback rules use, and
the loopback-client check of the control endpoints."""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


class SandboxServer(ThreadingHTTPServer):
    """Daemon handler threads; close does not join them, so a handler sleeping
    for a scripted delay, or a client holding a keep-alive connection, cannot
    block ``stop()``. A client going away is logged at debug, anything else
    with its traceback."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
            log.debug("sandbox: client %s went away: %s", client_address, exc)
        else:
            log.exception("sandbox: unexpected error serving %s", client_address)


class SandboxHandler(BaseHTTPRequestHandler):
    """The request handler both sandbox rails build on: HTTP/1.1 keep-alive
    (idle connections dropped after ``timeout`` seconds), no Nagle delay
    (headers and body go out as separate writes), access lines at debug on
    ``http_log`` as ``"<log_label> http: ..."``, GET and POST handed to
    ``_dispatch(method)`` (the subclass's), and ``write_answer`` for the
    response."""

    protocol_version = "HTTP/1.1"
    sys_version = ""
    timeout = 30  # idle keep-alive connections are dropped after this
    disable_nagle_algorithm = True  # headers and body go out as separate writes
    http_log = log
    log_label = "sandbox"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        self.http_log.debug("%s http: %s - %s", self.log_label, self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        raise NotImplementedError

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
