"""SIGTERM while a webhook POST is inside the merchant's receiver, against
the installed ``vpay-worker`` (design page, "SIGTERM and the drain": both
arms, exercised under a real signal)."""

from __future__ import annotations

import signal
import threading

import pytest

from support import wait_until
from test_webhooks import (Receiver, Reply, deliver_job, endpoint, make_payment, settle,
                           start_worker, stop, verify)


@pytest.fixture
def receiver():
    rx = Receiver()
    yield rx
    rx.close()


def test_clean_drain_finishes_the_post_in_flight_and_exits_0(db, db_url, spawn, receiver):
    release = threading.Event()
    receiver.script("/a", Reply(hold=release))
    ep = endpoint(db, "m1", receiver.url("/a"))
    event_id = settle(db, make_payment(db, "m1"))
    worker = start_worker(spawn, db_url)

    receiver.wait_posts("/a", 1)  # the POST is inside the receiver now
    worker.signal(signal.SIGTERM)
    worker.wait_for_log("draining", in_flight=1)
    assert worker.popen.poll() is None  # still waiting for the receiver's answer
    release.set()
    assert worker.wait(60) == 0, worker.text()[-3000:]

    assert worker.find("drain clean")
    assert worker.find("webhook delivered", status_code=200)
    [posted] = receiver.posts("/a")  # exactly one POST, signed
    assert verify(ep["secret"], posted)["id"] == event_id
    assert deliver_job(db) is None
    assert db.execute("SELECT status, attempts FROM webhook_deliveries").fetchone() == ("delivered", 1)


def test_timed_out_drain_releases_the_delivery_and_a_restart_sends_it_again(db, db_url, spawn, receiver):
    hold = threading.Event()  # the first POST is never answered while the worker lives
    receiver.script("/a", Reply(hold=hold), Reply(200))
    ep = endpoint(db, "m1", receiver.url("/a"))
    event_id = settle(db, make_payment(db, "m1"))
    worker = start_worker(spawn, db_url, "--shutdown-grace-seconds", "1")

    first = receiver.wait_posts("/a", 1)[0]
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 1, worker.text()[-3000:]
    assert worker.find("drain timed out: released=1", released=1)
    attempts, leased, due_in, _ = deliver_job(db)
    assert attempts == 1 and not leased and due_in <= 0  # handed back, due at once

    again = start_worker(spawn, db_url)
    second = receiver.wait_posts("/a", 2)[1]
    wait_until(lambda: deliver_job(db) is None, what="the delivery finished by the new worker")
    # at-least-once: the merchant got the event twice, with the same webhook-id
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == event_id
    assert verify(ep["secret"], first)["id"] == verify(ep["secret"], second)["id"] == event_id
    assert db.execute("SELECT status, attempts FROM webhook_deliveries").fetchone() == ("delivered", 2)
    stop(again)
