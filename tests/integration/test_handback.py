"""Outcomes kept through a database outage (vpay/worker/handback.py), in
process against a real Postgres: an outcome whose write failed past the
claim loop's retries is kept, its job stays held, and it is written (fenced)
as soon as the database answers; a lease lost meanwhile discards it; past its
bound, or at the drain, the lease is handed back. The outage itself, with
processes and a relay the test cuts: tests/acceptance/test_dead_workers.py."""

from __future__ import annotations

import psycopg
import pytest

from vpay import handlers
from vpay.base import metrics
from vpay.engine import queue
from vpay.engine.outcome import Done, RetryAfter
from vpay.worker import outcomes
from vpay.worker.loop import Worker, WorkerConfig
from vpay.worker.signals import ShutdownSignals


@pytest.fixture
def test_handlers():
    from vpay.handlers import testing  # noqa: F401 (registers the test.* kinds)
    yield


def _worker(pool, wid="w1") -> Worker:
    ctx = handlers.Context(pool=pool, worker_id=wid)
    return Worker(pool, ctx, WorkerConfig(worker_id=wid, concurrency=1, lease=600.0), ShutdownSignals())


def _count(result: str) -> float:
    return metrics.OUTCOME_HANDBACKS.labels(result)._value.get()


def _outage(monkeypatch, *writes: str):
    """The database is away for the outcome's writes: each of ``writes`` (the
    queue's lease-ending functions) raises as a dropped connection does,
    until the returned ``restore()``."""
    real = {name: getattr(queue, name) for name in writes}

    def away(*args, **kwargs):
        raise psycopg.OperationalError("server closed the connection unexpectedly")
    for name in writes:
        monkeypatch.setattr(queue, name, away)

    def restore():
        for name, fn in real.items():
            monkeypatch.setattr(queue, name, fn)
    return restore


def test_an_outcome_whose_write_outlasts_the_retries_is_kept_held_and_written_when_the_database_answers(
        db, pool, test_handlers, monkeypatch):
    monkeypatch.setattr(outcomes, "RETRY_SECONDS", 0.3)
    queue.enqueue(db, "test.count", "k:1", {"sleep": 0}, lane="housekeeping")
    db.execute("CREATE TABLE test_executions (job_key text, worker text)")
    w = _worker(pool)
    job = queue.claim(db, "w1", 600.0, ["housekeeping"])
    restore = _outage(monkeypatch, "finish", "finish_and_claim", "write_was_made")
    kept_before, written_before = _count("kept"), _count("written")
    assert w._serve(job, ("housekeeping",)) is None  # the loop goes on
    # kept, not dropped: still held (the heartbeat renews it), still leased to us
    assert w.kept.holds(job) and w.leases.held() == [job.lease_token]
    assert _count("kept") == kept_before + 1
    assert db.execute("SELECT locked_by FROM jobs").fetchone() == ("w1",)
    w.kept.retry()  # still away: kept
    assert len(w.kept) == 1
    restore()
    w.kept.retry()  # the database answers: the fenced finish lands
    assert len(w.kept) == 0 and w.leases.held() == []
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    assert _count("written") == written_before + 1
    assert w.gauge.snapshot()["done"] == 1


def test_a_kept_outcome_whose_lease_was_reaped_meanwhile_is_discarded(db, pool):
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    w = _worker(pool)
    job = queue.claim(db, "w1", 600.0, ["housekeeping"])
    w.kept.keep(job, RetryAfter(60), None, False)
    db.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second'")
    queue.reap_expired_leases(db)
    other = queue.claim(db, "w2", 600.0, ["housekeeping"])
    lost_before = _count("lost")
    w.kept.retry()
    assert len(w.kept) == 0 and _count("lost") == lost_before + 1
    assert db.execute("SELECT locked_by, lease_token FROM jobs").fetchone() == ("w2", other.lease_token)


def test_a_kept_outcome_past_its_bound_hands_its_lease_back(db, pool, monkeypatch):
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    w = _worker(pool)
    clock = [100.0]
    w.kept.clock = lambda: clock[0]
    job = queue.claim(db, "w1", 600.0, ["housekeeping"])
    _outage(monkeypatch, "reschedule", "write_was_made")
    w.kept.keep(job, RetryAfter(60), None, False)
    clock[0] += w.kept.keep_for  # the edge: not yet past
    w.kept.retry()
    assert len(w.kept) == 1
    released_before = _count("released")
    clock[0] += 0.001
    w.kept.retry()
    # the write still fails but the database answers the release: handed back, due now
    assert len(w.kept) == 0 and w.leases.held() == []
    assert _count("released") == released_before + 1
    assert db.execute("SELECT locked_by, run_at <= now() FROM jobs").fetchone() == (None, True)


def test_the_drain_writes_what_it_can_and_hands_back_the_rest(db, pool, monkeypatch):
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    queue.enqueue(db, "test.count", "k:2", lane="housekeeping")
    w = _worker(pool)
    first = queue.claim(db, "w1", 600.0, ["housekeeping"])
    second = queue.claim(db, "w1", 600.0, ["housekeeping"])
    w.kept.keep(first, Done(), None, False)
    w.kept.keep(second, RetryAfter(60), None, False)
    _outage(monkeypatch, "reschedule", "write_was_made")  # the first lands, the second cannot
    w.kept.last_try()
    assert len(w.kept) == 0 and w.leases.held() == []
    assert db.execute("SELECT dedupe_key, locked_by FROM jobs").fetchall() == [("k:2", None)]


def test_the_drains_last_try_on_a_database_gone_silent_ends_within_its_bounds(db_url, db, monkeypatch):
    """A database gone silent (every byte acknowledged, nothing answered:
    tests/pg_relay.py) at the drain: the last try of a kept outcome's write
    fails within ``ANSWER_SECONDS`` as a lost answer, and the lease release
    within ``EXIT_WRITE_SECONDS``, instead of holding the drain for ever."""
    import threading
    import time

    from pg_relay import BlackholeRelay
    from vpay.base.db import make_pool
    from vpay.worker import handback, leases

    monkeypatch.setattr(handback, "ANSWER_SECONDS", 0.5)
    monkeypatch.setattr(leases, "EXIT_WRITE_SECONDS", 0.5)
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    relay = BlackholeRelay(db_url)
    pool = make_pool(relay.url, max_size=1, name="silent-drain")
    try:
        w = _worker(pool)
        job = queue.claim(db, "w1", 600.0, ["housekeeping"])
        w.kept.keep(job, RetryAfter(60), None, False)
        with pool.connection() as conn:  # the pool's connections are open before the silence
            conn.execute("SELECT 1")
        assert relay.blackhole(b"silent-drain") >= 1
        ended = threading.Event()
        threading.Thread(target=lambda: (w.kept.last_try(), ended.set()), daemon=True).start()
        assert ended.wait(30), "the drain's last try is still waiting on a silent database"
        assert len(w.kept) == 0 and w.leases.held() == []  # given up
        # the reschedule never reached Postgres: the job is still leased to us, or
        # handed back by the release on a new connection (the relay silences
        # only the connections open when it was told to)
        locked_by, attempts_run_at_later = db.execute(
            "SELECT locked_by, run_at > now() + interval '30 seconds' FROM jobs").fetchone()
        assert locked_by in ("w1", None) and not attempts_run_at_later
    finally:
        pool.close(timeout=1)
        relay.close()
