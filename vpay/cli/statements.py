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

import json
from pathlib import Path

import click

from vpay.cli.common import fail, open_db


@click.group()
def statements() -> None:
    """Import a rail's transaction statement and reconcile against it."""


@statements.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path))
@click.option("--rail", required=True, type=click.Choice(["mtn", "orange"]), help="Whose statement it is.")
@click.option("--profile", default=None,
              help="Column names of a known format: default, pawapay, pawapay-deposits, sandbox.")
@click.option("--map", "mapping", default=None,
              help="Column names as KEY=COLUMN,… (keys: reference, rail_transaction_id, msisdn, amount, "
                   "currency, status, time, type, reason).")
@click.option("--apply", is_flag=True, help="Settle what the statement proves and record it "
                                            "[default: dry run, nothing written].")
@click.option("--lag-minutes", type=click.FloatRange(0, 24 * 60), default=60, show_default=True,
              help="How far the statement may lag the rail: our successes this close to its last line "
                   "are not yet expected in it.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--exceptions-csv", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write the exceptions to this CSV file.")
def import_(file: Path, rail: str, profile: str | None, mapping: str | None, apply: bool, lag_minutes: float,
            as_json: bool, exceptions_csv: Path | None) -> None:
    """Match a statement's lines against our charges and refunds."""
    from vpay.base.db import connect
    from vpay.statements import importer, report
    from vpay.statements.profiles import BadMap, choose
    from vpay.statements.reader import BadFile
    try:
        chosen = choose(profile, mapping)
    except BadMap as exc:
        raise click.UsageError(str(exc)) from None
    if exceptions_csv is not None:
        _check_writable(exceptions_csv)
    from vpay.statements.reader import read_path
    try:
        data = read_path(file)
    except BadFile as exc:
        fail(f"{file.name}: {exc}")
    url, _ = open_db()
    with connect(url) as conn:
        try:
            result = importer.run_audited(conn, data, rail=rail, profile=chosen, file_name=file.name,
                                          apply=apply, lag_seconds=lag_minutes * 60)
        except BadFile as exc:
            fail(f"{file.name}: {exc}")
    if exceptions_csv is not None:
        exceptions_csv.write_bytes(report.exceptions_csv(result))
    click.echo(json.dumps(result, indent=2) if as_json else report.render(result))


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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
def list_(as_json: bool, limit: int) -> None:
    """Recorded statements, newest first."""
    from vpay.base.db import connect
    from vpay.statements.importer import list_statements
    url, _ = open_db()
    with connect(url) as conn:
        rows = list_statements(conn, limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("(none)")  # as every other list command
        return
    click.echo(f"{'statement':<28} {'rail':<6} {'lines':>7}  {'period':<53} outcomes")
    for r in rows:
        period = f"{r['period']['start'] or '-'} .. {r['period']['end'] or '-'}"
        outcomes = ", ".join(f"{k} {v}" for k, v in r["outcomes"].items())
        click.echo(f"{r['statement']:<28} {r['rail']:<6} {r['lines']:>7}  {period:<53} {outcomes}")


@statements.command("show")
@click.argument("statement_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--exceptions-csv", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write the exceptions to this CSV file.")
def show(statement_id: str, as_json: bool, exceptions_csv: Path | None) -> None:
    """One recorded statement: its summary and its exceptions."""
    from vpay.base.db import connect
    from vpay.statements import importer, report
    if exceptions_csv is not None:
        _check_writable(exceptions_csv)
    url, _ = open_db()
    with connect(url) as conn:
        found = importer.show(conn, statement_id)
    if found is None:
        fail(f"no statement {statement_id!r}")
    if exceptions_csv is not None:
        exceptions_csv.write_bytes(report.exceptions_csv(found))
    click.echo(json.dumps(found, indent=2) if as_json else report.render(found))
