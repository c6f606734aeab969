"""Is there a transaction-pooling bouncer between us and Postgres? Asked once
at start, so that a setting that would corrupt queries or never deliver a
wake-up is refused (exit 78) instead of run (issue 25; docs/deployment.md,
"pgbouncer").

Why it matters: pgbouncer in ``transaction`` (or ``statement``) mode gives
a client's next transaction to whichever server connection is free. On
Debian 12's 1.18 that breaks psycopg's server-side prepared statements
(``prepared statement "_pg3_0" already exists``, ``... does not exist``, and
worse: a statement prepared by another client run without any error), and a
``LISTEN`` subscribes a server connection the client leaves at once, so no
notification ever reaches it.

How it is seen (``transaction_pooled``): two client connections, A and B,
each running ``SELECT pg_backend_pid()`` as its own transaction, in the
order A, A, B, A, for ``PROBE_ROUNDS`` rounds. Through Postgres itself or a
session-mode bouncer, a client connection keeps one backend for its whole
life and no two live ones share it: A answers one pid every time and B
another. So any of these proves pooling per transaction: A answering two
pids (it moved), or B answering one of A's (they shared a backend). The
order makes pgbouncer show it: by default it reuses the server connection
released last (LIFO), so B is handed the one A just let go; with
``server_round_robin = 1`` (FIFO) and two or more idle server connections,
A's second query goes to another one, and with one idle, B gets A's. No
statement holds a transaction open, so the probe never waits on itself, and
it leaves no state behind.

Limits, said plainly: it is a probe, not a proof of absence. Other clients
of the same bouncer taking server connections between our queries can hide
pooling from one round (they can never fake it: a false alarm is
impossible, since a session never changes backend); three rounds make that
unlikely, not impossible. It cannot tell pgbouncer 1.21+ with
``max_prepared_statements`` (which would make prepared statements safe) from
1.18, so it refuses prepared statements behind any transaction pooler: set
``VPAY_DATABASE_PREPARED_STATEMENTS=off`` there (the cost is a parse per
query). It costs one extra connection and ``4 * PROBE_ROUNDS`` round trips.
"""

from __future__ import annotations

import logging

import psycopg

from vpay.base.db import (PREPARED_STATEMENTS, SESSION_URL, ConfigError, connect_kwargs, describe,
                          open_timeout, prepared_statements)

log = logging.getLogger("vpay.db")

PROBE_ROUNDS = 3
"""Rounds of the probe (four one-statement transactions each): more rounds
only lower the odds that other clients of a busy bouncer hide it."""

PROBE_CONNECT_TIMEOUT_SECONDS = 5.0
"""The connect bound of the probe's connections where the database may be
down at start (the API, the console: they start anyway, and say they could
not look)."""

_PID = "SELECT pg_backend_pid()"


def _pid(conn: psycopg.Connection) -> int:
    return conn.execute(_PID, prepare=False).fetchone()[0]


def transaction_pooled(a: psycopg.Connection, b: psycopg.Connection, rounds: int = PROBE_ROUNDS) -> bool:
    """Whether the autocommit connections ``a`` and ``b`` (to one URL) are
    pooled per transaction: ``a`` answered two backend pids, or ``b`` one of
    ``a``'s (module docstring). Never a false ``True``; a ``False`` through a
    busy bouncer is likely, not certain. Raises what the queries raise."""
    seen_a: set[int] = set()
    for _ in range(rounds):
        seen_a.add(_pid(a))
        seen_a.add(_pid(a))
        pid_b = _pid(b)
        seen_a.add(_pid(a))
        if len(seen_a) > 1 or pid_b in seen_a:
            return True
    return False


def probe(url: str, first: psycopg.Connection | None = None, timeout: float | None = None) -> bool:
    """``transaction_pooled`` on ``first`` (an open autocommit connection to
    ``url``, e.g. the one a command opened anyway) or a new one, and a second
    connection made here (closed after, as is a ``first`` made here).
    ``timeout``: the connect bound in seconds (default ``open_timeout()``).
    Raises ``psycopg.Error`` when the database cannot be reached."""
    bound = max(1, round(open_timeout() if timeout is None else timeout))

    def connect() -> psycopg.Connection:
        return psycopg.connect(url, autocommit=True, connect_timeout=bound,
                               application_name="vpay-pooling-probe", **connect_kwargs())

    own = first is None
    a = connect() if own else first
    try:
        with connect() as b:
            return transaction_pooled(a, b)
    finally:
        if own:
            a.close()


def refuse_prepared_behind_pooler(url: str, first: psycopg.Connection | None = None,
                                  timeout: float | None = None) -> None:
    """Raise ``ConfigError`` (exit 78) when ``VPAY_DATABASE_PREPARED_STATEMENTS``
    is on and ``url`` (the pools' ``VPAY_DATABASE_URL``) is pooled per
    transaction (``probe``); nothing is probed when it is off. Raises
    ``psycopg.Error`` when the database cannot be reached."""
    if not prepared_statements():
        return  # off: prepared statements are never made, pooling is fine
    if probe(url, first, timeout):
        raise ConfigError(
            f"{PREPARED_STATEMENTS} is on but VPAY_DATABASE_URL ({describe(url)}) is pooled per "
            f"transaction (a pgbouncer in transaction mode): prepared statements would fail or run "
            f"another client's; set {PREPARED_STATEMENTS}=off")


WORKER_SESSION_NEEDS = "the wake-up LISTEN and the vacuum need a session"
"""Why the worker's session URL must not be pooled per transaction:
``LISTEN`` there never delivers a wake-up and the vacuum's ``SET`` would land
on another client's session."""

IMPORT_SESSION_NEEDS = "the statement import's temporary tables and advisory lock need a session"
"""Why ``statements import``'s connection must not be pooled per transaction:
its temporary tables and its per-rail advisory lock live in its session, and
the bouncer would scatter its statements over server connections."""


def refuse_pooled_session(url: str, explicit: bool, timeout: float | None = None, *,
                          needs: str) -> None:
    """Raise ``ConfigError`` (exit 78) when the session URL ``url`` is pooled
    per transaction (``probe``). ``needs``: the caller's reason, said in the
    message (``WORKER_SESSION_NEEDS``, ``IMPORT_SESSION_NEEDS``).
    ``explicit``: whether ``VPAY_SESSION_DATABASE_URL`` was set (else ``url``
    is ``VPAY_DATABASE_URL``'s, and the message says to set it). Raises
    ``psycopg.Error`` when the database cannot be reached."""
    if not probe(url, None, timeout):
        return
    where = SESSION_URL if explicit else f"{SESSION_URL} (unset, so VPAY_DATABASE_URL)"
    raise ConfigError(
        f"{where} ({describe(url)}) is pooled per transaction (a pgbouncer in transaction mode): "
        f"{needs}; point {SESSION_URL} at Postgres itself "
        f"or at a session-mode pool")


def check_or_warn(url: str, timeout: float = PROBE_CONNECT_TIMEOUT_SECONDS) -> None:
    """For services that start while the database is down (the API, the
    console): ``refuse_prepared_behind_pooler`` when the database answers
    within ``timeout`` seconds; when it does not, log a WARNING that the
    check could not be made and return (the service starts as before)."""
    try:
        refuse_prepared_behind_pooler(url, timeout=timeout)
    except psycopg.Error as exc:
        log.warning("could not check for a transaction-pooling bouncer: the database did not answer",
                    extra={"database": describe(url), "error": " ".join(str(exc).split())[:300]})
