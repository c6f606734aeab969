"""Database access: which Postgres, the connection pool, and migrations.

* ``VPAY_DATABASE_URL`` names the server; when it is unset, an embedded
  Postgres (``pgserver``) under ``VPAY_DATA_DIR`` (default ``./.vpay``) is
  created on first use and reused afterwards (contract: Configuration).
* Pools are created in the process that uses them, never across a fork
  (psycopg_pool docs), with autocommit connections: every multi-statement
  write is an explicit ``conn.transaction()`` block.
* ``VPAY_DATABASE_PREPARED_STATEMENTS`` (``on`` by default; ``off``) says
  whether psycopg may prepare statements server-side (it does after five
  executions of one query on one connection). ``off`` sets
  ``prepare_threshold=None`` on every connection made here (pools,
  ``connect``, ``session_connect``): what a transaction-pooling pgbouncer
  older than 1.21 needs, since it hands a client's next transaction to
  another server connection, where its prepared statements do not exist or
  are someone else's (docs/deployment.md, "pgbouncer").
* ``VPAY_SESSION_DATABASE_URL`` names the server for the connections that
  need a session of their own (the worker's LISTEN and its vacuum, the
  statement import's temporary tables and lock); default ``VPAY_DATABASE_URL``.
* Migrations are the ``sql/NNNN_*.sql`` files shipped inside the package as
  ``vpay.sql``, applied in file-name order, each once, recorded in
  ``schema_migrations``, under a transaction-scoped advisory lock so that two
  concurrent ``migrate`` runs are safe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Callable, Mapping

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

log = logging.getLogger("vpay.db")

MAX_CONNECTIONS = 10
"""The pool's size. A worker refuses ``--worker-concurrency`` above half of it
(design page: "What can go wrong"), leaving room for handler writes."""

CHECK_IDLE_SECONDS = 1.0
"""A pooled connection is checked (one empty query, a round trip) on checkout
only when it has sat idle in the pool at least this long; busier ones are
handed out as they are. pgx's pool (pgxpool, behind River) pings on acquire
after one second idle by the same reasoning: a connection used a moment ago
is almost surely alive, and one that died since fails its next statement,
which every caller already survives (a database error is retried; the pool
discards a broken connection when it comes back). Checking every checkout
cost a round trip per checkout (issue #15)."""

CHECK_ANSWER_SECONDS = 2.0
"""How long that check waits for its answer (seconds): a connection that has
gone silent (a stuck proxy, a NAT that dropped its mapping) is replaced
after it rather than holding the checkout, and whoever waits on it, for ever."""

_MIGRATE_LOCK = 7_316_240_051  # pg_advisory_xact_lock key for migrate; any fixed number


class ConfigError(Exception):
    """The configuration cannot work (exit 78, EX_CONFIG)."""


PREPARED_STATEMENTS = "VPAY_DATABASE_PREPARED_STATEMENTS"
SESSION_URL = "VPAY_SESSION_DATABASE_URL"

# Parameters people put in a URL that belong to psycopg, not libpq: libpq
# refuses every one of them, and the way to say it is a setting of ours.
_PSYCOPG_ONLY = {"prepare_threshold": f"{PREPARED_STATEMENTS}=off",
                 "prepared_statements": f"{PREPARED_STATEMENTS}=off"}


def prepared_statements(environ: Mapping[str, str] | None = None) -> bool:
    """``VPAY_DATABASE_PREPARED_STATEMENTS`` (``environ``, default
    ``os.environ``): ``on`` (the default, also when unset or blank) or
    ``off``, in any case. Raises ``ConfigError`` (exit 78) for anything
    else: a typo must not leave prepared statements on behind a bouncer
    that corrupts them."""
    env = os.environ if environ is None else environ
    raw = env.get(PREPARED_STATEMENTS, "").strip()
    value = raw.lower() or "on"
    if value not in ("on", "off"):
        raise ConfigError(f"{PREPARED_STATEMENTS} must be on or off (off behind a transaction-pooling "
                          f"pgbouncer older than 1.21), got {raw!r}")
    return value == "on"


PREPARE_AT_ONCE = 1
"""psycopg's ``prepare_threshold`` for the worker's pool: a statement is
prepared on its second run on a connection, after one that succeeded, not
after five runs sent unprepared (psycopg's default, each parsed and planned
anew). The worker runs a fixed set of statements thousands of times per
connection, and its claim statement costs about 1 ms to plan
(docs/performance.md, "A fifth run"). Not 0 (prepared on the first run):
psycopg 3.3 leaves on the server the prepared statement of a run that fails
or answers no rows (the pool's empty check query), one per failure until
the first success (a claim's is about 256 KiB); after one success, a failure
costs what it does at psycopg's default."""


def connect_kwargs(environ: Mapping[str, str] | None = None, *, prepare_at_once: bool = False) -> dict:
    """The keyword arguments every connection made here gets from the
    settings: ``{"prepare_threshold": None}`` when
    ``VPAY_DATABASE_PREPARED_STATEMENTS`` is ``off`` (psycopg then never
    prepares); else ``{"prepare_threshold": PREPARE_AT_ONCE}`` with
    ``prepare_at_once`` (the worker's pool), else nothing (psycopg's
    default: prepared after 5 runs). Raises ``ConfigError`` for a bad value
    (``prepared_statements``)."""
    if not prepared_statements(environ):
        return {"prepare_threshold": None}
    return {"prepare_threshold": PREPARE_AT_ONCE} if prepare_at_once else {}


def describe(url: str, environ: Mapping[str, str] | None = None) -> str:
    """``url`` without its password, for the one log line that says which
    database is in use: ``user@host:port/dbname``. What the URL leaves out is
    what libpq will use: ``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGDATABASE``
    from ``environ`` (default ``os.environ``), else libpq's own defaults (a
    Unix socket, 5432, the OS user), so the line names the server the
    process really connects to (libpq docs, "Environment Variables"). A
    multi-host URL is shown as every ``host:port`` it lists, in order."""
    env = os.environ if environ is None else environ
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable database url>"
    host = parts.get("host") or env.get("PGHOST") or "(local socket)"
    port = parts.get("port") or env.get("PGPORT") or "5432"
    user = parts.get("user") or env.get("PGUSER") or "(os user)"
    dbname = parts.get("dbname") or env.get("PGDATABASE") or "-"
    # A multi-host URL (a primary and its standbys, docs/deployment.md):
    # libpq pairs the n-th host with the n-th port, one port serving all.
    hosts, ports = host.split(","), port.split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    servers = ",".join(f"{h}:{p}" for h, p in zip(hosts, ports)) if len(ports) == len(hosts) \
        else f"{host}:{port}"
    return f"{user}@{servers}/{dbname}"


def embedded_url(data_dir: str | os.PathLike, cleanup_mode: str = "stop") -> str:
    """Start (or reuse) the embedded Postgres under ``data_dir/pgdata`` and
    return its URL (a Unix socket; it listens on no TCP port).

    The server stops when the last process that opened it exits (pgserver's
    ``cleanup_mode='stop'``; ``'delete'`` also deletes ``pgdata`` then, for
    a throwaway server such as the test suite's); a process killed with -9
    leaves it running, and the next use of the same ``data_dir`` reuses it
    (the test suite, whose every run has its own folder, sweeps such
    left-overs instead: tests/pg_orphans.py).
    """
    import fcntl

    import pgserver  # imported lazily: only the embedded default needs it

    logging.getLogger("pgserver").setLevel(logging.WARNING)
    root = Path(data_dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    # Several processes may start at once (a worker and the API, xdist
    # workers): pgserver creates the data folder without exist_ok, so the
    # first start is serialised on a lock file beside it.
    with open(root / ".pgserver.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            (root / "pgdata").mkdir(exist_ok=True)
            server = pgserver.get_server(root / "pgdata", cleanup_mode=cleanup_mode)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return server.get_uri()


def check_url(url: str, name: str = "VPAY_DATABASE_URL") -> str:
    """``url`` when it is a libpq URL (``postgresql://`` or ``postgres://``,
    or a ``key=value`` conninfo string) that names its database; raises
    ``ConfigError`` otherwise (exit 78 at once, no connection tried). The
    message names the setting ``name`` the URL came from.

    A URL without a database (a bare ``postgres://``, ``postgresql://host``)
    is refused rather than left to libpq's defaults (the database named like
    the OS user, on the default socket), which may be another service's
    database: write it, e.g. ``postgresql://vpay@/vpay?host=/run/postgresql``.

    Only libpq's connection parameters may be in it: a parameter libpq does
    not know is named in the refusal, and one that is psycopg's
    (``?prepare_threshold=0``) is answered with the setting that does it
    (``VPAY_DATABASE_PREPARED_STATEMENTS=off``)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else None
    if scheme is not None and scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"{name} must be a postgresql:// URL, not {scheme}://")
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        text = " ".join(str(exc).split())
        unknown = re.search(r'(?:invalid URI query parameter:|invalid connection option) "([^"]*)"', text)
        if unknown:
            param = unknown.group(1)
            instead = _PSYCOPG_ONLY.get(param.lower())
            if instead:
                raise ConfigError(f"{name} has {param!r}, which is not a libpq parameter: "
                                  f"remove it and set {instead} instead") from None
            raise ConfigError(f"{name} has a parameter libpq does not know: {param!r} "
                              f"(only libpq connection parameters go in the URL)") from None
        raise ConfigError(f"{name} is not a libpq URL: {text}") from None
    if not parts.get("dbname"):
        raise ConfigError(f"{name} names no database; libpq would pick defaults: "
                          "write it, e.g. postgresql://vpay@/vpay?host=/run/postgresql")
    return url


def database_url(environ: Mapping[str, str] | None = None) -> str:
    """The URL every command uses: ``VPAY_DATABASE_URL`` (checked by
    ``check_url``: ``ConfigError`` when it cannot be meant) or the embedded
    default under ``VPAY_DATA_DIR``. Logs which one, without a password.
    ``VPAY_DATABASE_PREPARED_STATEMENTS`` is checked here too, so every
    command refuses a bad value (78) before it connects."""
    env = os.environ if environ is None else environ
    prepared_statements(env)  # refused here, before any connection, when it cannot be meant
    url = env.get("VPAY_DATABASE_URL", "").strip()
    if url:
        check_url(url)
        log.info("database in use", extra={"database": describe(url), "embedded": False})
        return url
    data_dir = env.get("VPAY_DATA_DIR", "").strip() or "./.vpay"
    url = embedded_url(data_dir)
    log.info("database in use", extra={"database": describe(url), "embedded": True,
                                       "data_dir": str(Path(data_dir).resolve())})
    return url


def session_database_url(url: str, environ: Mapping[str, str] | None = None) -> str:
    """The URL of the connections that need a session of their own (the
    worker's LISTEN and vacuum, the statement import): ``VPAY_SESSION_DATABASE_URL``
    (``environ``, default ``os.environ``), checked like ``check_url``
    (``ConfigError`` naming it), else ``url`` (the pools' URL). Behind a
    transaction-pooling bouncer it must point at Postgres itself or at a
    session-mode pool (docs/deployment.md, "pgbouncer"). Logs which one
    when it is set."""
    env = os.environ if environ is None else environ
    session = env.get(SESSION_URL, "").strip()
    if not session:
        return url
    check_url(session, SESSION_URL)
    log.info("session database in use", extra={"database": describe(session)})
    return session


def session_connect(url: str, application_name: str, timeout: float | None = None,
                    **kwargs) -> psycopg.Connection:
    """One autocommit connection of its own to ``url`` (a session URL: the
    listener, the vacuum), named ``application_name`` (cut to Postgres's 63
    bytes), with the settings' ``connect_kwargs`` and a ``connect_timeout``
    of ``timeout`` seconds (default ``open_timeout()``). Sets no startup
    ``options``: pgbouncer refuses the connection for them (``unsupported
    startup parameter: options``); set a GUC with ``SET`` after connecting."""
    if timeout is None:
        timeout = open_timeout()
    return psycopg.connect(url, autocommit=True, application_name=application_name[:63],
                           connect_timeout=max(1, round(timeout)), **connect_kwargs(), **kwargs)


def check_if_idle(conn: psycopg.Connection) -> None:
    """The pool's ``check`` hook: ``ConnectionPool.check_connection``'s empty
    query (never prepared: see ``PREPARE_AT_ONCE``) only for a connection last
    handed out ``CHECK_IDLE_SECONDS`` or more ago (or never), which is at
    least as long as it sat idle: a
    connection held long by its user is checked once more than needed, never
    once less. Raises what the check raises; the pool then replaces the
    connection. (Not a ``reset`` hook stamping the return: psycopg_pool hands
    every return to its worker thread when a reset hook is set, a thread
    switch per checkout.) The check waits at most ``CHECK_ANSWER_SECONDS``
    for its answer (``answer_within``)."""
    now = time.monotonic()
    if now - getattr(conn, "_vpay_handed_out_at", float("-inf")) >= CHECK_IDLE_SECONDS:
        # a connection gone silent (every byte acknowledged, nothing answered)
        # would hold the checkout for ever: unanswered in time, it is dead
        with answer_within(conn, CHECK_ANSWER_SECONDS):
            conn.execute("", prepare=False)  # our connections are autocommit
    conn._vpay_handed_out_at = now


def make_pool(url: str, *, max_size: int = MAX_CONNECTIONS, min_size: int = 1,
              name: str = "vpay", timeout: float | None = None, wait: bool = True,
              configure: Callable[[psycopg.Connection], None] | None = None,
              prepare_at_once: bool = False) -> ConnectionPool:
    """An open pool of autocommit connections. A connection idle
    ``CHECK_IDLE_SECONDS`` or more is checked on checkout and replaced when
    broken; a broken one comes back from its failed statement and is
    replaced then, so a Postgres restart is survived.

    Raises ``psycopg_pool.PoolTimeout`` when no connection can be made within
    ``timeout`` seconds (default ``VPAY_DATABASE_OPEN_TIMEOUT_SECONDS``, 30).
    ``wait=False`` returns at once and lets the pool's own thread open its
    ``min_size`` connections (and keep retrying while the database is away):
    nothing raises here, a checkout waits or times out instead.

    Every connection gets ``connect_kwargs()`` (no server-side prepared
    statements with ``VPAY_DATABASE_PREPARED_STATEMENTS=off``; a bad value
    raises ``ConfigError`` here). ``configure`` is called with every new
    connection before it joins the pool (psycopg_pool's hook; it must leave
    the connection idle): the worker and the API report the commit mode
    with it (``vpay.base.replication.CommitModeLog``). ``prepare_at_once``:
    statements are prepared on their second run (``PREPARE_AT_ONCE``; the
    worker's pool), unless prepared statements are off.
    """
    if timeout is None:
        timeout = open_timeout()
    pool = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        name=name,
        open=False,
        # application_name: pg_stat_activity shows whose connections these are
        # connect_kwargs: prepare_threshold=None with VPAY_DATABASE_PREPARED_STATEMENTS=off
        kwargs={"autocommit": True, "application_name": name,
                **connect_kwargs(prepare_at_once=prepare_at_once)},
        check=check_if_idle,
        configure=configure,
        # Bounded, so the pool's back-off restarts within seconds after a long
        # outage (unbounded, it doubles for ever: ~30 s late after 90 s down);
        # a connection that gives up is replaced on the next checkout.
        reconnect_timeout=10.0,
    )
    pool.open(wait=wait, timeout=timeout)
    return pool


def migration_files() -> list[tuple[str, str]]:
    """``[(file name, sql text)]`` of the shipped migrations, in name order."""
    from vpay.base.queries import sql_root
    folder = sql_root()
    files = sorted((e for e in folder.iterdir() if e.name.endswith(".sql")), key=lambda e: e.name)
    return [(e.name, e.read_text(encoding="utf-8")) for e in files]


def migrate(conn: psycopg.Connection) -> list[str]:
    """Apply pending migrations in one transaction; answer the names applied
    (empty when the schema is current). Safe to run twice, and concurrently:
    the advisory lock serialises runs and the second sees them applied."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        done = {r[0] for r in conn.execute("SELECT name FROM schema_migrations")}
        for name, sql in migration_files():
            if name in done:
                continue
            conn.execute(sql)
            conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (name,))
            applied.append(name)
    return applied


def open_timeout() -> float:
    """``VPAY_DATABASE_OPEN_TIMEOUT_SECONDS`` (default 30): how long a command
    waits for the database at start. Raises ``ConfigError`` unless finite and > 0."""
    raw = os.environ.get("VPAY_DATABASE_OPEN_TIMEOUT_SECONDS", "").strip()
    try:
        value = float(raw) if raw else 30.0
    except ValueError:
        raise ConfigError(f"VPAY_DATABASE_OPEN_TIMEOUT_SECONDS must be a number of seconds, got {raw!r}") from None
    if not 0 < value < float("inf"):
        raise ConfigError(f"VPAY_DATABASE_OPEN_TIMEOUT_SECONDS must be > 0 and finite, got {raw!r}")
    return value


def connect(url: str) -> psycopg.Connection:
    """One autocommit connection, for commands that need no pool, with
    ``connect_kwargs()``; gives up after ``open_timeout()`` seconds
    (``psycopg.OperationalError``)."""
    return psycopg.connect(url, autocommit=True, connect_timeout=max(1, round(open_timeout())),
                           **connect_kwargs())


@contextlib.contextmanager
def answer_within(conn: psycopg.Connection, seconds: float):
    """Bound what ``conn`` is asked inside the block to ``seconds`` in all,
    whatever the path to the server does: when the time passes, the
    connection's socket is shut (``vpay.base.http_deadline.Deadline``, the
    process's one watchdog thread) and the statement waiting on it fails with
    ``psycopg.OperationalError``; the pool then drops the connection.

    For the writes of a worker's exit (the drain's lease releases, the
    workers row): a server that went silent behind a stuck proxy or a NAT
    that dropped its mapping acknowledges nothing and refuses nothing, and
    neither ``statement_timeout`` (the server's) nor TCP keepalives (the
    relay's kernel answers them) ends the wait. Answers the ``Deadline``
    (``.expired`` says whether it was the time)."""
    from vpay.base.http_deadline import Deadline
    with Deadline(seconds) as deadline:
        try:
            sock = socket.socket(fileno=os.dup(conn.fileno()))
        except (OSError, ValueError, psycopg.Error):
            sock = None  # closed already: nothing to bound
        if sock is not None:
            deadline.attach(sock)  # keeps a descriptor of its own
            sock.close()
        yield deadline
