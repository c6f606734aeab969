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
    log.info("migrated", extra={"applied": applied})
    if as_json:
        emit({"applied": applied}, True)
    else:
        emit([{"applied": name} for name in applied], False, ("applied",))
