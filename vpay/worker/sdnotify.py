"""A tiny sd_notify(3) client: the service-manager side of ``Type=notify``.

systemd hands a ``Type=notify`` service the address of a datagram socket in
``$NOTIFY_SOCKET``; the service reports its state by sending newline-separated
``KEY=VALUE`` assignments to it (sd_notify(3), "Description" and "Well-known
assignments"):

* ``READY=1``: start-up finished. A ``Type=notify`` unit whose main process
  exits before sending it has failed to start.
* ``STATUS=...``: one line shown by ``systemctl status``.
* ``STOPPING=1``: shutdown (our drain) has begun.
* ``WATCHDOG=1``: keep-alive; required at least every ``$WATCHDOG_USEC`` when
  the unit sets ``WatchdogSec=`` (sd_watchdog_enabled(3) recommends every half).
* ``EXTEND_TIMEOUT_USEC=...``: ask for this many more microseconds before the
  current start/stop timeout fires.

The protocol is one ``AF_UNIX``/``SOCK_DGRAM`` datagram per notification, and
an address starting with ``@`` names a socket in Linux's abstract namespace
(the ``@`` stands for a leading NUL byte). It is a few lines of standard
library code, so this module implements it rather than adding a dependency.

Outside systemd (``NOTIFY_SOCKET`` unset) every method is a no-op that opens
no socket, so callers notify unconditionally. Sending never raises: a
service manager that went away must not take the worker down with it.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
from typing import Mapping

__all__ = ["Notifier", "watchdog_interval"]

log = logging.getLogger(__name__)

# A send blocks only when systemd's receive queue is full. Bound that wait so a
# wedged manager cannot stall the claim loop; a lost WATCHDOG=1 is re-sent at
# the next interval anyway.
_SEND_TIMEOUT_SECONDS = 1.0


def _parse_address(raw: str | None) -> str | None:
    """Turn ``$NOTIFY_SOCKET`` into a ``socket.sendto`` address, or ``None``.

    sd_notify(3) accepts an absolute path or ``@name`` (abstract namespace).
    Other forms (``vsock:`` addresses from systemd >= 253, relative paths) are
    not supported here and disable notification rather than fail.
    """
    if not raw:
        return None
    if raw.startswith("/"):
        return raw
    if raw.startswith("@") and len(raw) > 1:
        return "\0" + raw[1:]
    log.warning("NOTIFY_SOCKET=%r is not a path or @abstract name; sd_notify disabled", raw)
    return None


def _format_value(value: object) -> str:
    if value is True:
        return "1"
    if value is False:
        return "0"
    # A newline would end the assignment early and smuggle in another one.
    return str(value).replace("\r", " ").replace("\n", " ")


class Notifier:
    """Sends sd_notify(3) state changes to the service manager.

    Build one with :meth:`from_env`. Thread-safe: a lock serialises sends, so
    the claim loop and a watchdog thread may share one instance. Each send
    opens a fresh socket, as libsystemd's ``sd_notify()`` does, so nothing
    stale survives a manager re-exec.
    """

    def __init__(self, address: str | None) -> None:
        """``address`` is a ready-made ``sendto`` address (a path, or
        ``"\\0name"`` for the abstract namespace); ``None`` disables."""
        self._address = address
        self._lock = threading.Lock()
        self._failing = False  # a send failed and was logged; reset on success

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Notifier":
        """A notifier for ``$NOTIFY_SOCKET`` (sd_notify(3)); disabled when the
        variable is unset or empty."""
        return cls(_parse_address(environ.get("NOTIFY_SOCKET")))

    @property
    def enabled(self) -> bool:
        """True when there is a socket to notify (we run under ``Type=notify``)."""
        return self._address is not None

    @property
    def address(self) -> str | None:
        """The ``sendto`` address, with an abstract name's ``@`` as ``\\0``."""
        return self._address

    def __repr__(self) -> str:
        return f"Notifier(address={self._address!r})"

    # -- sending ---------------------------------------------------------

    def send_raw(self, text: str) -> bool:
        """Send ``text`` as one datagram, unchanged. Returns whether it was
        sent; ``False`` when disabled or when sending failed (logged at debug
        once per run of failures, never raised)."""
        if self._address is None:
            return False
        data = text.encode("utf-8")
        with self._lock:
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                try:
                    sock.settimeout(_SEND_TIMEOUT_SECONDS)
                    sock.sendto(data, self._address)
                finally:
                    sock.close()
            except Exception:  # noqa: BLE001 - the caller must never see this
                if not self._failing:
                    self._failing = True
                    log.debug(
                        "sd_notify to %r failed; further failures are not logged until one succeeds",
                        self._address,
                        exc_info=True,
                    )
                return False
            self._failing = False
            return True

    def send(self, **fields: object) -> bool:
        """Send ``KEY=VALUE`` assignments in one datagram, in the order given:
        ``send(READY=1, STATUS="up")`` sends ``"READY=1\\nSTATUS=up"``.
        ``True``/``False`` become ``1``/``0``; newlines in values become spaces.
        Keys are sent as written (sd_notify(3) names them in upper case)."""
        if not fields or self._address is None:
            return False
        return self.send_raw("\n".join(f"{key}={_format_value(value)}" for key, value in fields.items()))

    # -- well-known assignments (sd_notify(3)) -----------------------------

    def ready(self, status: str | None = None) -> bool:
        """``READY=1`` (and ``STATUS=`` when given): start-up is complete."""
        if status is None:
            return self.send(READY=1)
        return self.send(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        """``STATUS=text``: the one-line state ``systemctl status`` shows."""
        return self.send(STATUS=text)

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1`` (and ``STATUS=`` when given): the drain has begun."""
        if status is None:
            return self.send(STOPPING=1)
        return self.send(STOPPING=1, STATUS=status)

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: the keep-alive ``WatchdogSec=`` expects."""
        return self.send(WATCHDOG=1)

    def extend_timeout(self, seconds: float) -> bool:
        """``EXTEND_TIMEOUT_USEC=``: ask for ``seconds`` more before the current
        start or stop timeout fires (sd_notify(3); systemd >= 236). Negative or
        non-finite values are sent as 0, which grants nothing."""
        usec = round(seconds * 1_000_000) if math.isfinite(seconds) and seconds > 0 else 0
        return self.send(EXTEND_TIMEOUT_USEC=usec)


def watchdog_interval(environ: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings, or ``None`` when no watchdog
    applies to this process.

    Mirrors sd_watchdog_enabled(3): the watchdog is ours when ``$WATCHDOG_USEC``
    is set and ``$WATCHDOG_PID`` is unset or equals our pid. The interval is
    half the timeout, as that page recommends. Unparsable or non-positive
    values count as "no watchdog".
    """
    raw_usec = environ.get("WATCHDOG_USEC")
    if not raw_usec:
        return None
    try:
        usec = int(raw_usec)
    except ValueError:
        return None
    if usec <= 0:
        return None
    raw_pid = environ.get("WATCHDOG_PID")
    if raw_pid:
        try:
            if int(raw_pid) != os.getpid():
                return None
        except ValueError:
            return None
    return usec / 2 / 1_000_000
