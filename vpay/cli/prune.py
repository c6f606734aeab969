"""``vpay-server prune --older-than DAYS [--dry-run]``: retention by hand.

Deletes what finished more than DAYS days ago: events with no delivery
pending, finished webhook deliveries, acknowledged alerts and dead letters;
never what a pending or unresolved charge or refund needs (``vpay.money.operator.prune``).
The hourly sweep does the same with ``VPAY_RETENTION_DAYS``. Prints the
counts (JSON with ``--json``). Exit codes: 0 done, 2 usage, 69 database
unavailable, 78 configuration refused.
"""

from __future__ import annotations

import logging

import click

from vpay.base.settings import MAX_RETENTION_DAYS
from vpay.cli.common import connect_db, echo_json

log = logging.getLogger("vpay.cli")


@click.command()
@click.option("--older-than", "days", required=True, type=click.IntRange(min=1, max=MAX_RETENTION_DAYS),
              help="Days since the row finished (an event's creation, a delivery's last "
                   "attempt, an alert's acknowledgement, a job's dead-lettering).")
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of text.")
def prune(days: int, dry_run: bool, as_json: bool) -> None:
    """Delete finished rows older than DAYS days (nothing a live payment needs)."""
    from vpay.money.operator import prune as run
    with connect_db() as conn:
        counts = run(conn, days, apply=not dry_run)
    log.info("pruned" if not dry_run else "prune dry run", extra={"older_than_days": days, **counts})
    if as_json:
        echo_json({"dry_run": dry_run, "older_than_days": days, **counts})
    else:
        verb = "would delete" if dry_run else "deleted"
        click.echo(f"{verb}: " + ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in counts.items()))
