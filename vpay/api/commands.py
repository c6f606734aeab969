"""``vpay-server api`` and ``vpay-server merchants …`` (registered in vpay/cli.py)."""

from __future__ import annotations

import json
import logging
import os
import sys

import click

log = logging.getLogger("vpay.api.commands")


@click.command()
@click.option("--bind", default="127.0.0.1:8080", show_default=True,
              help="HOST:PORT to listen on (loopback: a reverse proxy terminates TLS).")
@click.option("--workers", type=int, default=2, show_default=True, help="gunicorn worker processes.")
@click.option("--threads", type=int, default=4, show_default=True,
              help="Threads per worker (at most the per-worker pool size, 4).")
@click.option("--timeout", type=int, default=60, show_default=True,
              help="gunicorn worker timeout, seconds.")
def api(bind: str, workers: int, threads: int, timeout: int) -> None:
    """The HTTP API: rail callbacks and the merchant's payment intents (gunicorn, in process).

    Refuses to start (exit 78) on a configuration that cannot work: no rail of
    vpay.rails.KNOWN_RAILS configured (VPAY_MTN_*, VPAY_ORANGE_*), bad
    settings, or --threads above the pool size. Each rail that is not
    configured is logged at warning; its callbacks answer 404 and its payments
    503. The database is not contacted at start: /healthz answers 503 until it
    is reachable."""
    from .. import logs
    from ..cli import _open_db, _refuse
    from ..rails import KNOWN_RAILS, build_rail
    from ..rails.port import RailError
    from ..settings import ConfigError, Settings
    from .app import POOL_MAX, create_app
    from .server import ApiServer

    logs.setup(stream=sys.stdout)  # a service: its log is stdout (journald), like the worker's
    if not 1 <= threads <= POOL_MAX or workers < 1 or timeout < 1:
        _refuse(f"--threads must be 1..{POOL_MAX} (the per-worker pool), --workers and --timeout >= 1")
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        _refuse(str(exc))
    configured, unconfigured = [], []
    for code in KNOWN_RAILS:
        try:
            build_rail(code)
            configured.append(code)
        except RailError as exc:
            unconfigured.append(str(exc))
            log.warning("rail not configured: its callbacks answer 404 and its payments 503",
                        extra={"rail": code, "error": str(exc)})
    if not configured:
        _refuse("no rail is configured: " + "; ".join(unconfigured))
    if "mtn" in configured and not os.environ.get("VPAY_MTN_CALLBACK_URL"):
        log.warning("VPAY_MTN_CALLBACK_URL is not set: MoMo will send no callbacks "
                    "(payments still settle through the worker's polls)")
    url, _ = _open_db()  # a URL only: each worker makes its own pool after the fork

    def app_factory():
        return create_app(url, build_rail, settings)

    ApiServer(app_factory, {"bind": [bind], "workers": workers, "threads": threads,
                            "timeout": timeout,
                            "loglevel": logging.getLevelName(logging.getLogger().level).lower()}).run()


@click.group()
def merchants() -> None:
    """Merchant accounts and their API secret keys (JSON out)."""


@merchants.command("create")
@click.option("--id", "merchant_id", required=True, help="Merchant id: 1-64 letters, digits, '_', '-', '.'.")
@click.option("--name", default="", help="Display name (when the merchant is new).")
def merchants_create(merchant_id: str, name: str) -> None:
    """Create the merchant if needed and issue a new secret key, printed once.

    Prints {"merchant", "created", "key_id", "api_key"}; only sha256 of the
    key is stored, so keep the printed key: it cannot be shown again."""
    from .. import merchants as accounts
    from ..cli import _open_db
    from ..db import connect
    url, _ = _open_db()
    with connect(url) as conn, conn.transaction():
        try:
            created = accounts.create_merchant(conn, merchant_id, name)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--id") from None
        key_id, api_key = accounts.create_api_key(conn, merchant_id)
    log.info("api key issued", extra={"merchant": merchant_id, "key_id": key_id,
                                      "merchant_created": created})
    click.echo(json.dumps({"merchant": merchant_id, "created": created, "key_id": key_id,
                           "api_key": api_key}))
    click.echo("vpay: the api_key above is shown once; only its hash is stored.", err=True)


@merchants.command("list")
def merchants_list() -> None:
    """Every merchant with its keys' ids and dates (never a secret)."""
    from .. import merchants as accounts
    from ..cli import _open_db
    from ..db import connect
    url, _ = _open_db()
    with connect(url) as conn:
        click.echo(json.dumps(accounts.list_merchants(conn), indent=2))


@merchants.command("revoke-key")
@click.argument("key_id")
def merchants_revoke_key(key_id: str) -> None:
    """Revoke a secret key by its id (key_...): requests with it get 401 from now on."""
    from .. import merchants as accounts
    from ..cli import _open_db
    from ..db import connect
    url, _ = _open_db()
    with connect(url) as conn:
        merchant_id = accounts.revoke_api_key(conn, key_id)
    if merchant_id is None:
        click.echo(f"vpay: no live key {key_id!r}", err=True)
        sys.exit(1)
    log.info("api key revoked", extra={"merchant": merchant_id, "key_id": key_id})
    click.echo(json.dumps({"key_id": key_id, "merchant": merchant_id, "revoked": True}))
