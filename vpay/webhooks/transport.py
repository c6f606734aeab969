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
* One attempt is one urllib3 connection pool of one connection, to the
  checked address, on the deadline-aware pool classes
  (``vpay.base.http_deadline.WATCHED_POOLS``): no ``requests`` session per
  attempt. ``requests`` added nothing an attempt uses (no cookies, no
  redirects, no proxies, no auth) and cost about half of an attempt's CPU
  (issue 30).
"""

from __future__ import annotations

import ssl
import threading
import time
from dataclasses import dataclass
from typing import Mapping

import urllib3
from requests.certs import where as default_ca_bundle
from urllib3.exceptions import (ConnectTimeoutError, HTTPError, NewConnectionError, ReadTimeoutError,
                                SSLError)

from vpay.base.settings import env_seconds
from vpay.base.http_deadline import WatchedHTTPPool, WatchedHTTPSPool, Deadline, parse_retry_after
from vpay.webhooks.policy import UrlRefused, check_url

__all__ = ["Attempt", "CONNECT_TIMEOUT_ENV", "MAX_RESPONSE_BYTES", "READ_TIMEOUT_ENV", "attempt_deadline",
           "parse_retry_after", "post", "timeouts"]


CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 15.0
MAX_RESPONSE_BYTES = 64 * 1024
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


def _pinned_pool(scheme: str, ip: str, port: int, host: str, connect_timeout: float,
                 read_timeout: float, verify: bool | str) -> urllib3.HTTPConnectionPool:
    """A pool of one connection to ``ip`` (the address the policy checked)
    while TLS uses ``host`` for SNI and certificate verification."""
    common = {"timeout": urllib3.Timeout(connect=connect_timeout, read=read_timeout), "maxsize": 1,
              "retries": False}
    if scheme != "https":
        return WatchedHTTPPool(ip, port, **common)
    if verify is False:
        tls = {"cert_reqs": "CERT_NONE", "assert_hostname": False, "server_hostname": host}
    else:
        tls = {"cert_reqs": "CERT_REQUIRED", "ssl_context": _ssl_context(verify),
               "server_hostname": host, "assert_hostname": host}
    return WatchedHTTPSPool(ip, port, **common, **tls)


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
    send_headers.update({"host": target.host_header, "accept-encoding": "identity",
                         "connection": "close"})
    last: Attempt | None = None
    deadline = attempt_deadline(connect_timeout, read_timeout)
    for ip in target.addresses[:2]:
        remaining = deadline - (time.monotonic() - started)
        if remaining <= 0:
            break
        pool = _pinned_pool(target.scheme, ip, target.port, target.host, connect_timeout, read_timeout,
                            verify)
        last = _post_once(pool, target.request_path, body, send_headers, connect_timeout,
                          read_timeout, remaining, started, ip)
        if not last.error or not last.error.startswith("connect"):
            return last
    return last or Attempt(None, error="timeout: attempt deadline", elapsed=time.monotonic() - started)


def _post_once(pool: urllib3.HTTPConnectionPool, path: str, body: bytes, headers: dict[str, str],
               connect_timeout: float, read_timeout: float, deadline: float, started: float,
               ip: str) -> Attempt:
    watch = Deadline(deadline)
    try:
        with watch:
            try:
                resp = pool.urlopen("POST", path, body=body, headers=headers, redirect=False,
                                    retries=False, preload_content=False, assert_same_host=False,
                                    release_conn=False)
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
                return Attempt(None, error=f"tls error: {_short(exc)}",
                               elapsed=time.monotonic() - started, address=ip)
            except (HTTPError, OSError) as exc:
                if watch.expired:
                    return Attempt(None, error=f"timeout: attempt deadline of {deadline:g} s",
                                   elapsed=time.monotonic() - started, address=ip)
                return Attempt(None, error=f"connection error: {_short(exc)}",
                               elapsed=time.monotonic() - started, address=ip)
            try:
                if watch.expired:
                    # The deadline shut the socket while the headers were
                    # still arriving: http.client reads that EOF as the end
                    # of the headers and hands back the status line's code.
                    # The receiver never finished answering: not a delivery.
                    return Attempt(None, error=f"timeout: attempt deadline of {deadline:g} s",
                                   elapsed=time.monotonic() - started, address=ip)
                excerpt = _read_excerpt(resp)
                return Attempt(resp.status,
                               retry_after=parse_retry_after(resp.headers.get("retry-after"),
                                                             resp.headers.get("date")),
                               elapsed=time.monotonic() - started, body_excerpt=excerpt, address=ip)
            finally:
                resp.close()
    finally:
        pool.close()


def _read_excerpt(resp: urllib3.BaseHTTPResponse) -> str:
    """Read at most MAX_RESPONSE_BYTES of the body (undecoded); the status
    is already known, so a body that fails to arrive changes nothing."""
    got = bytearray()
    try:
        while len(got) < MAX_RESPONSE_BYTES:
            chunk = resp.read(min(16384, MAX_RESPONSE_BYTES - len(got)), decode_content=False)
            if not chunk:
                break
            got += chunk
    except Exception:  # noqa: BLE001 - the body is informational only
        pass
    text = bytes(got[:300]).decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else " " for c in text)


def _short(exc: BaseException) -> str:
    return str(exc).replace("\n", " ")[:300]
