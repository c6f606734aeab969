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
@click.option("--console", "with_console", is_flag=True,
              help="Also run the operator console, print a login, and keep it up after the run "
                   "(Ctrl-C or SIGTERM ends it).")
@click.option("--console-bind", default="127.0.0.1:8081", show_default=True,
              help="Where --console listens: a loopback HOST:PORT (the cookie goes without TLS).")
@click.option("--quick", is_flag=True, help="Five payments (every rail) instead of the whole batch.")
def demo(deadline_seconds: float, database: str, reset: bool, with_console: bool, console_bind: str,
         quick: bool) -> None:
    """The main job on the embedded default: sandbox rail, worker, a batch of payments.

    With VPAY_DATABASE_URL set, it works in its own database on that server
    and drops only a database it made itself; exit 1 (nothing touched) when
    --database exists and was made by something else, unless --reset.
    With --console, the operator console runs on --console-bind with a
    one-time admin login printed, and stays up after the report."""
    from vpay.demo import DemoRefused, run
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", database):
        raise click.BadParameter("a database name of lower-case letters, digits and '_'",
                                 param_hint="--database")
    if with_console:
        from vpay.cli.api import _check_listen, _host_port
        from vpay.cli.console import _loopback
        listen = _host_port(console_bind)
        if listen is None or not _loopback(listen[0]):
            raise click.BadParameter("a loopback HOST:PORT (127.0.0.1:8081): the demo's console has no TLS",
                                     param_hint="--console-bind")
        _check_listen(*listen)
    try:
        code = run(deadline_seconds=deadline_seconds, database=database, reset=reset,
                   console_bind=console_bind if with_console else None, quick=quick)
    except DemoRefused as exc:
        raise Refused(f"refused: {exc}") from None
    sys.exit(code)
