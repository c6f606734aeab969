"""Test harness: a real Postgres for every test, never a mock.

* The server: ``VPAY_TEST_DATABASE_URL`` when set, otherwise one embedded
  Postgres (pgserver) per test run, shared by the xdist workers of that run,
  in ``$TMPDIR/vpay-test-pg-<run>`` (outside pytest's rotating basetemp),
  deleted by the last process of the run to exit; one a killed run left is
  stopped and deleted by the next run (``tests/pg_orphans.py``).
* Each xdist worker gets its own database, cloned (``CREATE DATABASE …
  TEMPLATE``) from a template migrated once per set of migration files.
* ``db`` empties every table before a test, so tests pass in any order.
* The server starts on the first test that asks for a database (the
  session-scoped ``server_url``), so ``pytest -m unit`` starts none.
* Rings (docs/testing.md): a test's folder gives it its marker (``unit``,
  ``integration``, ``acceptance``); a unit test asking for a database or a
  process, or an integration test asking for a process, stops the run.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from vpay.base import db as vdb

# Webhook secrets are sealed under VPAY_SECRET_KEYS (vpay/base/secretbox.py):
# the tests make their own key, once per process, before any test runs;
# support.base_env hands it to every child process.
if not os.environ.get("VPAY_SECRET_KEYS", "").strip():
    from vpay.base.secretbox import new_key
    os.environ["VPAY_SECRET_KEYS"] = new_key()

TABLES = ("rail_pauses", "operator_actions", "operator_sessions", "login_failures", "operators", "rail_calls", "rail_callbacks", "resolution_proposals", "console_samples", "console_figures", "settlement_evidence", "statement_lines", "statements", "alerts", "events", "jobs", "refunds", "charges", "payment_intents", "webhook_endpoints", "merchants", "workers")
_RUN = uuid.uuid4().hex[:8]
_LOCK = 7_316_240_052


def _server_url() -> str:
    url = os.environ.get("VPAY_TEST_DATABASE_URL", "").strip()
    if url:
        return url
    # A folder of its own, outside pytest's basetemp: pytest keeps only the
    # newest three numbered basetemp folders, so a second and third session
    # started on the same machine deleted a running suite's server under it.
    # One folder per run, shared by that run's xdist workers (xdist gives
    # them one PYTEST_XDIST_TESTRUNUID); the last process to leave stops the
    # server and deletes its data (pgserver's cleanup_mode='delete').
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", _RUN)[:16]
    root = Path(tempfile.gettempdir()) / f"vpay-test-pg-{run}"
    # atexit runs last-registered first: this runs after pgserver's cleanup,
    # and removes the folder once that cleanup has deleted the data in it.
    atexit.register(_remove_if_emptied, root)
    return vdb.embedded_url(root, cleanup_mode="delete")


def _remove_if_emptied(root: Path) -> None:
    """Remove the run's folder once pgserver's cleanup has deleted its data
    (only the last process of the run finds it so)."""
    if root.is_dir() and not (root / "pgdata").exists():
        shutil.rmtree(root, ignore_errors=True)


def _stop_on_sigterm(signum, frame):
    # SIGTERM (timeout(1), a CI cancel) would end the process without atexit,
    # leaving the embedded server running; ended like Ctrl-C, a run without
    # xdist cleans up. Under xdist SIGTERM keeps its default (the run dies at
    # once) and the workers' server is left to the next run's sweep.
    raise KeyboardInterrupt


WORKERS_PER_CORE = 2
"""``pytest -n auto`` starts this many xdist workers per core. Most of the
acceptance ring's time is spent waiting on real processes and timers (the
poll ladder's first rung, lease expiry, drains), not on the CPU: with one
worker per core the 2-core CI box idled at a load near 1.5 (docs/testing.md)."""


def pytest_xdist_auto_num_workers(config):
    """How many workers ``-n auto`` means (pytest-xdist's hook):
    ``WORKERS_PER_CORE`` per core, each with its own database."""
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


def pytest_configure(config):
    """Once per run, in the controller (or the only process), before any
    test: remove the embedded servers earlier runs left when they were
    killed (tests/pg_orphans.py), and, without xdist, end on SIGTERM the
    way Ctrl-C does."""
    if hasattr(config, "workerinput"):
        return
    import signal
    # Not under xdist: a KeyboardInterrupt raised in its controller did not
    # stop the run (the workers went on), where SIGTERM's default does.
    xdist = bool(getattr(config.option, "numprocesses", None))
    if not xdist and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
    if not os.environ.get("VPAY_TEST_DATABASE_URL", "").strip():
        import pg_orphans
        pg_orphans.sweep(Path(tempfile.gettempdir()))


RINGS = ("unit", "integration", "acceptance")
# What a ring may not ask for (through any fixture it uses): unit tests have
# no database and start no process; integration tests run in this process.
_PROCESS_FIXTURES = frozenset({"spawn", "api_stack", "stack"})
_FORBIDDEN = {
    "unit": frozenset({"server_url", "db_url", "pool", "db", "merchant"}) | _PROCESS_FIXTURES,
    "integration": _PROCESS_FIXTURES,
    "acceptance": frozenset(),
}


def ring_of(path: Path) -> str | None:
    """The ring a test file belongs to: the folder under tests/ it sits in."""
    here = Path(__file__).resolve().parent
    try:
        folder = Path(path).resolve().relative_to(here).parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in RINGS else None


def pytest_collection_modifyitems(config, items):
    """Mark every test with its ring, and refuse the run (before any test
    starts) when a test sits outside the rings or asks for what its ring
    promises not to use."""
    broken = []
    for item in items:
        ring = ring_of(item.path)
        if ring is None:
            broken.append(f"{item.nodeid}: not in a ring (tests/unit, tests/integration, tests/acceptance)")
            continue
        item.add_marker(getattr(pytest.mark, ring))
        asked = sorted(_FORBIDDEN[ring] & set(item.fixturenames))
        if asked:
            broken.append(f"{item.nodeid}: the {ring} ring uses no {', '.join(asked)} (docs/testing.md): "
                          "move the test to a heavier ring or drop the fixture")
    if broken:
        raise pytest.UsageError("tests outside their ring's promise:\n  " + "\n  ".join(broken))


def _with_db(url: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


@pytest.fixture(autouse=True)
def _no_database_error_carried_over(monkeypatch):
    """``vpay_database_up`` reads 0 for a minute after any failed statement of
    the process (``vpay.base.metrics.database_error``): one test's simulated
    outage must not hold it at 0 for the next test in the same process."""
    from vpay.base import metrics
    monkeypatch.setattr(metrics, "_last_database_error", None, raising=False)


@pytest.fixture(scope="session")
def server_url() -> str:
    return _server_url()


@pytest.fixture(scope="session")
def db_url(server_url, worker_id) -> str:
    """This xdist worker's own migrated database."""
    digest = hashlib.sha256("".join(n + s for n, s in vdb.migration_files()).encode()).hexdigest()[:12]
    template = f"vpay_tpl_{digest}"
    mine = f"vpay_test_{_RUN}_{worker_id}"
    admin_url = _with_db(server_url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        # CREATE DATABASE cannot run in a transaction, so a session-level lock
        # serialises the template's creation and the clones across workers.
        admin.execute("SELECT pg_advisory_lock(%s)", (_LOCK,))
        try:
            exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (template,)).fetchone()
            if not exists:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(template)))
                with psycopg.connect(_with_db(server_url, template), autocommit=True) as conn:
                    vdb.migrate(conn)
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(mine)))
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(mine), sql.Identifier(template)))
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (_LOCK,))
    yield _with_db(server_url, mine)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(mine)))


@pytest.fixture(scope="session")
def pool(db_url):
    p = vdb.make_pool(db_url, max_size=vdb.MAX_CONNECTIONS)
    yield p
    p.close()


@pytest.fixture
def db(db_url, pool):
    """An autocommit connection to this worker's database, emptied first."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
            sql.SQL(", ").join(sql.Identifier(t) for t in TABLES)))
        conn.execute("DROP TABLE IF EXISTS test_executions")
        yield conn


@pytest.fixture
def spawn(tmp_path):
    """Start installed console scripts; every process is killed at teardown.
    ``spawn("vpay-worker", "--worker-concurrency", "2", env=...)``."""
    from support import Proc, script
    procs: list[Proc] = []

    def start(name: str, *args: str, env: dict[str, str]) -> Proc:
        proc = Proc([script(name), *args], env, tmp_path / f"{name}-{len(procs)}.log")
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.close()


@pytest.fixture
def sandbox():
    """A MoMo-shaped rail: a real HTTP server on 127.0.0.1 in this process."""
    from vpay.sandbox.mtn import SandboxRail
    with SandboxRail(success_after_seconds=0.2) as rail:
        yield rail



@pytest.fixture
def merchant(db) -> str:
    from vpay.money.merchants import create_merchant
    create_merchant(db, "m_test", "Test merchant")
    return "m_test"
