"""Waking on commit, round trips per job, and what the speed work must not
change (issue #15). Behaviour, never timing: a worker whose idle sleep is
30 s (each loop sleeps 15 to 30 s, jittered) claims a job within a deadline
far below that, which it can only do if something woke it.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import psycopg
import pytest

from support import base_env, wait_until
from vpay.money import charges
from vpay.engine import queue
from vpay import webhooks
from vpay.engine.wake import Listener, Waker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from pgcount import CountingProxy  # noqa: E402

LONG_SLEEP = "30"
WELL_UNDER = 10.0  # seconds: a wake-up, not the 15-30 s fallback sleep


def _worker(spawn, url, *args):
    return spawn("vpay-worker", "--idle-sleep", LONG_SLEEP, *args,
                 env=base_env(url, VPAY_TEST_HANDLERS="1"))


def _settled(db) -> bool:
    """The worker has booted, run its boot jobs and gone idle: the hourly
    jobs are rescheduled and unleased, and every other session of this
    database has been idle for a second (its loops are asleep)."""
    boot = db.execute("SELECT count(*) FROM jobs WHERE dedupe_key IN ('scan:live', 'sweep:expired') "
                      "AND attempts >= 1 AND locked_at IS NULL").fetchone()[0]
    busy = db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
                      "AND (state <> 'idle' OR state_change > now() - interval '1 second')").fetchone()[0]
    return boot == 2 and busy == 0


def _listener_pid(db):
    row = db.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                     "AND application_name LIKE 'vpay-listener%%'").fetchone()
    return row[0] if row else None


def _gone(db, key) -> bool:
    return db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = %s", (key,)).fetchone()[0] == 0


def test_a_job_committed_while_the_worker_idles_is_claimed_long_before_its_idle_sleep(db, db_url, spawn):
    worker = _worker(spawn, db_url)
    worker.wait_for_log("worker started")
    wait_until(lambda: _listener_pid(db) and _settled(db), timeout=60, what="an idle worker")
    queue.enqueue(db, "test.noop", "wake:1")
    wait_until(lambda: _gone(db, "wake:1"), timeout=WELL_UNDER,
               what="the committed job to be claimed and finished (woken, not after the idle sleep)")


def test_a_job_due_later_is_claimed_when_due_not_after_the_idle_sleep(db, db_url, spawn):
    # Nothing notifies for a job due in 2 s: the claim told the loop when the
    # next one is due, and it sleeps until then.
    queue.enqueue(db, "test.noop", "later:1", delay=2.0)
    worker = _worker(spawn, db_url)
    worker.wait_for_log("worker started")
    wait_until(lambda: _gone(db, "later:1"), timeout=WELL_UNDER,
               what="the job due in 2 s to be run when due")


def test_the_listener_reconnects_after_its_backend_is_terminated_and_still_wakes(db, db_url, spawn):
    worker = _worker(spawn, db_url)
    worker.wait_for_log("worker started")
    first = wait_until(lambda: _listener_pid(db), timeout=60, what="the listener")
    assert db.execute("SELECT pg_terminate_backend(%s)", (first,)).fetchone()[0]
    wait_until(lambda: (_listener_pid(db) or first) != first, timeout=30, what="a new listener session")
    worker.wait_for_log("listener reconnected")
    wait_until(lambda: _settled(db), timeout=60, what="an idle worker")
    queue.enqueue(db, "test.noop", "wake:after-reconnect")
    wait_until(lambda: _gone(db, "wake:after-reconnect"), timeout=WELL_UNDER,
               what="the job to be claimed through the new listener")
    assert worker.popen.poll() is None


def _both_asleep(waker: Waker) -> tuple[dict[int, bool], list[threading.Thread]]:
    """Loops 0 and 1 asleep on ``waker`` (up to 30 s each): what each
    ``sleep`` answered, filled in as they end, and their threads."""
    woken: dict[int, bool] = {}
    sleepers = [threading.Thread(target=lambda s=s: woken.__setitem__(s, waker.sleep(s, 30)))
                for s in (0, 1)]
    for t in sleepers:
        t.start()
    wait_until(lambda: len(waker._idle) == 2, timeout=10, what="both loops asleep")
    return woken, sleepers


def test_a_notification_wakes_only_loops_of_its_lane(db, db_url):
    # The real trigger and listener, two loops: one serving mtn, one webhooks.
    waker = Waker([("mtn",), ("webhooks",)])
    halt = threading.Event()
    listener = Listener(db_url, waker, halt, "t")
    listener.start()
    try:
        assert listener.connected.wait(30)
        woken, sleepers = _both_asleep(waker)
        queue.enqueue(db, "test.noop", "hook:1", lane="webhooks")
        sleepers[1].join(WELL_UNDER)
        assert woken.get(1) is True          # the webhooks loop was woken
        assert sleepers[0].is_alive()        # the mtn loop sleeps on
        assert waker.wakeups == [0, 1]
    finally:
        waker.stop()
        halt.set()
    for t in sleepers:
        t.join(5)
    assert woken.get(0) is True  # by the stop, not by the notification
    assert waker.wakeups == [0, 1]


def test_waker_keeps_a_notification_that_found_no_idle_loop_for_the_next_to_sleep():
    waker = Waker([("mtn",), ("mtn", "orange")])
    waker.notify("orange")              # nobody idle: pending for orange
    waker.notify("webhooks")            # no loop serves it: dropped
    assert waker.sleep(0, 0.01) is False  # loop 0 does not serve orange: sleeps its full timeout
    assert waker.sleep(1, 30) is True     # loop 1 claims again at once
    assert waker.sleep(1, 0.01) is False  # consumed once


def test_no_more_than_two_round_trips_per_no_op_job_with_a_real_worker(db, db_url, spawn):
    # Every connection of the worker goes through a wire-protocol proxy that
    # counts Sync and Query messages (one wait for the server each). Before
    # issue #15: claim, finish, and a pool check on each of the two checkouts.
    proxy = CountingProxy(db_url).start()
    try:
        # the long idle sleep keeps idle polling out of the count (bench/peers.py
        # counts at the default flags, idle claims included)
        worker = _worker(spawn, proxy.url, "--worker-concurrency", "5", "--queues", "housekeeping")
        worker.wait_for_log("worker started")
        wait_until(lambda: _settled(db), timeout=60, what="an idle worker")
        before = proxy.total()
        n = 400
        db.execute("INSERT INTO jobs (kind, lane, dedupe_key) "
                   "SELECT 'test.noop', 'housekeeping', 'rt:' || g FROM generate_series(1, %s) g", (n,))
        wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE kind = 'test.noop'").fetchone()[0] == 0,
                   timeout=120, what="the jobs to be done")
        per_job = (proxy.total() - before) / n
        assert per_job <= 2.0, (per_job, proxy.by_statement().most_common(6))
        # and the pool's liveness check (the empty query) is not one of them per job
        assert proxy.by_statement()[""] < n / 10, proxy.by_statement().most_common(6)
    finally:
        proxy.stop()


def _fanouts(db):
    return [r[0] for r in db.execute("SELECT dedupe_key FROM jobs WHERE kind = 'fanout' ORDER BY id")]


def test_no_fanout_job_for_an_event_whose_merchant_has_no_enabled_endpoint(db, merchant):
    plain = charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail="mtn",
                                 payer="256770000001")
    events = db.execute("SELECT id FROM events WHERE payment_intent_id = %s",
                        (plain.intent["id"],)).fetchall()
    assert len(events) == 1      # the event is still written (payments show lists it)
    assert _fanouts(db) == []    # but nobody can receive it: no job
    # a disabled endpoint receives nothing either
    endpoint = webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    db.execute("UPDATE webhook_endpoints SET enabled = false")
    charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail="mtn",
                         payer="256770000002")
    assert _fanouts(db) == []
    # enabled: the next event is born with its fan-out job, in the webhooks lane
    db.execute("UPDATE webhook_endpoints SET enabled = true")
    hooked = charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail="mtn",
                                  payer="256770000003")
    event_id = db.execute("SELECT id FROM events WHERE payment_intent_id = %s",
                          (hooked.intent["id"],)).fetchone()[0]
    assert _fanouts(db) == [f"fanout:{event_id}"]
    assert db.execute("SELECT lane FROM jobs WHERE kind = 'fanout'").fetchone()[0] == "webhooks"
    assert endpoint


def test_the_listener_claims_for_the_loop_it_wakes_and_the_loop_starts_from_that_claim(db, db_url):
    # The real trigger and listener, with the worker's kind of claim: the
    # woken loop finds the job already leased to its worker id, and the loop
    # of another lane is neither woken nor claimed for.
    waker = Waker([("mtn",), ("webhooks",)])
    halt = threading.Event()
    claims: list[tuple[str, ...]] = []

    def claim(conn, lanes):
        claims.append(lanes)
        return queue.claim_or_next_due(conn, "w-test", 300.0, lanes)

    listener = Listener(db_url, waker, halt, "t", claim=claim)
    listener.start()
    try:
        assert listener.connected.wait(30)
        woken, sleepers = _both_asleep(waker)
        queue.enqueue(db, "test.noop", "hook:claimed", lane="webhooks")
        sleepers[1].join(WELL_UNDER)
        assert woken.get(1) is True
        job, next_due = waker.take(1)
        assert job is not None and job.dedupe_key == "hook:claimed" and next_due is None
        assert waker.take(1) is None  # once
        assert db.execute("SELECT locked_by, lease_token FROM jobs WHERE dedupe_key = 'hook:claimed'"
                          ).fetchone() == ("w-test", job.lease_token)
        assert claims == [("webhooks",)]
        assert sleepers[0].is_alive() and waker.take(0) is None
    finally:
        waker.stop()
        halt.set()
    for t in sleepers:
        t.join(5)


def test_a_loop_whose_sleep_ends_while_the_listener_claims_for_it_waits_for_that_claim():
    # The drain (or the loop's own timeout) must not leave a job the listener
    # is claiming for it without an owner: the loop takes the answer.
    waker = Waker([("mtn",)])
    in_claim, release = threading.Event(), threading.Event()
    released = [False]
    seen: list = []

    def slow_claim(lanes):
        in_claim.set()
        release.wait(30)
        released[0] = True
        return ("job", None)

    sleeper = threading.Thread(target=lambda: seen.append((waker.sleep(0, 30), released[0])))
    sleeper.start()
    wait_until(lambda: waker._idle == [0], timeout=10, what="the loop asleep")
    claimer = threading.Thread(target=lambda: waker.claim_for("mtn", slow_claim))
    claimer.start()
    assert in_claim.wait(10)
    waker.stop()                  # the drain wakes every loop...
    release.set()
    sleeper.join(10)
    claimer.join(10)
    assert seen == [(True, True)]  # ...but this one returned only after the claim
    assert waker.take(0) == ("job", None)


def test_a_listener_claim_that_finds_no_idle_loop_claims_nothing_and_keeps_the_lane_pending():
    waker = Waker([("mtn",)])
    calls: list = []
    assert waker.claim_for("mtn", calls.append) is False      # the loop is busy
    assert waker.claim_for("webhooks", calls.append) is False  # no loop serves it
    assert calls == []
    assert waker.sleep(0, 30) is True  # the busy loop claims again before sleeping
    assert waker.take(0) is None


def test_a_listener_claim_refused_on_a_sound_connection_leaves_the_claim_to_the_loop(db, db_url):
    # A server that refuses writes (a demoted primary) refuses the listener's
    # claim too: the loop is woken without an answer and claims itself, and
    # the listener keeps its connection and goes on listening.
    waker = Waker([("webhooks",)])
    halt = threading.Event()
    calls: list[tuple[str, ...]] = []

    def claim(conn, lanes):
        calls.append(lanes)
        mode = "READ ONLY" if len(calls) == 1 else "READ WRITE"
        conn.execute(f"SET SESSION CHARACTERISTICS AS TRANSACTION {mode}")
        return queue.claim_or_next_due(conn, "w-test", 300.0, lanes)

    listener = Listener(db_url, waker, halt, "t", claim=claim)
    listener.start()
    try:
        assert listener.connected.wait(30)
        for key, expect_job in (("hook:refused", False), ("hook:claimed", True)):
            woken: list[bool] = []
            sleeper = threading.Thread(target=lambda: woken.append(waker.sleep(0, 30)))
            sleeper.start()
            wait_until(lambda: waker._idle == [0], timeout=10, what="the loop asleep")
            queue.enqueue(db, "test.noop", key, lane="webhooks")
            sleeper.join(WELL_UNDER)
            assert woken == [True]
            answer = waker.take(0)
            if expect_job:
                assert answer[0].dedupe_key == key
            else:
                assert answer is None  # nothing claimed for it: it claims itself
                assert queue.claim(db, "w-loop", 300.0, ["webhooks"]).dedupe_key == key
        assert len(calls) == 2 and listener.connections == 1
    finally:
        waker.stop()
        halt.set()
