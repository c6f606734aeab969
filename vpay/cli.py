"""``vpay-server`` (a click group) and ``vpay-worker`` (= ``vpay-server worker``).

Names, flags and exit codes are the contract's: 0 clean drain, 1 timed-out
drain, 2 usage error, 78 configuration refused (EX_CONFIG).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys

import click

from . import logs

EX_CONFIG = 78
EX_UNAVAILABLE = 69
log = logging.getLogger("vpay.cli")


def _refuse(message: str) -> None:
    """One clear line, then exit 78: systemd will not restart a refused config
    (RestartPreventExitStatus=78)."""
    click.echo(f"vpay: configuration refused: {message}", err=True)
    sys.exit(EX_CONFIG)


def _open_db(pool_size: int | None = None):
    from .db import ConfigError, database_url, make_pool
    try:
        url = database_url()
    except ConfigError as exc:
        _refuse(str(exc))
    if pool_size is None:
        return url, None
    return url, make_pool(url, max_size=pool_size)


@click.group()
@click.option("--log-level", default=lambda: os.environ.get("VPAY_LOG_LEVEL", "INFO"),
              show_default="INFO", help="Python log level for the JSON log on stdout.")
def main(log_level: str) -> None:
    """vpay-reconciler: decides how mobile-money payments end."""
    logs.setup(log_level.upper())


@main.command()
def migrate() -> None:
    """Apply pending sql/ migrations (idempotent; safe to run concurrently)."""
    from .db import connect, migrate as run
    url, _ = _open_db()
    with connect(url) as conn:
        applied = run(conn)
    log.info("migrated", extra={"applied": applied})
    click.echo(json.dumps({"applied": applied}))


@main.command()
@click.option("--worker-concurrency", type=int, default=4, show_default=True,
              help="Claim loops in this process (at most MAX_CONNECTIONS // 2 = 5).")
@click.option("--shutdown-grace-seconds", type=float, default=30.0, show_default=True,
              help="After SIGTERM, how long in-flight jobs may take before their leases are released.")
@click.option("--lease-seconds", type=float, default=300.0, show_default=True,
              help="A lease older than this is reaped (RecoveryPolicy.lease).")
@click.option("--idle-sleep", type=float, default=1.0, show_default=True,
              help="Seconds a claim loop sleeps when nothing is due.")
@click.option("--worker-id", default=None, help="Lease owner name [default: <hostname>:<pid>].")
def worker(worker_concurrency: int, shutdown_grace_seconds: float, lease_seconds: float,
           idle_sleep: float, worker_id: str | None) -> None:
    """The reconciler worker: claims jobs, polls rails, drains on SIGTERM.

    Exit codes: 0 clean drain, 1 timed-out drain (leases released), 2 usage
    error, 78 configuration refused, 69 database unreachable at boot, 70 a
    claim loop crashed (a bug; "anything else is a crash", and systemd
    restarts the worker)."""
    logs.setup(stream=sys.stdout)
    from .db import MAX_CONNECTIONS
    # Refused before any database connection: a wrong flag must not touch the fleet.
    if not 1 <= worker_concurrency <= MAX_CONNECTIONS // 2:
        _refuse(f"--worker-concurrency {worker_concurrency} is outside 1..{MAX_CONNECTIONS // 2} "
                f"(MAX_CONNECTIONS // 2); scale with more replicas instead")
    import math
    if not all(map(math.isfinite, (shutdown_grace_seconds, lease_seconds, idle_sleep))) \
            or shutdown_grace_seconds < 0 or lease_seconds <= 0 or idle_sleep <= 0:
        _refuse("--shutdown-grace-seconds must be >= 0, --lease-seconds and --idle-sleep > 0, "
                "all finite numbers")
    from .handlers import Context
    from .loop import Worker, WorkerConfig
    from .settings import ConfigError, Settings
    from .signals import ShutdownSignals

    signals = ShutdownSignals().install()  # before the pool: a TERM during boot still drains
    from .rails import configured_rails
    from .rails.port import RailError
    from .webhooks import timeouts
    try:
        settings = Settings.from_env()
        timeouts()
        rails = configured_rails()
    except (ConfigError, RailError) as exc:
        _refuse(str(exc))
    if not rails:
        log.warning("no rail is configured (VPAY_MTN_*, VPAY_ORANGE_*): payment jobs will wait")
    wid = worker_id or f"{socket.gethostname()}:{os.getpid()}"
    from psycopg_pool import PoolTimeout
    try:
        _, pool = _open_db(pool_size=MAX_CONNECTIONS)
    except PoolTimeout as exc:
        # Not a drain (1) and not a refused configuration (78): systemd retries.
        log.error("database unreachable at boot", extra={"error": str(exc)[:300]})
        sys.exit(EX_UNAVAILABLE)
    ctx = Context(pool=pool, worker_id=wid, settings=settings, lease_seconds=lease_seconds)
    config = WorkerConfig(worker_id=wid, concurrency=worker_concurrency,
                          shutdown_grace=shutdown_grace_seconds, lease=lease_seconds,
                          idle_sleep=idle_sleep)
    from .handlers import ensure_scheduled
    with pool.connection() as conn:
        ensure_scheduled(conn)
    drain = Worker(pool, ctx, config, signals).run()
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    if drain.value != 0:
        # Threads still inside handlers must not keep the process alive; their
        # later writes would be fenced anyway (the leases were released).
        os._exit(drain.value)
    pool.close()
    sys.exit(drain.value)



@main.group()
def payments() -> None:
    """Start and inspect payments from a shell (JSON out)."""


@payments.command("create")
@click.option("--merchant", required=True, help="Merchant id.")
@click.option("--amount", required=True, type=int, help="Amount in minor units (e.g. 1050 = 10.50 EUR).")
@click.option("--currency", required=True, help="ISO 4217 code, e.g. EUR, XAF, UGX.")
@click.option("--rail", default="mtn", show_default=True, help="Rail code.")
@click.option("--payer", required=True, help="Payer MSISDN, international form, digits only.")
@click.option("--description", default=None, help="Shown to the payer (at most 160 characters).")
def payments_create(merchant, amount, currency, rail, payer, description) -> None:
    """Create and confirm a payment as the API would; print {payment_intent, charge}."""
    from .db import make_pool
    from .money import InvalidPayment
    from .payments import create_and_submit
    from .rails import build_rail
    from .rails.port import RailError
    from .settings import ConfigError, Settings
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        _refuse(str(exc))
    url, _ = _open_db()
    pool = make_pool(url, max_size=2)
    try:
        result = create_and_submit(pool, build_rail, merchant_id=merchant, amount=amount,
                                   currency=currency, rail=rail, payer=payer,
                                   description=description,
                                   prompt_ttl_seconds=settings.prompt_ttl_seconds)
    except InvalidPayment as exc:
        raise click.BadParameter(str(exc), param_hint=f"--{exc.param}") from None
    except RailError as exc:
        _refuse(str(exc))
    finally:
        pool.close()
    click.echo(json.dumps(result, indent=2))


@payments.command("show")
@click.argument("some_id")
def payments_show(some_id: str) -> None:
    """An intent (pi_...) or a charge (ch_...) with its events, as JSON."""
    from .db import connect
    from .money import show
    url, _ = _open_db()
    with connect(url) as conn:
        found = show(conn, some_id)
    if found is None:
        click.echo(f"vpay: no payment intent or charge {some_id!r}", err=True)
        sys.exit(1)
    click.echo(json.dumps(found, indent=2))


@main.command("sandbox-rail")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8090, show_default=True, type=int)
@click.option("--success-after-seconds", default=3.0, show_default=True, type=float,
              help="Payers outside MTN's failure numbers succeed this long after the request-to-pay.")
def sandbox_rail(host: str, port: int, success_after_seconds: float) -> None:
    """A local HTTP server speaking the MTN MoMo Collection API (demos and tests).

    Credentials it accepts are those of VPAY_MTN_SUBSCRIPTION_KEY, VPAY_MTN_API_USER,
    VPAY_MTN_API_KEY (defaults: the sandbox's own)."""
    import signal as _signal
    from .rails.sandbox import SandboxRail
    kwargs = {k: v for k, v in {
        "subscription_key": os.environ.get("VPAY_MTN_SUBSCRIPTION_KEY"),
        "api_user": os.environ.get("VPAY_MTN_API_USER"),
        "api_key": os.environ.get("VPAY_MTN_API_KEY"),
    }.items() if v}
    rail = SandboxRail(host, port, success_after_seconds=success_after_seconds, **kwargs)

    def _stop(signum, frame):
        raise KeyboardInterrupt

    _signal.signal(_signal.SIGTERM, _stop)
    log.info("sandbox rail listening", extra={"url": rail.url})
    click.echo(json.dumps({"url": rail.url}), err=True)
    try:
        rail.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        rail.stop()



@main.command()
@click.option("--deadline-seconds", default=150.0, show_default=True, type=float,
              help="Stop waiting for the batch to settle after this long.")
def demo(deadline_seconds: float) -> None:
    """The main job on the embedded default: sandbox rail, worker, a batch of payments."""
    from .demo import run
    sys.exit(run(deadline_seconds=deadline_seconds))

def worker_main() -> None:
    """Entry point of ``vpay-worker``: ``vpay-server worker`` under its own name."""
    logs.setup(os.environ.get("VPAY_LOG_LEVEL", "INFO").upper(), sys.stdout)
    worker.main(prog_name="vpay-worker")


# Feature command groups register themselves here, one line each.
from .webhooks_cli import webhooks  # noqa: E402
main.add_command(webhooks)
from .api.commands import api, merchants  # noqa: E402
main.add_command(api)
main.add_command(merchants)
from .refunds_cli import refunds  # noqa: E402
main.add_command(refunds)
