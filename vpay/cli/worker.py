"""``vpay-server worker`` / ``vpay-worker``: the reconciler worker.

Exit codes: 0 clean drain, 1 drain not clean (timed out, jobs whose outcome
could not be written were still leased, or the worker id taken over by
another process), 2 usage error, 78 configuration refused, 69 database
unreachable or metrics port unavailable at boot, 70 a claim loop crashed.
"""

from __future__ import annotations

import logging
import os
import socket
import sys

import click

from vpay import __version__
import vpay.money  # noqa: F401  (its lanes: --queues and the split read them)
from vpay.engine import lanes as _lanes  # the registry: --queues names what it holds
from vpay.base import logs
from vpay.cli.common import Duration, log_level, log_level_option, open_database, refuse
from vpay.cli.errors import Unavailable, _unavailable_line

log = logging.getLogger("vpay.cli")


@click.command()
@click.version_option(__version__, "--version", prog_name="vpay-worker", message="%(prog)s %(version)s")
@click.option("--worker-concurrency", type=int, default=4, show_default=True,
              help="Claim loops in this process (at most MAX_CONNECTIONS // 2 = 5).")
@click.option("--shutdown-grace-seconds", type=Duration(bare="s"), default="30s", show_default=True,
              help="After SIGTERM, how long in-flight jobs may take before their leases are released "
                   "(seconds, or with a unit: 30s, 2m).")
@click.option("--lease-seconds", type=Duration(minimum=0.001, bare="s"), default="300s", show_default=True,
              help="A lease older than this is reaped (RecoveryPolicy.lease; seconds, or 5m).")
@click.option("--idle-sleep", type=Duration(minimum=0.001, bare="s"), default="1s", show_default=True,
              help="How long a claim loop sleeps when nothing is due (seconds, or 1s, 0.5s).")
@click.option("--worker-id", default=None,
              help="Lease owner name: printable, no whitespace around it, at most 200 characters "
                   "(MAX_WORKER_ID_CHARS) [default: <hostname>:<pid>].")
@click.option("--queues", envvar="VPAY_WORKER_QUEUES", default=None, metavar="LANE,...",
              help=f"Lanes this worker claims from: {', '.join(_lanes.LANES)} "
                   "[env VPAY_WORKER_QUEUES; default: all].")
@click.option("--lane-concurrency", envvar="VPAY_WORKER_LANE_CONCURRENCY", default=None,
              metavar="LANE=N,...",
              help="Exact claim loops for some lanes, within --worker-concurrency; the other lanes "
                   "share the rest [env VPAY_WORKER_LANE_CONCURRENCY; default split: "
                   "docs/flows/reconciler.md, Lanes].")
@click.option("--party-share", envvar="VPAY_WORKER_PARTY_SHARE", default=None, metavar="FRACTION",
              help="The most of a lane's own loops one merchant's jobs may hold at once unless they "
                   "are known fast (above 0, at most 1) [env VPAY_WORKER_PARTY_SHARE; default 0.5; "
                   "docs/flows/reconciler.md, A fair share in time].")
@click.option("--lend/--no-lend", default=None,
              help="A loop whose own lanes have nothing due takes another lane's due job, one at a "
                   "time [env VPAY_WORKER_LEND=on|off; default on; docs/flows/reconciler.md, "
                   "Lending idle loops].")
@click.option("--metrics-port", type=int, default=None, envvar="VPAY_METRICS_PORT",
              help="Serve Prometheus metrics on this port (/metrics) [default: off; env VPAY_METRICS_PORT].")
@click.option("--metrics-bind", default="127.0.0.1", show_default=True, envvar="VPAY_METRICS_BIND",
              help="Address the metrics port listens on [env VPAY_METRICS_BIND].")
@log_level_option
@click.pass_context
def worker(ctx: click.Context, worker_concurrency: int, shutdown_grace_seconds: float,
           lease_seconds: float, idle_sleep: float, worker_id: str | None, queues: str | None,
           lane_concurrency: str | None, party_share: str | None, lend: bool | None,
           metrics_port: int | None, metrics_bind: str, level: str | None) -> None:
    """The reconciler worker: claims jobs, polls rails, drains on SIGTERM.

    Its --worker-concurrency claim loops are split among the lanes it serves
    (--queues), each lane with loops of its own; see vpay/lanes.py.

    Exit codes: 0 clean drain, 1 drain not clean (the grace ran out, jobs
    whose outcome could not be written were still leased, or the worker id
    was taken over by another process; the leases still held were handed
    back if the database answered, else they stay until reaped), 2 usage
    error, 78 configuration refused, 69 database unreachable or metrics port
    unavailable at boot, 70 a claim loop crashed (a bug; "anything else is a
    crash", and systemd restarts the worker)."""
    # vpay-worker: its own --log-level or VPAY_LOG_LEVEL; vpay-server worker:
    # the group's level unless this command's flag names one.
    logs.setup(log_level(level) if level or ctx.parent is None else None, stream=sys.stdout)
    if metrics_port is not None and not 1 <= metrics_port <= 65535:
        # the flag is a usage error (2); the same value from VPAY_METRICS_PORT is
        # the deployment's configuration, refused at boot (78)
        if ctx.get_parameter_source("metrics_port") is click.core.ParameterSource.ENVIRONMENT:
            refuse(f"--metrics-port {metrics_port} is not a TCP port (1..65535; from VPAY_METRICS_PORT)")
        raise click.BadParameter(f"{metrics_port} is not a TCP port (1..65535)", ctx,
                                 param_hint="'--metrics-port'")
    from vpay.base.db import MAX_CONNECTIONS
    # Refused before any database connection: a wrong flag must not touch the fleet.
    if not 1 <= worker_concurrency <= MAX_CONNECTIONS // 2:
        refuse(f"--worker-concurrency {worker_concurrency} is outside 1..{MAX_CONNECTIONS // 2} "
                f"(MAX_CONNECTIONS // 2); scale with more replicas instead")
    import math
    if not all(map(math.isfinite, (shutdown_grace_seconds, lease_seconds, idle_sleep))) \
            or shutdown_grace_seconds < 0 or lease_seconds <= 0 or idle_sleep <= 0:
        refuse("--shutdown-grace-seconds must be >= 0, --lease-seconds and --idle-sleep > 0, "
                "all finite numbers")
    from vpay.engine.workers import worker_id_problem
    if worker_id is not None and (problem := worker_id_problem(worker_id)):
        refuse(problem)
    from vpay.engine import lanes
    try:
        served = lanes.parse_queues(*_lane_setting(ctx, "queues", queues, "VPAY_WORKER_QUEUES"))
        overrides = lanes.parse_lane_concurrency(
            *_lane_setting(ctx, "lane_concurrency", lane_concurrency, "VPAY_WORKER_LANE_CONCURRENCY"))
        # Checked here with no rail taken as passive: a count that fits only
        # because a rail is unconfigured today must not break when it is set.
        lanes.split(worker_concurrency, served, overrides)
    except lanes.LaneError as exc:
        refuse(str(exc))
    from vpay.engine import timeshare
    try:
        share = timeshare.parse_party_share(
            *_lane_setting(ctx, "party_share", party_share, "VPAY_WORKER_PARTY_SHARE"))
        if lend is None:
            lend = timeshare.parse_lend(os.environ.get("VPAY_WORKER_LEND"), "VPAY_WORKER_LEND (env, for --lend)")
    except timeshare.TimeShareError as exc:
        refuse(str(exc))
    from vpay.handlers import Context
    from vpay.worker.loop import Worker, WorkerConfig
    from vpay.base.settings import ConfigError, Settings
    from vpay.worker.signals import ShutdownSignals

    signals = ShutdownSignals().install()  # before the pool: a TERM during boot still drains
    from vpay.rails import configured_rails
    from vpay.rails.port import RailError
    from vpay.webhooks import timeouts
    from vpay.engine.vacuum import every_from_env
    from vpay.engine.liveness import dead_after_from_env as listener_dead_after_from_env
    from vpay.engine.workers import dead_after_from_env
    from vpay.base import secretbox
    from vpay.base.db import prepared_statements, session_database_url
    try:
        # "" when unset (then the pool's URL); a URL that cannot be meant is
        # refused here, before any connection
        session_url = session_database_url("")
        settings = Settings.from_env()
        timeouts()
        rails = configured_rails()
        jobs_vacuum_every = every_from_env()
        listener_dead_after = listener_dead_after_from_env()
        dead_after = dead_after_from_env()  # VPAY_WORKER_DEAD_AFTER_SECONDS
        box = secretbox.default()  # webhook secrets are sealed under these keys
    except (ConfigError, RailError) as exc:
        refuse(str(exc))
    if not rails:
        log.warning("no rail is configured (VPAY_MTN_*, VPAY_ORANGE_*, VPAY_MPESA_*, VPAY_PAWAPAY_*): payment jobs will wait")
    wid = worker_id or f"{socket.gethostname()}:{os.getpid()}"
    collector = _serve_metrics(metrics_port, metrics_bind)
    import psycopg
    from psycopg_pool import PoolTimeout
    from vpay.base import pooling
    try:
        # The same bound and message as every command (VPAY_DATABASE_OPEN_TIMEOUT_SECONDS);
        # with prepared statements on, a transaction-pooling bouncer is refused there (78).
        # Each new connection reads whether the primary commits synchronously;
        # the first one and any change (a failover) are logged.
        from vpay.base.replication import CommitModeLog
        # Statements are prepared on their second run (vpay.base.db.PREPARE_AT_ONCE).
        url, pool = open_database(pool_size=MAX_CONNECTIONS, configure=CommitModeLog("worker"),
                                  prepare_at_once=True)
        try:
            # The listener and the vacuum need a session: a transaction-pooled
            # session URL would never deliver a wake-up (vpay/base/pooling.py).
            # Unset with prepared statements on, it is the URL just probed.
            if session_url or not prepared_statements():
                pooling.refuse_pooled_session(session_url or url, explicit=bool(session_url),
                                              needs=pooling.WORKER_SESSION_NEEDS)
        except BaseException:
            pool.close()
            raise
    except ConfigError as exc:
        refuse(str(exc))
    except (psycopg.OperationalError, PoolTimeout) as exc:
        # Not a drain (1) and not a refused configuration (78): systemd retries.
        line = _unavailable_line(exc)
        log.error("database unreachable at boot", extra={"error": line})
        for handler in logging.getLogger().handlers:
            handler.flush()
        # Like every other refusal: one ``vpay:`` line on stderr too.
        raise Unavailable(line) from None
    if collector is not None:
        collector.pool = pool
    from vpay.rails.calls import BatchedRecorder, set_recorder
    # rail_calls, the console's payment timelines: written in batches, not a
    # round trip per status read (issue 30); what is left is written at the end
    set_recorder(BatchedRecorder(pool))
    from vpay.rails.gate import share_pauses
    from vpay.rails.pauses import DatabasePauses
    share_pauses(DatabasePauses(pool, wid))  # a rail's 429/503 pause holds fleet-wide (rail_pauses)
    handler_ctx = Context(pool=pool, worker_id=wid, settings=settings, lease_seconds=lease_seconds)
    config = WorkerConfig(worker_id=wid, concurrency=worker_concurrency,
                          shutdown_grace=shutdown_grace_seconds, lease=lease_seconds,
                          idle_sleep=idle_sleep, queues=served, lane_concurrency=overrides,
                          passive=tuple(r for r in lanes.RAIL_LANES if r not in rails),
                          jobs_vacuum_every=jobs_vacuum_every, listener_dead_after=listener_dead_after,
                          session_url=session_url or url, dead_after=dead_after,
                          party_share=share, lend=lend)
    from vpay.engine import workers
    from vpay.handlers import ensure_scheduled
    from vpay.webhooks.sealing import check_keys, plaintext_count
    with pool.connection() as conn:
        try:
            workers.refuse_shared_id(conn, wid, host=socket.gethostname(), pid=os.getpid())
            unopened = check_keys(conn, box)  # wrong keys: refused here, not at every delivery
        except ConfigError as exc:
            pool.close()
            refuse(str(exc))
        if unopened:
            log.warning("webhook secrets that no configured key opens: these endpoints' deliveries "
                        "will fail until re-sealed (`vpay-server secrets rotate` with the old key "
                        "back) or rotated by the merchant", extra={"endpoints": unopened})
        if plaintext := plaintext_count(conn):
            log.warning("webhook secrets stored in plaintext: run `vpay-server secrets rotate`",
                        extra={"endpoints": plaintext})
        ensure_scheduled(conn)
    drain = Worker(pool, handler_ctx, config, signals).run()
    set_recorder(None)  # the rail calls still held are written (BatchedRecorder.close)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    if drain.value != 0:
        # Threads still inside handlers must not keep the process alive; their
        # later writes would be fenced anyway (the leases were released).
        os._exit(drain.value)
    pool.close()
    sys.exit(drain.value)


def _lane_setting(ctx: click.Context, name: str, value: str | None, envvar: str) -> tuple[str | None, str]:
    """``(value, source)`` of a worker option read by ``vpay.engine.lanes``
    or ``vpay.engine.timeshare`` (lanes, loop counts, the party share):
    ``source`` is the flag, or ``ENVVAR (--flag)`` when the value came from
    the environment, so a refusal names what the operator must fix. click
    treats a variable set to ``""`` as unset; it is passed on as ``""`` here
    so the parser decides (the lanes refuse it; the party share reads it as
    its default, like every blank numeric setting)."""
    flag = "--" + name.replace("_", "-")
    source = ctx.get_parameter_source(name)
    if source is click.core.ParameterSource.ENVIRONMENT:
        return value, f"{envvar} (env, for {flag})"
    if value is None and envvar in os.environ:
        return os.environ[envvar], f"{envvar} (env, for {flag})"
    return value, flag


def _serve_metrics(port: int | None, bind: str):
    """Start the metrics server (``vpay.base.metrics.serve``) before the pool, so a
    port that cannot be had (busy, or an address not on this host) ends the
    boot without touching the database: ``Unavailable``, exit 69, like every
    port that cannot be had (``sandbox-rail``, ``api``; vpay/cli/errors.py).
    Answers the database collector to attach the pool to, or ``None`` when
    metrics are off."""
    if port is None:
        return None
    from vpay.base import metrics
    from vpay.engine import lanes
    from vpay.money.gauges import DatabaseCollector
    collector = DatabaseCollector(lanes=lanes.LANES)
    try:
        metrics.serve(port, bind, collector)
    except OSError as exc:
        raise Unavailable(f"cannot serve metrics on {bind}:{port}: {exc.strerror or exc}") from None
    log.info("metrics served", extra={"metrics_url": f"http://{bind}:{port}/metrics"})
    return collector
