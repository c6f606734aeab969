"""``vpay-server merchants create|create-key|list|revoke-key``: merchant
accounts and their API keys.

``create --id M`` makes a new merchant and its first secret key, printed
once; on an id that exists it changes nothing and exits 1 naming
``create-key``, so a second live key is never issued by a repeated command.
``create-key --id M`` issues another key (a rotation: revoke the old one
with ``revoke-key`` once clients moved). A table by default, JSON with
``--json``. Exit codes: 0 done, 1 an unknown merchant or key, or a merchant
that exists already (nothing changed), 2 usage (a malformed id), 69
database unavailable, 78 configuration refused.
"""

from __future__ import annotations

import logging

import click

from vpay.cli.common import connect_db
from vpay.cli.errors import NotFound, Refused
from vpay.cli.output import emit, json_option

log = logging.getLogger("vpay.cli")

SHOWN_ONCE = "vpay: the api_key above is shown once; only its hash is stored."


@click.group()
def merchants() -> None:
    """Merchant accounts and their API secret keys."""


def _issue(conn, merchant_id: str, created: bool, as_json: bool) -> None:
    """Issue a key for ``merchant_id`` (in the caller's transaction), print it once, log it for the audit."""
    from vpay.money import merchants as accounts
    key_id, api_key = accounts.create_api_key(conn, merchant_id)
    log.info("api key issued", extra={"audit": True, "merchant": merchant_id, "key_id": key_id,
                                      "merchant_created": created})
    emit({"merchant": merchant_id, "created": created, "key_id": key_id, "api_key": api_key}, as_json)


@merchants.command("create")
@click.option("--id", "merchant_id", required=True, help="Merchant id: 1-64 letters, digits, '_', '-', '.'.")
@click.option("--name", default="", help="Display name.")
@json_option
def merchants_create(merchant_id: str, name: str, as_json: bool) -> None:
    """Create a merchant and its first secret key, printed once.

    Prints {"merchant", "created", "key_id", "api_key"}; only sha256 of the
    key is stored, so keep the printed key: it cannot be shown again. An id
    that exists is refused (exit 1): another key is ``merchants create-key``."""
    from vpay.money import merchants as accounts
    with connect_db() as conn:
        with conn.transaction():
            try:
                created = accounts.create_merchant(conn, merchant_id, name)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--id") from None
            if not created:
                raise Refused(f"merchant {merchant_id!r} exists, nothing changed; to issue it another key "
                              f"run vpay-server merchants create-key --id {merchant_id}")
            _issue(conn, merchant_id, True, as_json)
    click.echo(SHOWN_ONCE, err=True)


@merchants.command("create-key")
@click.option("--id", "merchant_id", required=True, help="The merchant's id.")
@json_option
def merchants_create_key(merchant_id: str, as_json: bool) -> None:
    """Issue another secret key for an existing merchant, printed once (a
    rotation: revoke the old one with revoke-key when clients have moved)."""
    from vpay.money.charges import MERCHANT
    if not MERCHANT.fullmatch(merchant_id):
        raise click.BadParameter("merchant id must be 1-64 letters, digits, '_', '-' or '.'", param_hint="--id")
    with connect_db() as conn:
        with conn.transaction():
            try:
                _issue(conn, merchant_id, False, as_json)
            except LookupError as exc:
                raise NotFound(str(exc)) from None
    click.echo(SHOWN_ONCE, err=True)


@merchants.command("list")
@json_option
def merchants_list(as_json: bool) -> None:
    """Every merchant with its keys' ids and dates (never a secret)."""
    from vpay.money import merchants as accounts
    with connect_db() as conn:
        rows = accounts.list_merchants(conn)
    if as_json:
        emit(rows, True)
        return
    table = [{"id": r["id"], "name": r["name"], "created_at": r["created_at"],
              "live_keys": ",".join(k["id"] for k in r["keys"] if not k.get("revoked_at")) or None,
              "revoked_keys": sum(1 for k in r["keys"] if k.get("revoked_at"))} for r in rows]
    emit(table, False, ("id", "name", "created_at", "live_keys", "revoked_keys"))


@merchants.command("revoke-key")
@click.argument("key_id")
@json_option
def merchants_revoke_key(key_id: str, as_json: bool) -> None:
    """Revoke a secret key by its id (key_...): requests with it get 401 from now on."""
    from vpay.money import merchants as accounts
    with connect_db() as conn:
        merchant_id = accounts.revoke_api_key(conn, key_id)
    if merchant_id is None:
        raise NotFound(f"no live key {key_id!r}")
    log.info("api key revoked", extra={"audit": True, "merchant": merchant_id, "key_id": key_id})
    doc = {"key_id": key_id, "merchant": merchant_id, "revoked": True}
    emit(doc, as_json)
