"""gunicorn, in process: ``vpay-server api`` runs the arbiter itself
(``gunicorn.app.base.BaseApplication``), not as a child, so that under
``systemd/vpay-api.service`` (Type=notify, NotifyAccess=main) the arbiter's
own ``READY=1`` comes from the main process.

Workers are ``gthread``; the app is loaded in each worker after the fork and
makes its connection pool on first use there (psycopg_pool: never across a
fork), closing it when the worker exits. gunicorn's own log lines go through
Python logging, so they come out as vpay's JSON lines on stdout.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import falcon
from gunicorn import glogging
from gunicorn.app.base import BaseApplication

log = logging.getLogger("vpay.api.server")


class JsonLogger(glogging.Logger):
    """gunicorn's error log through the root logger (``vpay.base.logs`` JSON);
    gunicorn's access log stays off (``vpay.api.access`` logs each request)."""

    def setup(self, cfg) -> None:
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True


class ApiServer(BaseApplication):
    """``ApiServer(app_factory, options).run()``: ``app_factory()`` builds the
    Falcon app (called in each worker); ``options`` are gunicorn settings
    (``bind``, ``workers``, ``threads``, ...). Blocks until the arbiter
    stops; exits the process like gunicorn does."""

    def __init__(self, app_factory: Callable[[], falcon.App], options: dict[str, Any],
                 metrics: bool = False):
        self.app_factory = app_factory
        self.options = options
        # GET /metrics across the workers (vpay.api.exposition); needs prepare() first.
        self.metrics = metrics
        self.app: falcon.App | None = None
        super().__init__(prog="vpay-server api")

    def load_config(self) -> None:
        defaults = {
            "worker_class": "gthread",
            "logger_class": JsonLogger,
            "proc_name": "vpay-api",
            # gunicorn >= 25 opens a control socket under $HOME by default:
            # shared between instances, and $HOME is read-only under the unit.
            "control_socket_disable": True,
            "when_ready": _when_ready,
            "worker_exit": self._worker_exit,
        }
        if self.metrics:
            from vpay.api.exposition import child_exit
            defaults["child_exit"] = child_exit
        for key, value in (defaults | self.options).items():
            self.cfg.set(key, value)

    def load(self):
        self.app = self.app_factory()
        self.app.vpay_db.warm()
        if self.metrics:
            from vpay.api.exposition import with_metrics
            return with_metrics(self.app)
        return self.app

    def _worker_exit(self, server, worker) -> None:
        if self.app is not None:
            self.app.vpay_db.close()


def _when_ready(server) -> None:
    log.info("api ready", extra={"bind": [str(s) for s in server.LISTENERS], "pid": server.pid,
                                 "workers": server.num_workers})
