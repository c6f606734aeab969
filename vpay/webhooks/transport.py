"""One HTTP delivery attempt: pinned to a checked address, bounded in time and size.

* **Timeouts**: connect 5 s, read 15 s (per socket read, as urllib3
  means it), configurable by ``VPAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS`` and
  ``VPAY_WEBHOOK_READ_TIMEOUT_SECONDS``; and a whole-attempt deadline of
  connect + 2 x read enforced by ``vpay.base.http_deadline.Deadline`` (a watchdog
  that shuts the socket; the rail adapters use the same one), so a receiver
  dribbling bytes cannot hold a claim loop longer. The response
  body is read at most ``MAX_RESPONSE_BYTES`` (64 KiB).
* Redirects are never followed; environment proxies and ``.netrc`` are
  ignored (they would bypass the URL policy).
* An attempt goes through a urllib3 connection pool to the checked
  address, on the deadline-aware pool classes
  (``vpay.base.http_deadline.WATCHED_POOLS``): no ``requests`` session per
  attempt. ``requests`` added nothing an attempt uses (no cookies, no
  redirects, no proxies, no auth) and cost about half of an attempt's CPU
  (issue 30).
* **Keep-alive** (issue 30): the pool of a checked address (with the name
  TLS verifies, the trust store and the timeouts) is kept after an attempt
  whose answer was read whole, so the next delivery to that receiver reuses
  its connection: no TCP and TLS handshake per delivery. Bounded: at most
  ``KEPT_POOLS`` pools (the least recently used closed first), each of at
  most ``KEPT_CONNECTIONS`` idle connections, and a pool unused for
  ``KEPT_IDLE_SECONDS`` is closed rather than reused (below the usual
  servers' keep-alive timeouts, so a connection the receiver is closing is
  rarely taken). The URL policy still runs on every attempt, DNS included:
  only a connection to an address checked again is reused. An answer not
  read whole (over ``MAX_RESPONSE_BYTES``, cut by the deadline, any error)
  closes its connection, and so does an interim (1xx) answer taken for the
  final one: http.client skips only ``100 Continue``, so after a ``103
  Early Hints`` the receiver's real answer is still on its way, and the
  next delivery on that connection would read it as its own. A sweeper
  thread (one per process, while pools are kept) closes idle pools within
  ``KEPT_IDLE_SECONDS`` of their last use, deliveries or not.
* **A kept connection the receiver has closed** (its idle timeout, a
  restart) fails as the request is sent, before any answer: the attempt is
  made once more at once, within the same deadline, on a new connection
  (the pool is replaced, its other idle connections are likely closed too).
  Only for a connection reused from the pool, with no byte of an answer
  received (a ``100 Continue`` counts), and only once per attempt, whichever
  address: the rule
  browsers follow for a kept connection that ends with no answer (delivery
  is at least once, under one ``webhook-id``, either way). A new connection
  that ends so is a failed attempt (fresh-clone review of issue 30: 67 of
  300 deliveries to a receiver that closes without saying so spent an
  attempt and waited 5 s).
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Mapping

import urllib3
from requests.certs import where as default_ca_bundle
from urllib3.exceptions import (ClosedPoolError, ConnectTimeoutError, HTTPError, NewConnectionError,
                                ProtocolError, ReadTimeoutError, SSLError)

from vpay.base.settings import env_seconds
from vpay.base.http_deadline import (WatchedHTTPConnection, WatchedHTTPPool, WatchedHTTPSConnection,
                                     WatchedHTTPSPool, Deadline, parse_retry_after)
from vpay.webhooks.policy import UrlRefused, check_url

__all__ = ["Attempt", "CONNECT_TIMEOUT_ENV", "MAX_RESPONSE_BYTES", "READ_TIMEOUT_ENV", "attempt_deadline",
           "parse_retry_after", "post", "timeouts"]


CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 15.0
MAX_RESPONSE_BYTES = 64 * 1024
KEPT_POOLS = 64
"""Receivers' addresses whose connections are kept between attempts (the
least recently used pool is closed past it)."""
KEPT_CONNECTIONS = 8
"""Idle connections kept per address: above the claim loops of a worker
(``--worker-concurrency`` is at most 5), so a connection is never dropped for
want of room."""
KEPT_IDLE_SECONDS = 4.0
"""A kept pool unused this long is closed, not reused: below the keep-alive
timeouts of common servers (nginx 75 s, Apache httpd and Node.js 5 s), so
that an attempt rarely sends on a connection the receiver is closing."""
CONNECT_TIMEOUT_ENV = "VPAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS"
READ_TIMEOUT_ENV = "VPAY_WEBHOOK_READ_TIMEOUT_SECONDS"


def timeouts(environ: Mapping[str, str] | None = None) -> tuple[float, float]:
    """``(connect, read)`` seconds from ``VPAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS``
    (default 5) and ``VPAY_WEBHOOK_READ_TIMEOUT_SECONDS`` (default 15).
    Raises ``ConfigError`` for a value that is not a positive number."""
    def one(name: str, default: float) -> float:
        return env_seconds(name, default, maximum=600.0, env=environ)

    return one(CONNECT_TIMEOUT_ENV, CONNECT_TIMEOUT_SECONDS), one(READ_TIMEOUT_ENV, READ_TIMEOUT_SECONDS)


def attempt_deadline(connect: float, read: float) -> float:
    """Seconds one attempt may take in all: connect + 2 x read. urllib3's
    read timeout bounds each socket read, not the response; this bounds the
    whole attempt so a slow-dripping receiver cannot hold a claim loop."""
    return connect + 2 * read





@dataclass(frozen=True)
class Attempt:
    """What one POST did. ``status_code`` is None when no response came
    (``error`` says why: refused by the policy, connect/read timeout,
    connection error, TLS). ``retry_after`` is the receiver's Retry-After in
    seconds (any status; ``decide`` honours it on 429/503 only).
    ``permanent`` marks a policy refusal no retry can cure. ``elapsed`` is
    seconds; ``body_excerpt`` at most 300 characters of the response."""

    status_code: int | None
    error: str | None = None
    retry_after: float | None = None
    permanent: bool = False
    elapsed: float = 0.0
    body_excerpt: str = ""
    address: str | None = None

    @property
    def summary(self) -> str:
        if self.status_code is not None:
            text = f"HTTP {self.status_code}"
            if self.retry_after is not None:
                text += f", Retry-After {self.retry_after:g} s"
            return text
        return self.error or "no response"


_ssl_contexts: dict[str, ssl.SSLContext] = {}
_ssl_lock = threading.Lock()


def _ssl_context(verify: bool | str) -> ssl.SSLContext:
    # Our own context, one per trust store, kept: urllib3 matches the
    # certificate's name itself (assert_hostname), which pinning needs, so
    # the context's own check is off.
    # Trust: requests' bundle (certifi) by default, as every rail call's;
    # a CA file when ``verify`` names one (tests).
    key = verify if isinstance(verify, str) else default_ca_bundle()
    with _ssl_lock:
        ctx = _ssl_contexts.get(key)
        if ctx is None:
            ctx = ssl.create_default_context(cafile=key)
            ctx.check_hostname = False  # urllib3 matches assert_hostname itself
            _ssl_contexts[key] = ctx
        return ctx


_took = threading.local()
"""This thread's attempt: ``kept``, whether the connection it took from its
pool was an open one kept from an earlier attempt (not a new one, nor one
urllib3 found dropped and reopens); ``answered``, whether any byte of an
answer came on it."""


class AnswerCutShort(http.client.HTTPException):
    """The receiver ended the connection inside its answer's headers."""


class _LinesWatched:
    # The response's file while its headers are read: keeps the last line.
    __slots__ = ("_fp", "last")

    def __init__(self, fp):
        self._fp, self.last = fp, b"\r\n"

    def readline(self, *args):
        self.last = self._fp.readline(*args)
        return self.last

    def __getattr__(self, name):
        return getattr(self._fp, name)


class _Answer(http.client.HTTPResponse):
    """http.client's response, noting whether the receiver sent a byte
    before the status line is parsed (a ``100 Continue`` skipped, or a
    status line followed by a reset, is an answer begun: never sent again),
    and refusing headers the receiver cut short: http.client takes the end
    of the connection for the end of the headers and hands back the status
    (``AnswerCutShort``, a connection error: not a delivery, as when the
    deadline cuts them)."""

    def begin(self):
        if self.fp.peek(1):  # blocks as the status line's read would; b"": closed
            _took.answered = True
        real = self.fp
        watched = self.fp = _LinesWatched(real)
        try:
            super().begin()
        finally:
            if self.fp is watched:
                self.fp = real
        if not watched.last.endswith(b"\n"):  # not the blank line that ends the headers
            raise AnswerCutShort("the receiver closed the connection inside its answer's headers")


class _KeptHTTPConnection(WatchedHTTPConnection):
    response_class = _Answer


class _KeptHTTPSConnection(WatchedHTTPSConnection):
    response_class = _Answer


class _NotesKept:
    """Pool mixin: notes in ``_took.kept`` whether the connection handed out
    is an open one kept from an earlier attempt."""

    def _get_conn(self, timeout=None):
        conn = super()._get_conn(timeout)
        sock = getattr(conn, "sock", None)
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            # Bytes after the last answer, already decrypted inside TLS:
            # urllib3's dropped-connection check reads the socket, not the
            # TLS layer, and the next attempt would read them as its answer.
            conn.close()
            sock = None
        _took.kept = sock is not None
        return conn


class _KeptHTTPPool(_NotesKept, WatchedHTTPPool):
    ConnectionCls = _KeptHTTPConnection


class _KeptHTTPSPool(_NotesKept, WatchedHTTPSPool):
    ConnectionCls = _KeptHTTPSConnection


def _pinned_pool(scheme: str, ip: str, port: int, host: str, connect_timeout: float,
                 read_timeout: float, verify: bool | str) -> urllib3.HTTPConnectionPool:
    """A pool of connections to ``ip`` (the address the policy checked)
    while TLS uses ``host`` for SNI and certificate verification; it never
    blocks for a connection (one more is made) and keeps at most
    ``KEPT_CONNECTIONS`` idle."""
    common = {"timeout": urllib3.Timeout(connect=connect_timeout, read=read_timeout),
              "maxsize": KEPT_CONNECTIONS, "block": False, "retries": False}
    if scheme != "https":
        return _KeptHTTPPool(ip, port, **common)
    if verify is False:
        tls = {"cert_reqs": "CERT_NONE", "assert_hostname": False, "server_hostname": host}
    else:
        tls = {"cert_reqs": "CERT_REQUIRED", "ssl_context": _ssl_context(verify),
               "server_hostname": host, "assert_hostname": host}
    return _KeptHTTPSPool(ip, port, **common, **tls)


class _KeptPools:
    """The pinned pools kept between attempts (see the module doc): at most
    ``KEPT_POOLS``, least recently used closed first; those unused for
    ``KEPT_IDLE_SECONDS`` (and not in use: a delivery slower than that keeps
    its pool) are closed by a sweeper thread (running while any pool is
    kept, looking every quarter of that bound), or replaced by the next
    ``take`` of its key. A pool
    replaced (``fresh``) or evicted while attempts use it is closed when the
    last of them ends, never under one.
    Thread-safe.
    ``clock``: monotonic seconds (tests)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        # key -> [pool, last used (monotonic s), attempts using it now]
        self._pools: OrderedDict[tuple, list] = OrderedDict()
        # pools replaced or evicted while attempts used them: id -> entry,
        # closed when the last of those attempts ends (at most one per attempt)
        self._retired: dict[int, list] = {}
        self._sweeping = False  # a sweeper thread runs

    def take(self, key: tuple, make, fresh: bool = False) -> urllib3.HTTPConnectionPool:
        """The kept pool for ``key``, counted in use until ``used`` (``make()``
        makes one when there is none, only a stale one, or ``fresh``: the kept
        one is closed, once no other attempt uses it)."""
        stale: list[urllib3.HTTPConnectionPool] = []
        with self._lock:
            now = self._clock()
            # Only this key's pool is looked at here (the sweeper closes the
            # others): one idle past the bound is replaced, not reused.
            kept = self._pools.pop(key, None)
            if kept is not None and (fresh or (not kept[2] and now - kept[1] >= KEPT_IDLE_SECONDS)):
                stale += self._retire(kept)
                kept = None
            if kept is None:
                kept = [make(), now, 0]
            kept[1], kept[2] = now, kept[2] + 1
            self._pools[key] = kept
            pool = kept[0]
            while len(self._pools) > KEPT_POOLS:
                stale += self._retire(self._pools.popitem(last=False)[1])
            if not self._sweeping:
                self._sweeping = True
                threading.Thread(target=self._sweep, name="webhook-pools-sweeper", daemon=True).start()
        for old in stale:
            old.close()
        return pool

    def _retire(self, entry: list) -> list[urllib3.HTTPConnectionPool]:
        # out of the kept pools (under the lock): closed now when unused
        # (answered for the caller to close), else by its last user's ``used``
        if entry[2] == 0:
            return [entry[0]]
        self._retired[id(entry[0])] = entry
        return []

    def _stale(self, now: float) -> list[urllib3.HTTPConnectionPool]:
        # What sat idle past the bound, none in use (under the lock): a
        # delivery slower than the bound keeps its pool for the next one.
        stale = [key for key, (_, last, using) in self._pools.items()
                 if not using and now - last >= KEPT_IDLE_SECONDS]
        return [self._pools.pop(key)[0] for key in stale]

    def _sweep(self) -> None:
        # Closes idle pools without waiting for the next delivery (the
        # receiver sees its connection closed within the bound); ends when
        # nothing is kept, and the next take starts another.
        while True:
            time.sleep(KEPT_IDLE_SECONDS / 4)
            with self._lock:
                stale = self._stale(self._clock())
                done = not self._pools
                if done:  # a take from now on starts another sweeper
                    self._sweeping = False
            for old in stale:
                old.close()
            if done:
                return

    def used(self, key: tuple, pool: urllib3.HTTPConnectionPool) -> None:
        """An attempt through ``key``'s ``pool`` (as ``take`` gave it) has just ended."""
        with self._lock:
            kept = self._pools.get(key)
            if kept is not None and kept[0] is pool:
                kept[1], kept[2] = self._clock(), max(kept[2] - 1, 0)
                self._pools.move_to_end(key)
                return
            retired = self._retired.get(id(pool))
            if retired is None or retired[0] is not pool:
                return
            retired[2] -= 1
            if retired[2] > 0:
                return
            del self._retired[id(pool)]
        pool.close()

    def __len__(self) -> int:
        return len(self._pools)

    def clear(self) -> None:
        """Close every kept pool (tests; a worker's exit closes the sockets anyway)."""
        with self._lock:
            pools = list(self._pools.values()) + list(self._retired.values())
            self._pools, self._retired = OrderedDict(), {}
        for pool, *_ in pools:
            pool.close()


KEPT = _KeptPools()
"""This process's kept pools (``_KeptPools``)."""


def post(url: str, body: bytes, headers: Mapping[str, str], *, connect_timeout: float,
         read_timeout: float, allow_private: bool, verify: bool | str = True) -> Attempt:
    """POST ``body`` to ``url`` once, under the URL policy; never raises for
    network trouble (the answer says what happened).

    The host is resolved and every address checked (``check_url``); the
    connection goes to a checked address (the next one is tried only when
    the connection could not be made). Redirects are not followed,
    environment proxies are not used, at most ``MAX_RESPONSE_BYTES`` of the
    response are read, and the whole attempt is cut at
    ``attempt_deadline(connect_timeout, read_timeout)`` seconds. ``verify``
    is True (requests' trust store, certifi) or a CA bundle path (tests).
    Sources: the issue (webhooks, points 1 and 3); Standard Webhooks, "SSRF".
    """
    started = time.monotonic()
    try:
        target = check_url(url, allow_private=allow_private)
    except UrlRefused as exc:
        return Attempt(None, error=f"refused: {exc}", permanent=exc.permanent,
                       elapsed=time.monotonic() - started)
    send_headers = {k.lower(): v for k, v in headers.items()}
    send_headers.update({"host": target.host_header, "accept-encoding": "identity"})
    last: Attempt | None = None
    deadline = attempt_deadline(connect_timeout, read_timeout)
    sent_again = False  # once per attempt, whichever address
    for ip in target.addresses[:2]:
        remaining = deadline - (time.monotonic() - started)
        if remaining <= 0:
            break
        key = (target.scheme, ip, target.port, target.host, connect_timeout, read_timeout,
               verify if isinstance(verify, (bool, str)) else True)
        make = partial(_pinned_pool, target.scheme, ip, target.port, target.host,
                       connect_timeout, read_timeout, verify)
        pool = KEPT.take(key, make)
        try:
            last = _post_once(pool, target.request_path, body, send_headers, connect_timeout,
                              read_timeout, remaining, started, ip, again=not sent_again)
            if last is _SEND_AGAIN:
                sent_again = True
                KEPT.used(key, pool)
                # a kept connection the receiver had closed: once more, on a new one
                remaining = deadline - (time.monotonic() - started)
                pool = KEPT.take(key, make, fresh=True)
                last = (_post_once(pool, target.request_path, body, send_headers, connect_timeout,
                                   read_timeout, remaining, started, ip, again=False)
                        if remaining > 0 else
                        Attempt(None, error=f"timeout: attempt deadline of {deadline:g} s",
                                elapsed=time.monotonic() - started, address=ip))
        finally:
            KEPT.used(key, pool)
        if not last.error or not last.error.startswith(_NOT_MADE):
            return last  # the next address only when no connection was made: nothing was sent
    return last or Attempt(None, error="timeout: attempt deadline", elapsed=time.monotonic() - started)


_NOT_MADE = ("connect error", "connect timeout")
"""How the errors of an attempt that made no connection begin (``_post_once``)."""

_SEND_AGAIN = Attempt(None, error="a kept connection closed by the receiver")
"""``_post_once``'s answer when the request failed on a connection reused
from the pool before any answer came: ``post`` sends it once more."""


def _post_once(pool: urllib3.HTTPConnectionPool, path: str, body: bytes, headers: dict[str, str],
               connect_timeout: float, read_timeout: float, deadline: float, started: float,
               ip: str, again: bool = True) -> Attempt:
    watch = Deadline(deadline)
    with watch:
        _took.kept = _took.answered = False
        try:
            resp = pool.urlopen("POST", path, body=body, headers=headers, redirect=False,
                                retries=False, preload_content=False, assert_same_host=False,
                                release_conn=False)
        except ClosedPoolError:
            # closed by another thread's take (past KEPT_POOLS) before this one used it
            if again:
                return _SEND_AGAIN
            return Attempt(None, error="connection error: pool closed",
                           elapsed=time.monotonic() - started, address=ip)
        except NewConnectionError as exc:  # a subclass of ConnectTimeoutError: first
            # "<connection repr>: Failed to establish …: [Errno 111] …" → the cause
            return Attempt(None, error=f"connect error: {_short(exc).split(': ')[-1]}",
                           elapsed=time.monotonic() - started, address=ip)
        except ConnectTimeoutError:
            return Attempt(None, error=f"connect timeout after {connect_timeout:g} s",
                           elapsed=time.monotonic() - started, address=ip)
        except ReadTimeoutError:
            return Attempt(None, error=f"timeout: no response within {read_timeout:g} s",
                           elapsed=time.monotonic() - started, address=ip)
        except SSLError as exc:
            if again and _took.kept and not _took.answered and _tls_closed(exc):
                return _SEND_AGAIN  # a kept TLS connection closed under the request
            return Attempt(None, error=f"tls error: {_short(exc)}",
                           elapsed=time.monotonic() - started, address=ip)
        except (HTTPError, OSError) as exc:
            if watch.expired:
                return Attempt(None, error=f"timeout: attempt deadline of {deadline:g} s",
                               elapsed=time.monotonic() - started, address=ip)
            if again and isinstance(exc, ProtocolError) and _took.kept and not _took.answered \
                    and _closed_before_answering(exc):
                return _SEND_AGAIN
            if isinstance(exc, ProtocolError) and isinstance(_cause(exc), TimeoutError):
                # the request's write stalled (urllib3 says "Connection aborted")
                return Attempt(None, error=f"timeout: sending took over {read_timeout:g} s",
                               elapsed=time.monotonic() - started, address=ip)
            return Attempt(None, error=f"connection error: {_short(exc)}",
                           elapsed=time.monotonic() - started, address=ip)
        whole = False
        try:
            if watch.expired:
                # The deadline shut the socket while the headers were
                # still arriving: http.client reads that EOF as the end
                # of the headers and hands back the status line's code.
                # The receiver never finished answering: not a delivery.
                return Attempt(None, error=f"timeout: attempt deadline of {deadline:g} s",
                               elapsed=time.monotonic() - started, address=ip)
            if resp.status < 200:
                # An interim answer taken for the final one: the real answer
                # follows on this connection. Not read (urllib3 hands a
                # connection back to the pool when a body is read to its
                # end, and a 1xx has none), so the finally closes it.
                excerpt = ""
            else:
                excerpt, whole = _read_excerpt(resp)
                whole = whole and not watch.expired
            return Attempt(resp.status,
                           retry_after=parse_retry_after(resp.headers.get("retry-after"),
                                                         resp.headers.get("date")),
                           elapsed=time.monotonic() - started, body_excerpt=excerpt, address=ip)
        finally:
            if whole:
                resp.release_conn()  # read to its end: the connection goes back for the next attempt
            else:
                resp.close()  # a part left unread, or a socket the deadline shut: never reused


def _cause(exc: ProtocolError) -> BaseException | None:
    # urllib3 wraps the cause: ('Connection aborted.', RemoteDisconnected(...))
    return exc.args[1] if len(exc.args) > 1 else exc.__context__


def _tls_closed(exc: SSLError) -> bool:
    # urllib3's SSLError(ssl.SSLEOFError(...)): the peer ended the session
    # (or reset it) under the request, not a failed handshake or check
    seen, todo = set(), [exc]
    while todo:
        one = todo.pop()
        if one is None or id(one) in seen:
            continue
        seen.add(id(one))
        if isinstance(one, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError,
                            BrokenPipeError)):
            return True
        todo += [a for a in getattr(one, "args", ()) if isinstance(a, BaseException)]
        todo += [one.__cause__, one.__context__]
    return False


def _closed_before_answering(exc: ProtocolError) -> bool:
    # a connection the receiver had closed ends in EOF or, written to, a reset
    return isinstance(_cause(exc), (http.client.RemoteDisconnected, ConnectionResetError,
                                    BrokenPipeError, ConnectionAbortedError))


def _read_excerpt(resp: urllib3.BaseHTTPResponse) -> tuple[str, bool]:
    """Read at most MAX_RESPONSE_BYTES of the body (undecoded); the status
    is already known, so a body that fails to arrive changes nothing.
    Answers its first 300 characters, printable, and whether the body was
    read to its end (then the connection may be used again)."""
    got = bytearray()
    whole = False
    try:
        while len(got) <= MAX_RESPONSE_BYTES:
            chunk = resp.read(min(16384, MAX_RESPONSE_BYTES + 1 - len(got)), decode_content=False)
            if not chunk:
                whole = True
                break
            got += chunk
    except Exception:  # noqa: BLE001 - the body is informational only
        pass
    text = bytes(got[:300]).decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else " " for c in text), whole


def _short(exc: BaseException) -> str:
    return str(exc).replace("\n", " ")[:300]
