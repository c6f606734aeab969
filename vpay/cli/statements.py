"""``vpay-server statements import|list|show``: reconcile against a rail's
statement (docs/flows/statements.md).

``import FILE --rail mtn|orange [--profile NAME | --map KEY=COLUMN,…]
[--apply] [--lag-minutes N] [--json] [--exceptions-csv PATH]``: a dry run unless ``--apply``.
Prints the summary table (counts and amounts per outcome) and the exceptions,
or the report as JSON; ``--exceptions-csv`` writes the exceptions for an
accountant. Exit codes: 0 done (exceptions are in the report, not the exit
code), 1 the file cannot be a statement (wrong columns, not UTF-8, UTF-16,
a duplicate line, a truncated last line, …; one line on stderr, nothing
written), 2 usage (no such file, unknown profile, bad ``--map``), 69 database
unreachable, 78 configuration refused.
"""

from __future__ import annotations

from pathlib import Path

import click

from vpay.cli.common import Duration, connect_db, connect_session_db
from vpay.cli.errors import NotFound, Refused
from vpay.cli.output import echo_text, emit, json_option


@click.group()
def statements() -> None:
    """Import a rail's transaction statement and reconcile against it."""


@statements.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path))
@click.option("--rail", required=True, type=click.Choice(["mtn", "orange", "mpesa", "pawapay"]), help="Whose statement it is.")
@click.option("--profile", default=None,
              help="Column names of a known format: default, pawapay, pawapay-deposits, sandbox.")
@click.option("--map", "mapping", default=None,
              help="Column names as KEY=COLUMN,… (keys: reference, rail_transaction_id, msisdn, amount, "
                   "currency, status, time, type, reason).")
@click.option("--apply", is_flag=True, help="Settle what the statement proves and record it "
                                            "[default: dry run, nothing written].")
@click.option("--lag-minutes", "lag", type=Duration(maximum=86400, bare="m"), default="60m", show_default=True,
              help="How far the statement may lag the rail: our successes this close to its last line "
                   "are not yet expected in it (minutes, or 2h; at most 24h).")
@click.option("--period-start", default=None, metavar="TIME",
              help="The period the statement covers, from (ISO 8601; a date alone is its midnight UTC) "
                   "[default: the file's period columns, else its lines' times].")
@click.option("--period-end", default=None, metavar="TIME",
              help="... to (inclusive; a date alone covers that whole day).")
@json_option
@click.option("--exceptions-csv", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write the exceptions to this CSV file.")
def import_(file: Path, rail: str, profile: str | None, mapping: str | None, apply: bool, lag: float,
            period_start: str | None, period_end: str | None, as_json: bool,
            exceptions_csv: Path | None) -> None:
    """Match a statement's lines against our charges and refunds."""
    from vpay.statements import importer, report
    from vpay.statements.profiles import BadMap, choose
    from vpay.statements.reader import BadFile
    try:
        chosen = choose(profile, mapping)
    except BadMap as exc:
        raise click.UsageError(str(exc)) from None
    period = _period(period_start, period_end)
    if exceptions_csv is not None:
        _check_writable(exceptions_csv)
    from vpay.statements.reader import read_path
    try:
        raw = read_path(file)  # the header is read; the lines are read while judging
    except BadFile as exc:
        raise Refused(f"{file.name}: {exc}") from None
    # Its temporary tables and its per-rail lock live in the session: the
    # session URL, never a transaction-pooled one (docs/deployment.md, "pgbouncer").
    from vpay.base.pooling import IMPORT_SESSION_NEEDS
    with connect_session_db(IMPORT_SESSION_NEEDS) as conn:
        try:
            result = importer.run_audited(conn, raw, rail=rail, profile=chosen, file_name=file.name,
                                          apply=apply, lag_seconds=lag, period=period)
        except BadFile as exc:
            raise Refused(f"{file.name}: {exc}") from None
        except (importer.Busy, importer.PeriodConflict) as exc:
            raise Refused(str(exc)) from None
    if exceptions_csv is not None:
        exceptions_csv.write_bytes(report.exceptions_csv(result))
    emit(result, True) if as_json else echo_text(report.render(result))


def _period(start: str | None, end: str | None):
    """``(start, end)`` from ``--period-start/--period-end`` (both or
    neither), inclusive: a date alone ends at the end of that day."""
    from datetime import timedelta

    from vpay.statements.lines import parse_time
    if start is None and end is None:
        return None
    if start is None or end is None:
        raise click.UsageError("give --period-start and --period-end together")
    values = []
    for name, text in (("--period-start", start), ("--period-end", end)):
        value = parse_time(text)
        if value is None:
            raise click.BadParameter(f"{text!r} is not an ISO 8601 time between 2000 and tomorrow",
                                     param_hint=f"'{name}'")
        values.append(value)
    if len(end.strip()) == 10:  # 2026-11-30: the whole day
        values[1] += timedelta(days=1, microseconds=-1)
    if values[1] < values[0]:
        raise click.UsageError("--period-end is before --period-start")
    return values[0], values[1]


def _check_writable(path: Path) -> None:
    """Refuse (usage, exit 2) an ``--exceptions-csv`` path that cannot be
    written, before anything is imported: with ``--apply`` the statement is
    applied and committed first, so a failed write afterwards would report
    an internal error for an import that did happen."""
    existed = path.exists()
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        raise click.BadParameter(f"cannot write {str(path)!r}: {exc.strerror or exc}",
                                 param_hint="'--exceptions-csv'") from None
    if not existed:
        path.unlink(missing_ok=True)


@statements.command("list")
@json_option
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
def list_(as_json: bool, limit: int) -> None:
    """Recorded statements, newest first."""
    from vpay.statements.importer import list_statements
    with connect_db() as conn:
        rows = list_statements(conn, limit)
    if as_json:
        emit(rows, True)
        return
    emit([{"statement": r["statement"], "rail": r["rail"], "lines": r["lines"],
           "period_start": r["period"]["start"], "period_end": r["period"]["end"],
           "outcomes": ", ".join(f"{k} {v}" for k, v in r["outcomes"].items())} for r in rows], False,
         ("statement", "rail", "lines", "period_start", "period_end", "outcomes"))


@statements.command("show")
@click.argument("statement_id")
@json_option
@click.option("--exceptions-csv", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write the exceptions to this CSV file.")
def show(statement_id: str, as_json: bool, exceptions_csv: Path | None) -> None:
    """One recorded statement: its summary and its exceptions."""
    from vpay.statements import importer, report
    if exceptions_csv is not None:
        _check_writable(exceptions_csv)
    with connect_db() as conn:
        found = importer.show(conn, statement_id)
    if found is None:
        raise NotFound(f"no statement {statement_id!r}")
    if exceptions_csv is not None:
        exceptions_csv.write_bytes(report.exceptions_csv(found))
    emit(found, True) if as_json else echo_text(report.render(found))
