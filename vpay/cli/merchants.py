"""``vpay-server merchants create|list|revoke-key``: merchant accounts and API keys (JSON out)."""

from __future__ import annotations

import json
import logging
import sys

import click

from vpay.cli.common import open_db

log = logging.getLogger("vpay.cli")


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
    from vpay.money import merchants as accounts
    from vpay.base.db import connect
    url, _ = open_db()
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
    from vpay.money import merchants as accounts
    from vpay.base.db import connect
    url, _ = open_db()
    with connect(url) as conn:
        click.echo(json.dumps(accounts.list_merchants(conn), indent=2))


@merchants.command("revoke-key")
@click.argument("key_id")
def merchants_revoke_key(key_id: str) -> None:
    """Revoke a secret key by its id (key_...): requests with it get 401 from now on."""
    from vpay.money import merchants as accounts
    from vpay.base.db import connect
    url, _ = open_db()
    with connect(url) as conn:
        merchant_id = accounts.revoke_api_key(conn, key_id)
    if merchant_id is None:
        click.echo(f"vpay: no live key {key_id!r}", err=True)
        sys.exit(1)
    log.info("api key revoked", extra={"merchant": merchant_id, "key_id": key_id})
    click.echo(json.dumps({"key_id": key_id, "merchant": merchant_id, "revoked": True}))
