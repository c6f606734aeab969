"""``vpay-server migrate``: apply pending sql/ migrations."""

from __future__ import annotations

import json
import logging

import click

from vpay.cli.common import open_db

log = logging.getLogger("vpay.cli")


@click.command()
def migrate() -> None:
    """Apply pending sql/ migrations (idempotent; safe to run concurrently)."""
    from vpay.base.db import connect, migrate as run
    url, _ = open_db()
    with connect(url) as conn:
        applied = run(conn)
        sealed = _seal_plaintext(conn)
    log.info("migrated", extra={"applied": applied})
    click.echo(json.dumps({"applied": applied} | sealed))


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
