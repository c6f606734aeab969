"""``vpay-server charges list|resolve``: the unresolved-charges runbook's steps.

``list [--status unresolved] [--older-than 24h] [--json]``: charges in a
status, oldest first, with their age, open alerts, next poll and what the
rail last answered.

``resolve ch_… --outcome succeeded|failed --evidence TEXT [--json]``: only a
charge that is ``unresolved``, or ``pending`` with an open alert; the
evidence is required and stored; the charge moves exactly as a rail answer
would move it (one transition, one event). Never on age alone (design page:
"Age is not evidence"). See ``vpay.money.resolve``.

Exit codes: 0 done, 1 not found or refused by the data (already settled;
pending without an open alert), 2 usage (no evidence, a bad duration), 69
database unreachable, 78 configuration refused.
"""

from __future__ import annotations

import click

from vpay.cli.common import Duration, connect_db
from vpay.cli.errors import NotFound, Refused
from vpay.cli.output import emit, json_option

COLUMNS = ("id", "rail", "rail_reference", "amount", "age", "open_alerts", "next_poll", "last_error")


@click.group()
def charges() -> None:
    """List charges by status and resolve the ones a person was asked to."""


@charges.command("list")
@click.option("--status", type=click.Choice(["unresolved", "pending", "succeeded", "failed"]),
              default="unresolved", show_default=True)
@click.option("--older-than", "older_than", type=Duration(), default="0s",
              help="Only charges at least this old: 90s, 15m, 24h, 2d.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@json_option
def list_(status: str, older_than: float, limit: int, as_json: bool) -> None:
    """Charges in one status, oldest first. A settled charge has no next poll
    and no rail answer to show: its poll has ended."""
    from vpay.money.currency import minor_to_major_string
    from vpay.money.resolve import list_charges
    with connect_db() as conn:
        rows = list_charges(conn, status, older_than, limit)
    if as_json:
        emit(rows, True)
        return
    for r in rows:
        r["amount"] = f"{minor_to_major_string(r['amount'], r['currency'])} {r['currency']}"
        r["age"] = f"{r['age_seconds'] / 3600:.1f}h"
        if r["poll_dead"]:
            r["next_poll"] = "dead-lettered"
    emit(rows, False, COLUMNS)


@charges.command("resolve")
@click.argument("charge_id")
@click.option("--outcome", required=True, type=click.Choice(["succeeded", "failed"]))
@click.option("--evidence", required=True,
              help="What proves the outcome (a statement line, a rail ticket, the payer's receipt); stored.")
@json_option
def resolve(charge_id: str, outcome: str, evidence: str, as_json: bool) -> None:
    """Settle an unresolved charge (or a pending one with an open alert) on evidence."""
    from vpay.money.audit import audited, os_actor
    from vpay.money.resolve import Refused as NotResolvable, resolve_charge
    with connect_db() as conn:
        try:
            with audited(conn, actor=os_actor(), action="charges.resolve", target=f"charge:{charge_id}",
                         note=f"{outcome}: {evidence}"[:2000]):
                result = resolve_charge(conn, charge_id, outcome, evidence)
        except NotResolvable as exc:
            if exc.code == "bad_evidence":
                raise click.BadParameter(str(exc), param_hint="--evidence") from None
            raise (NotFound if exc.code == "not_found" else Refused)(str(exc)) from None
    if as_json:
        emit(result, True)
    else:
        c = result["charge"]
        emit({"charge": c["id"], "status": c["status"], "evidence": result["evidence"]["id"]}, False)
