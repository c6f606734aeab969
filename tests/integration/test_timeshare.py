"""A fair share in time and lending idle loops against a real Postgres
(issue 30; vpay/engine/timeshare.py, the claim statements and ``unclaim`` in
sql/queries/queue.sql): the claim's skips and lent lanes, the hand-back, and a
worker's loops in-process. The unit half: tests/unit/test_timeshare_unit.py;
real processes: tests/acceptance/test_timeshare_acceptance.py.

No timing assertions: the tests wait on conditions (``wait_until``) and read
the rows.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from support import wait_until
from vpay import handlers
from vpay.base import metrics
from vpay.engine import queue
from vpay.worker.loop import Worker, WorkerConfig
from vpay.worker.signals import Drain, ShutdownSignals


@pytest.fixture
def test_handlers():
    from vpay.handlers import testing  # noqa: F401 (registers the test.* kinds)
    yield


def _job(db, key: str, lane: str, merchant: str | None = None, kind: str = "test.count",
         payload: dict | None = None, ago: float = 0.0) -> str:
    """A job of ``lane`` working for ``merchant`` (``jobs.fair_key``, set by
    hand: test kinds have no charge to read it from), due ``ago`` s ago."""
    queue.enqueue(db, kind, key, payload or {}, lane=lane)
    db.execute("UPDATE jobs SET fair_key = %s, run_at = now() - make_interval(secs => %s) "
               "WHERE dedupe_key = %s", (merchant, ago, key))
    return key


def _attempts(db, key: str) -> int:
    return db.execute("SELECT attempts FROM jobs WHERE dedupe_key = %s", (key,)).fetchone()[0]


# --- the claim statements ---------------------------------------------------------


@pytest.mark.parametrize("own", [("mtn",), ("mtn", "orange")])
def test_a_claim_skips_the_parties_named_and_counts_only_what_it_may_take_in_next_due(db, own):
    _job(db, "t1", "mtn", "m_t", ago=3)
    _job(db, "t2", "mtn", "m_t", ago=2)
    _job(db, "t-deliver", "mtn", "m_t", kind="test.noop", ago=2.5)  # another kind: another party
    _job(db, "c1", "mtn", "m_c", ago=-30)                            # due in 30 s
    skip = ["mtn/test.count/m_t"]
    job, _ = queue.claim_or_next_due(db, "w", 30.0, own, skip=skip)
    assert job.dedupe_key == "t-deliver" and job.fair_key == "m_t"
    job, next_due = queue.claim_or_next_due(db, "w", 30.0, own, skip=skip)
    assert job is None and 25 < next_due <= 30  # m_t's due jobs are not "due" for this claim
    skip.append("mtn/test.count/m_c")
    assert queue.claim_or_next_due(db, "w", 30.0, own, skip=skip) == (None, None)
    job, _ = queue.claim_or_next_due(db, "w", 30.0, own)   # nothing skipped: oldest first
    assert job.dedupe_key == "t1"


def test_a_claim_borrows_the_oldest_due_job_of_a_lent_lane_only_when_its_own_lanes_have_none(db):
    _job(db, "hook", "webhooks", "m_c", ago=1)
    _job(db, "mtn-old", "mtn", "m_s", ago=5)
    _job(db, "orange", "orange", "m_s", ago=4)
    _job(db, "mtn-young", "mtn", "m_s", ago=2)
    lent = ["mtn", "orange"]
    # its own lane first, however old the lent lanes' jobs
    assert queue.claim_or_next_due(db, "w", 30.0, ("webhooks",), lent=lent)[0].dedupe_key == "hook"
    taken = [queue.claim_or_next_due(db, "w", 30.0, ("webhooks",), lent=lent)[0].dedupe_key for _ in range(3)]
    assert taken == ["mtn-old", "orange", "mtn-young"]   # then the oldest due among the lent lanes
    assert queue.claim_or_next_due(db, "w", 30.0, ("webhooks",), lent=lent) == (None, None)
    # a lent lane's future job does not time the borrower's sleep (its own lanes do)
    _job(db, "later", "mtn", "m_s", ago=-5)
    _job(db, "own-later", "webhooks", "m_c", ago=-60)
    job, next_due = queue.claim_or_next_due(db, "w", 30.0, ("webhooks",), lent=lent)
    assert job is None and 55 < next_due <= 60


def test_a_borrowed_claim_skips_parties_too_and_takes_placed_jobs(db):
    _job(db, "t", "mtn", "m_t", ago=5)
    _job(db, "placed", "mtn", "m_s", ago=4)
    db.execute("UPDATE jobs SET share_round = 3 WHERE dedupe_key = 'placed'")  # a rebalance's round
    job, _ = queue.claim_or_next_due(db, "w", 30.0, ("webhooks", "housekeeping"), lent=["mtn"],
                                     skip=["mtn/test.count/m_t"])
    assert job.dedupe_key == "placed"


def test_the_lent_probes_read_each_lanes_own_index_not_other_lanes_backlogs(db):
    # Another lane's burst (due jobs by the thousand) must not be walked by a
    # borrower looking for mtn's head.
    import re
    from vpay.base.queries import Q
    db.execute("INSERT INTO jobs (kind, lane, dedupe_key) SELECT 'test.count', 'webhooks', 'burst:' || g "
               "FROM generate_series(1, 3000) g")
    db.execute("INSERT INTO jobs (kind, lane, dedupe_key) SELECT 'test.count', 'mtn', 'mtn:' || g "
               "FROM generate_series(1, 5) g")
    db.execute("ANALYZE jobs")
    for name, own in (("claim_lane", {"lane": "housekeeping"}),
                      ("claim_lanes", {"lanes": ["orange", "housekeeping"]})):
        plan = "\n".join(r[0] for r in db.execute(
            "EXPLAIN (ANALYZE, FORMAT TEXT) " + Q[name],
            {"id": None, "token": None, "worker": "w", "new_token": uuid.uuid4(), "lease": 30.0,
             "lent": ["mtn"], "skip": [], **own}))
        lent = plan[plan.index("generate_series slot"):]
        assert "jobs_claimable_lane" in lent and "Seq Scan" not in plan, plan
        assert max(int(n) for n in re.findall(r"actual time=\S+ rows=(\d+)", plan)) <= 10, plan
    assert db.execute("SELECT count(*) FROM jobs WHERE locked_by = 'w'").fetchone()[0] == 2


def test_unclaim_gives_the_job_back_due_as_it_was_with_its_attempt_and_is_fenced(db):
    _job(db, "j", "mtn", "m_t", ago=7)
    db.execute("UPDATE jobs SET attempts = 2, failures = 1")
    before = db.execute("SELECT run_at FROM jobs").fetchone()[0]
    job = queue.claim(db, "w", 30.0, ("mtn",))
    stale = queue.Job(**{**job.__dict__, "lease_token": uuid.uuid4()})
    assert queue.unclaim(db, stale) is False                 # not our lease: nothing changes
    assert db.execute("SELECT locked_by, attempts FROM jobs").fetchone() == ("w", 3)
    assert queue.unclaim(db, job) is True
    assert db.execute("SELECT locked_by, locked_at, lease_token, attempts, failures, run_at FROM jobs"
                      ).fetchone() == (None, None, None, 2, 1, before)
    assert queue.unclaim(db, job) is False                   # once
    assert queue.claim(db, "w2", 30.0, ("mtn",)).dedupe_key == "j"  # claimable at once


# --- a worker's loops, in-process -------------------------------------------------


def _run_worker(pool, wid: str, **config) -> tuple[Worker, ShutdownSignals, threading.Thread, list]:
    signals = ShutdownSignals()
    config.setdefault("idle_sleep", 0.1)
    worker = Worker(pool, handlers.Context(pool=pool, worker_id=wid),
                    WorkerConfig(worker_id=wid, jobs_vacuum_every=0, **config), signals)
    result: list[Drain] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    return worker, signals, thread, result


def _stop(signals, thread, result, release=None) -> None:
    if release is not None:
        release.touch()
    signals.stop.set()
    thread.join(60)
    assert result and result[0] in (Drain.CLEAN, Drain.TIMED_OUT)


def test_a_slow_party_holds_at_most_its_share_of_a_lanes_loops_and_another_party_is_served(
        db, pool, test_handlers, tmp_path):
    # The ten-trickle input, in-process: two mtn loops, three jobs of one
    # merchant that hold their loop until the test lets go, due first; a
    # calm merchant's job due after them.
    db.execute("CREATE TABLE test_executions (job_key text NOT NULL, worker text NOT NULL)")
    release = tmp_path / "release"
    held = [_job(db, f"hold:{i}", "mtn", "m_t", kind="test.hold", payload={"until": str(release)}, ago=5 - i)
            for i in range(3)]
    calm = _job(db, "calm", "mtn", "m_c", ago=1)
    worker, signals, thread, result = _run_worker(pool, "ts-share", concurrency=2, queues=("mtn",))
    try:
        wait_until(lambda: db.execute("SELECT count(*) FROM test_executions WHERE job_key = 'calm'").fetchone()[0],
                   timeout=30, what="the calm merchant's job to run beside the held one")
        # one held job of m_t runs, on one of the two loops; the others were
        # never run (a claim that raced past the share was handed back with
        # its attempt)
        leased = [k for k, in db.execute("SELECT dedupe_key FROM jobs WHERE locked_by = 'ts-share'")]
        assert len(leased) == 1 and leased[0] in held
        assert [_attempts(db, k) for k in held if k not in leased] == [0, 0]
        assert worker.timeshare.caps["mtn"] == 1
    finally:
        _stop(signals, thread, result, release)
    assert calm not in {k for k, in db.execute("SELECT dedupe_key FROM jobs")}


def test_a_party_share_of_1_lets_one_party_hold_both_loops(db, pool, test_handlers, tmp_path):
    release = tmp_path / "release"
    held = [_job(db, f"hold:{i}", "mtn", "m_t", kind="test.hold", payload={"until": str(release)}, ago=5 - i)
            for i in range(3)]
    worker, signals, thread, result = _run_worker(pool, "ts-all", concurrency=2, queues=("mtn",),
                                                  party_share=1.0)
    try:
        wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE locked_by = 'ts-all'").fetchone()[0] == 2,
                   timeout=30, what="both loops holding m_t's jobs")
        assert _attempts(db, held[2]) == 0
    finally:
        _stop(signals, thread, result, release)


def _borrowed(lane: str) -> float:
    return metrics.JOBS_BORROWED.labels(lane)._value.get()


@pytest.mark.parametrize("lend", [True, False])
def test_an_idle_loop_of_another_lane_borrows_a_backlog_and_not_with_lending_off(
        db, pool, test_handlers, tmp_path, lend):
    # One mtn loop, one webhooks loop with nothing due: a backlog of fast mtn
    # jobs of one merchant (known fast after its first) is shared by both.
    db.execute("CREATE TABLE test_executions (job_key text NOT NULL, worker text NOT NULL)")
    before = _borrowed("mtn")
    keys = [_job(db, f"mtn:{i}", "mtn", "m_s", payload={"sleep": 0.05}, ago=10 - i * 0.01) for i in range(40)]
    worker, signals, thread, result = _run_worker(pool, f"ts-lend-{lend}", concurrency=2,
                                                  queues=("mtn", "webhooks"), lend=lend)
    try:
        assert worker.loops == [("mtn",), ("webhooks",)]
        wait_until(lambda: db.execute("SELECT count(*) FROM test_executions").fetchone()[0] == len(keys),
                   timeout=60, what="the mtn backlog to run")
    finally:
        _stop(signals, thread, result)
    if lend:
        assert _borrowed("mtn") > before
    else:
        assert _borrowed("mtn") == before


def test_a_lane_whose_job_runs_slow_is_not_lent_to(db, pool, test_handlers, tmp_path):
    db.execute("CREATE TABLE test_executions (job_key text NOT NULL, worker text NOT NULL)")
    release = tmp_path / "release"
    # Loops that sleep until woken, so the wake-up decides who claims: a job
    # of mtn committed while both idle goes to mtn's own loop.
    worker, signals, thread, result = _run_worker(pool, "ts-slow", concurrency=2, queues=("mtn", "webhooks"),
                                                  idle_sleep=60)
    try:
        wait_until(lambda: worker.listener and worker.listener.connected.is_set()
                   and sorted(worker.waker._idle) == [0, 1], timeout=30, what="both loops asleep")
        _job(db, "slow", "mtn", None, kind="test.hold", payload={"until": str(release)})
        wait_until(lambda: worker.timeshare.lendable(("webhooks",)) == frozenset(), timeout=30,
                   what="mtn's held job past the slow bound: mtn not lent to")
        assert db.execute("SELECT locked_by FROM jobs WHERE dedupe_key = 'slow'").fetchone() == ("ts-slow",)
        assert worker.waker._idle == [1]  # the webhooks loop sleeps: mtn's own loop holds it
        waiting = _job(db, "waiting", "mtn", None)
        _job(db, "hook", "webhooks", None)  # the webhooks loop claims after it, and does not borrow
        wait_until(lambda: db.execute("SELECT count(*) FROM test_executions WHERE job_key = 'hook'").fetchone()[0],
                   timeout=30, what="the webhooks loop's own job")
        assert _attempts(db, waiting) == 0
    finally:
        _stop(signals, thread, result, release)


def test_a_claim_borrows_from_at_most_the_slots_the_statement_reads(db):
    lent = [f"lane{i}" for i in range(queue.LENT_LANES_MAX - 1)] + ["mtn"]  # the last slot still read
    _job(db, "far", "mtn", "m_s", ago=1)
    assert queue.claim_or_next_due(db, "w", 30.0, ("webhooks",), lent=lent)[0].dedupe_key == "far"
    with pytest.raises(ValueError, match="at most 8 lanes"):
        queue.claim_or_next_due(db, "w", 30.0, ("webhooks",), lent=lent + ["orange"])


def test_the_claim_keeps_its_generic_plan_with_lent_lanes_and_skips(db):
    # Found by bench/peers.py: with unnest() of the lent lanes the planner
    # judged the generic plan dearer than a custom one and planned every
    # claim afresh (Postgres CPU per no-op job doubled).
    for i in range(20):
        _job(db, f"n:{i}", "housekeeping", None, kind="test.noop")
    with db.transaction():
        db.execute("SET LOCAL plan_cache_mode = auto")
        job = queue.claim(db, "w", 30.0, ("housekeeping",))
        for _ in range(12):
            job = queue.finish_and_claim(db, job, 30.0, ("housekeeping",), lent=["mtn", "webhooks"],
                                         skip=["mtn/poll/m_t"])[1]
        # claim_lane as sent (its comments dropped): the lent slots, and no
        # unnest (claim_lanes reads its own lanes' placed rows with one)
        plans = db.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                           "WHERE statement LIKE '%%generate_series(1, 8)%%' "
                           "AND statement NOT LIKE '%%unnest(%%'").fetchone()
    assert plans[0] > 0 and plans[1] <= 5, plans


def test_a_job_notified_while_the_loop_ran_another_costs_no_claim_after_it(db, pool, test_handlers,
                                                                             tmp_path):
    # Issue 30: one loop, busy with a held job when a second job is
    # committed (its notification finds no loop idle: pending). The claim
    # written with the held job's outcome takes the second; after it, the
    # loop goes idle and must not claim once more for that stale notification.
    db.execute("CREATE TABLE test_executions (job_key text NOT NULL, worker text NOT NULL)")
    release = tmp_path / "release"
    worker, signals, thread, result = _run_worker(pool, "ts-stale", concurrency=1,
                                                  queues=("housekeeping",), idle_sleep=30.0)
    sleeps: list[bool] = []
    real_sleep = worker.waker.sleep

    def sleep(slot, timeout, stop=None):
        woke_at_once = real_sleep(slot, timeout, stop)
        sleeps.append(woke_at_once)
        return woke_at_once

    try:
        wait_until(lambda: worker.listener is not None and worker.listener.connected.is_set()
                   and worker.waker._idle == [0], timeout=30, what="the loop idle, listening")
        worker.waker.sleep = sleep
        queue.enqueue(db, "test.hold", "held", {"until": str(release)}, lane="housekeeping")
        wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE locked_by = 'ts-stale'").fetchone()[0],
                   timeout=30, what="the held job running")
        queue.enqueue(db, "test.count", "next", {}, lane="housekeeping")
        wait_until(lambda: "housekeeping" in worker.waker._pending, timeout=30,
                   what="its notification kept pending (the loop is busy)")
        release.touch()
        wait_until(lambda: db.execute("SELECT count(*) FROM test_executions").fetchone()[0] == 1
                   and worker.waker._idle == [0], timeout=30, what="the second job run and the loop idle")
        # asleep again: a sleep that answered at once (a claim more) would
        # have ended before the loop went into the idle list
        assert sleeps == [], sleeps
        assert worker.waker._pending == {}
    finally:
        _stop(signals, thread, result)
