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

import click

from vpay.cli.common import MINOR_UNITS, connect_db, open_database, refuse
from vpay.cli.errors import NotFound, Refused
from vpay.cli.output import echo_record, emit, json_option

# A refund that may not be made because of what the charge is (not how it was typed): exit 1.
DATA_REFUSALS = ("charge_not_succeeded", "nothing_to_refund", "amount_exceeds_refundable",
                 "refunds_not_supported")


@click.group()
def refunds() -> None:
    """Refunds of succeeded charges (a table, or JSON with --json)."""


@refunds.command("create")
@click.option("--charge", "charge_id", required=True, help="The succeeded charge to refund (ch_...).")
@click.option("--amount", type=MINOR_UNITS, default=None,
              help="Minor units (e.g. 1050 = 10.50 EUR) [default: all that is left to refund].")
@click.option("--reason", default=None, help="Why, kept on the refund (at most 160 characters).")
@json_option
def create(charge_id: str, amount: int | None, reason: str | None, as_json: bool) -> None:
    """Refund a succeeded charge; print {refund}. The worker settles it.

    Exit 1: no such charge, or the charge refuses it (not succeeded, the
    amount above what is left); 2: a malformed amount or reason."""
    from vpay.rails import build_rail
    from vpay.rails.port import RailError
    from vpay.money.refunds import InvalidRefund, create_and_submit
    _, pool = open_database(pool_size=2)
    try:
        try:
            result = create_and_submit(pool, build_rail, charge_id=charge_id, amount=amount, reason=reason)
        except InvalidRefund as exc:
            if exc.code == "charge_not_found":
                raise NotFound(str(exc)) from None
            if exc.code in DATA_REFUSALS:
                raise Refused(f"refused, nothing changed: {exc}") from None
            raise click.BadParameter(str(exc), param_hint=f"--{exc.param}") from None
        except RailError as exc:
            refuse(str(exc))
    finally:
        pool.close()
    refused = result.pop("rail_refusal", None)
    if as_json:
        emit(result, True)
    else:
        echo_record(result["refund"])
    if refused is not None:
        refund = result["refund"]
        refuse(f"rail {refund['rail']} refused our configuration ({refused['code']}); refund {refund['id']} "
               f"failed with rail_configuration_refused, no money moved: fix the "
               f"VPAY_{refund['rail'].upper()}_* settings (rail_misconfigured alert)")


@refunds.command("show")
@click.argument("refund_id")
@json_option
def show(refund_id: str, as_json: bool) -> None:
    """A refund (re_...) with its charge and events. Exit 1 when the id names nothing."""
    from vpay.money.refunds import show as find
    with connect_db() as conn:
        found = find(conn, refund_id)
    if found is None:
        raise NotFound(f"no refund {refund_id!r}")
    if as_json:
        emit(found, True)
        return
    refund = found["refund"]
    echo_record(refund | {"charge_status": found["charge"].get("status")},
                [k for k, v in refund.items() if not isinstance(v, (dict, list))] + ["charge_status"],
                {"events": (found["events"], ("id", "type", "created"))})
