"""Webhooks to merchants: endpoints, the URL policy, signing, one HTTP
delivery attempt, and the retry schedule.

The job handlers (``fanout``, ``deliver``) live in ``vpay.handlers.webhooks``;
this module holds everything they and ``vpay-server webhooks`` need, with no
queue logic in it. Rules and their sources:

* **Signing** is Standard Webhooks (spec, "Signature scheme" and "Webhook
  headers"): ``webhook-id`` = the event id, ``webhook-timestamp`` = the
  attempt's Unix time in seconds, ``webhook-signature`` = ``v1,<base64
  HMAC-SHA256 of "{id}.{timestamp}.{body}">``, made with the
  ``standardwebhooks`` library so that any Standard Webhooks library
  verifies it. During a secret rotation both secrets sign (space-separated).
* **Status handling** (spec, "Delivery success and failure"; the issue):
  2xx is delivered; 410 disables the endpoint; 429/503 with ``Retry-After``
  delay the next attempt at least that long, bounded by
  ``RETRY_AFTER_CAP_SECONDS``; anything else, redirects included (never
  followed), timeouts and connection errors, is retried on
  ``RETRY_SCHEDULE`` (spec, "Deliverability": the example schedule, about
  three days, with jitter) and then dead-lettered.
* **Timeouts**: connect 5 s, read 15 s (per socket read, as ``requests``
  means it), configurable by ``VPAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS`` and
  ``VPAY_WEBHOOK_READ_TIMEOUT_SECONDS``; and a whole-attempt deadline of
  connect + 2 x read, so a receiver dribbling bytes cannot hold a claim loop
  longer. The response body is read at most ``MAX_RESPONSE_BYTES`` (64 KiB).
* **SSRF** (spec, "Server side request forgery"; the issue): by default
  only ``https`` URLs whose host resolves to public addresses only. The
  check runs at registration and again at every attempt, and the attempt
  connects to the very address it checked (the URL's host is kept for the
  ``Host`` header, TLS SNI and certificate verification), so a DNS answer
  changed between the check and the connection (rebinding) cannot reach a
  private address. Environment proxies and ``.netrc`` are ignored for the
  same reason. ``VPAY_WEBHOOKS_ALLOW_PRIVATE=1`` (development and tests)
  also allows ``http`` and loopback/private addresses; link-local (cloud
  metadata), multicast, unspecified and reserved addresses stay refused.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import os
import random
import secrets as _secrets
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import urlsplit

import psycopg
import requests
from psycopg.rows import dict_row
from requests.adapters import HTTPAdapter
from standardwebhooks.webhooks import Webhook
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NewConnectionError

from .db import ConfigError
from .ids import new_id
from .queries import Q

log = logging.getLogger("vpay.webhooks")

CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 15.0
MAX_RESPONSE_BYTES = 64 * 1024
RETRY_AFTER_CAP_SECONDS = 3600.0
RETRY_SCHEDULE: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
"""Seconds before attempt n + 1 after attempt n failed (n = 1 … 9): 5 s,
5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h. Standard Webhooks' example
schedule; about 3.1 days from the first attempt to the tenth."""
MAX_ATTEMPTS = len(RETRY_SCHEDULE) + 1
JITTER = 0.1  # each delay is scaled by a uniform factor in [1 - JITTER, 1 + JITTER]
MAX_URL_LENGTH = 2048
ALLOW_PRIVATE_ENV = "VPAY_WEBHOOKS_ALLOW_PRIVATE"
CONNECT_TIMEOUT_ENV = "VPAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS"
READ_TIMEOUT_ENV = "VPAY_WEBHOOK_READ_TIMEOUT_SECONDS"
USER_AGENT = "vpay-webhooks/1"
_TRUE = {"1", "true", "yes", "on"}
_DEV_ALLOWED = {"loopback", "private"}  # what VPAY_WEBHOOKS_ALLOW_PRIVATE=1 lets through
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


# ---- configuration ------------------------------------------------------

def allow_private(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``VPAY_WEBHOOKS_ALLOW_PRIVATE`` is on (``1``, ``true``, ``yes``,
    ``on``). Read at each call, so registration and every delivery attempt
    apply the process's current setting (issue: webhooks, point 1)."""
    env = os.environ if environ is None else environ
    return env.get(ALLOW_PRIVATE_ENV, "").strip().lower() in _TRUE


def timeouts(environ: Mapping[str, str] | None = None) -> tuple[float, float]:
    """``(connect, read)`` seconds from ``VPAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS``
    (default 5) and ``VPAY_WEBHOOK_READ_TIMEOUT_SECONDS`` (default 15).
    Raises ``ConfigError`` for a value that is not a positive number."""
    env = os.environ if environ is None else environ

    def one(name: str, default: float) -> float:
        raw = env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
        if not 0 < value <= 600:
            raise ConfigError(f"{name} must be above 0 and at most 600 seconds, got {raw!r}")
        return value

    return one(CONNECT_TIMEOUT_ENV, CONNECT_TIMEOUT_SECONDS), one(READ_TIMEOUT_ENV, READ_TIMEOUT_SECONDS)


def attempt_deadline(connect: float, read: float) -> float:
    """Seconds one attempt may take in all: connect + 2 x read. ``requests``'
    read timeout bounds each socket read, not the response; this bounds the
    whole attempt so a slow-dripping receiver cannot hold a claim loop."""
    return connect + 2 * read


# ---- the URL policy (SSRF) ----------------------------------------------

class UrlRefused(ValueError):
    """A webhook URL or its resolved address is not allowed. ``permanent`` is
    True when no later attempt can succeed (scheme, credentials, a literal
    private IP); False when it depends on DNS (the name resolves to a
    refused address now, or does not resolve)."""

    def __init__(self, message: str, *, permanent: bool):
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class Target:
    """A URL that passed the policy. ``host`` is the URL's host (ASCII, no
    brackets), ``port`` explicit, ``request_path`` the path and query;
    ``addresses`` the checked IPs, in the order to try (empty when
    ``check_url`` ran with ``resolve=False``)."""

    url: str
    scheme: str
    host: str
    port: int
    request_path: str
    addresses: tuple[str, ...]

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def resolve_host(host: str, port: int) -> list[str]:
    """The IP addresses ``host`` resolves to for a TCP connection, in
    ``getaddrinfo`` order, without duplicates. Raises ``OSError``
    (``socket.gaierror``) when it does not resolve. Tests replace this
    function to simulate a DNS answer that changes."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
    seen: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        ip = str(sockaddr[0]).split("%", 1)[0]
        if ip not in seen:
            seen.append(ip)
    return seen


def address_problem(ip: str, *, allow_private: bool) -> str | None:
    """Why a webhook may not connect to ``ip`` (``"loopback"``, ``"private"``,
    ``"link-local"``, ``"multicast"``, ``"unspecified"``, ``"reserved"``,
    ``"not an IP address"``), or ``None`` when it may. IPv4 addresses
    embedded in IPv6 (mapped, 6to4, NAT64 ``64:ff9b::/96``) are judged as
    the IPv4 address. ``allow_private`` lets loopback and private through,
    never the rest (the development flag must not open cloud metadata at
    169.254.169.254)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return "not an IP address"
    if addr.version == 6:
        if addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        elif addr.sixtofour is not None:
            addr = addr.sixtofour
        elif addr in _NAT64:
            addr = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr.is_unspecified:
        problem = "unspecified"
    elif addr.is_multicast:
        problem = "multicast"
    elif addr.is_loopback:
        problem = "loopback"
    elif addr.is_link_local:
        problem = "link-local"
    elif addr.is_reserved:
        problem = "reserved"
    elif addr.is_private or not addr.is_global:
        problem = "private"
    else:
        return None
    if allow_private and problem in _DEV_ALLOWED:
        return None
    return problem


def check_url(url: str, *, allow_private: bool, resolve: bool = True,
              resolver: Callable[[str, int], list[str]] | None = None) -> Target:
    """Apply the webhook URL policy; answer the ``Target`` to connect to.

    Refused (``UrlRefused``, ``permanent=True``): not ``https`` (``http``
    only with ``allow_private``), no host, credentials in the URL, a
    fragment, whitespace, longer than ``MAX_URL_LENGTH``, a literal IP that
    ``address_problem`` refuses. Refused with ``permanent=False``: the host
    does not resolve, or ANY of its addresses is refused (a name answering
    public and private addresses at once is how DNS rebinding starts). With
    ``resolve=False`` only the static rules run. ``resolver`` defaults to
    this module's ``resolve_host`` (looked up at call time).
    Source: the issue (webhooks, point 1); Standard Webhooks, "SSRF".
    """
    if not isinstance(url, str) or not url:
        raise UrlRefused("the URL is empty", permanent=True)
    if len(url) > MAX_URL_LENGTH:
        raise UrlRefused(f"the URL is longer than {MAX_URL_LENGTH} characters", permanent=True)
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise UrlRefused("the URL contains whitespace or control characters", permanent=True)
    try:
        prepared = requests.models.PreparedRequest()
        prepared.prepare_url(url, None)  # IDNA-encodes the host, normalises the rest
        parts = urlsplit(prepared.url)
        port = parts.port
    except (requests.exceptions.RequestException, ValueError) as exc:
        raise UrlRefused(f"not a valid URL: {exc}", permanent=True) from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise UrlRefused(f"the scheme must be https, not {scheme or 'none'}", permanent=True)
    if scheme == "http" and not allow_private:
        raise UrlRefused(f"the scheme must be https (http only with {ALLOW_PRIVATE_ENV}=1)",
                         permanent=True)
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("credentials in the URL are not accepted; receivers verify the "
                         "webhook signature instead", permanent=True)
    if "#" in url:
        raise UrlRefused("the URL must not have a fragment", permanent=True)
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise UrlRefused("the URL has no host", permanent=True)
    port = port or (443 if scheme == "https" else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    literal = _literal_ip(host)
    if literal is not None:
        problem = address_problem(literal, allow_private=allow_private)
        if problem:
            raise UrlRefused(f"{host} is a {problem} address", permanent=True)
        return Target(prepared.url, scheme, literal, port, path, (literal,))
    if not resolve:
        return Target(prepared.url, scheme, host, port, path, ())
    try:
        addresses = (resolver or resolve_host)(host, port)
    except OSError as exc:
        raise UrlRefused(f"{host} does not resolve: {exc}", permanent=False) from None
    if not addresses:
        raise UrlRefused(f"{host} does not resolve", permanent=False)
    for ip in addresses:
        problem = address_problem(ip, allow_private=allow_private)
        if problem:
            raise UrlRefused(f"{host} resolves to {ip}, a {problem} address", permanent=False)
    return Target(prepared.url, scheme, host, port, path, tuple(addresses))


def _literal_ip(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


# ---- secrets, payload, signature ----------------------------------------

def new_secret() -> str:
    """A fresh endpoint secret: ``whsec_`` + base64 of 32 random bytes
    (Standard Webhooks: symmetric secrets are 24 to 64 random bytes,
    base64, prefixed ``whsec_``)."""
    return "whsec_" + base64.b64encode(_secrets.token_bytes(32)).decode("ascii")


def payload(event: Mapping[str, Any]) -> bytes:
    """The body POSTed for an event row (``id``, ``type``, ``created_at``,
    ``data``): compact JSON ``{"id", "type", "created", "data"}``, ASCII
    only (non-ASCII escaped), ``created`` as ISO 8601 UTC. The bytes that
    are signed are exactly the bytes sent."""
    created = event["created_at"]
    if isinstance(created, datetime):
        created = created.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    doc = {"id": event["id"], "type": event["type"], "created": created, "data": event["data"]}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, sort_keys=False).encode("ascii")


def signature(msg_id: str, timestamp: int, body: bytes, secrets: Iterable[str]) -> str:
    """The ``webhook-signature`` header: one ``v1,<base64>`` per secret,
    space-separated (Standard Webhooks, "Webhook headers": a list, for
    rotation). ``timestamp`` is Unix seconds; ``body`` the exact bytes sent.
    Raises ``ValueError`` when no secret is given."""
    when = datetime.fromtimestamp(int(timestamp), tz=timezone.utc)
    text = body.decode("utf-8")
    sigs = [Webhook(s).sign(msg_id, when, text) for s in secrets if s]
    if not sigs:
        raise ValueError("no secret to sign with")
    return " ".join(sigs)


def signed_headers(msg_id: str, timestamp: int, body: bytes, secrets: Iterable[str]) -> dict[str, str]:
    """The request headers of one attempt: ``content-type``, ``user-agent``
    and the three Standard Webhooks headers."""
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": signature(msg_id, timestamp, body, secrets),
    }


# ---- one HTTP attempt ---------------------------------------------------

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


class _Watch:
    """Shuts down an attempt's sockets when its deadline passes: the blocked
    read wakes with EOF and the attempt ends as a connection error."""

    def __init__(self, seconds: float):
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> "_Watch":
        _current.watch = self
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        _current.watch = None

    def attach(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._socks.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            socks = list(self._socks)
        for sock in socks:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        # The plain socket's shutdown, also for an SSLSocket: unblocks a
        # reader in another thread without touching the TLS object under it.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


_current = threading.local()


class _WatchedHTTPConnection(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        watch = getattr(_current, "watch", None)
        if watch is not None:
            watch.attach(self.sock)


class _WatchedHTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        watch = getattr(_current, "watch", None)
        if watch is not None:
            watch.attach(self.sock)


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_ssl_contexts: dict[str, ssl.SSLContext] = {}
_ssl_lock = threading.Lock()


def _ssl_context(verify: bool | str) -> ssl.SSLContext:
    # Our own context, never requests' shared one: urllib3 turns
    # check_hostname off on the context it is given when it checks the
    # hostname itself (assert_hostname), which pinning needs.
    # Trust: requests' bundle (certifi) by default, like any requests call;
    # a CA file when ``verify`` names one (tests).
    key = verify if isinstance(verify, str) else requests.certs.where()
    with _ssl_lock:
        ctx = _ssl_contexts.get(key)
        if ctx is None:
            ctx = ssl.create_default_context(cafile=key)
            ctx.check_hostname = False  # urllib3 matches assert_hostname itself
            _ssl_contexts[key] = ctx
        return ctx


class _PinnedAdapter(HTTPAdapter):
    """Sends to the URL's IP literal (the address the policy checked) while
    TLS uses the original host for SNI and certificate verification."""

    def __init__(self, server_hostname: str, verify: bool | str):
        self._server_hostname = server_hostname
        self._verify = verify
        super().__init__(max_retries=0)

    def init_poolmanager(self, connections, maxsize, block=False, **pool_kwargs):
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedHTTPPool,
                                                   "https": _WatchedHTTPSPool}

    def build_connection_pool_key_attributes(self, request, verify, cert=None):
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, verify, cert)
        if host_params["scheme"] == "https":
            if self._verify is False:
                pool_kwargs = {"cert_reqs": "CERT_NONE", "assert_hostname": False,
                               "server_hostname": self._server_hostname}
            else:
                pool_kwargs = {"cert_reqs": "CERT_REQUIRED",
                               "ssl_context": _ssl_context(self._verify),
                               "server_hostname": self._server_hostname,
                               "assert_hostname": self._server_hostname}
        return host_params, pool_kwargs

    def cert_verify(self, conn, url, verify, cert):
        # Trust is configured on the pool (build_connection_pool_key_attributes);
        # requests' per-request CA loading would reload it into the shared context.
        return None


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
    is ``requests``' (True, or a CA bundle path for tests).
    Sources: the issue (webhooks, points 1 and 3); Standard Webhooks, "SSRF".
    """
    started = time.monotonic()
    try:
        target = check_url(url, allow_private=allow_private)
    except UrlRefused as exc:
        return Attempt(None, error=f"refused: {exc}", permanent=exc.permanent,
                       elapsed=time.monotonic() - started)
    send_headers = {k.lower(): v for k, v in headers.items()}
    send_headers.update({"host": target.host_header, "accept-encoding": "identity",
                         "connection": "close"})
    last: Attempt | None = None
    deadline = attempt_deadline(connect_timeout, read_timeout)
    for ip in target.addresses[:2]:
        remaining = deadline - (time.monotonic() - started)
        if remaining <= 0:
            break
        literal = f"[{ip}]" if ":" in ip else ip
        pinned = f"{target.scheme}://{literal}:{target.port}{target.request_path}"
        last = _post_once(pinned, body, send_headers, target.host, connect_timeout,
                          read_timeout, remaining, verify, started, ip)
        if not last.error or not last.error.startswith("connect"):
            return last
    return last or Attempt(None, error="timeout: attempt deadline", elapsed=time.monotonic() - started)


def _post_once(pinned_url: str, body: bytes, headers: dict[str, str], host: str,
               connect_timeout: float, read_timeout: float, deadline: float,
               verify: bool | str, started: float, ip: str) -> Attempt:
    session = requests.Session()
    session.trust_env = False  # no proxies or .netrc from the environment: connect where we checked
    adapter = _PinnedAdapter(host, verify)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    watch = _Watch(deadline)
    try:
        with watch:
            try:
                resp = session.post(pinned_url, data=body, headers=headers,
                                    timeout=(connect_timeout, read_timeout),
                                    allow_redirects=False, stream=True, verify=verify)
            except requests.exceptions.ConnectTimeout:
                return Attempt(None, error=f"connect timeout after {connect_timeout:g} s",
                               elapsed=time.monotonic() - started, address=ip)
            except requests.exceptions.ReadTimeout:
                return Attempt(None, error=f"timeout: no response within {read_timeout:g} s",
                               elapsed=time.monotonic() - started, address=ip)
            except requests.exceptions.SSLError as exc:
                return Attempt(None, error=f"tls error: {_short(exc)}",
                               elapsed=time.monotonic() - started, address=ip)
            except requests.exceptions.ConnectionError as exc:
                if watch.expired:
                    return Attempt(None, error=f"timeout: attempt deadline of {deadline:g} s",
                                   elapsed=time.monotonic() - started, address=ip)
                reason = getattr(exc.args[0], "reason", None) if exc.args else None
                if isinstance(reason, NewConnectionError):
                    # "<connection repr>: Failed to establish …: [Errno 111] …" → the cause
                    return Attempt(None, error=f"connect error: {_short(reason).split(': ')[-1]}",
                                   elapsed=time.monotonic() - started, address=ip)
                return Attempt(None, error=f"connection error: {_short(reason or exc)}",
                               elapsed=time.monotonic() - started, address=ip)
            except requests.exceptions.RequestException as exc:
                return Attempt(None, error=f"request error: {_short(exc)}",
                               elapsed=time.monotonic() - started, address=ip)
            with resp:
                excerpt = _read_excerpt(resp)
                return Attempt(resp.status_code,
                               retry_after=parse_retry_after(resp.headers.get("retry-after"),
                                                             resp.headers.get("date")),
                               elapsed=time.monotonic() - started, body_excerpt=excerpt, address=ip)
    finally:
        session.close()


def _read_excerpt(resp: requests.Response) -> str:
    """Read at most MAX_RESPONSE_BYTES of the body (undecoded); the status
    is already known, so a body that fails to arrive changes nothing."""
    got = bytearray()
    try:
        while len(got) < MAX_RESPONSE_BYTES:
            chunk = resp.raw.read(min(16384, MAX_RESPONSE_BYTES - len(got)), decode_content=False)
            if not chunk:
                break
            got += chunk
    except Exception:  # noqa: BLE001 - the body is informational only
        pass
    text = bytes(got[:300]).decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else " " for c in text)


def _short(exc: BaseException) -> str:
    return str(exc).replace("\n", " ")[:300]


def parse_retry_after(value: str | None, date_header: str | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds, or an HTTP-date measured
    from the response's ``Date`` header when present (so neither clock's
    skew matters), else from this host's clock. None when absent or
    unparseable; never negative (RFC 9110, 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    now = None
    if date_header:
        try:
            now = parsedate_to_datetime(date_header)
        except (TypeError, ValueError, IndexError):
            now = None
    if now is None:
        now = datetime.now(timezone.utc)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())


# ---- the retry schedule -------------------------------------------------

def retry_delay(attempt: int, rng: random.Random | None = None) -> float | None:
    """Seconds to wait after attempt number ``attempt`` (1-based: the job's
    ``attempts``) failed: ``RETRY_SCHEDULE[attempt - 1]`` with ±10 % jitter;
    None once ``attempt`` >= ``MAX_ATTEMPTS`` (the delivery is given up).
    Raises ``ValueError`` for ``attempt`` < 1. Source: the issue (point 3)
    and Standard Webhooks' example schedule."""
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    if attempt > len(RETRY_SCHEDULE):
        return None
    return RETRY_SCHEDULE[attempt - 1] * (rng or random).uniform(1 - JITTER, 1 + JITTER)


@dataclass(frozen=True)
class Decision:
    """What to do after an attempt: ``action`` is ``"delivered"``,
    ``"gone"`` (410: disable the endpoint), ``"retry"`` (in ``delay``
    seconds) or ``"give_up"``; ``note`` is for ``last_error`` and logs."""

    action: str
    delay: float = 0.0
    note: str = ""


def decide(attempt: Attempt, attempt_no: int, rng: random.Random | None = None) -> Decision:
    """The rule of the issue (point 3) and Standard Webhooks ("Delivery
    success and failure"): 2xx → delivered; 410 → gone; a permanent policy
    refusal → give up; otherwise retry after ``retry_delay(attempt_no)``,
    or give up when the schedule is spent. On 429 and 503, ``Retry-After``
    is honoured as a lower bound capped at ``RETRY_AFTER_CAP_SECONDS``: the
    next attempt is never sooner than the receiver asked (up to an hour),
    nor sooner than the schedule, so a receiver answering ``Retry-After:
    1`` cannot spend the ten attempts in ten seconds."""
    code = attempt.status_code
    if code is not None and 200 <= code < 300:
        return Decision("delivered", note=attempt.summary)
    if code == 410:
        return Decision("gone", note="receiver answered 410 Gone")
    if attempt.permanent:
        return Decision("give_up", note=f"{attempt.summary} (permanent)")
    delay = retry_delay(attempt_no, rng)
    if delay is None:
        return Decision("give_up", note=f"webhook delivery gave up after {attempt_no} attempts; "
                                        f"last: {attempt.summary}")
    if code in (429, 503) and attempt.retry_after is not None:
        delay = max(delay, min(attempt.retry_after, RETRY_AFTER_CAP_SECONDS))
    return Decision("retry", delay=delay, note=f"attempt {attempt_no}: {attempt.summary}")


# ---- endpoints (vpay-server webhooks) -----------------------------------

def add_endpoint(conn: psycopg.Connection, merchant_id: str, url: str, *,
                 permit_private: bool | None = None,
                 resolver: Callable[[str, int], list[str]] | None = None) -> dict[str, Any]:
    """Register ``url`` for ``merchant_id``; answer ``{id, merchant_id, url,
    enabled, created_at, secret}``. The secret is answered here and never
    again (``list_endpoints`` omits it). Raises ``UrlRefused`` when the URL
    fails ``check_url`` (resolved now; ``permit_private`` defaults to
    ``VPAY_WEBHOOKS_ALLOW_PRIVATE``), ``LookupError`` for an unknown
    merchant. Nothing is written when it raises."""
    allowed = allow_private() if permit_private is None else permit_private
    check_url(url, allow_private=allowed, resolver=resolver)
    secret = new_secret()
    try:
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(Q["webhook_endpoint_insert"], {
                "id": new_id("we"), "merchant_id": merchant_id, "url": url,
                "secret": secret}).fetchone()
    except psycopg.errors.ForeignKeyViolation:
        raise LookupError(f"unknown merchant {merchant_id!r}") from None
    log.info("webhook endpoint added", extra={"endpoint_id": row["id"], "merchant_id": merchant_id,
                                              "host": urlsplit(url).hostname})
    return dict(row) | {"secret": secret}


def list_endpoints(conn: psycopg.Connection, merchant_id: str | None = None) -> list[dict[str, Any]]:
    """Every endpoint (of ``merchant_id`` when given), without secrets:
    ``[{id, merchant_id, url, enabled, disabled_at, disabled_reason,
    rotating, created_at}]`` ordered by merchant then creation."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["webhook_endpoint_list"], {"merchant_id": merchant_id}).fetchall()


def disable_endpoint(conn: psycopg.Connection, endpoint_id: str, reason: str) -> dict[str, Any] | None:
    """Stop deliveries to an endpoint; its pending deliveries end as
    ``skipped`` when they next run. Idempotent (the first reason is kept).
    Answers the endpoint (no secret), or None when unknown."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["webhook_endpoint_disable"], {"id": endpoint_id, "reason": reason}).fetchone()
    if row is not None:
        log.warning("webhook endpoint disabled", extra={"endpoint_id": endpoint_id, "reason": reason})
    return row


def enable_endpoint(conn: psycopg.Connection, endpoint_id: str) -> dict[str, Any] | None:
    """Re-enable an endpoint for events from now on (deliveries that ended
    while it was disabled are not replayed). None when unknown."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["webhook_endpoint_enable"], {"id": endpoint_id}).fetchone()
    if row is not None:
        log.info("webhook endpoint enabled", extra={"endpoint_id": endpoint_id})
    return row


def rotate_secret(conn: psycopg.Connection, endpoint_id: str,
                  overlap_seconds: float = 24 * 3600.0) -> dict[str, Any] | None:
    """Give an endpoint a new secret; answer ``{id, merchant_id, url,
    enabled, previous_secret_expires_at, secret}`` (the new secret, shown
    once), or None when unknown. For ``overlap_seconds`` (default 24 h) the
    old secret keeps signing next to the new one, so a receiver can switch
    without failing a delivery (Standard Webhooks, "Webhook headers");
    0 revokes the old secret at once. Raises ``ValueError`` when negative."""
    if overlap_seconds < 0:
        raise ValueError("overlap_seconds must be >= 0")
    secret = new_secret()
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["webhook_endpoint_rotate_secret"], {
            "id": endpoint_id, "secret": secret, "overlap": float(overlap_seconds)}).fetchone()
    if row is None:
        return None
    log.info("webhook secret rotated", extra={"endpoint_id": endpoint_id,
                                              "overlap_seconds": overlap_seconds})
    return dict(row) | {"secret": secret}
