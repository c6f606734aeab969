"""The durable queue against a real Postgres: claim, fencing, reaping."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from vpay.engine import queue


def _age_lease(conn, job_id: int, seconds: int = 3600, lease: int = 300) -> None:
    """Pretend the job was claimed ``seconds`` ago with a ``lease``-second lease."""
    conn.execute("UPDATE jobs SET locked_at = now() - make_interval(secs => %s), "
                 "lease_expires_at = now() - make_interval(secs => %s) + make_interval(secs => %s) "
                 "WHERE id = %s", (seconds, seconds, lease, job_id))


def test_enqueue_is_idempotent_on_dedupe_key(db):
    assert queue.enqueue(db, "test.count", "k:1", {"a": 1}) is True
    assert queue.enqueue(db, "test.count", "k:1", {"a": 2}) is False
    assert db.execute("SELECT payload->>'a' FROM jobs").fetchall() == [("1",)]


def test_claim_leases_one_due_job_and_counts_the_attempt(db):
    queue.enqueue(db, "test.count", "k:1")
    job = queue.claim(db, "w1")
    assert job is not None and job.attempts == 1 and job.worker == "w1"
    row = db.execute("SELECT locked_by, locked_at IS NOT NULL, lease_token FROM jobs").fetchone()
    assert row == ("w1", True, job.lease_token)
    assert queue.claim(db, "w2") is None  # leased: nobody else gets it


def test_claim_skips_future_leased_and_dead_lettered_rows(db):
    queue.enqueue(db, "test.count", "future", delay=3600)
    queue.enqueue(db, "test.count", "dead")
    db.execute("UPDATE jobs SET run_at = 'infinity' WHERE dedupe_key = 'dead'")
    assert queue.claim(db, "w1") is None
    queue.enqueue(db, "test.count", "due")
    assert queue.claim(db, "w1").dedupe_key == "due"
    assert queue.claim(db, "w1") is None


def test_claim_can_use_the_partial_index(db):
    db.execute("SET enable_seqscan = off")
    plan = "\n".join(r[0] for r in db.execute(
        "EXPLAIN SELECT id FROM jobs WHERE locked_at IS NULL AND run_at <> 'infinity' "
        "AND share_round = 0 AND run_at <= now() ORDER BY run_at LIMIT 1 FOR UPDATE SKIP LOCKED"))
    assert "jobs_claimable" in plan


@pytest.mark.parametrize("name", ["renew", "release", "reap_expired_leases"])
def test_lease_statements_read_the_leased_rows_never_the_backlog(db, name):
    # The heartbeat renews every lease/3 s per worker: over a large
    # backlog, a scan of the table grew with it (7 ms at 100k due jobs here).
    queue.enqueue(db, "test.count", "k:0")
    db.execute("INSERT INTO jobs (kind, lane, dedupe_key, payload) "
               "SELECT 'test.count', (SELECT lane FROM jobs LIMIT 1), 'k:' || g, '{}' "
               "FROM generate_series(1, 20000) g")
    tokens = [queue.claim(db, "w1").lease_token for _ in range(20)]
    db.execute("ANALYZE jobs")
    params = {"renew": {"worker": "w1", "tokens": tokens, "lease": 30.0},
              "release": {"worker": "w1", "tokens": tokens[:3]},
              "reap_expired_leases": {"max_failures": queue.MAX_FAILURES, "by_heartbeat": True,
                                      "reaper": "w2"}}[name]
    statement = psycopg.ClientCursor(db).mogrify(queue.Q[name], params)
    plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + statement))
    assert "Seq Scan on jobs" not in plan, plan
    assert "jobs_leased" in plan, plan


@pytest.mark.parametrize("write", ["finish", "reschedule", "park", "retry_failed"])
def test_fenced_write_after_reap_and_reclaim_by_the_same_worker_is_lost(db, write):
    queue.enqueue(db, "test.count", "k:1")
    old = queue.claim(db, "w1")
    _age_lease(db, old.id)
    assert [r["id"] for r in queue.reap_expired_leases(db)] == [old.id]
    new = queue.claim(db, "w1")  # same worker id, new claim, new token
    assert new.id == old.id and new.lease_token != old.lease_token
    ops = {"finish": lambda j: queue.finish(db, j),
           "reschedule": lambda j: queue.reschedule(db, j, 60),
           "park": lambda j: queue.park(db, j, "x"),
           "retry_failed": lambda j: queue.retry_failed(db, j, 60, "boom")}
    assert ops[write](old) is False
    row = db.execute("SELECT locked_by, lease_token, run_at <> 'infinity', attempts FROM jobs").fetchone()
    assert row == ("w1", new.lease_token, True, 2)
    assert db.execute("SELECT count(*) FROM alerts").fetchone()[0] == 0
    assert ops[write](new) is True


def test_reaper_racing_a_finishing_worker_skips_its_row_and_never_resurrects_the_job(db, db_url):
    queue.enqueue(db, "test.count", "k:1")
    job = queue.claim(db, "w1")
    _age_lease(db, job.id)
    finisher = psycopg.connect(db_url)  # not autocommit: hold the DELETE open
    reaper = psycopg.connect(db_url, autocommit=True)
    try:
        assert queue.finish(finisher, job) is True  # row locked, uncommitted
        # The reaper does not wait for the finisher's lock (a wait is how a
        # reaper over many rows joins a deadlock): it leaves the row alone.
        reaper.execute("SET statement_timeout = '5s'")
        assert queue.reap_expired_leases(reaper) == []
        finisher.commit()
        assert queue.reap_expired_leases(reaper) == []
    finally:
        finisher.close()
        reaper.close()
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


def test_a_row_skipped_by_the_reaper_is_reaped_on_its_next_pass_when_the_holder_gives_up(db, db_url):
    queue.enqueue(db, "test.count", "k:1")
    job = queue.claim(db, "w1")
    _age_lease(db, job.id)
    finisher = psycopg.connect(db_url)
    try:
        assert queue.finish(finisher, job) is True
        assert queue.reap_expired_leases(db) == []
        finisher.rollback()  # the finish never landed: the expired lease is still there
    finally:
        finisher.close()
    assert [r["id"] for r in queue.reap_expired_leases(db)] == [job.id]


def test_the_reaper_never_waits_on_a_heartbeat_holding_some_of_the_expired_rows(db, db_url):
    # The deadlock a reviewer feared: a heartbeat renewing many of a paused
    # worker's leases while the reaper frees them, each holding rows the other
    # wants. The reaper takes only rows nobody holds, so it never waits at all.
    for n in range(4):
        queue.enqueue(db, "test.count", f"k:{n}")
    jobs = [queue.claim(db, "w1") for _ in range(4)]
    for job in jobs:
        _age_lease(db, job.id)
    heartbeat = psycopg.connect(db_url)  # a renew of two of them, not yet committed
    reaper = psycopg.connect(db_url, autocommit=True)
    try:
        held = sorted(j.id for j in jobs)[1:3]
        mine = [j.lease_token for j in jobs if j.id in held]
        assert queue.renew(heartbeat, "w1", mine, 30) == 2
        reaper.execute("SET statement_timeout = '5s'")
        reaped = {r["id"] for r in queue.reap_expired_leases(reaper)}
        assert reaped == {j.id for j in jobs} - set(held)
        heartbeat.commit()
        assert queue.reap_expired_leases(reaper) == []  # renewed: no longer expired
    finally:
        heartbeat.close()
        reaper.close()
    assert db.execute("SELECT count(*) FROM jobs WHERE locked_by = 'w1'").fetchone()[0] == 2


def test_reaper_first_then_finish_is_lost(db):
    queue.enqueue(db, "test.count", "k:1")
    job = queue.claim(db, "w1")
    _age_lease(db, job.id)
    queue.reap_expired_leases(db)
    assert queue.finish(db, job) is False
    assert db.execute("SELECT locked_by FROM jobs").fetchone() == (None,)


def test_reaper_leaves_young_leases_alone(db):
    queue.enqueue(db, "test.count", "k:1")
    job = queue.claim(db, "w1")
    _age_lease(db, job.id, 10)
    assert queue.reap_expired_leases(db) == []
    assert queue.finish(db, job) is True


def test_repeatedly_expiring_lease_is_dead_lettered_with_an_alert(db):
    queue.enqueue(db, "test.exit", "poison")
    for n in range(1, queue.MAX_FAILURES + 1):
        job = queue.claim(db, "w1")
        assert job is not None, f"claim {n}"
        _age_lease(db, job.id)
        [reaped] = queue.reap_expired_leases(db)
        assert reaped["parked"] is (n == queue.MAX_FAILURES)
    assert queue.claim(db, "w1") is None
    row = db.execute("SELECT run_at = 'infinity', last_error FROM jobs").fetchone()
    assert row[0] is True and "dead-lettered" in row[1]
    alerts = db.execute("SELECT kind, details->>'dedupe_key' FROM alerts").fetchall()
    assert alerts == [("job_dead_lettered", "poison")]


def test_an_outcome_ends_the_failure_streak(db):
    queue.enqueue(db, "test.count", "k:1")
    job = queue.claim(db, "w1")
    assert queue.retry_failed(db, job, 0, "boom") is True
    assert db.execute("SELECT failures, last_error FROM jobs").fetchone() == (1, "boom")
    job = queue.claim(db, "w1")
    assert queue.reschedule(db, job, 0) is True
    assert db.execute("SELECT failures FROM jobs").fetchone() == (0,)


def test_release_hands_back_only_the_given_leases_due_at_once(db):
    for k in ("a", "b"):
        queue.enqueue(db, "test.count", k)
    a = queue.claim(db, "w1")
    b = queue.claim(db, "w1")
    assert queue.release(db, "w1", [a.lease_token, uuid.uuid4()]) == 1
    again = queue.claim(db, "w2")
    assert again.id == a.id
    assert queue.finish(db, a) is False  # the released lease is fenced off
    assert queue.finish(db, b) is True


def test_two_threads_never_claim_the_same_job(db, db_url):
    for i in range(200):
        queue.enqueue(db, "test.count", f"k:{i}")
    claimed: list[list[int]] = [[], []]

    def take(slot):
        with psycopg.connect(db_url, autocommit=True) as conn:
            while (job := queue.claim(conn, f"w{slot}")) is not None:
                claimed[slot].append(job.id)

    threads = [threading.Thread(target=take, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not set(claimed[0]) & set(claimed[1])
    assert len(claimed[0]) + len(claimed[1]) == 200


def test_a_lease_is_judged_by_its_own_expiry_not_by_the_reapers(db):
    queue.enqueue(db, "test.count", "long")
    queue.enqueue(db, "test.count", "short")
    long_job = queue.claim(db, "patient", lease=300)
    short_job = queue.claim(db, "hasty", lease=1)
    db.execute("UPDATE jobs SET locked_at = locked_at - interval '10 seconds', "
                "lease_expires_at = lease_expires_at - interval '10 seconds'")
    # a reaper (whatever its own worker's lease) frees only the lease past its own expiry
    assert [r["dedupe_key"] for r in queue.reap_expired_leases(db)] == ["short"]
    assert queue.finish(db, long_job) is True
    assert queue.finish(db, short_job) is False


@pytest.mark.parametrize("lanes", [("housekeeping",), ("housekeeping", "webhooks")])
def test_claim_statements_answer_the_columns_the_queue_reads_by_position(db, lanes):
    """queue._claim unpacks the claim statement's row by position
    (queue.CLAIM_COLUMNS): a reordered or added column in queue.sql must fail
    here, not mislabel a job's fields."""
    name, params = queue._lane_params(lanes)
    params.update(id=None, token=None, new_token=uuid.uuid4(), worker="w", lease=30.0)
    with db.cursor() as cur:
        cur.execute(queue.Q[name], params)
        assert tuple(c.name for c in cur.description) == queue.CLAIM_COLUMNS


def test_a_claimed_job_carries_its_row_and_the_next_claim_on_the_same_connection_reuses_the_cursor(db):
    queue.enqueue(db, "test.count", "k:1", {"charge_id": "ch_1"}, lane="housekeeping")
    queue.enqueue(db, "test.count", "k:2", lane="housekeeping")
    first = queue.claim(db, "w1", 30.0, ["housekeeping"])
    row = db.execute("SELECT id, kind, lane, dedupe_key, payload, attempts, failures, lease_token, "
                     "run_at, created_at FROM jobs WHERE id = %s", (first.id,)).fetchone()
    assert (first.id, first.kind, first.lane, first.dedupe_key, first.payload, first.attempts,
            first.failures, first.lease_token, first.run_at, first.created_at) == row
    assert first.dedupe_key == "k:1" and first.payload == {"charge_id": "ch_1"} and first.worker == "w1"
    assert first.late_by >= 0
    cursor = queue._claim_cursor(db)
    finished, second, next_due = queue.finish_and_claim(db, first, 30.0, ["housekeeping"])
    assert finished and second.dedupe_key == "k:2" and next_due is None
    assert queue._claim_cursor(db) is cursor
    finished, third, next_due = queue.finish_and_claim(db, second, 30.0, ["housekeeping"])
    assert finished and third is None and next_due is None  # nothing left, nothing scheduled


def test_a_finish_waiting_for_a_row_lock_holds_no_claimed_row(db, db_url):
    """The claim statement deletes the finished job before it claims the
    next: a finish that waits (here on a row lock held by a test connection;
    in the benches, on a sibling's claim that locked the row in passing)
    holds no claimed row meanwhile. Claiming first, as the statement once
    did, let three loops each wait on the next one's claimed row: a
    deadlock, one loop's error after deadlock_timeout (1 s)."""
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    first = queue.claim(db, "w1", 30.0, ["housekeeping"])
    queue.enqueue(db, "test.count", "k:2", lane="housekeeping")
    second_id = db.execute("SELECT id FROM jobs WHERE dedupe_key = 'k:2'").fetchone()[0]
    with psycopg.connect(db_url) as locker, psycopg.connect(db_url, autocommit=True) as loop_conn, \
            psycopg.connect(db_url) as probe:
        locker.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (first.id,))
        answer: list = []
        pid = loop_conn.info.backend_pid
        thread = threading.Thread(target=lambda: answer.append(
            queue.finish_and_claim(loop_conn, first, 30.0, ["housekeeping"])), daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while db.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                             (pid,)).fetchone()[0] != "Lock":
                assert time.monotonic() < deadline, "the finish never waited for the row lock"
                time.sleep(0.01)
            # the waiting statement holds the next job neither leased nor locked
            assert probe.execute("SELECT id, locked_by FROM jobs WHERE id = %s FOR UPDATE NOWAIT",
                                 (second_id,)).fetchone() == (second_id, None)
            probe.rollback()
        finally:
            locker.rollback()  # first: the loop's connection closes only once its statement ends
            thread.join(10)
    finished, nxt, _ = answer[0]
    assert finished and nxt.id == second_id
