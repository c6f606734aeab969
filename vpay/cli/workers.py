"""``vpay-server workers list``: the workers the database knows (the
``workers`` table, vpay/engine/workers.py).

``list [--state live|dead|stopped]``: live first, then by id: id, host, pid,
lanes, version, started, heartbeat age (seconds), state, and the leases each
holds now. A worker is ``live`` while its heartbeat is within its own
``VPAY_WORKER_DEAD_AFTER_SECONDS``, ``dead`` past it (its leases are reaped
then: docs/runbooks/dead-worker.md), ``stopped`` after a clean exit. A table
by default, JSON with ``--json``. Exit codes: 0 done, 2 usage, 69 database
unavailable, 78 configuration refused.
"""

from __future__ import annotations

import click

from vpay.cli.common import connect_db
from vpay.cli.output import emit, json_option

COLUMNS = ("id", "host", "pid", "lanes", "version", "started_at", "heartbeat_age", "state", "leases")


@click.group()
def workers() -> None:
    """Worker processes as the database knows them: heartbeats and leases."""


@workers.command("list")
@click.option("--state", type=click.Choice(("live", "dead", "stopped")), default=None,
              help="Only workers in this state.")
@json_option
def list_(state: str | None, as_json: bool) -> None:
    """Workers, live first (at most 1000): heartbeat age, live/dead/stopped, leases held."""
    from vpay.engine.workers import list_workers
    with connect_db() as conn:
        rows = list_workers(conn, state)
    for row in rows:
        row["heartbeat_age"] = round(row["heartbeat_age"], 1)
    if as_json:
        emit(rows, True)
        return
    emit([{**r, "lanes": ",".join(r["lanes"])} for r in rows], False, COLUMNS)
