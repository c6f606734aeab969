"""``vpay-server`` (a click group) and ``vpay-worker`` (= ``vpay-server worker``).

One module per command group; each registers here in one line. Names, flags
and exit codes are the contract's (shared/design/contract.md); the shared
exit codes, the one-line refusal and the translation of every failure into
one line on stderr (never a traceback) live in ``vpay.cli.errors``; tables
and ``--json`` in ``vpay.cli.output``; docs/cli.md lists every command.
"""

from __future__ import annotations

import click

from vpay import __version__
from vpay.cli.alerts import alerts
from vpay.cli.api import api
from vpay.cli.charges import charges
import vpay.money  # noqa: F401  (the domain registers its lanes before any command reads them)
from vpay.cli.common import VpayGroup, guarded_main, log_level_option, setup_logging
from vpay.cli.console import console, operators
from vpay.cli.demo import demo
from vpay.cli.jobs import jobs
from vpay.cli.merchants import merchants
from vpay.cli.migrate import migrate
from vpay.cli.payments import payments
from vpay.cli.prune import prune
from vpay.cli.rails import rails
from vpay.cli.refunds import refunds
from vpay.cli.sandbox import sandbox_rail
from vpay.cli.secrets import secrets
from vpay.cli.statements import statements
from vpay.cli.webhooks import webhooks
from vpay.cli.worker import worker
from vpay.cli.workers import workers


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
                jobs, alerts, prune, charges, statements, secrets, console, operators, rails, workers):
    main.add_command(command)


def worker_main() -> None:
    """Entry point of ``vpay-worker``: ``vpay-server worker`` under its own name."""
    guarded_main(worker, "vpay-worker")
