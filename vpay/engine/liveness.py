"""The wake-up listener's liveness (issue 25, "The listener is checked with a
bound"): how a ``LISTEN`` connection that died without a word is found and
replaced within a named bound.

A connection cut by a NAT or a firewall, or by anything that keeps the socket
open and forwards nothing, sends no FIN and no RST: the listener's socket
stays open and quiet, and a quiet listener looks exactly like a quiet queue.
Without a check, claim latency falls to the idle sleep for ever and nothing
says so. Three layers, all derived from one bound, ``dead_after``
(``VPAY_LISTENER_DEAD_AFTER_SECONDS``, default ``DEAD_AFTER_SECONDS``):

* **A ping with its own deadline.** After ``ping_every`` seconds with
  nothing heard, the listener sends ``SELECT 1`` and waits for the answer on
  the connection's socket with a deadline (``ping``: libpq's asynchronous
  calls and a ``selectors`` wait; a plain ``execute`` would block until the
  kernel gives up, many minutes later, and ``statement_timeout`` is the
  server's, which never sees the query). No answer within ``ping_timeout``:
  the connection is closed and ``ListenerUnresponsive`` raised. This is
  the layer that catches a peer whose kernel still acknowledges (a relay, a
  proxy, a bouncer that stopped forwarding).
* **TCP keepalives and ``tcp_user_timeout``** (libpq parameters, for TCP
  connections; a Unix socket has no network to lose): idle probes keep a
  NAT's or a firewall's mapping alive in the first place, and the kernel
  errors out a connection whose probes or data go unacknowledged: about
  ``dead_after / 2``. They bound what the ping cannot, the listener's own
  claim on its connection (``Waker.claim_for``). Settings the database URL
  already gives win.
* **A bounded reconnection**: ``connect_timeout``.

The bound: silence starts at t; the ping starts by t + ``ping_every``, gives
up by t + ``ping_every`` + ``ping_timeout`` (= ``dead_after / 2``), the
listener waits its first back-off (0.5 s) and connects within
``connect_timeout`` (at most ``dead_after / 4`` + 1 s): listening again by
t + ``dead_after`` whenever the database takes a new connection (hence the
minimum of 6 s: libpq's shortest connect timeout is 2 s).
"""

from __future__ import annotations

import math
import os
import selectors
import time
from dataclasses import dataclass
from typing import Mapping

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from vpay.base.settings import ConfigError, env_seconds

DEAD_AFTER_SECONDS = 30.0
"""Default of ``VPAY_LISTENER_DEAD_AFTER_SECONDS``: a wake-up listener whose
connection stops answering is replaced within this many seconds (when the
database takes a new connection). The idle sleep covers the wake-ups missed
meanwhile."""
MIN_DEAD_AFTER_SECONDS = 6.0
"""The shortest bound accepted: a ping every 1.5 s and libpq's 2 s connect
timeout still fit in it."""
MAX_DEAD_AFTER_SECONDS = 300.0
"""The longest bound accepted (issue 25 asks for 30 s at most by default)."""

KEEPALIVES_COUNT = 3
"""Unanswered TCP keepalive probes before the kernel drops the connection."""


class ListenerUnresponsive(psycopg.OperationalError):
    """The listener's connection did not answer a ping within its deadline
    (it has been closed): replace it."""


@dataclass(frozen=True)
class Liveness:
    """The listener's checks, all derived from ``dead_after`` (seconds):
    ``ping_every`` and ``ping_timeout`` (seconds), ``connect_timeout`` (whole
    seconds, libpq's), and the TCP keepalive parameters (``params``)."""

    dead_after: float = DEAD_AFTER_SECONDS

    @property
    def ping_every(self) -> float:
        """Seconds with nothing heard before the listener pings."""
        return self.dead_after / 4

    @property
    def ping_timeout(self) -> float:
        """Seconds a ping may take before the connection is declared dead."""
        return self.dead_after / 4

    @property
    def connect_timeout(self) -> int:
        """libpq ``connect_timeout`` of the listener's connections (whole
        seconds; libpq takes 1 as 2)."""
        return max(2, math.ceil(self.dead_after / 4))

    def params(self, url: str) -> dict[str, int]:
        """Connection parameters for the listener's connections to ``url``:
        TCP keepalives (idle ``dead_after / 4``, interval ``dead_after /
        12``, ``KEEPALIVES_COUNT`` probes), ``tcp_user_timeout`` (sent data
        unacknowledged for ``dead_after / 2`` drops the connection; ms) and
        ``connect_timeout``. What ``url`` sets itself is kept, except a
        ``connect_timeout`` longer than ours (the bound needs ours)."""
        given = conninfo_to_dict(url)
        ours = {"keepalives": 1,
                "keepalives_idle": max(1, int(self.dead_after / 4)),
                "keepalives_interval": max(1, int(self.dead_after / 12)),
                "keepalives_count": KEEPALIVES_COUNT,
                "tcp_user_timeout": int(self.dead_after * 1000 / 2)}
        params = {k: v for k, v in ours.items() if k not in given}
        try:
            theirs = int(given.get("connect_timeout") or 0)
        except ValueError:
            theirs = 0
        params["connect_timeout"] = min(theirs, self.connect_timeout) if theirs > 0 else self.connect_timeout
        return params


def dead_after_from_env(environ: Mapping[str, str] | None = None) -> float:
    """``VPAY_LISTENER_DEAD_AFTER_SECONDS`` (default ``DEAD_AFTER_SECONDS``).
    Raises ``ConfigError`` (exit 78) unless it is a number of seconds from
    ``MIN_DEAD_AFTER_SECONDS`` to ``MAX_DEAD_AFTER_SECONDS``."""
    env = os.environ if environ is None else environ
    name = "VPAY_LISTENER_DEAD_AFTER_SECONDS"
    try:
        value = env_seconds(name, DEAD_AFTER_SECONDS, maximum=MAX_DEAD_AFTER_SECONDS, env=env)
    except ConfigError:
        value = math.nan  # one message for every refusal: the real range, not env_seconds' "above 0"
    if not MIN_DEAD_AFTER_SECONDS <= value <= MAX_DEAD_AFTER_SECONDS:
        raise ConfigError(f"{name} must be a number of seconds from {MIN_DEAD_AFTER_SECONDS:g} to "
                          f"{MAX_DEAD_AFTER_SECONDS:g}, got {env.get(name, '').strip()!r}")
    return value


def ping(conn: psycopg.Connection, timeout: float) -> list[str]:
    """One round trip (``SELECT 1``) on ``conn`` (idle, autocommit, used by
    this thread alone) within ``timeout`` seconds. Answers the payloads of
    the notifications that arrived with the answer, for the caller to hand
    on (libpq queued them; nothing else would read them until more data
    came). Raises ``ListenerUnresponsive`` past the deadline, after closing
    ``conn``; ``psycopg.OperationalError`` when the connection fails or the
    server answers an error."""
    pg = conn.pgconn
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        pg.send_query(b"SELECT 1")  # queued: the connection is non-blocking
        while pg.flush():  # 1: more to send
            _wait(conn, sel, selectors.EVENT_WRITE, deadline, timeout)
        error = None
        while True:
            if pg.is_busy():
                _wait(conn, sel, selectors.EVENT_READ, deadline, timeout)
                pg.consume_input()
                continue
            result = pg.get_result()
            if result is None:
                break
            if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
                error = (result.error_message or b"").decode(errors="replace").strip()
    if error is not None:
        raise psycopg.OperationalError(f"listener ping failed: {error}")
    payloads = []
    while (note := pg.notifies()) is not None:
        payloads.append(note.extra.decode(conn.info.encoding, errors="replace"))
    return payloads


def _wait(conn: psycopg.Connection, sel: selectors.BaseSelector, event: int, deadline: float,
          timeout: float) -> None:
    """Wait until ``conn``'s socket is ready for ``event``, or close ``conn``
    and raise ``ListenerUnresponsive`` at ``deadline``."""
    remaining = deadline - time.monotonic()
    ready = False
    if remaining > 0:
        sel.register(conn.pgconn.socket, event)
        try:
            ready = bool(sel.select(remaining))
        finally:
            sel.unregister(conn.pgconn.socket)
    if not ready:
        conn.close()
        raise ListenerUnresponsive(f"no answer to the listener's ping within {timeout:g} s")
