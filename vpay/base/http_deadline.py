"""One total deadline for an outbound HTTP call, however the peer trickles.

``requests``' timeouts are per socket operation: a connect timeout, and a read
timeout that restarts with every byte. A peer that sends its headers at once
and then one byte of body a second never trips either, and holds the caller
for as long as it likes (the issue "Isolation", input 2: one MoMo status read
took 110 s with (3.05, 10) s timeouts). ``Deadline`` bounds the whole call:

* ``with Deadline(seconds) as deadline:`` puts the deadline on the process's
  one watchdog thread (``_Watchdog``: a heap of the deadlines in force; a
  thread per call cost a thread's start and end on every rail read and
  webhook attempt, issue 30). Every
  socket a ``requests`` session opens (or takes from its pool) inside the
  block, in this thread, is registered with it, provided the session's
  adapter uses ``WatchedHTTPPool`` / ``WatchedHTTPSPool`` (``DeadlineAdapter``
  does; ``new_session()`` mounts it).
* When the deadline passes, the watchdog shuts those sockets down
  (``shutdown(SHUT_RDWR)`` on a duplicate of the descriptor, so it works for a
  TLS socket and during the TLS handshake too). The blocked read wakes with
  EOF and the call ends as a connection error; ``deadline.expired`` tells the
  caller that this was the deadline, not the peer.
* ``deadline.remaining()`` is what is left, for the caller's own waits (a
  lock, a retry's sleep), so that those count against the same bound.

Used by the webhook transport (``vpay.webhooks.transport``: one attempt) and
by the rail adapters (``vpay.rails.mtn``, ``vpay.rails.orange``: one call,
token fetch and transport retries included).

``parse_retry_after`` reads a ``Retry-After`` header (RFC 9110, 10.2.3) for
both: a merchant's receiver and a rail asking for less traffic.
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

_current = threading.local()


class _Watchdog:
    """The one thread of a process that expires every ``Deadline`` in force,
    each when its time comes: a heap ordered by time, a condition the
    thread waits on. A deadline left (``__exit__``) before its time stays in
    the heap, marked done, and is dropped when the thread next looks; the
    heap is rebuilt without such entries once they are over half of it, so
    it holds at most about twice the deadlines in force. The thread looks at
    least every ``TICK_SECONDS`` while deadlines are in force, and is woken
    early only for one due sooner than its next look (or the first after an
    idle spell): a busy process pays about one wake-up a second, not one per
    call. It starts with the first deadline (and again in a forked child,
    which has none)."""

    TICK_SECONDS = 1.0

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._done = 0  # entries in the heap whose deadline was left
        self._next_look = float("inf")  # when the thread wakes next on its own
        self._thread: threading.Thread | None = None

    def watch(self, deadline: "Deadline", at: float) -> None:
        """Expire ``deadline`` at ``at`` (monotonic seconds) unless it is
        left before."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-deadline", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (at, next(self._seq), deadline))
            if at < self._next_look:
                self._cond.notify()  # due before the thread would look again

    def left(self) -> None:
        """A deadline in the heap was left before its time."""
        with self._cond:
            self._done += 1
            if self._done * 2 > len(self._heap) >= 64:
                self._heap = [e for e in self._heap if not e[2].done]
                heapq.heapify(self._heap)
                self._done = 0

    def _next_due(self) -> "Deadline":
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                    self._done = max(0, self._done - 1)
                now = time.monotonic()
                if not self._heap:
                    self._next_look = float("inf")
                    self._cond.wait()
                    continue
                if self._heap[0][0] <= now:
                    return heapq.heappop(self._heap)[2]
                self._next_look = min(self._heap[0][0], now + self.TICK_SECONDS)
                self._cond.wait(self._next_look - now)

    def _run(self) -> None:
        while True:
            self._next_due()._expire()  # outside the lock: it shuts sockets


_watchdog = _Watchdog()


def _after_fork_in_child() -> None:
    global _watchdog
    _watchdog = _Watchdog()  # the parent's thread and deadlines are not the child's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Deadline:
    """A total time bound, in seconds, for the HTTP work done inside
    ``with Deadline(seconds):`` in the calling thread. Re-entrant per thread:
    an inner ``Deadline`` is in force inside its block, the outer one again
    after it. ``seconds`` must be positive and finite (callers validate
    settings; ``ValueError`` otherwise). Expired by the process's one
    watchdog thread (``_Watchdog``)."""

    def __init__(self, seconds: float):
        if not (0 < seconds < float("inf")):
            raise ValueError(f"a deadline needs a positive finite number of seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self.expired = False
        self.done = False
        """Left (``__exit__``): the watchdog skips it."""
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._started = time.monotonic()
        self._outer: Deadline | None = None

    def __enter__(self) -> "Deadline":
        self._outer = getattr(_current, "deadline", None)
        _current.deadline = self
        self._started = time.monotonic()
        _watchdog.watch(self, self._started + self.seconds)
        return self

    def __exit__(self, *exc) -> None:
        _current.deadline = self._outer
        with self._lock:
            self.done = True
            socks, self._socks = self._socks, []
        if not self.expired:
            _watchdog.left()
        for sock in socks:
            try:
                sock.close()  # our duplicate descriptor only; the connection's own is untouched
            except OSError:
                pass

    def remaining(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self.seconds - (time.monotonic() - self._started))

    def attach(self, sock: socket.socket | None) -> None:
        """Register ``sock`` (plain or TLS) to be shut when the deadline
        passes; shut at once when it already has."""
        if sock is None:
            return
        try:
            dup = socket.socket(sock.family, sock.type, sock.proto, fileno=os.dup(sock.fileno()))
        except (OSError, ValueError):
            return  # already closed: nothing to bound
        with self._lock:
            if self.done:
                expired = None
            else:
                self._socks.append(dup)
                expired = self.expired
        if expired is None:
            dup.close()  # the block was left: nothing to bound
        elif expired:
            _shut(dup)

    def _expire(self) -> None:
        with self._lock:
            if self.done:
                return  # left as its time came: nothing to shut
            self.expired = True
            socks = list(self._socks)
        for sock in socks:
            _shut(sock)


def current() -> Deadline | None:
    """The ``Deadline`` in force in this thread, if any."""
    return getattr(_current, "deadline", None)


def _shut(sock: socket.socket) -> None:
    try:
        # shutdown acts on the connection, not the descriptor: the reader
        # blocked on the original descriptor (plain or TLS) wakes with EOF.
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _attach(sock) -> None:
    deadline = current()
    if deadline is not None:
        deadline.attach(sock)


class WatchedHTTPConnection(HTTPConnection):
    """Registers its socket with the thread's ``Deadline`` as soon as the TCP
    connection exists (before any TLS handshake)."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _attach(sock)
        return sock


class WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _attach(sock)
        return sock


class WatchedHTTPPool(HTTPConnectionPool):
    """A pool whose connections are bounded by the thread's ``Deadline``,
    including keep-alive connections taken again from the pool."""

    ConnectionCls = WatchedHTTPConnection

    def _get_conn(self, timeout=None):
        conn = super()._get_conn(timeout)
        _attach(getattr(conn, "sock", None))
        return conn


class WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = WatchedHTTPSConnection

    def _get_conn(self, timeout=None):
        conn = super()._get_conn(timeout)
        _attach(getattr(conn, "sock", None))
        return conn


WATCHED_POOLS = {"http": WatchedHTTPPool, "https": WatchedHTTPSPool}
"""``PoolManager.pool_classes_by_scheme`` for an adapter whose calls a ``Deadline`` bounds."""


class DeadlineAdapter(HTTPAdapter):
    """``requests``' adapter with deadline-aware pools. ``max_retries=0``:
    retries are the caller's (bounded, and counted against its deadline)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("max_retries", 0)
        super().__init__(**kwargs)

    def init_poolmanager(self, connections, maxsize, block=False, **pool_kwargs):
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(WATCHED_POOLS)


_SHORT_WAY = frozenset({"headers", "json", "data", "timeout", "allow_redirects"})
"""The arguments a ``RailSession`` call may have to be sent the short way."""

MAX_ENVIRONMENT_ORIGINS = 64
"""How many origins (scheme, host, port) a ``RailSession`` keeps the
environment's answer for; past it the kept answers are dropped and read
again. A rail adapter talks to one or two."""


class RailSession(requests.Session):
    """A ``requests.Session`` that reads the environment once per origin.

    ``requests`` with ``trust_env`` scans the whole of ``os.environ`` three
    times per request (``HTTP(S)_PROXY``/``NO_PROXY`` twice, the CA bundle
    once) and opens ``~/.netrc``: in the bench's environment that was 40 %
    of a MoMo status read's CPU (issue 30, bench/charges.py under yappi).
    Here ``trust_env`` is off and the same answers are supplied by hand:

    * proxies: ``requests.utils.get_environ_proxies(url)`` (``NO_PROXY``
      applied), read at the first request to an origin and kept (at most
      ``MAX_ENVIRONMENT_ORIGINS``): a change of the environment after that
      is not seen by this session (a new adapter reads it again);
    * trust: ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` when the call did
      not name its own, as ``requests`` does;
    * ``~/.netrc`` is never read: every rail call sets its own
      ``Authorization``, which a ``.netrc`` entry for the rail's host would
      otherwise replace.

    A call with only ``headers``, ``json``, ``data``, ``timeout`` (and
    ``allow_redirects``, ignored; an argument given as ``None`` counts as
    not given) — every rail adapter's call
    (``vpay.rails.http.exchange``) — is sent the short way: the request is
    prepared (method, URL, the session's headers under the call's, body)
    and handed to the mounted adapter (``requests``' documented transport
    adapter API; ``responses`` still sees it), and its body read before
    returning. What that leaves out, on purpose:

    * **redirects are never followed**: a 3xx is the answer (the adapters
      read it as our configuration, MISCONFIGURED: ``vpay.rails.http.exchange``).
      ``requests`` strips only ``Authorization`` when
      a redirect leaves the host; MoMo's ``Ocp-Apim-Subscription-Key`` and
      the reference headers would go on to wherever a misconfigured or
      hijacked base URL points;
    * no cookie jar (no rail uses cookies), no hooks, no credentials taken
      from the URL (the call's own ``Authorization`` stands);
    * ``Session.request``'s merging of settings, which cost about an eighth
      of a status read's CPU (issue 30, bench/charges.py).

    Any other argument (``params``, ``auth``, ``files``, ``cookies``,
    ``stream``, ``verify``, ...) takes ``requests``' own path, with the
    environment's proxies and trust supplied as above.
    """

    def __init__(self) -> None:
        super().__init__()
        self.trust_env = False
        self._environment: dict[str, tuple[dict[str, str], str | None]] = {}
        self._environment_lock = threading.Lock()

    def request(self, method, url, *args, **kwargs):  # noqa: D102 - requests' signature
        proxies, bundle = self._from_environment(url)
        given = {name: value for name, value in kwargs.items() if value is not None}
        if not args and _SHORT_WAY.issuperset(given):  # an argument given as None is not given
            return self._send_short(method, url, proxies, bundle, **given)
        if proxies:
            given = dict(kwargs.get("proxies") or {})
            for scheme, proxy in proxies.items():
                given.setdefault(scheme, proxy)
            kwargs["proxies"] = given
        if bundle and kwargs.get("verify") in (True, None):
            kwargs["verify"] = bundle
        return super().request(method, url, *args, **kwargs)

    def _send_short(self, method: str, url: str, proxies: dict[str, str], bundle: str | None, *,
                    headers=None, json=None, data=None, timeout=None,
                    allow_redirects: bool = False) -> requests.Response:
        merged = CaseInsensitiveDict(self.headers)
        if headers:
            merged.update(headers)
        for name in [name for name, value in merged.items() if value is None]:
            del merged[name]  # as requests does: a header set to None (the session's too) is not sent
        prep = requests.PreparedRequest()
        prep.prepare_method(method)
        prep.prepare_url(url, None)
        prep.prepare_headers(merged)
        prep.prepare_body(data, None, json)
        response = self.get_adapter(url).send(
            prep, stream=False, timeout=timeout, verify=bundle or self.verify, cert=self.cert,
            proxies={**self.proxies, **proxies})
        response.content  # noqa: B018 - read the body now, inside the caller's deadline
        return response

    def _from_environment(self, url: str) -> tuple[dict[str, str], str | None]:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        with self._environment_lock:
            known = self._environment.get(origin)
        if known is not None:
            return known
        known = (requests.utils.get_environ_proxies(url),
                 os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or None)
        with self._environment_lock:
            if len(self._environment) >= MAX_ENVIRONMENT_ORIGINS:
                self._environment.clear()
            self._environment[origin] = known
        return known


def new_session() -> requests.Session:
    """A ``RailSession`` whose requests a ``Deadline`` bounds (every rail
    adapter's default session)."""
    session = RailSession()
    adapter = DeadlineAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def parse_retry_after(value: str | None, date_header: str | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds, or an HTTP-date measured
    from the response's ``Date`` header when present (so neither clock's
    skew matters), else from this host's clock. None when absent or
    unparseable; never negative (RFC 9110, 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        # str.isdigit takes "²" and other digits int() refuses; and a
        # 400-digit number does not fit a float: unparseable, never a raise
        try:
            return float(int(value))
        except (ValueError, OverflowError):
            return None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    now = None
    if date_header:
        try:
            now = parsedate_to_datetime(date_header)
        except (TypeError, ValueError, IndexError, OverflowError):
            now = None
    if now is None:
        now = datetime.now(timezone.utc)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())
