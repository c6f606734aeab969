"""``GET /metrics`` for the API, correct under gunicorn's several worker
processes: ``prometheus_client``'s multiprocess mode.

Each gunicorn worker counts in its own memory-mapped files under
``PROMETHEUS_MULTIPROC_DIR``; a scrape, answered by whichever worker
accepts it, sums the files of every worker, live or dead, so no request
counted by another worker (or by one gunicorn has since replaced) is missed.

* ``prepare()`` makes a private directory (``mkdtemp``, mode 0700) and
  sets the variable. ``vpay-server api`` calls it first thing, before
  anything imports ``vpay.base.metrics``: the library chooses its value store
  when it is imported. The directory is removed when the arbiter exits;
  one left by an arbiter that was killed is removed by the next start.
* ``child_exit`` (gunicorn's hook, in the arbiter) calls
  ``mark_process_dead`` for a worker that exited, so its live gauges (if
  any are ever added) stop counting; its counters stay in the sums.
* ``with_metrics(app)`` puts ``/metrics`` in front of the Falcon app at the
  WSGI level, outside its routes: it is an operator's endpoint, not part of
  the merchant API or its OpenAPI document (docs/api.md). A request that
  came through a proxy (``Forwarded`` or ``X-Forwarded-For`` present) is
  passed to the app, which answers 404, so a reverse proxy in front of the
  API does not publish the metrics by accident. Optionally behind a bearer
  token (``VPAY_API_METRICS_TOKEN``) and/or on a bind of its own
  (``VPAY_API_METRICS_BIND``), docs/observability.md.

The scraped metrics are the in-process ones of ``vpay.base.metrics`` the API
records: ``vpay_api_requests_total``, ``vpay_api_request_seconds`` and the
rail calls it makes (``request_to_pay``). The database gauges are the
worker's (docs/observability.md).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from typing import Callable, Iterable

ENV = "PROMETHEUS_MULTIPROC_DIR"
PATH = "/metrics"
PREFIX = "vpay-api-metrics-"
"""Directory names are ``PREFIX<pid of the arbiter>-<random>``."""

log = logging.getLogger("vpay.api.exposition")


def _remove_orphans() -> None:
    """Remove the directories of API processes that died without cleaning up
    (SIGKILL, a crash): their arbiter's pid no longer exists. Only our own
    prefix in the temporary directory, and only directories we can remove."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].partition("-")[0]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0; a process of
    another user counts as alive). Also used by the test harness's sweep of
    left-over embedded servers (tests/pg_orphans.py)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def prepare() -> str:
    """Create this API's private multiprocess directory, export it as
    ``PROMETHEUS_MULTIPROC_DIR`` (replacing any inherited value: a stale or
    shared directory would mix in other processes' counts) and answer its
    path. It is removed at the exit of the process that made it (gunicorn's
    workers, forked from it, leave it alone). Raises ``RuntimeError`` when
    ``prometheus_client`` was imported already in this process (its metrics
    would silently stay per process)."""
    if "prometheus_client.values" in sys.modules:
        raise RuntimeError("prometheus_client was imported before the multiprocess directory "
                           "was set; vpay.api.exposition.prepare() must run first")
    owner = os.getpid()
    _remove_orphans()
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{owner}-")
    os.environ[ENV] = path
    log.info("api metrics directory", extra={"path": path})

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(remove)
    return path


def child_exit(server, worker) -> None:
    """gunicorn ``child_exit`` hook: forget a dead worker's live gauges."""
    from prometheus_client import multiprocess
    multiprocess.mark_process_dead(worker.pid)


def _proxied(environ: dict) -> bool:
    return "HTTP_FORWARDED" in environ or "HTTP_X_FORWARDED_FOR" in environ


def _plain(start_response: Callable, status: str, headers: list | None = None) -> Iterable[bytes]:
    body = status.encode() + b"\n"
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body)))] + (headers or []))
    return [body]


def with_metrics(app: Callable, *, token: str | None = None, listener: int | None = None) -> Callable:
    """A WSGI app answering ``GET /metrics`` from every worker's files and
    passing everything else to ``app``.

    ``token`` (``VPAY_API_METRICS_TOKEN``): when set, a scrape must send
    ``Authorization: Bearer <token>`` (compared in constant time), else 401.
    ``listener`` (the index of ``VPAY_API_METRICS_BIND`` among the binds,
    ``vpay.api.server.LISTENER_KEY``): when set, ``/metrics`` is served on
    that listener only, which serves nothing else (404), and the API's own
    listeners pass ``/metrics`` to the app (404)."""
    import hmac

    from prometheus_client import CollectorRegistry, make_wsgi_app, multiprocess

    from vpay.api.server import LISTENER_KEY

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    exposition = make_wsgi_app(registry)
    expected = f"Bearer {token}".encode() if token else None

    def dispatch(environ: dict, start_response: Callable) -> Iterable[bytes]:
        on_metrics_listener = listener is not None and environ.get(LISTENER_KEY) == listener
        is_scrape = (environ.get("PATH_INFO") == PATH
                     and environ.get("REQUEST_METHOD") in ("GET", "HEAD") and not _proxied(environ))
        if listener is not None and not on_metrics_listener:
            return app(environ, start_response)  # the API's own listener: /metrics is no route
        if not is_scrape:
            if on_metrics_listener:
                return _plain(start_response, "404 Not Found")
            return app(environ, start_response)
        if expected is not None:
            given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, expected):
                return _plain(start_response, "401 Unauthorized", [("WWW-Authenticate", "Bearer")])
        return exposition(environ, start_response)

    return dispatch
