"""HTTP plumbing shared by the sandbox rails (``mtn.py`` for MoMo,
``orange.py`` for Orange Money): a threaded server that never blocks
``stop()`` on a handler, and the loopback check their callback rules use."""

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
