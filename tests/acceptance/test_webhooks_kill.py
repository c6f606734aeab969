"""Kill point "mid webhook POST": a worker SIGKILLed while the POST is inside
the merchant's receiver leaves its lease behind; a new worker reaps it and
delivers again (design page, "Leases and crash recovery"; at-least-once)."""

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


def test_sigkill_mid_post_is_reaped_and_delivered_again(db, db_url, spawn, receiver):
    hold = threading.Event()  # the first POST is never answered
    receiver.script("/a", Reply(hold=hold), Reply(200))
    ep = endpoint(db, "m1", receiver.url("/a"))
    event_id = settle(db, make_payment(db, "m1"))
    worker = start_worker(spawn, db_url, "--lease-seconds", "5")  # the dead lease must expire

    first = receiver.wait_posts("/a", 1)[0]
    worker.signal(signal.SIGKILL)
    assert worker.wait(30) == -signal.SIGKILL
    attempts, leased, _, _ = deliver_job(db)
    assert attempts == 1 and leased  # the dead worker's lease is still on the row

    again = start_worker(spawn, db_url, "--lease-seconds", "2")
    second = receiver.wait_posts("/a", 2, timeout=30)[1]
    wait_until(lambda: deliver_job(db) is None, what="the delivery finished by the new worker")
    dedupe_key = db.execute("SELECT 'deliver:' || event_id || ':' || endpoint_id "
                            "FROM webhook_deliveries").fetchone()[0]
    assert again.find("lease reaped", dedupe_key=dedupe_key)
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == event_id
    assert verify(ep["secret"], second)["id"] == event_id
    assert db.execute("SELECT status, attempts FROM webhook_deliveries").fetchone() == ("delivered", 2)
    assert len(receiver.posts("/a")) == 2
    stop(again)
