"""The WSGI app: one Falcon app for rail callbacks and the merchant API.

``create_app(database_url, rail_for, settings)`` builds it without touching
the database: the connection pool is made on first use, in the process that
uses it (psycopg_pool docs: never across a fork), so gunicorn can load the
app in its arbiter or in each worker alike. Routes:

    POST|PUT /provider/{code}/callback   callbacks.CallbackResource (hints only)
    POST|GET /v1/payment_intents         intents.IntentsResource (create; list)
    GET      /v1/payment_intents/{id}    intents.IntentResource
    POST|GET /v1/refunds                 refunds.RefundsResource (create; list)
    GET      /v1/refunds/{id}            refunds.RefundResource
    GET      /v1/events                  events.EventsResource (list)
    GET      /v1/events/{id}             events.EventResource
    POST|GET /v1/webhook_endpoints       webhook_endpoints.EndpointsResource
    GET|DELETE /v1/webhook_endpoints/{id}            webhook_endpoints.EndpointResource
    POST     /v1/webhook_endpoints/{id}/rotate_secret webhook_endpoints.RotateSecretResource
    GET      /healthz                    200 when the database answers, else 503
    GET      /openapi.json               the OpenAPI 3.1 document (openapi.DOCUMENT)
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import falcon
import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from vpay.base import metrics
from vpay.rails.port import Rail
from vpay.base.settings import Settings
from vpay.api import errors
from vpay.api.auth import MerchantAuth
from vpay.api.wire import answer

log = logging.getLogger("vpay.api")
access_log = logging.getLogger("vpay.api.access")

POOL_MAX = 4
"""Connections per gunicorn worker process. Each request holds at most one
at a time, so ``--threads`` up to this never waits on the pool."""

WARM_WAIT_SECONDS = 2.0
"""How long a gunicorn worker waits, after the fork and before it accepts
requests, for its standing connection to reach the pool. Past it the worker
starts anyway (Postgres is down: /healthz answers 503), so a down database
delays each worker's start by at most this. The pool's own thread tries to
connect for ``vpay.base.db.make_pool``'s 10 s reconnect timeout, then gives up
until a request asks: the first request after a longer outage opens the
connection itself (a probe answers 503 until Postgres is back)."""

_WARM_POLL_SECONDS = 0.005


class Database:
    """The per-process pool, made lazily. ``connection()`` yields an
    autocommit connection or raises ``ApiError`` 503 after ``timeout``
    seconds when the database does not answer."""

    def __init__(self, url: str, *, max_size: int = POOL_MAX, timeout: float = 5.0):
        self.url = url
        self.max_size = max_size
        self.timeout = timeout
        self._pool: ConnectionPool | None = None
        self._lock = threading.Lock()

    def pool(self) -> ConnectionPool:
        """The pool, created on first call. Opening never waits for the
        database (the pool's thread opens its one standing connection), so a
        process started while Postgres is down still serves /healthz (503)
        and recovers when it is back: within the pool's 10 s reconnect
        timeout on its own, later on the first request that asks."""
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    from vpay.base.db import make_pool
                    from vpay.base.replication import CommitModeLog
                    # The commit mode is logged by the first connection, and
                    # again when a failover changes it.
                    self._pool = make_pool(self.url, max_size=self.max_size, min_size=1,
                                           configure=CommitModeLog("api"),
                                           name="vpay-api", timeout=self.timeout, wait=False)
        return self._pool

    def warm(self, wait: float = WARM_WAIT_SECONDS) -> bool:
        """Create the pool now (each gunicorn worker, after the fork) and wait
        up to ``wait`` seconds for its standing connection to be ready in it;
        answer whether it is. A load balancer's first /healthz then neither
        pays for a new connection nor, by arriving while the first one is
        still connecting, makes the pool grow a second one. Never raises: a
        database that is down costs the wait, not the start."""
        pool = self.pool()
        # Not pool.wait(): on its timeout it closes the pool, and a worker
        # started while Postgres is down must keep a pool that recovers.
        # Not a checkout either: a checkout that finds no ready connection
        # asks the pool to grow.
        deadline = time.monotonic() + wait
        while pool.get_stats().get("pool_available", 0) < 1:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_WARM_POLL_SECONDS)
        return True

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection]:
        try:
            with self.pool().connection(timeout=self.timeout if timeout is None else timeout) as conn:
                yield conn
        except PoolTimeout:
            log.warning("database unavailable: no connection within the timeout")
            raise errors.unavailable() from None

    def ping(self, timeout: float) -> bool:
        """Whether the database answers ``SELECT 1`` within about ``timeout`` s."""
        try:
            with self.pool().connection(timeout=timeout) as conn:
                conn.execute("SELECT 1").fetchone()
            return True
        except (PoolTimeout, psycopg.Error):
            return False

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


class Rails:
    """Rail adapters by code, built on first use and shared by threads."""

    def __init__(self, factory: Callable[[str], Rail]):
        self._factory = factory
        self._rails: dict[str, Rail] = {}
        self._lock = threading.Lock()

    def __call__(self, code: str) -> Rail:
        with self._lock:
            if code not in self._rails:
                self._rails[code] = self._factory(code)
            return self._rails[code]


class Health:
    def __init__(self, db: Database):
        self.db = db

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self.db.ping(timeout=2.0):
            answer(resp, 200, {"status": "ok", "database": "ok"})
        else:
            answer(resp, 503, {"status": "unavailable", "database": "unreachable"},
                   {"Retry-After": "1"})


class OpenApi:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        from vpay.api.openapi import DOCUMENT
        answer(resp, 200, DOCUMENT)


class AccessLog:
    """One JSON line per request: method, route template (never the query
    string or a header), status, milliseconds."""

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.started = time.monotonic()

    def process_response(self, req, resp, resource, req_succeeded) -> None:
        started = getattr(req.context, "started", None)
        access_log.info("request", extra={
            "method": req.method, "route": req.uri_template or "(no route)",
            "status": resp.status_code,
            "ms": round((time.monotonic() - started) * 1000, 1) if started else None})
        metrics.api_request(req.method, req.uri_template, resp.status_code,
                            time.monotonic() - started if started else 0.0)


def _on_database_error(req, resp, exc, params) -> None:
    log.error("database error", extra={"error": type(exc).__name__, "route": req.uri_template})
    raise errors.unavailable()


def _on_unexpected(req, resp, exc, params) -> None:
    if isinstance(exc, falcon.HTTPError):  # ours and Falcon's: the serializer answers
        raise exc
    log.error("unhandled error", exc_info=exc, extra={"route": req.uri_template})
    raise errors.internal()


class ApiApp(falcon.App):
    """``falcon.App`` with the process's ``Database`` as ``vpay_db``."""

    vpay_db: Database


def create_app(database_url: str, rail_for: Callable[[str], Rail], settings: Settings | None = None,
               *, db_timeout: float = 5.0, submit_slots: int | None = None) -> ApiApp:
    """The app. ``rail_for(code)`` builds a rail adapter (``vpay.rails.build_rail``
    in production); it is called at most once per code. ``app.vpay_db`` is
    the ``Database`` (``close()`` it when done). ``submit_slots``: how many
    requests of this process may wait on a rail at once (None: no limit);
    the others leave the request-to-pay to the worker, so health checks,
    callbacks and reads always find a free thread."""
    from vpay.api.callbacks import CallbackResource
    from vpay.api.events import EventResource, EventsResource
    from vpay.api.intents import IntentResource, IntentsResource
    from vpay.api.refunds import RefundResource, RefundsResource
    from vpay.api.webhook_endpoints import EndpointResource, EndpointsResource, RotateSecretResource

    db = Database(database_url, timeout=db_timeout)
    rails = Rails(rail_for)
    settings = settings or Settings()
    app = ApiApp(middleware=[AccessLog(), MerchantAuth(db)])
    app.req_options.strip_url_path_trailing_slash = False
    app.set_error_serializer(errors.serialize)
    app.add_error_handler(Exception, _on_unexpected)
    app.add_error_handler(psycopg.OperationalError, _on_database_error)

    slots = threading.BoundedSemaphore(submit_slots) if submit_slots else None
    routes = {
        "/provider/{code}/callback": CallbackResource(db, rails),
        "/v1/payment_intents": IntentsResource(db, rails, settings, slots),
        "/v1/payment_intents/{intent_id}": IntentResource(db),
        "/v1/refunds": RefundsResource(db, rails),
        "/v1/refunds/{refund_id}": RefundResource(db),
        "/v1/events": EventsResource(db, settings.retention_days),
        "/v1/events/{event_id}": EventResource(db),
        "/v1/webhook_endpoints": EndpointsResource(db),
        "/v1/webhook_endpoints/{endpoint_id}": EndpointResource(db),
        "/v1/webhook_endpoints/{endpoint_id}/rotate_secret": RotateSecretResource(db),
        "/healthz": Health(db),
        "/openapi.json": OpenApi(),
    }
    for template, resource in routes.items():
        app.add_route(template, resource)
    metrics.set_api_routes(routes)  # the route label's fixed set
    app.vpay_db = db
    return app
