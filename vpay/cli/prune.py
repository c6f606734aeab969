"""``vpay-server prune --older-than 90d [--dry-run]``: retention by hand.

Deletes what finished longer ago than ``--older-than`` (a duration with its
unit: ``90d``, ``36h``; a bare ``24`` is refused: hours, days or seconds?):
events with no delivery pending, finished webhook deliveries, acknowledged
alerts and dead letters; never what a pending or unresolved charge or refund
needs (``vpay.money.operator.prune``). The hourly sweep does the same with
``VPAY_RETENTION_DAYS``. Prints the counts (a table, JSON with ``--json``).
Exit codes: 0 done, 2 usage, 69 database unavailable, 78 configuration
refused.
"""

from __future__ import annotations

import logging

import click

from vpay.base.settings import MAX_RETENTION_DAYS
from vpay.cli.common import Duration, connect_db, format_duration
from vpay.cli.output import emit, json_option

log = logging.getLogger("vpay.cli")


@click.command()
@click.option("--older-than", "older_than", required=True,
              type=Duration(minimum=3600, maximum=MAX_RETENTION_DAYS * 86400),
              help="How long ago the row finished (an event's creation, a delivery's last attempt, "
                   "an alert's acknowledgement, a job's dead-lettering): 90d, 36h; at least 1h.")
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
@json_option
def prune(older_than: float, dry_run: bool, as_json: bool) -> None:
    """Delete finished rows older than --older-than (nothing a live payment needs)."""
    from vpay.money.operator import prune as run
    days = older_than / 86400
    with connect_db() as conn:
        counts = run(conn, days, apply=not dry_run)
    log.info("pruned" if not dry_run else "prune dry run",
             extra={"audit": not dry_run, "older_than_days": days, **counts})
    doc = {"dry_run": dry_run, "older_than": format_duration(older_than), "older_than_days": days, **counts}
    if as_json:
        emit(doc, True)
    else:
        emit([{"table": name, "would_delete" if dry_run else "deleted": n} for name, n in counts.items()],
             False)
