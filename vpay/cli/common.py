"""What every command shares: exit codes, the one-line refusal, the database URL,
and the translation of every failure into one line on stderr.

Exit codes (contract): 0 done, 1 not found / refused by the data, 2 usage,
69 a resource it needs is unavailable (the database, a port: EX_UNAVAILABLE),
70 a bug (EX_SOFTWARE), 78 configuration refused (EX_CONFIG). Every failure
is one line on stderr starting ``vpay:``, never a traceback (``--log-level
DEBUG`` adds the traceback to the JSON log, for a bug report).

``VpayGroup`` (the ``vpay-server`` group) and ``guarded`` (``vpay-worker``)
apply this to every command, so a command only raises: a database it cannot
reach (``psycopg.OperationalError``, ``PoolTimeout``) is 69, a refused
setting (``ConfigError``) is 78, a usage error 2.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any, Iterator, Sequence

import click

EX_USAGE = 2
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_CONFIG = 78

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

log = logging.getLogger("vpay.cli")


def fail(message: str, code: int = 1) -> None:
    """One line on stderr, then exit ``code`` (1: not found / refused by the data);
    control characters in ``message`` are escaped (``output.safe_text``)."""
    from vpay.cli.output import safe_text
    click.echo(f"vpay: {safe_text(message)}", err=True)
    sys.exit(code)


def refuse(message: str) -> None:
    """One clear line, then exit 78: systemd will not restart a refused config
    (RestartPreventExitStatus=78)."""
    fail(f"configuration refused: {message}", EX_CONFIG)


class MinorUnits(click.ParamType):
    """An amount in minor units on the command line: ASCII digits only.

    click's ``int`` is Python's ``int()``, which also takes ``1_000``,
    surrounding blanks and any Unicode decimal digit (``١٠٠`` is 100): a
    typo or a pasted figure would become a real charge. This accepts
    ``[0-9]+`` and nothing else; the range is the money layer's to check.
    """

    name = "minor_units"

    def convert(self, value: Any, param, ctx) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value)
        if not (text.isascii() and text.isdigit()):
            self.fail(f"{text!r} is not an amount in minor units (ASCII digits only, "
                      f"e.g. 1050 = 10.50 EUR)", param, ctx)
        return int(text)


MINOR_UNITS = MinorUnits()

# A row id (jobs.id, alerts.id: bigint). A larger number names no row, and
# would otherwise reach Postgres and fail there as a bug (exit 70).
ROW_ID = click.IntRange(min=1, max=2**63 - 1)


def log_level(value: str | None) -> str:
    """The log level named by ``--log-level`` (``value``) or ``VPAY_LOG_LEVEL``
    (default INFO), upper-cased. A bad ``VPAY_LOG_LEVEL`` is a refused
    configuration (78); a bad flag is caught by its ``click.Choice`` (2)."""
    if value:
        return value.upper()
    raw = os.environ.get("VPAY_LOG_LEVEL", "").strip() or "INFO"
    if raw.upper() not in LOG_LEVELS:
        refuse(f"VPAY_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return raw.upper()


def log_level_option(fn):
    """``--log-level``: one of ``LOG_LEVELS`` (any case); default ``VPAY_LOG_LEVEL`` or INFO."""
    return click.option("--log-level", "level", default=None, type=click.Choice(LOG_LEVELS, case_sensitive=False),
                        help="Log level [default: VPAY_LOG_LEVEL, else INFO].")(fn)


def _unavailable_line(exc: BaseException) -> str:
    import psycopg
    text = " ".join(str(exc).split())[:400] or type(exc).__name__
    hint = ""
    if "does not exist" in text and "database" in text:
        hint = " (create it first, e.g. createdb, then run vpay-server migrate)"
    elif isinstance(exc, psycopg.errors.UndefinedTable):  # not any text naming a relation (a deadlock's does)
        hint = " (run vpay-server migrate)"
    return f"database unavailable: {text}{hint}"


_CONNECTION_STATES = ("08", "53", "57P")
"""SQLSTATE classes that mean the database is unreachable or going away:
connection exceptions, insufficient resources, operator intervention
(shutdown, cannot connect now)."""


def _refused_line(exc: BaseException) -> str:
    """A database that answered and refused one statement (a deadlock, a
    lock or statement timeout, a serialization failure): what it said,
    under its own name; nothing was committed by the failed transaction."""
    text = " ".join(str(exc).split())[:300] or type(exc).__name__
    state = getattr(exc, "sqlstate", None) or "?"
    return (f"database refused the transaction ({type(exc).__name__}, SQLSTATE {state}): {text}; "
            "its changes were rolled back: run the command again")


def translate(exc: BaseException) -> tuple[str, int]:
    """``(line, exit code)`` for an exception a command let out. A database
    that cannot be reached is 69 ("database unavailable"), one that answered
    and refused a transaction (deadlock, timeout) 69 too, said as what it is
    ("database refused the transaction", no migrate hint); a refused setting
    78, anything else is a bug (70)."""
    import psycopg
    from psycopg_pool import PoolTimeout

    from vpay.base.db import ConfigError
    if isinstance(exc, ConfigError):
        return f"configuration refused: {exc}", EX_CONFIG
    state = getattr(exc, "sqlstate", None)
    if isinstance(exc, psycopg.OperationalError) and state and not state.startswith(_CONNECTION_STATES):
        # a deadlock (40P01), a lock or statement timeout (55P03, 57014), a
        # serialization failure: the database is there and said no
        return _refused_line(exc), EX_UNAVAILABLE
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout)):
        return _unavailable_line(exc), EX_UNAVAILABLE
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return _unavailable_line(exc), EX_UNAVAILABLE
    return f"internal error ({type(exc).__name__}): {' '.join(str(exc).split())[:300]}", EX_SOFTWARE


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Run a command so that any failure is one line and an exit code
    (see the module doc). ``SystemExit`` passes through."""
    try:
        yield
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        fail("aborted", 1)
    except click.UsageError as exc:
        hint = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
        fail(f"usage: {' '.join(exc.format_message().split())}{hint}", EX_USAGE)
    except click.ClickException as exc:
        fail(" ".join(exc.format_message().split()), exc.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line
        line, code = translate(exc)
        log.debug("command failed", exc_info=True)
        fail(line, code)


class VpayGroup(click.Group):
    """The ``vpay-server`` group: every command runs ``guarded``."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             **extra: Any) -> Any:
        extra.pop("standalone_mode", None)
        with guarded():
            code = super().main(args, prog_name, standalone_mode=False, **extra)
            sys.exit(code if isinstance(code, int) else 0)


def guarded_main(command: click.Command, prog_name: str) -> None:
    """Run ``command`` as its own program (``vpay-worker``) under ``guarded``."""
    with guarded():
        code = command.main(prog_name=prog_name, standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)


def open_db(pool_size: int | None = None):
    """``(url, pool)``: the database URL (``VPAY_DATABASE_URL`` or the embedded
    default) and, when ``pool_size`` is given, a pool of that size. A bad
    setting exits 78 with one line; a database that does not answer within
    ``VPAY_DATABASE_OPEN_TIMEOUT_SECONDS`` raises ``PoolTimeout`` (69)."""
    from vpay.base.db import ConfigError, database_url, make_pool
    try:
        url = database_url()
    except ConfigError as exc:
        refuse(str(exc))
    if pool_size is None:
        return url, None
    return url, make_pool(url, max_size=pool_size)


def connect_db():
    """One autocommit connection to the configured database, for one-shot
    commands; a database that does not answer raises (69, one line)."""
    from vpay.base.db import connect
    return connect(open_db()[0])


def echo_json(doc: Any) -> None:
    """``doc`` as indented JSON on stdout (datetimes as ISO 8601)."""
    import json
    from datetime import datetime

    def default(value):
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(f"not JSON: {type(value).__name__}")
    click.echo(json.dumps(doc, indent=2, default=default))


TEXT_COLUMNS = ("last_error", "details", "note", "reason")
"""Free-text columns, cut at 60 characters in a table (ids never are)."""


def echo_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    """``rows`` as a plain text table of ``columns`` (a header, then one line
    per row; ``TEXT_COLUMNS`` cut at 60 characters), or ``(none)``."""
    if not rows:
        click.echo("(none)")
        return
    from vpay.cli.output import safe_text

    def cell(value: Any, column: str) -> str:
        if value is None:
            return "-"
        if hasattr(value, "isoformat"):
            value = value.isoformat(timespec="seconds")
        elif isinstance(value, (dict, list)):
            import json
            value = json.dumps(value, default=str)
        text = safe_text(" ".join(str(value).split()))
        return text if len(text) <= 60 or column not in TEXT_COLUMNS else text[:59] + "…"
    cells = [[cell(r.get(c), c) for c in columns] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip())
    for line in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())


def echo_rows(rows: list[dict[str, Any]], columns: Sequence[str], as_json: bool,
              done: str | None = None) -> None:
    """What an operator command answers: ``rows`` as JSON (``--json``) or as
    a table of ``columns``; for a table, ``done`` (a past-tense verb) is
    followed by the row count on stderr (``retried 3``), so stdout stays the
    table alone."""
    if as_json:
        echo_json(rows)
        return
    echo_table(rows, columns)
    if done is not None:
        click.echo(f"{done} {len(rows)}", err=True)
