"""``vpay-server`` (a click group) and ``vpay-worker`` (= ``vpay-server worker``).

One module per command group; each registers here in one line. Names, flags
and exit codes are the contract's (shared/design/contract.md); the shared
exit codes, the one-line refusal and the translation of every failure into
one line on stderr (never a traceback) live in ``vpay.cli.errors``; tables
and ``--json`` in ``vpay.cli.output``; docs/cli.md lists every command.
"""

from __future__ import annotations

import click

from .. import __version__
from .alerts import alerts
from .api import api
from .charges import charges
from .common import VpayGroup, guarded_main, log_level_option, setup_logging
from .demo import demo
from .jobs import jobs
from .merchants import merchants
from .migrate import migrate
from .payments import payments
from .prune import prune
from .refunds import refunds
from .sandbox import sandbox_rail
from .statements import statements
from .webhooks import webhooks
from .worker import worker


@click.group(cls=VpayGroup)
@click.version_option(__version__, "--version", prog_name="vpay-server", message="%(prog)s %(version)s")
@log_level_option
def main(level: str | None) -> None:
    """vpay-reconciler: decides how mobile-money payments end.

    Exit codes: 0 done, 1 not found or refused by the data, 2 usage error,
    69 the database (or a port) is unavailable, 70 a bug, 78 configuration
    refused; every failure is one line on stderr. Data commands print a
    table, or JSON with --json; durations take a unit (30s, 15m, 24h, 90d)."""
    setup_logging(level)


for command in (migrate, worker, payments, sandbox_rail, demo, api, merchants, refunds, webhooks,
                jobs, alerts, prune, charges, statements):
    main.add_command(command)


def worker_main() -> None:
    """Entry point of ``vpay-worker``: ``vpay-server worker`` under its own name."""
    guarded_main(worker, "vpay-worker")
