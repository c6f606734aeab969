"""``vpay-server refunds``: refund a succeeded charge, and look a refund up.

``create --charge ch_… [--amount N] [--reason TEXT]`` creates the refund and
its poll job in one transaction, asks the rail, and prints ``{"refund": …}``
(the worker settles it later). ``show re_…`` prints the refund, its charge and
its events. Output is JSON on stdout (logs go to stderr). Exit codes: 0 done,
1 unknown charge or refund, 2 a refund that may not be made (charge not
succeeded, amount above what is left, bad input), 78 configuration refused
(also, after printing it, when the rail refused OUR configuration and the
refund failed with ``rail_configuration_refused``).
``create`` is not idempotent: run twice, it makes two refunds (bounded by
what the charge has left).
"""

from __future__ import annotations

import json
import sys

import click

from vpay.cli.common import MINOR_UNITS, open_db, refuse


def _url() -> str:
    return open_db()[0]


@click.group()
def refunds() -> None:
    """Refunds of succeeded charges (JSON out)."""


@refunds.command("create")
@click.option("--charge", "charge_id", required=True, help="The succeeded charge to refund (ch_...).")
@click.option("--amount", type=MINOR_UNITS, default=None,
              help="Minor units (e.g. 1050 = 10.50 EUR) [default: all that is left to refund].")
@click.option("--reason", default=None, help="Why, kept on the refund (at most 160 characters).")
def create(charge_id: str, amount: int | None, reason: str | None) -> None:
    """Refund a succeeded charge; print {refund}. The worker settles it."""
    from vpay.base.db import make_pool
    from vpay.money.misconfiguration import FAILURE_CODE, open_codes
    from vpay.rails import build_rail
    from vpay.rails.port import RailError
    from vpay.money.refunds import InvalidRefund, create_and_submit
    pool = make_pool(_url(), max_size=2)
    try:
        try:
            result = create_and_submit(pool, build_rail, charge_id=charge_id, amount=amount, reason=reason)
        except InvalidRefund as exc:
            if exc.code == "charge_not_found":
                click.echo(f"vpay: {exc}", err=True)
                sys.exit(1)
            raise click.BadParameter(str(exc), param_hint=f"--{exc.param}") from None
        except RailError as exc:
            refuse(str(exc))
        click.echo(json.dumps(result, indent=2))
        refund = result["refund"]
        if refund["failure_code"] == FAILURE_CODE:
            with pool.connection() as conn:
                codes = open_codes(conn, refund["rail"])
            refuse(f"rail {refund['rail']} refused our configuration ({', '.join(codes) or 'see the log'}); "
                   f"refund {refund['id']} failed with {FAILURE_CODE}, no money moved: fix the "
                   f"VPAY_{refund['rail'].upper()}_* settings (rail_misconfigured alert)")
    finally:
        pool.close()


@refunds.command("show")
@click.argument("refund_id")
def show(refund_id: str) -> None:
    """A refund (re_...) with its charge and events, as JSON."""
    from vpay.base.db import connect
    from vpay.money.refunds import show as find
    with connect(_url()) as conn:
        found = find(conn, refund_id)
    if found is None:
        click.echo(f"vpay: no refund {refund_id!r}", err=True)
        sys.exit(1)
    click.echo(json.dumps(found, indent=2))
