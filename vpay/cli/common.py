"""What every command shares: the database it opens (one bound, one message),
the log it writes, and the parameter types of its flags (amounts, row ids,
ports, durations).

The exit codes and the one ``vpay:`` line are ``vpay.cli.errors``; what a
command prints (a table, or JSON with ``--json``) is ``vpay.cli.output``.
``VpayGroup`` (the ``vpay-server`` group) and ``guarded_main``
(``vpay-worker``) run every command under ``errors.guarded``, so a command
only raises.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Sequence

import click

from vpay.cli.errors import guarded, refuse

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

log = logging.getLogger("vpay.cli")


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


def open_database(pool_size: int | None = None, configure=None, prepare_at_once: bool = False):
    """``(url, conn_or_pool)``: the one way every command and the worker
    reach the database, with one bound and one message.

    The URL is ``VPAY_DATABASE_URL`` or the embedded default (a bad setting:
    ``ConfigError``, exit 78). One connection is made at once, bounded by
    ``VPAY_DATABASE_OPEN_TIMEOUT_SECONDS`` (libpq's ``connect_timeout``): a
    refused or unknown host fails on the spot, a silent one after the bound;
    its failure carries ``user@host:port/db`` for the one line (exit 69).
    With ``pool_size``, that connection is closed and a pool of that size
    is opened (bounded the same way) and returned instead: a pool alone
    would retry a refused server for the whole bound and then say only
    "pool initialization incomplete". ``configure``, ``prepare_at_once``:
    as for ``vpay.base.db.make_pool``.

    With ``VPAY_DATABASE_PREPARED_STATEMENTS`` on, the URL is first probed
    for a transaction-pooling bouncer (``vpay.base.pooling``: one more
    connection and a dozen one-row queries) and refused (``ConfigError``,
    78) when it is one: prepared statements would fail or run another
    client's."""
    import psycopg
    from psycopg_pool import PoolTimeout

    from vpay.base import pooling
    from vpay.base.db import connect, database_url, describe, make_pool
    url = database_url()
    try:
        conn = connect(url)
        try:
            pooling.refuse_prepared_behind_pooler(url, first=conn)
        except BaseException:
            conn.close()
            raise
    except psycopg.OperationalError as exc:
        exc.vpay_where = describe(url)
        raise
    if pool_size is None:
        return url, conn
    conn.close()
    try:
        return url, make_pool(url, max_size=pool_size, configure=configure,
                              prepare_at_once=prepare_at_once)
    except PoolTimeout as exc:
        exc.vpay_where = describe(url)
        raise


def open_db(pool_size: int | None = None):
    """``(url, pool)``: ``open_database`` for a pool of ``pool_size``, or the
    URL alone (``pool`` None) without one, for a service that starts while
    the database is down (the API, the console): then the URL is probed for
    a transaction-pooling bouncer only if the database answers within
    ``pooling.PROBE_CONNECT_TIMEOUT_SECONDS`` (``pooling.check_or_warn``:
    ``ConfigError``, 78, when prepared statements are on behind one)."""
    if pool_size is None:
        from vpay.base import pooling
        from vpay.base.db import database_url
        url = database_url()
        pooling.check_or_warn(url)
        return url, None
    return open_database(pool_size)


def connect_db():
    """One autocommit connection for a one-shot command (``open_database``)."""
    return open_database()[1]


def connect_session_db(needs: str):
    """One autocommit connection to the session URL (``VPAY_SESSION_DATABASE_URL``,
    default ``VPAY_DATABASE_URL``), for a one-shot command that keeps state in
    its session (the statement import: temporary tables, a session lock),
    which a transaction-pooling bouncer would scatter over server connections.
    Checked, bounded and reported like ``open_database``; probed like the
    worker's session URL (``pooling.refuse_pooled_session``: 78 when it is
    pooled per transaction, the message saying ``needs``: what the command
    keeps in its session, e.g. ``pooling.IMPORT_SESSION_NEEDS``)."""
    import psycopg

    from vpay.base import pooling
    from vpay.base.db import SESSION_URL, connect, database_url, describe, session_database_url
    url = database_url()
    session = session_database_url(url)
    try:
        pooling.refuse_pooled_session(session, explicit=bool(os.environ.get(SESSION_URL, "").strip()),
                                      needs=needs)
        return connect(session)
    except psycopg.OperationalError as exc:
        exc.vpay_where = describe(session)
        raise


class _Quiet(logging.Filter):
    """On a one-shot command's stderr: only operator audit lines
    (``extra={"audit": True}``), unless the log was asked for."""

    def filter(self, record: logging.LogRecord) -> bool:
        return bool(getattr(record, "audit", False))


def setup_logging(flag_level: str | None) -> None:
    """The log of a one-shot command: JSON on stderr, where it would mix with
    the one ``vpay:`` line a failure prints. So by default only operator
    audit lines go there (``jobs retry``, ``alerts ack``, keys issued or
    revoked); everything at the level asked for when ``--log-level`` is
    given, or ``VPAY_LOG_LEVEL`` is DEBUG. Services (the worker, the API)
    set up their own log on stdout and are not quieted."""
    from vpay.base import logs
    level = log_level(flag_level)
    logs.setup(level)
    if flag_level is None and level != "DEBUG":
        for handler in logging.getLogger().handlers:
            handler.addFilter(_Quiet())


class Duration(click.ParamType):
    """A duration on the command line, always with its unit: ``30s``,
    ``15m``, ``24h``, ``90d`` (contract: "Durations on the command line take
    a unit everywhere"). A bare number is refused with a one-line hint: is
    ``24`` hours, days or seconds? The one exception is a flag whose name
    already says the unit (``--lease-seconds``, ``--overlap-hours``): it
    takes a bare number in that unit (``bare="s"``, ``"h"``…) as well.
    Converts to seconds (a float); ``minimum``/``maximum`` bound it
    (seconds, inclusive)."""

    name = "duration"
    UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    MAX_SECONDS = 36500 * 86400
    """A hundred years: past it Postgres cannot subtract it from now()."""

    def __init__(self, minimum: float = 0.0, maximum: float | None = None, bare: str | None = None):
        self.minimum = minimum
        self.bare = bare
        self.maximum = self.MAX_SECONDS if maximum is None else maximum

    def convert(self, value: Any, param, ctx) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        import re
        text = str(value).strip().lower()
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)", text)
        if m is None:
            self.fail(f"{value!r} is not a duration like 30s, 15m, 24h or 90d", param, ctx)
        unit = m.group(2) or self.bare
        if unit is None:
            self.fail(f"{value!r} has no unit: write {text}s, {text}m, {text}h or {text}d", param, ctx)
        seconds = float(m.group(1)) * self.UNITS[unit]
        if seconds < self.minimum:
            self.fail(f"{value!r} is less than {format_duration(self.minimum)}", param, ctx)
        if seconds > self.maximum:
            self.fail(f"{value!r} is more than {format_duration(self.maximum)}", param, ctx)
        return seconds


def format_duration(seconds: float) -> str:
    """``seconds`` in the largest unit that divides it: ``90d``, ``24h``, ``15m``, ``30s``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


PORT = click.IntRange(min=0, max=65535)
"""A TCP port on the command line (0: any free one); anything else is a usage error."""
