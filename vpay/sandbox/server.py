"""HTTP plumbing shared by the sandbox rails (``mtn.py`` for MoMo,
``orange.py`` for Orange Money): a threaded server that never blocks
``stop()`` on a handler, the loopback check their callback rules use, and
the loopback-client check of the control endpoints."""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from http.server import ThreadingHTTPServer
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
