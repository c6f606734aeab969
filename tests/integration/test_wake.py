"""Waking on commit, round trips per job, and what the speed work must not
change (issue #15). Behaviour, never timing: a worker whose idle sleep is
30 s (each loop sleeps 15 to 30 s, jittered) claims a job within a deadline
far below that, which it can only do if something woke it.
"""

from __future__ import annotations

import threading

from support import wait_until
from vpay.money import charges
from vpay.engine import queue
from vpay import webhooks
from vpay.engine.wake import Listener, Waker


WELL_UNDER = 10.0  # seconds: a wake-up, not the 15-30 s fallback sleep


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


def _webhook_jobs(db):
    return [r[0] for r in db.execute("SELECT dedupe_key FROM jobs WHERE kind IN ('fanout', 'deliver') "
                                     "ORDER BY id")]


def test_no_webhook_job_for_an_event_whose_merchant_has_no_enabled_endpoint(db, merchant):
    plain = charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail="mtn",
                                 payer="256770000001")
    events = db.execute("SELECT id FROM events WHERE payment_intent_id = %s",
                        (plain.intent["id"],)).fetchall()
    assert len(events) == 1      # the event is still written (payments show lists it)
    assert _webhook_jobs(db) == []    # but nobody can receive it: no job
    # a disabled endpoint receives nothing either
    endpoint = webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    db.execute("UPDATE webhook_endpoints SET enabled = false")
    charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail="mtn",
                         payer="256770000002")
    assert _webhook_jobs(db) == []
    # enabled: the next event is born with its deliver job, in the webhooks lane
    db.execute("UPDATE webhook_endpoints SET enabled = true")
    hooked = charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail="mtn",
                                  payer="256770000003")
    event_id = db.execute("SELECT id FROM events WHERE payment_intent_id = %s",
                          (hooked.intent["id"],)).fetchone()[0]
    assert _webhook_jobs(db) == [f"deliver:{event_id}:{endpoint['id']}"]
    assert db.execute("SELECT lane FROM jobs WHERE kind = 'deliver'").fetchone()[0] == "webhooks"


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


# --- the listener's liveness (issue 25; vpay/engine/liveness.py) -------------


def test_a_ping_hands_on_the_notifications_that_came_in_with_its_answer(db, db_url):
    # libpq reads a notification that arrived before the ping's answer along
    # with it; left in libpq's queue, nothing would read it until more data
    # came (a wake-up lost to the idle sleep).
    import selectors

    import psycopg
    from vpay.engine.liveness import ping
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("LISTEN vpay_jobs")
        assert ping(conn, 5.0) == []
        db.execute("NOTIFY vpay_jobs, 'mtn'")
        with selectors.DefaultSelector() as sel:  # the notification is on the socket, unread
            sel.register(conn.pgconn.socket, selectors.EVENT_READ)
            assert sel.select(10), "the notification to arrive"
        assert ping(conn, 5.0) == ["mtn"]
        assert list(conn.notifies(timeout=0.2)) == []  # handed on once, not twice


def test_a_ping_on_a_connection_that_went_silent_gives_up_at_its_deadline_and_closes_it(db_url):
    import psycopg
    import pytest
    from pg_relay import BlackholeRelay
    from vpay.engine.liveness import ListenerUnresponsive, ping
    relay = BlackholeRelay(db_url)
    try:
        with psycopg.connect(relay.url, autocommit=True, application_name="vpay-listener t") as conn:
            conn.execute("LISTEN vpay_jobs")
            assert relay.blackhole(b"vpay-listener") == 1
            with pytest.raises(ListenerUnresponsive, match="within 0.5 s"):
                ping(conn, 0.5)
            assert conn.closed
    finally:
        relay.close()


def test_a_listener_whose_connection_goes_silent_is_replaced_and_counted(db, db_url):
    # The in-process half of tests/acceptance/test_wake_acceptance.py's
    # silent-relay test: the shortest bound, and the counter.
    from pg_relay import BlackholeRelay
    from vpay.base.metrics import REGISTRY
    from vpay.engine.liveness import MIN_DEAD_AFTER_SECONDS, Liveness

    def count() -> float:
        return REGISTRY.get_sample_value("vpay_listener_reconnects_total", {"cause": "unresponsive"}) or 0.0

    relay = BlackholeRelay(db_url)
    halt = threading.Event()
    waker = Waker([("mtn",)])
    listener = Listener(relay.url, waker, halt, "t", liveness=Liveness(MIN_DEAD_AFTER_SECONDS))
    before = count()
    listener.start()
    try:
        assert listener.connected.wait(30)
        assert relay.blackhole(b"vpay-listener") == 1
        wait_until(lambda: listener.connections == 2, timeout=60, what="a new listener connection")
        assert count() == before + 1
        woken, sleepers = {}, [threading.Thread(target=lambda: woken.__setitem__(0, waker.sleep(0, 30)))]
        sleepers[0].start()
        wait_until(lambda: len(waker._idle) == 1, timeout=10, what="the loop asleep")
        queue.enqueue(db, "poll", "poll:after-silence", {}, rail="mtn")
        sleepers[0].join(WELL_UNDER)
        assert woken == {0: True}  # woken through the new connection, not at the end of its sleep
    finally:
        halt.set()
        listener.join(10)
        relay.close()
