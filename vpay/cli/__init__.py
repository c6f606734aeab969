"""``vpay-server`` (a click group) and ``vpay-worker`` (= ``vpay-server worker``).

One module per command group; each registers here in one line. Names, flags
and exit codes are the contract's (shared/design/contract.md); the shared
exit codes and the one-line refusal live in ``vpay.cli.common``.
"""

from __future__ import annotations

import os
import sys

import click

from .. import logs
from .api import api
from .charges import charges
from .demo import demo
from .merchants import merchants
from .migrate import migrate
from .payments import payments
from .refunds import refunds
from .sandbox import sandbox_rail
from .statements import statements
from .webhooks import webhooks
from .worker import worker


@click.group()
@click.option("--log-level", default=lambda: os.environ.get("VPAY_LOG_LEVEL", "INFO"),
              show_default="INFO", help="Python log level for the JSON log on stdout.")
def main(log_level: str) -> None:
    """vpay-reconciler: decides how mobile-money payments end."""
    logs.setup(log_level.upper())


for command in (migrate, worker, payments, sandbox_rail, demo, api, merchants, refunds, webhooks,
                charges, statements):
    main.add_command(command)


def worker_main() -> None:
    """Entry point of ``vpay-worker``: ``vpay-server worker`` under its own name."""
    logs.setup(os.environ.get("VPAY_LOG_LEVEL", "INFO").upper(), sys.stdout)
    worker.main(prog_name="vpay-worker")
