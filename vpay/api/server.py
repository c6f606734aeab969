"""Serving a WSGI app to the open internet: gunicorn's arbiter in process,
waitress in each worker, so slow or idle clients cost no thread.

``serve(app_factory, ...)`` is the one way vpay serves HTTP (the API today,
the console next). Two well-kept servers, each doing what it is good at:

* **gunicorn's arbiter** runs in this process (``gunicorn.app.base``), not as
  a child, so under ``systemd/vpay-api.service`` (Type=notify,
  NotifyAccess=main) its own ``READY=1`` comes from the main process. It
  forks the worker processes, restarts one that dies, stops them gracefully
  on SIGTERM, and keeps its exit codes.
* **waitress** serves inside each worker (``BufferingWorker``): an event loop
  reads every connection and hands a request to a thread only once the whole
  request, headers and body, has arrived (waitress buffers it). A client that
  trickles its headers, sends half a body or says nothing holds a socket, not
  a thread. gunicorn's own ``gthread`` worker commits a thread at the first
  byte: eight slow-header connections took the API down (issue #27).

On top of waitress, what it lacks (``HttpLimits``, every value a named
setting): a deadline for a request's headers and one for its body (waitress
only has an inactivity timeout, which a client sending a byte a second never
meets), and a connection limit per client address; the connections these
close are counted in ``vpay_http_connections_closed_total{reason}``.

Each worker loads the app after the fork (the app makes its connection pool
on first use there: psycopg_pool, never across a fork), warms it, and closes
it when the worker exits. gunicorn's log lines go through Python logging, so
they come out as vpay's JSON lines on stdout.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from gunicorn import glogging
from gunicorn.app.base import BaseApplication
from gunicorn.workers.base import Worker

from vpay.base.db import ConfigError
from vpay.base.settings import env_seconds

log = logging.getLogger("vpay.api.server")

LISTENER_KEY = "vpay.listener"
"""WSGI environ key: the index, in ``bind`` order, of the listener a request
came in on (``with_metrics`` serves ``/metrics`` on its own bind only)."""


def _count(env: Mapping[str, str], name: str, default: int, maximum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) > maximum:
        raise ConfigError(f"{name} must be a whole number 0..{maximum}, got {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class HttpLimits:
    """What one client may cost a server process. Every field is a setting
    (docs/security.md, "Slow clients"), read by ``from_env``:

    * ``header_seconds`` (``VPAY_HTTP_HEADER_TIMEOUT_SECONDS``, default 10):
      from a connection's accept, or a request's first byte on a kept-alive
      connection, to the end of its headers; past it the connection is closed.
    * ``body_seconds`` (``VPAY_HTTP_BODY_TIMEOUT_SECONDS``, default 30): from
      the end of the headers to the end of the body.
    * ``idle_seconds`` (``VPAY_HTTP_IDLE_TIMEOUT_SECONDS``, default 30): a
      kept-alive connection with no request in progress (waitress's
      ``channel_timeout``).
    * ``per_address`` (``VPAY_HTTP_MAX_CONNECTIONS_PER_ADDRESS``, default 32;
      0 = no limit): open connections one client address may hold in one
      worker process; a connection past it is closed on accept. Behind a
      reverse proxy every client is the proxy's address: set 0 there.
    * ``connections`` (``VPAY_HTTP_MAX_CONNECTIONS``, default 2000): open
      connections per worker process; past it the worker stops accepting
      (the kernel's backlog holds the rest) until one closes.
    * ``header_bytes`` (64 KiB) and ``body_bytes`` (1 MiB): waitress answers
      431/413 itself past them (the app's own 64 KiB limit answers before).
    """

    header_seconds: float = 10.0
    body_seconds: float = 30.0
    idle_seconds: float = 30.0
    per_address: int = 32
    connections: int = 2000
    header_bytes: int = 64 * 1024
    body_bytes: int = 1024 * 1024

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "HttpLimits":
        """Raises ``ConfigError`` (exit 78) naming the setting and its bounds."""
        env = os.environ if env is None else env
        d = cls()
        return cls(
            header_seconds=env_seconds("VPAY_HTTP_HEADER_TIMEOUT_SECONDS", d.header_seconds,
                                       maximum=300.0, env=env),
            body_seconds=env_seconds("VPAY_HTTP_BODY_TIMEOUT_SECONDS", d.body_seconds,
                                     maximum=600.0, env=env),
            idle_seconds=env_seconds("VPAY_HTTP_IDLE_TIMEOUT_SECONDS", d.idle_seconds,
                                     maximum=3600.0, env=env),
            per_address=_count(env, "VPAY_HTTP_MAX_CONNECTIONS_PER_ADDRESS", d.per_address, 100_000),
            connections=max(1, _count(env, "VPAY_HTTP_MAX_CONNECTIONS", d.connections, 100_000)),
        )


# --- waitress, guarded ---------------------------------------------------------

def _closed(reason: str) -> None:
    from vpay.base import metrics
    metrics.http_connection_closed(reason)


def _guarded_classes():
    """The waitress channel and server classes with deadlines and the
    per-address limit (imported late: only a serving worker needs waitress)."""
    from waitress.channel import HTTPChannel
    from waitress.server import TcpWSGIServer, UnixWSGIServer
    from waitress.task import ErrorTask

    class ShapedErrorTask(ErrorTask):
        """waitress's own answers (a malformed request, a body or headers
        over the limits) in the served app's error shape when the server was
        given ``error_body`` (the API: its JSON errors), else waitress's text."""

        def execute(self):
            shape = getattr(self.channel.server, "error_body", None)
            if shape is None:
                return super().execute()
            code = self.request.error.code
            content_type, body = shape(code)
            self.status = f"{code} {self.request.error.reason}"
            self.response_headers.append(("Content-Type", content_type))
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class GuardedChannel(HTTPChannel):
        """A waitress connection that remembers when its current request began
        (``waiting_since``: the accept, or the first byte of a request on a
        kept-alive connection; None while idle between requests) and when its
        headers ended (``headers_at``). Runs on the event loop's thread only."""

        error_task_class = ShapedErrorTask

        def __init__(self, server, sock, addr, adj, map=None):
            self.waiting_since: float | None = time.monotonic()
            self.headers_at: float | None = None
            self.address = addr[0] if isinstance(addr, tuple) and addr else ""
            super().__init__(server, sock, addr, adj, map)
            server.guard.opened(self.address)

        def received(self, data):
            now = time.monotonic()
            before = self.request
            if data and before is None and self.waiting_since is None:
                self.waiting_since = now
            answer = super().received(data)
            if self.request is None:  # every request in ``data`` is whole
                if data:
                    self.waiting_since = self.headers_at = None
                return answer
            if self.request is not before and before is not None or (
                    before is None and self.requests):
                # ``data`` ended one request and began the next: its clock starts now
                self.waiting_since, self.headers_at = now, None
            if self.request.headers_finished and self.headers_at is None:
                self.headers_at = now
            return answer

        def del_channel(self, map=None):
            if self._fileno is not None and self._fileno in self.server.active_channels:
                self.server.guard.closed(self.address)
            super().del_channel(map)

    class Guard:
        """Open connections by client address, across one worker's listeners."""

        def __init__(self, limits: HttpLimits):
            self.limits = limits
            self.by_address: dict[str, int] = {}

        def admits(self, address: str) -> bool:
            limit = self.limits.per_address
            return not (limit and address and self.by_address.get(address, 0) >= limit)

        def opened(self, address: str) -> None:
            self.by_address[address] = self.by_address.get(address, 0) + 1

        def closed(self, address: str) -> None:
            left = self.by_address.get(address, 0) - 1
            if left > 0:
                self.by_address[address] = left
            else:
                self.by_address.pop(address, None)

    class Guarded:
        """Mixed into waitress's servers: refuse an address over its limit on
        accept, and close connections past their deadlines (checked every
        ``cleanup_interval``, 1 s, by waitress's ``maintenance``)."""

        channel_class = GuardedChannel
        guard: Guard
        error_body: Callable[[int], tuple[str, bytes]] | None = None

        def handle_accept(self):
            try:
                accepted = self.accept()
                if accepted is None:
                    return
                conn, addr = accepted
                self.set_socket_options(conn)
            except OSError:
                return
            addr = self.fix_addr(addr)
            address = addr[0] if isinstance(addr, tuple) and addr else ""
            if not self.guard.admits(address):
                # Cheapest answer to a client already holding its share:
                # close at once (RST on unread data), nothing buffered.
                conn.close()
                _closed("address_limit")
                log.debug("connection refused: address at its limit", extra={"address": address})
                return
            self.channel_class(self, conn, addr, self.adj, map=self._map)

        def maintenance(self, now):
            super().maintenance(now)  # idle kept-alive connections
            limits = self.guard.limits
            clock = time.monotonic()
            for channel in list(self.active_channels.values()):
                if channel.requests or channel.will_close:
                    continue  # a whole request is with a thread, or it is closing anyway
                if channel.headers_at is not None:
                    if clock - channel.headers_at > limits.body_seconds:
                        channel.will_close = True
                        _closed("body_timeout")
                elif channel.waiting_since is not None and clock - channel.waiting_since > limits.header_seconds:
                    channel.will_close = True
                    _closed("header_timeout")

    class GuardedTcp(Guarded, TcpWSGIServer):
        pass

    class GuardedUnix(Guarded, UnixWSGIServer):
        pass

    return Guard, GuardedTcp, GuardedUnix


class BufferingWorker(Worker):
    """A gunicorn worker that serves its listeners with waitress: requests are
    read on one event-loop thread and handed whole to ``threads`` threads.
    The app is ``self.wsgi`` (loaded by gunicorn after the fork); the limits
    are the application's ``http_limits``. On SIGTERM it stops accepting,
    lets the requests in progress finish (at most ``graceful_timeout``) and
    exits; SIGINT/SIGQUIT end it at once (gunicorn's own handlers)."""

    def run(self) -> None:
        from waitress.adjustments import Adjustments
        from waitress import wasyncore
        from waitress.task import ThreadedTaskDispatcher

        limits: HttpLimits = getattr(self.app, "http_limits", None) or HttpLimits()
        Guard, GuardedTcp, GuardedUnix = _guarded_classes()
        guard = Guard(limits)
        sockets = [listener.sock for listener in self.sockets]
        adj = Adjustments(
            sockets=sockets, threads=self.cfg.threads,
            connection_limit=limits.connections, channel_timeout=limits.idle_seconds,
            cleanup_interval=1, max_request_header_size=limits.header_bytes,
            max_request_body_size=limits.body_bytes, asyncore_use_poll=True,
            expose_tracebacks=False, ident="vpay", log_socket_errors=False,
            # Proxy headers reach the app as sent (as under gunicorn): it trusts
            # none, and /metrics refuses a request that carries one.
            clear_untrusted_proxy_headers=False,
            backlog=self.cfg.backlog)
        dispatcher = ThreadedTaskDispatcher()
        dispatcher.set_thread_count(self.cfg.threads)
        channels: dict = {}
        servers = []
        for index, sock in enumerate(sockets):
            kind = GuardedUnix if sock.family == getattr(socket, "AF_UNIX", None) else GuardedTcp
            server = kind(_on_listener(self.wsgi, index), map=channels, _sock=sock, dispatcher=dispatcher,
                          adj=adj, sockinfo=(sock.family, sock.type, sock.proto, sock.getsockname()),
                          bind_socket=False)
            server.guard = guard
            server.error_body = getattr(self.app, "error_body", None)
            servers.append(server)

        while self.alive:
            self.notify()
            if self.ppid != os.getppid():
                self.log.info("Parent changed, shutting down: %s", self)
                break
            wasyncore.loop(timeout=0.5, map=channels, use_poll=True, count=1)

        # Graceful: stop accepting here (the other workers, or the next
        # arbiter, take new connections), finish what is with a thread.
        for server in servers:
            server.accepting = False
            server.del_channel()
            server.socket.close()
        deadline = time.monotonic() + self.cfg.graceful_timeout
        while time.monotonic() < deadline:
            busy = False
            for channel in [c for c in channels.values() if hasattr(c, "requests")]:
                if channel.requests or channel.total_outbufs_len:
                    busy = True
                elif not channel.will_close:
                    channel.will_close = True  # idle or half-sent: no answer is owed
            if not busy:
                break
            self.notify()
            wasyncore.loop(timeout=0.1, map=channels, use_poll=True, count=1)
        dispatcher.shutdown(cancel_pending=True, timeout=1)
        wasyncore.close_all(channels)


def _on_listener(app: Callable, index: int) -> Callable:
    def tagged(environ: dict, start_response: Callable) -> Iterable[bytes]:
        environ[LISTENER_KEY] = index
        return app(environ, start_response)
    return tagged


# --- gunicorn, in process --------------------------------------------------------

class JsonLogger(glogging.Logger):
    """gunicorn's error log through the root logger (``vpay.base.logs`` JSON);
    gunicorn's access log stays off (``vpay.api.access`` logs each request)."""

    def setup(self, cfg) -> None:
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True


class Server(BaseApplication):
    """``Server(app_factory, options, limits).run()``: ``app_factory()`` builds
    the app (called in each worker, after the fork); ``options`` are gunicorn
    settings (``bind``, ``workers``, ``threads``, ...). An app with a
    ``vpay_db`` (the API's) has it warmed before the worker accepts and
    closed when it exits. ``wrap(app)`` is applied to what the factory built
    (``vpay.api.exposition.with_metrics``); ``child_exit`` is gunicorn's hook;
    ``error_body(status)`` answers ``(content_type, body)`` for the errors
    waitress answers itself (400, 413, 431, 501), in the app's own shape.
    Blocks until the arbiter stops; exits the process like gunicorn does."""

    def __init__(self, app_factory: Callable[[], Any], options: dict[str, Any],
                 limits: HttpLimits | None = None, *, proc_name: str = "vpay-api",
                 wrap: Callable[[Any], Callable] | None = None,
                 child_exit: Callable | None = None,
                 error_body: Callable[[int], tuple[str, bytes]] | None = None):
        self.app_factory = app_factory
        self.error_body = error_body
        self.options = options
        self.http_limits = limits or HttpLimits()
        self.proc_name = proc_name
        self.wrap = wrap
        self.child_exit = child_exit
        self.app: Any = None
        super().__init__(prog=f"vpay-server {proc_name.removeprefix('vpay-')}")

    def load_config(self) -> None:
        defaults = {
            "worker_class": BufferingWorker,
            "logger_class": JsonLogger,
            "proc_name": self.proc_name,
            # gunicorn >= 25 opens a control socket under $HOME by default:
            # shared between instances, and $HOME is read-only under the unit.
            "control_socket_disable": True,
            "when_ready": _when_ready,
            "worker_exit": self._worker_exit,
        }
        if self.child_exit is not None:
            defaults["child_exit"] = self.child_exit
        for key, value in (defaults | self.options).items():
            self.cfg.set(key, value)

    def load(self):
        self.app = self.app_factory()
        db = getattr(self.app, "vpay_db", None)
        if db is not None:
            db.warm()
        return self.wrap(self.app) if self.wrap is not None else self.app

    def _worker_exit(self, server, worker) -> None:
        db = getattr(self.app, "vpay_db", None)
        if db is not None:
            db.close()


def serve(app_factory: Callable[[], Any], *, bind: list[str], workers: int, threads: int,
          timeout: int = 60, limits: HttpLimits | None = None, proc_name: str = "vpay-api",
          loglevel: str = "info", wrap: Callable[[Any], Callable] | None = None,
          child_exit: Callable | None = None,
          error_body: Callable[[int], tuple[str, bytes]] | None = None) -> None:
    """Serve ``app_factory()`` on every address of ``bind`` (``HOST:PORT``,
    ``unix:PATH``; checked by the caller) with ``workers`` processes of
    ``threads`` threads each, under ``limits`` (default ``HttpLimits()``);
    ``timeout`` is gunicorn's worker heartbeat timeout. Blocks until SIGTERM
    (graceful) or SIGINT; exits the process as gunicorn does."""
    Server(app_factory, {"bind": bind, "workers": workers, "threads": threads, "timeout": timeout,
                         "loglevel": loglevel},
           limits, proc_name=proc_name, wrap=wrap, child_exit=child_exit, error_body=error_body).run()


def _when_ready(server) -> None:
    log.info("api ready", extra={"bind": [str(s) for s in server.LISTENERS], "pid": server.pid,
                                 "workers": server.num_workers})

