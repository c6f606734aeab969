"""The worker's rail calls written in batches (issue 30;
``vpay.rails.calls.BatchedRecorder``): one statement for many calls, each
row stamped with the database's clock at its call, bounded while the
database is away, written at the end."""

from __future__ import annotations

import pytest
from psycopg_pool import ConnectionPool

from vpay.rails import calls
from vpay.rails.calls import MAX_PENDING, BatchedRecorder


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _call(n: int, **over) -> dict:
    return {"rail": "mtn", "operation": "status", "reference": f"r{n}", "charge_id": None, "refund_id": None,
            "http_status": 200, "answer": "pending", "reason": None, "latency_ms": 12, **over}


def _references(db) -> list[str]:
    return [r[0] for r in db.execute("SELECT reference FROM rail_calls ORDER BY id")]


def test_queued_calls_are_written_in_one_statement_stamped_at_their_call(db, pool):
    clock = _Clock()
    rec = BatchedRecorder(pool, clock=clock)
    try:
        rec(_call(1))
        rec(_call(2, answer="paused", http_status=429, paused_seconds=30.0))
        clock.now += 20.0  # the write comes 20 s after the calls
        assert rec.flush() == 2 and rec.pending() == 0
    finally:
        rec.close()
    assert _references(db) == ["r1", "r2"]
    ages = db.execute("SELECT extract(epoch FROM now() - created_at), "
                      "extract(epoch FROM paused_until - created_at) FROM rail_calls ORDER BY id").fetchall()
    assert all(19.0 <= age <= 25.0 for age, _ in ages)  # the call's time, not the write's
    assert ages[0][1] is None and ages[1][1] == pytest.approx(30.0)


def test_the_default_bound_and_one_past_it(db, pool):
    rec = BatchedRecorder(pool, flush_seconds=3600)
    assert rec.max_pending == MAX_PENDING
    rec._thread = object()  # no writer thread: this test writes by hand
    for n in range(MAX_PENDING):
        rec(_call(n))
    assert (rec.pending(), rec.dropped) == (MAX_PENDING, 0)
    rec(_call(MAX_PENDING))  # one past the bound: the oldest goes
    assert (rec.pending(), rec.dropped) == (MAX_PENDING, 1)
    assert rec.flush() == MAX_PENDING  # in statements of MAX_BATCH rows
    refs = _references(db)
    assert len(refs) == MAX_PENDING and refs[0] == "r1" and refs[-1] == f"r{MAX_PENDING}"


def test_rows_wait_through_an_outage_and_a_refused_batch_is_dropped(db, pool):
    with _nowhere() as away:
        rec = BatchedRecorder(away, max_pending=2)
        rec._thread = object()
        rec(_call(1))
        rec(_call(2))
        assert rec.flush(timeout=0.2) == 0
        assert (rec.pending(), rec.dropped) == (2, 0)  # kept for when the database answers
        rec(_call(3))
        assert (rec.pending(), rec.dropped) == (2, 1)
    rec.pool = pool  # the database is back
    rec(_call(4, latency_ms=-1))  # past the bound again (call 2 goes); a row the table refuses
    assert rec.dropped == 2
    assert rec.flush() == 0 and rec.dropped == 4 and rec.pending() == 0  # the batch went with it
    rec(_call(5))
    assert rec.flush() == 1 and _references(db) == ["r5"]


def _nowhere() -> ConnectionPool:
    return ConnectionPool("postgresql://postgres@127.0.0.1:1/none?connect_timeout=1", min_size=0, max_size=1,
                          open=True, kwargs={"autocommit": True})


def test_set_recorder_closes_the_one_it_replaces_writing_what_it_held(db, pool):
    rec = BatchedRecorder(pool, flush_seconds=3600)
    calls.set_recorder(rec)
    try:
        rec(_call(1))
    finally:
        calls.set_recorder(None)
    assert _references(db) == ["r1"]
    rec(_call(2))  # closed: not recorded
    assert rec.pending() == 0 and _references(db) == ["r1"]


def test_bad_bounds_are_refused(pool):
    with pytest.raises(ValueError):
        BatchedRecorder(pool, flush_seconds=0)
    with pytest.raises(ValueError):
        BatchedRecorder(pool, max_pending=0)


def test_a_rails_nul_byte_or_lone_surrogate_does_not_drop_the_batch_it_rides_in(db, pool):
    # A rail's text is the rail's: one bad row must not cost the other 500 theirs.
    rec = BatchedRecorder(pool, flush_seconds=3600)
    rec._thread = object()  # no writer thread: this test writes by hand
    for n in range(500):
        rec(_call(n))
    rec(_call(500, reason="bad\x00byte"))
    rec(_call(501, reference="r501\udc80"))
    assert rec.flush() == 502
    assert len(_references(db)) == 502
    assert db.execute("SELECT reason FROM rail_calls WHERE reference = 'r500'").fetchone() == ("bad\ufffdbyte",)
    assert db.execute("SELECT count(*) FROM rail_calls WHERE reference = 'r501?'").fetchone() == (1,)


def test_close_returns_within_its_bound_while_a_write_waits_on_the_database(db_url, pool):
    # Review of issue 30: close() joined the writer, then waited on its write
    # without a bound; a write the database never answers held the drain. Here
    # the write waits on a real lock held by another session.
    import threading

    import psycopg

    from support import wait_until
    with psycopg.connect(db_url) as locker:
        locker.execute("LOCK TABLE rail_calls IN ACCESS EXCLUSIVE MODE")
        rec = BatchedRecorder(pool, flush_seconds=0.01)
        rec(_call(1))
        wait_until(lambda: locker.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'rail_calls'::regclass"
        ).fetchone()[0] > 0, what="the batch's write to wait on the lock")
        closer = threading.Thread(target=rec.close, kwargs={"timeout": 0.2}, daemon=True)
        closer.start()
        closer.join(10)
        stuck = closer.is_alive()
        locker.rollback()
    assert not stuck, "close() waited on the stuck write past its bound"
