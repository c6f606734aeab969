"""``vpay-server jobs list|retry|release``: the queue, as an operator sees it.

``list [--dead] [--stranded] [--kind K] [--lane L]``: jobs oldest ``run_at``
first, with each lease's holder's state and heartbeat age (the ``workers``
table); ``--stranded`` is a lease past its own ``lease_expires_at``, or whose
holder is gone: dead by its heartbeat, stopped, or restarted (a live worker
renews its leases and beats its row). ``retry ID… | --all-dead``: dead
letters due now, failure streak reset (a ``deliver`` job restarts its webhook
schedule), their ``job_dead_lettered`` alerts acknowledged, one audit line
each in the log. ``release ID… | --all-stranded``: only stranded leases. A table by default, JSON with ``--json``. Exit codes: 0 done,
1 an id that does not qualify (nothing changed), 2 usage, 69 database
unavailable, 78 configuration refused.
"""

from __future__ import annotations

import click

import vpay.money  # noqa: F401  (the domain registers its lanes before --lane's help reads them)
from vpay.cli.common import ROW_ID, connect_db
from vpay.cli.errors import Refused
from vpay.cli.output import echo_rows, json_option
from vpay.engine import lanes as _lanes

COLUMNS = ("id", "kind", "lane", "state", "dedupe_key", "attempts", "failures", "run_at",
           "locked_by", "holder_state", "heartbeat_age", "lease_expires_at", "last_error")


def _actor() -> str:
    """The CLI's audit actor: the OS user (``vpay.money.audit.os_actor``)."""
    from vpay.money.audit import os_actor
    return os_actor()


def _known_kind(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--kind``: one of the handler registry's kinds, else a usage error
    (a typo would otherwise list "(none)" or retry nothing, exit 0)."""
    if value is None:
        return value
    from vpay.handlers import REGISTRY
    if value not in REGISTRY:
        raise click.BadParameter(f"unknown job kind {value!r}; kinds are {','.join(sorted(REGISTRY))}",
                                 ctx, param)
    return value


def _known_lane(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--lane``: one of ``vpay.engine.lanes.LANES``, else a usage error."""
    from vpay.engine.lanes import LANES
    if value is not None and value not in LANES:
        raise click.BadParameter(f"unknown lane {value!r}; lanes are {','.join(LANES)}", ctx, param)
    return value


@click.group()
def jobs() -> None:
    """The job queue: list jobs, retry dead letters, release stranded leases."""


@jobs.command("list")
@click.option("--dead", is_flag=True, help="Only dead letters (run_at = infinity).")
@click.option("--stranded", is_flag=True,
              help="Only stranded leases: past their own lease_expires_at, or whose holder is dead by "
                   "its heartbeat, stopped or restarted (vpay-server workers list).")
@click.option("--kind", default=None, callback=_known_kind, help="Only this job kind (poll, deliver, ...).")
@click.option("--lane", default=None, callback=_known_lane,
              help=f"Only this lane ({', '.join(_lanes.LANES)}).")
@json_option
def list_(dead: bool, stranded: bool, kind: str | None, lane: str | None, as_json: bool) -> None:
    """Jobs, oldest run_at first (at most 1000). --dead and --stranded
    exclude each other (a dead letter holds no lease): both is a usage error,
    not an empty list."""
    from vpay.money.operator import list_jobs
    if dead and stranded:
        raise click.UsageError("--dead and --stranded exclude each other (a dead letter holds no lease); "
                               "give one")
    with connect_db() as conn:
        rows = list_jobs(conn, dead=dead, stranded=stranded, kind=kind, lane=lane)
    echo_rows(rows, COLUMNS, as_json)


def _ids(conn, ids: tuple[int, ...], every: bool, flag: str, **filters) -> list[int]:
    from vpay.money.operator import list_jobs
    if bool(ids) == every:
        raise click.UsageError(f"give job ids or {flag}, not both and not neither")
    _narrow_only(every, flag, kind=filters.get("kind"), lane=filters.get("lane"))
    if every:
        return [r["id"] for r in list_jobs(conn, **filters)]
    return list(ids)


def _narrow_only(every: bool, flag: str, **filters: str | None) -> None:
    """Filters (``--kind``, ``--lane``) narrow ``flag`` (``--all-dead``); with
    job ids they would be ignored without a word: a usage error (2)."""
    given = [f"--{name}" for name, value in filters.items() if value is not None]
    if given and not every:
        raise click.UsageError(f"{' and '.join(given)} narrow{'s' if len(given) == 1 else ''} {flag}; "
                               f"with job ids {'it' if len(given) == 1 else 'they'} would be ignored")


@jobs.command("retry")
@click.argument("ids", nargs=-1, type=ROW_ID)
@click.option("--all-dead", "every", is_flag=True, help="Every dead letter (of --kind / --lane).")
@click.option("--kind", default=None, callback=_known_kind, help="With --all-dead: only this job kind.")
@click.option("--lane", default=None, callback=_known_lane, help="With --all-dead: only this lane.")
@click.option("--note", default="retried by an operator", show_default=True,
              help="Kept on the job_dead_lettered alerts this acknowledges, and in the audit line.")
@json_option
def retry(ids: tuple[int, ...], every: bool, kind: str | None, lane: str | None, note: str,
          as_json: bool) -> None:
    """Put dead letters back on the queue, due now (fix the cause first)."""
    from vpay.money.operator import Refused as NotAllowed, check_note, retry as requeue
    try:
        note = check_note(note)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--note") from None
    with connect_db() as conn:
        chosen = _ids(conn, ids, every, "--all-dead", dead=True, kind=kind, lane=lane)
        try:
            rows = requeue(conn, chosen, note, _actor()) if chosen else []
        except NotAllowed as exc:
            raise Refused(f"refused, nothing changed: {exc}") from None
    echo_rows(rows, ("id", "kind", "dedupe_key", "attempts", "last_error"), as_json, done="retried")


@jobs.command("release")
@click.argument("ids", nargs=-1, type=ROW_ID)
@click.option("--all-stranded", "every", is_flag=True, help="Every stranded lease (as jobs list --stranded).")
@json_option
def release(ids: tuple[int, ...], every: bool, as_json: bool) -> None:
    """Free stranded leases (past their lease_expires_at, or their holder gone) so a live worker claims them."""
    from vpay.money.operator import Refused as NotAllowed, release as free
    with connect_db() as conn:
        chosen = _ids(conn, ids, every, "--all-stranded", stranded=True)
        try:
            rows = free(conn, chosen, _actor()) if chosen else []
        except NotAllowed as exc:
            raise Refused(f"refused, nothing changed: {exc}") from None
    echo_rows(rows, ("id", "kind", "dedupe_key", "failures", "last_error"), as_json, done="released")
