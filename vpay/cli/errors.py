"""The error layer of every command: exit codes by construction, one line.

A command never prints its own failure and never calls ``sys.exit`` for one:
it raises one of the classes below (or lets a library exception out), and
``guarded`` (wrapped around ``vpay-server`` and ``vpay-worker``) prints exactly
one ``vpay: …`` line on stderr and exits with the code the class carries.
The rule (README, contract "Commands, exit codes"):

====  =========================  =============================================
code  class                      when
====  =========================  =============================================
0     (none)                     done
1     ``NotFound``, ``Refused``  an id that names nothing; the data refuses
                                 (a refund above what is left, an alert
                                 already acknowledged): nothing changed
2     ``click.UsageError``       a bad flag, a bad value, a missing option
69    ``Unavailable``            the database (or a port) cannot be had
70    anything else              a bug (``--log-level DEBUG`` logs the trace)
78    ``ConfigRefused``          a setting that cannot work (``EX_CONFIG``:
                                 systemd does not restart it)
====  =========================  =============================================

Library exceptions are translated in one place (``translate``):
``psycopg.OperationalError``/``PoolTimeout``/an undefined table are 69,
``ConfigError`` 78. Nothing else reaches stderr unless asked for: one-shot
commands log there only with ``--log-level`` (or ``VPAY_LOG_LEVEL=DEBUG``);
see ``vpay.cli.common.setup_logging``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from typing import Iterator

import click

EX_OK = 0
EX_DATA = 1
EX_USAGE = 2
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_CONFIG = 78

EXIT_CODES = {EX_OK: "done", EX_DATA: "not found, or refused by the data (nothing changed)",
              EX_USAGE: "usage error (a bad flag or value)",
              EX_UNAVAILABLE: "the database (or a port) is unavailable",
              EX_SOFTWARE: "a bug (internal error)", EX_CONFIG: "configuration refused"}
"""Every exit code a command may give, with what it means (docs/cli.md)."""

log = logging.getLogger("vpay.cli")


class CommandError(click.ClickException):
    """A failure with its exit code; ``guarded`` prints ``vpay: <message>``."""

    exit_code = EX_DATA
    prefix = ""

    def __init__(self, message: str):
        super().__init__(self.prefix + " ".join(str(message).split()))


class NotFound(CommandError):
    """An id that names nothing (exit 1): ``no refund 're_x'``."""


class Refused(CommandError):
    """The data refuses the request (exit 1); nothing was changed."""


class Unavailable(CommandError):
    """A resource the command needs cannot be had (exit 69): the database, a port."""

    exit_code = EX_UNAVAILABLE


class ConfigRefused(CommandError):
    """A setting that cannot work (exit 78)."""

    exit_code = EX_CONFIG
    prefix = "configuration refused: "


def fail(message: str, code: int = EX_DATA) -> None:
    """Raise the ``CommandError`` for ``code`` (1, 69 or 78) with ``message``.
    Kept for the commands written before this layer; new code raises a class."""
    cls = {EX_DATA: Refused, EX_UNAVAILABLE: Unavailable}.get(code)
    if cls is None:
        exc = CommandError(message)
        exc.exit_code = code
        raise exc
    raise cls(message)


def refuse(message: str) -> None:
    """Raise ``ConfigRefused(message)`` (exit 78)."""
    raise ConfigRefused(message)


def _unavailable_line(exc: BaseException) -> str:
    """``database unavailable: WHERE: CAUSE (hint)`` for a psycopg failure.
    WHERE is ``user@host:port/db`` when the failure came through
    ``open_database`` (which sets ``exc.vpay_where``)."""
    import psycopg
    text = " ".join(str(exc).split())[:400] or type(exc).__name__
    where = getattr(exc, "vpay_where", None)
    if where:
        # libpq repeats the address it tried; the cause is what follows the last "failed:"
        cause = text.rsplit(" failed: ", 1)[-1]
        cause = re.sub(r"\s*Is the server running [^?]*\?", "", cause).replace("FATAL: ", "").strip()
        text = f"{where}: {cause}"
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
    """``(line, exit code)`` for an exception a command let out. Database
    trouble is 69, a refused setting 78, anything else is a bug (70)."""
    import psycopg
    from psycopg_pool import PoolTimeout

    from vpay.base.db import ConfigError
    if isinstance(exc, ConfigError):
        return f"configuration refused: {' '.join(str(exc).split())}", EX_CONFIG
    state = getattr(exc, "sqlstate", None)
    if isinstance(exc, psycopg.OperationalError) and state and not state.startswith(_CONNECTION_STATES):
        # a deadlock (40P01), a lock or statement timeout (55P03, 57014), a
        # serialization failure: the database is there and said no
        return _refused_line(exc), EX_UNAVAILABLE
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout,
                        psycopg.errors.UndefinedTable)):
        return _unavailable_line(exc), EX_UNAVAILABLE
    return f"internal error ({type(exc).__name__}): {' '.join(str(exc).split())[:300]}", EX_SOFTWARE


def _say(line: str, code: int) -> None:
    from vpay.cli.output import safe_text  # a message may quote rail, merchant or statement text
    click.echo(f"vpay: {safe_text(line)}", err=True)
    sys.exit(code)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Run a command so that any failure is one ``vpay:`` line on stderr and
    its exit code (see the module doc). ``SystemExit`` passes through."""
    try:
        yield
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        _say("aborted", EX_DATA)
    except click.UsageError as exc:
        hint = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
        _say(f"usage: {' '.join(exc.format_message().split())}{hint}", EX_USAGE)
    except click.ClickException as exc:
        _say(" ".join(exc.format_message().split()), exc.exit_code)
    except KeyboardInterrupt:
        _say("interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line
        line, code = translate(exc)
        log.debug("command failed", exc_info=True)
        _say(line, code)
