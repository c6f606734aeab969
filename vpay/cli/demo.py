"""``vpay-server demo``: the main job on the embedded default (see vpay/demo.py)."""

from __future__ import annotations

import re
import sys

import click

from vpay.cli.common import Duration
from vpay.cli.errors import Refused


@click.command()
@click.option("--deadline-seconds", default="150s", show_default=True, type=Duration(minimum=0.001, bare="s"),
              help="Stop waiting for the batch to settle after this long.")
@click.option("--database", default="vpay_demo", show_default=True,
              help="The database the demo makes (and drops first, when it made it) on the server.")
@click.option("--reset", is_flag=True,
              help="Drop --database even if the demo did not make it (with VPAY_DATABASE_URL set).")
def demo(deadline_seconds: float, database: str, reset: bool) -> None:
    """The main job on the embedded default: sandbox rail, worker, a batch of payments.

    With VPAY_DATABASE_URL set, it works in its own database on that server
    and drops only a database it made itself; exit 1 (nothing touched) when
    --database exists and was made by something else, unless --reset."""
    from vpay.demo import DemoRefused, run
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", database):
        raise click.BadParameter("a database name of lower-case letters, digits and '_'",
                                 param_hint="--database")
    try:
        code = run(deadline_seconds=deadline_seconds, database=database, reset=reset)
    except DemoRefused as exc:
        raise Refused(f"refused: {exc}") from None
    sys.exit(code)
