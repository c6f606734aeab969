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

import json
import re

import click

from vpay.cli.common import fail, open_db

_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DURATION_SECONDS = 36500 * 86400


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``24h``, ``2d`` or plain seconds, as seconds.
    Raises ``click.BadParameter``."""
    m = _DURATION.fullmatch(text.strip().lower())
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 15m, 24h or 2d")
    seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if seconds > MAX_DURATION_SECONDS:
        # Postgres cannot subtract more than its interval range from now();
        # a hundred years is older than any charge.
        raise click.BadParameter(f"{text!r} is more than {MAX_DURATION_SECONDS // 86400} days")
    return seconds


@click.group()
def charges() -> None:
    """List charges by status and resolve the ones a person was asked to."""


@charges.command("list")
@click.option("--status", type=click.Choice(["unresolved", "pending", "succeeded", "failed"]),
              default="unresolved", show_default=True)
@click.option("--older-than", "older_than", default="0", help="Only charges at least this old: 90s, 15m, 24h, 2d.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(status: str, older_than: str, limit: int, as_json: bool) -> None:
    """Charges in one status, oldest first."""
    from vpay.money.currency import minor_to_major_string
    from vpay.base.db import connect
    from vpay.money.resolve import list_charges
    seconds = parse_duration(older_than)
    url, _ = open_db()
    with connect(url) as conn:
        rows = list_charges(conn, status, seconds, limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("(none)")  # as every other list command
        return
    click.echo(f"{'charge':<28} {'rail':<6} {'rail_reference':<36} {'amount':>14} {'age':>8} {'alerts':>6}  "
               f"{'next poll':<25} last error")
    for r in rows:
        amount = f"{minor_to_major_string(r['amount'], r['currency'])} {r['currency']}"
        age = f"{r['age_seconds'] / 3600:.1f}h"
        click.echo(f"{r['id']:<28} {r['rail']:<6} {r['rail_reference']:<36} {amount:>14} {age:>8} "
                   f"{r['open_alerts']:>6}  {('dead-lettered' if r['poll_dead'] else r['next_poll'] or '-')[:25]:<25} {r['last_error'] or ''}")


@charges.command("resolve")
@click.argument("charge_id")
@click.option("--outcome", required=True, type=click.Choice(["succeeded", "failed"]))
@click.option("--evidence", required=True,
              help="What proves the outcome (a statement line, a rail ticket, the payer's receipt); stored.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def resolve(charge_id: str, outcome: str, evidence: str, as_json: bool) -> None:
    """Settle an unresolved charge (or a pending one with an open alert) on evidence."""
    from vpay.base.db import connect
    from vpay.money.audit import audited, os_actor
    from vpay.money.resolve import Refused, resolve_charge
    url, _ = open_db()
    with connect(url) as conn:
        try:
            with audited(conn, actor=os_actor(), action="charges.resolve", target=f"charge:{charge_id}",
                         note=f"{outcome}: {evidence}"[:2000]):
                result = resolve_charge(conn, charge_id, outcome, evidence)
        except Refused as exc:
            if exc.code == "bad_evidence":
                raise click.BadParameter(str(exc), param_hint="--evidence") from None
            fail(str(exc))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        c = result["charge"]
        click.echo(f"{c['id']} {c['status']} (evidence {result['evidence']['id']} stored)")
