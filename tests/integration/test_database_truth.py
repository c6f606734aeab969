"""Issue 25 against a real Postgres (the pgbouncer halves: tests/acceptance/test_pgbouncer.py):
VPAY_DATABASE_PREPARED_STATEMENTS=off really stops server-side prepares on
every connection vpay makes; the transaction-pooling probe never takes
Postgres itself for a pooler; vpay_database_up drops to 0 when the worker's
statements fail although the snapshot answers; and the drain is not called
clean while a job whose outcome could not be written is still leased."""

from __future__ import annotations

import threading

import pytest

from support import wait_until
from vpay import handlers
from vpay.base import db as vdb
from vpay.base import metrics, pooling
from vpay.engine import lanes, queue
from vpay.money import gauges
from vpay.worker.loop import Worker, WorkerConfig
from vpay.worker.signals import Drain, ShutdownSignals

REPEATS = 8  # above psycopg's prepare_threshold (5)


def _prepared_after_repeats(conn) -> int:
    """Run one query ``REPEATS`` times on ``conn``; answer how many statements
    its session holds prepared (``pg_prepared_statements``: this session's)."""
    for _ in range(REPEATS):
        conn.execute("SELECT count(*) FROM jobs WHERE lane = %s", ("mtn",)).fetchone()
    return conn.execute("SELECT count(*) FROM pg_prepared_statements", prepare=False).fetchone()[0]


@pytest.mark.parametrize("setting, prepared", [("on", True), ("off", False)])
def test_the_setting_decides_whether_pooled_and_single_connections_prepare(db, db_url, monkeypatch,
                                                                           setting, prepared):
    monkeypatch.setenv("VPAY_DATABASE_PREPARED_STATEMENTS", setting)
    pool = vdb.make_pool(db_url, max_size=1)
    try:
        with pool.connection() as conn:
            assert (_prepared_after_repeats(conn) > 0) is prepared
    finally:
        pool.close()
    with vdb.connect(db_url) as conn:
        assert (_prepared_after_repeats(conn) > 0) is prepared
    with vdb.session_connect(db_url, "vpay-test") as conn:
        assert (_prepared_after_repeats(conn) > 0) is prepared


def test_postgres_itself_is_never_taken_for_a_transaction_pooler(db, db_url, monkeypatch):
    monkeypatch.setenv("VPAY_DATABASE_PREPARED_STATEMENTS", "on")
    assert pooling.probe(db_url) is False
    with vdb.connect(db_url) as first:
        assert pooling.probe(db_url, first) is False
        assert not first.closed  # a connection handed in is the caller's to close
    pooling.refuse_prepared_behind_pooler(db_url)  # no ConfigError
    pooling.refuse_pooled_session(db_url, explicit=True, needs=pooling.WORKER_SESSION_NEEDS)


def _up(collector) -> float:
    for family in collector.collect():
        for sample in family.samples:
            if sample.name == "vpay_database_up":
                return sample.value
    raise AssertionError("no vpay_database_up")


def test_database_up_is_0_while_the_workers_statements_fail_though_the_snapshot_answers(db, pool, monkeypatch):
    now = [100.0]
    collector = gauges.DatabaseCollector(pool, lanes=lanes.LANES, clock=lambda: now[0])
    assert _up(collector) == 1
    metrics.database_error("outcome")  # as the worker's loop records a failed outcome write
    now[0] += gauges.CACHE_SECONDS  # a new scrape, not the cached one
    assert _up(collector) == 0
    # the snapshot itself answered: its numbers are still reported
    names = {s.name for f in collector.collect() for s in f.samples}
    assert "vpay_queue_jobs" in names
    # once the window has passed with no new failure, up again
    monkeypatch.setattr(metrics, "_last_database_error",
                        metrics._last_database_error - metrics.DATABASE_ERROR_WINDOW_SECONDS)
    now[0] += gauges.CACHE_SECONDS
    assert _up(collector) == 1


@pytest.fixture
def unwritable_finish(db):
    """A job whose finish (DELETE) the database refuses: an outcome write that
    fails at once with an error the server answered (no retry path), as a
    transaction-pooling bouncer's broken prepared statements did (issue 25).
    Releasing it (an UPDATE) still works."""
    db.execute("""CREATE FUNCTION test_refuse_finish() RETURNS trigger LANGUAGE plpgsql AS $$
                  BEGIN RAISE EXCEPTION 'test: this finish is refused'; END $$""")
    db.execute("CREATE TRIGGER test_refuse_finish BEFORE DELETE ON jobs FOR EACH ROW "
               "WHEN (OLD.dedupe_key = 'unwritable') EXECUTE FUNCTION test_refuse_finish()")
    yield
    db.execute("DROP TRIGGER test_refuse_finish ON jobs")
    db.execute("DROP FUNCTION test_refuse_finish()")


def test_a_drain_with_a_job_left_leased_by_a_failed_outcome_write_is_not_clean_and_hands_it_back(
        db, pool, unwritable_finish):
    from vpay.handlers import testing  # noqa: F401 (registers test.noop)
    signals = ShutdownSignals()
    wid = "truth-w1"
    worker = Worker(pool, handlers.Context(pool=pool, worker_id=wid),
                    WorkerConfig(worker_id=wid, concurrency=1, queues=("housekeeping",), listen=False,
                                 idle_sleep=0.05, jobs_vacuum_every=0), signals)
    result: list[Drain] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    try:
        queue.enqueue(db, "test.noop", "unwritable")
        # the handler answered Done, the finish was refused: the lease is still ours
        wait_until(lambda: worker.leases._unrecorded, timeout=30, what="the refused outcome write")
        assert db.execute("SELECT locked_by FROM jobs WHERE dedupe_key = 'unwritable'").fetchone() == (wid,)
        assert metrics.database_failed_recently()  # vpay_database_up reads 0 now
    finally:
        signals.stop.set()
        thread.join(60)
    assert result == [Drain.TIMED_OUT]  # exit 1: not the clean drain (0) the issue saw
    # handed back at the drain, due at once for another worker
    assert db.execute("SELECT locked_by, run_at <= now() FROM jobs WHERE dedupe_key = 'unwritable'"
                      ).fetchone() == (None, True)


def test_a_drain_after_a_refused_outcome_whose_lease_was_reaped_meanwhile_is_clean(db, pool, unwritable_finish):
    """The verdict is about what is still leased at the drain: a job whose
    lease ran out and was reaped is not this worker's any more."""
    from vpay.handlers import testing  # noqa: F401
    signals = ShutdownSignals()
    wid = "truth-w2"
    worker = Worker(pool, handlers.Context(pool=pool, worker_id=wid),
                    WorkerConfig(worker_id=wid, concurrency=1, queues=("housekeeping",), listen=False,
                                 idle_sleep=0.05, jobs_vacuum_every=0), signals)
    result: list[Drain] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    try:
        queue.enqueue(db, "test.noop", "unwritable")
        wait_until(lambda: worker.leases._unrecorded, timeout=30, what="the refused outcome write")
        # its lease expires and the job is reaped (and parked, so no loop claims it again)
        db.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
                   "WHERE dedupe_key = 'unwritable'")
        queue.reap_expired_leases(db)
        db.execute("UPDATE jobs SET run_at = 'infinity' WHERE dedupe_key = 'unwritable'")
    finally:
        signals.stop.set()
        thread.join(60)
    assert result == [Drain.CLEAN]
