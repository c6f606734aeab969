"""``vpay-server alerts list|ack``: what needs a human.

``list [--open] [--kind K] [--charge ch_…]``: oldest first. ``ack ID… --note
TEXT`` (or ``--all-open [--kind K]``): acknowledge open alerts, the note (who
owns the case, what was found) stored on each. A table by default, JSON with
``--json``. Exit codes: 0 done, 1 an unknown or already acknowledged alert
(nothing changed), 2 usage, 69 database unavailable, 78 configuration refused.
"""

from __future__ import annotations

import click

from vpay.cli.common import ROW_ID, connect_db
from vpay.cli.errors import Refused
from vpay.cli.output import echo_rows, json_option
from vpay.cli.jobs import _actor

COLUMNS = ("id", "kind", "charge_id", "created_at", "acknowledged_at", "details", "note")


def _known_kind(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--kind``: one of ``ALERT_KINDS`` (vpay/alert_kinds.py), else a usage error."""
    from vpay.money.alert_kinds import ALERT_KINDS
    if value is not None and value not in ALERT_KINDS:
        raise click.BadParameter(f"unknown alert kind {value!r}; kinds are {','.join(ALERT_KINDS)}",
                                 ctx, param)
    return value


@click.group()
def alerts() -> None:
    """Alerts raised for a human: list and acknowledge."""


@alerts.command("list")
@click.option("--open", "open_only", is_flag=True, help="Only alerts not yet acknowledged.")
@click.option("--kind", default=None, callback=_known_kind,
              help="Only this kind (charge_unresolved, job_dead_lettered, ...).")
@click.option("--charge", default=None, help="Only this charge's alerts (ch_...).")
@json_option
def list_(open_only: bool, kind: str | None, charge: str | None, as_json: bool) -> None:
    """Alerts, oldest first (at most 1000)."""
    from vpay.money.operator import list_alerts
    with connect_db() as conn:
        rows = list_alerts(conn, open_only=open_only, kind=kind, charge=charge)
    echo_rows(rows, COLUMNS, as_json)


@alerts.command("ack")
@click.argument("ids", nargs=-1, type=ROW_ID)
@click.option("--all-open", "every", is_flag=True, help="Every open alert (of --kind).")
@click.option("--kind", default=None, callback=_known_kind, help="With --all-open: only this kind.")
@click.option("--note", required=True, help="Who owns the case and what was found (stored).")
@json_option
def ack(ids: tuple[int, ...], every: bool, kind: str | None, note: str, as_json: bool) -> None:
    """Acknowledge alerts, keeping a note on each."""
    from vpay.money.operator import Refused as NotAllowed, ack as acknowledge, check_note, list_alerts
    try:
        note = check_note(note)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--note") from None
    if bool(ids) == every:
        raise click.UsageError("give alert ids or --all-open, not both and not neither")
    if kind is not None and not every:
        raise click.UsageError("--kind narrows --all-open; with alert ids it would be ignored")
    with connect_db() as conn:
        chosen = list(ids) if ids else [r["id"] for r in list_alerts(conn, open_only=True, kind=kind)]
        try:
            rows = acknowledge(conn, chosen, note, _actor()) if chosen else []
        except NotAllowed as exc:
            raise Refused(f"refused, nothing changed: {exc}") from None
    echo_rows(rows, ("id", "kind", "charge_id", "acknowledged_at", "note"), as_json, done="acknowledged")
