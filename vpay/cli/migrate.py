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
    log.info("migrated", extra={"applied": applied})
    click.echo(json.dumps({"applied": applied}))
