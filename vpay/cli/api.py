"""``vpay-server api``: the HTTP API (rail callbacks, payment intents), served by
``vpay.api.server.serve`` (gunicorn's arbiter in process, waitress in each worker)."""

from __future__ import annotations

import logging
import os
import socket
import sys

import click

from vpay.cli.common import Duration, open_db, refuse
from vpay.cli.errors import Unavailable

log = logging.getLogger("vpay.cli")


def _host_port(bind: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``HOST:PORT`` / ``[V6]:PORT`` bind; None for
    what gunicorn takes that is not an address of ours (``unix:PATH``,
    ``fd://N``). Raises ``click.BadParameter`` for anything else: gunicorn
    would bind a default (an empty value is 127.0.0.1:8000) or fail with a
    traceback (a port past 65535)."""
    return _address(bind, "'--bind'")


def _address(bind: str, hint: str) -> tuple[str, int] | None:
    if bind.startswith(("unix:", "fd://")):
        return None
    host, sep, port = bind.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise click.BadParameter(f"{bind!r} is not HOST:PORT (port 0..65535), e.g. 127.0.0.1:8080",
                                 param_hint=hint)
    return host, int(port)


def _check_listen(host: str, port: int) -> None:
    """Exit 69 in one line when HOST:PORT cannot be listened on (busy, not an
    address of this host), as ``sandbox-rail`` does: gunicorn would retry for
    five seconds, log at error and exit 1, which systemd restarts for ever.
    The probe binds as gunicorn does (SO_REUSEADDR) and lets go at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise Unavailable(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


@click.command()
@click.option("--bind", default="127.0.0.1:8080", show_default=True,
              help="HOST:PORT to listen on (TLS: a terminating proxy or load balancer in front).")
@click.option("--workers", type=int, default=2, show_default=True, help="gunicorn worker processes.")
@click.option("--threads", type=int, default=4, show_default=True,
              help="Threads per worker (at most the per-worker pool size, 4).")
@click.option("--timeout", type=Duration(minimum=1, bare="s"), default="60s", show_default=True,
              help="gunicorn worker timeout (seconds, or 60s, 2m).")
def api(bind: str, workers: int, threads: int, timeout: float) -> None:
    """The HTTP API: rail callbacks and the merchant's payment intents.

    Safe to expose without a proxy: a request reaches a thread only once it
    has arrived whole, within VPAY_HTTP_HEADER_TIMEOUT_SECONDS and
    VPAY_HTTP_BODY_TIMEOUT_SECONDS, with at most
    VPAY_HTTP_MAX_CONNECTIONS_PER_ADDRESS connections per client address and
    worker (docs/security.md). GET /metrics: optionally VPAY_API_METRICS_TOKEN
    (bearer) and VPAY_API_METRICS_BIND (HOST:PORT of its own).

    Refuses to start (exit 78) on a configuration that cannot work: no rail of
    vpay.rails.KNOWN_RAILS configured (VPAY_MTN_*, VPAY_ORANGE_*, VPAY_MPESA_*, VPAY_PAWAPAY_*), no
    VPAY_SECRET_KEYS (the webhook endpoint routes seal new secrets), bad
    settings, or --threads above the pool size. Each rail that is not
    configured is logged at warning; its callbacks answer 404 and its payments
    422 payment_method_unavailable. The database is not contacted at start: /healthz answers 503 until it
    is reachable."""
    # The address first: a usage error touches nothing (no log, no metrics directory).
    listen = _host_port(bind)
    from vpay.base import logs
    logs.setup(stream=sys.stdout)  # a service: its log is stdout (journald), like the worker's
    from vpay.api.exposition import prepare
    prepare()  # before anything imports prometheus_client: GET /metrics sums every worker
    from vpay.rails import KNOWN_RAILS, build_rail
    from vpay.rails.port import RailError
    from vpay.base.settings import ConfigError, Settings
    from vpay.api.app import POOL_MAX, create_app
    from vpay.api.server import HttpLimits, serve
    from vpay.base.credentials import lookup

    if not 1 <= threads <= POOL_MAX or workers < 1 or timeout < 1:
        refuse(f"--threads must be 1..{POOL_MAX} (the per-worker pool), --workers and --timeout >= 1")
    metrics_bind = os.environ.get("VPAY_API_METRICS_BIND", "").strip() or None
    try:
        metrics_listen = _address(metrics_bind, "VPAY_API_METRICS_BIND") if metrics_bind else None
    except click.BadParameter as exc:
        refuse(exc.format_message())
    try:
        settings = Settings.from_env()
        # No body over the routes' own limit is buffered: waitress answers
        # the 413 (in the API's shape) as soon as the headers declare one.
        from dataclasses import replace
        from vpay.api.wire import MAX_BODY_BYTES
        limits = replace(HttpLimits.from_env(), body_bytes=MAX_BODY_BYTES)
        metrics_token = lookup("VPAY_API_METRICS_TOKEN")
        # Merchants register endpoints and rotate their secrets here
        # (/v1/webhook_endpoints): a new secret is sealed before it is stored.
        from vpay.base import secretbox
        secretbox.default()
    except ConfigError as exc:
        refuse(str(exc))
    configured, unconfigured = [], []
    for code in KNOWN_RAILS:
        try:
            build_rail(code)
            configured.append(code)
        except RailError as exc:
            unconfigured.append(str(exc))
            log.warning("rail not configured: its callbacks answer 404 and its payments 422",
                        extra={"rail": code, "error": str(exc)})
    if not configured:
        refuse("no rail is configured: " + "; ".join(unconfigured))
    if "mtn" in configured and not os.environ.get("VPAY_MTN_CALLBACK_URL"):
        log.warning("VPAY_MTN_CALLBACK_URL is not set: MoMo will send no callbacks "
                    "(payments still settle through the worker's polls)")
    url, _ = open_db()  # a URL only: each worker makes its own pool after the fork
    # At most half the threads of a process wait on a rail at once, each for
    # at most VPAY_API_RAIL_TIMEOUT_SECONDS: /healthz, callbacks and reads
    # always find a thread, however the rail behaves (docs/api.md).
    slots = max(1, threads // 2)

    def rail_for(code):
        return build_rail(code, total_timeout=settings.api_rail_timeout_seconds)

    def app_factory():
        app = create_app(url, rail_for, settings, submit_slots=slots)
        # rail_calls: the API's requests-to-pay on the console's timelines,
        # through this worker process's own pool (made after the fork)
        from vpay.rails.calls import database_recorder, set_recorder
        set_recorder(database_recorder(app.vpay_db))
        # a rail's 429/503 pause holds fleet-wide (rail_pauses), here too
        from vpay.rails.gate import share_pauses
        from vpay.rails.pauses import DatabasePauses
        share_pauses(DatabasePauses(app.vpay_db, f"api {socket.gethostname()}:{os.getpid()}"))
        return app

    if listen is not None:
        _check_listen(*listen)
    if metrics_listen is not None:
        _check_listen(*metrics_listen)
    binds = [bind] + ([metrics_bind] if metrics_bind else [])
    from vpay.api.wire import server_error_body
    from vpay.api.exposition import child_exit, with_metrics

    def wrap(app):
        return with_metrics(app, token=metrics_token, listener=1 if metrics_bind else None)

    serve(app_factory, bind=binds, workers=workers, threads=threads, timeout=max(1, round(timeout)), limits=limits,
          loglevel=logging.getLevelName(logging.getLogger().level).lower(), wrap=wrap,
          child_exit=child_exit, error_body=server_error_body)
