"""``vpay-server migrate``: apply pending sql/ migrations."""

from __future__ import annotations

import logging

import click

from vpay.cli.common import connect_db
from vpay.cli.output import emit, json_option

log = logging.getLogger("vpay.cli")


@click.command()
@json_option
def migrate(as_json: bool) -> None:
    """Apply pending sql/ migrations (idempotent; safe to run concurrently).
    Prints the migrations applied (none when the schema is current)."""
    from vpay.base.db import migrate as run
    with connect_db() as conn:
        applied = run(conn)
        sealed = _seal_plaintext(conn)
    log.info("migrated", extra={"applied": applied})
    if as_json:
        emit({"applied": applied} | sealed, True)
    else:
        emit([{"applied": name} for name in applied], False, ("applied",))
        for key, value in sealed.items():
            click.echo(f"{key.replace('_', ' ')}: {value}")


def _seal_plaintext(conn) -> dict:
    """Webhook secrets still in plaintext (written before 0018) are sealed
    now when ``VPAY_SECRET_KEYS`` is set; without it they are counted and
    left for ``vpay-server secrets rotate`` (docs/security.md, "Upgrading")."""
    from vpay.base import secretbox
    from vpay.base.db import ConfigError
    from vpay.webhooks import sealing
    left = sealing.plaintext_count(conn)
    if not left:
        return {}
    try:
        box = secretbox.default()
    except ConfigError:
        click.echo(f"vpay: {left} webhook endpoint(s) keep their secrets in plaintext: set "
                   f"{secretbox.KEYS_ENV} and run `vpay-server secrets rotate`", err=True)
        return {"plaintext_secrets": left}
    counts = sealing.rotate(conn, box, actor="vpay-server migrate")
    return {"sealed_secrets": counts["sealed_from_plaintext"]}
