"""Webhooks end to end: the installed ``vpay-worker`` delivers signed events to
a real HTTP receiver on loopback (retries, 410, Retry-After, a hanging
receiver), and the ``vpay-server webhooks`` commands. The acceptance half of
tests/integration/test_webhooks.py, which keeps ``Receiver`` and the helpers.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from support import base_env, script, wait_until
from vpay.base import secretbox
from vpay.money import merchants
# helpers kept in tests/integration/test_webhooks.py
from test_webhooks import (Reply, deliver_job, endpoint, make_payment, receiver, settle, start_worker,
                           stop, verify, webhook_jobs)


# ---- end to end, against vpay-worker ------------------------------------

def test_settled_payment_reaches_both_endpoints_of_its_merchant_signed(db, db_url, spawn, receiver):
    a = endpoint(db, "m1", receiver.url("/a"))
    b = endpoint(db, "m1", receiver.url("/b"))
    endpoint(db, "m2", receiver.url("/c"))
    charge_id = make_payment(db, "m1")
    event_id = settle(db, charge_id)

    worker = start_worker(spawn, db_url)
    receiver.wait_posts("/a", 1)
    receiver.wait_posts("/b", 1)
    wait_until(lambda: webhook_jobs(db) == 0, what="fan-out and deliveries finished")

    assert receiver.posts("/c") == []  # the other merchant's endpoint
    for ep, path in ((a, "/a"), (b, "/b")):
        [posted] = receiver.posts(path)
        assert posted.headers["webhook-id"] == event_id
        assert posted.headers["content-type"] == "application/json"
        doc = verify(ep["secret"], posted)  # on the raw bytes, with the library
        assert doc["id"] == event_id and doc["type"] == "payment_intent.succeeded"
        assert set(doc) == {"id", "type", "created", "data"}
        assert doc["data"]["object"]["status"] == "succeeded"
        assert doc["data"]["charge"]["id"] == charge_id
        tampered = bytearray(posted.body)
        tampered[len(tampered) // 2] ^= 0x01  # one byte changed
        with pytest.raises(WebhookVerificationError):
            Webhook(ep["secret"]).verify(bytes(tampered), posted.headers)
    with pytest.raises(WebhookVerificationError):  # each endpoint has its own secret
        verify(b["secret"], receiver.posts("/a")[0])
    rows = db.execute("SELECT endpoint_id, status, attempts, last_status_code FROM webhook_deliveries "
                      "ORDER BY endpoint_id").fetchall()
    assert sorted(rows) == sorted([(a["id"], "delivered", 1, 200), (b["id"], "delivered", 1, 200)])
    stop(worker)
    assert len(receiver.posts("/a")) == 1 and len(receiver.posts("/b")) == 1


def test_500_twice_then_200_is_three_attempts_then_done(db, db_url, spawn, receiver):
    ep = endpoint(db, "m1", receiver.url("/a"))
    receiver.script("/a", Reply(500, body=b"boom"), Reply(500), Reply(200))
    event_id = settle(db, make_payment(db, "m1"))
    worker = start_worker(spawn, db_url)

    expected_rung = {1: (4.0, 6.0), 2: (260.0, 340.0)}  # 5 s and 5 min, ±10 % jitter
    for attempt in (1, 2):
        receiver.wait_posts("/a", attempt)
        row = wait_until(lambda: (r := deliver_job(db)) and r[0] == attempt and not r[1] and r[2] > 1 and r,
                         what=f"attempt {attempt} rescheduled")
        low, high = expected_rung[attempt]
        assert low <= row[2] <= high, row
        assert "HTTP 500" in row[3]
        db.execute("UPDATE jobs SET run_at = now() WHERE kind = 'deliver'")  # move time, not wait
    receiver.wait_posts("/a", 3)
    wait_until(lambda: deliver_job(db) is None, what="delivery done")

    posts = receiver.posts("/a")
    assert len(posts) == 3
    assert {p.headers["webhook-id"] for p in posts} == {event_id}
    assert all(verify(ep["secret"], p)["id"] == event_id for p in posts)
    assert db.execute("SELECT status, attempts, last_status_code FROM webhook_deliveries").fetchone() \
        == ("delivered", 3, 200)
    assert worker.find("webhook delivery failed; will retry", attempts=2, status_code=500)
    assert worker.find("webhook delivered", attempts=3, status_code=200)
    stop(worker)


def test_410_disables_the_endpoint_and_later_events_skip_it(db, db_url, spawn, receiver):
    ep = endpoint(db, "m1", receiver.url("/a"))
    receiver.script("/a", Reply(410))
    settle(db, make_payment(db, "m1"))
    worker = start_worker(spawn, db_url)
    receiver.wait_posts("/a", 1)
    wait_until(lambda: webhook_jobs(db) == 0, what="delivery ended")

    enabled, reason = db.execute("SELECT enabled, disabled_reason FROM webhook_endpoints WHERE id = %s",
                                 (ep["id"],)).fetchone()
    assert enabled is False and "410" in reason
    assert db.execute("SELECT status FROM webhook_deliveries").fetchone() == ("gone",)

    settle(db, make_payment(db, "m1"))  # a later event: fanned out to nobody
    wait_until(lambda: webhook_jobs(db) == 0, what="second fan-out done")
    assert db.execute("SELECT count(*) FROM webhook_deliveries").fetchone() == (1,)
    assert len(receiver.posts("/a")) == 1
    stop(worker)


def test_retry_after_2_on_503_is_honoured(db, db_url, spawn, receiver):
    ep = endpoint(db, "m1", receiver.url("/a"))
    receiver.script("/a", Reply(503, {"Retry-After": "2"}), Reply(200))
    settle(db, make_payment(db, "m1"))
    worker = start_worker(spawn, db_url)
    first = receiver.wait_posts("/a", 1)[0]
    row = wait_until(lambda: (r := deliver_job(db)) and not r[1] and r, what="rescheduled")
    assert "HTTP 503, Retry-After 2 s" in row[3] and row[2] >= 1.0
    second = receiver.wait_posts("/a", 2, timeout=30)[1]  # no time moved: the worker waits itself
    assert second.at - first.at >= 2.0
    wait_until(lambda: deliver_job(db) is None, what="delivered")
    assert verify(ep["secret"], second)["id"] == first.headers["webhook-id"]
    stop(worker)


def test_a_hanging_receiver_times_out_retries_and_does_not_block_the_worker(db, db_url, spawn, receiver):
    hang = threading.Event()  # set only at teardown: the receiver never answers the first POST
    receiver.script("/slow", Reply(hold=hang), Reply(200))
    slow = endpoint(db, "m1", receiver.url("/slow"))
    endpoint(db, "m2", receiver.url("/fast"))
    settle(db, make_payment(db, "m1"))
    worker = start_worker(spawn, db_url, "--worker-concurrency", "1",
                          VPAY_WEBHOOK_READ_TIMEOUT_SECONDS="1")
    first = receiver.wait_posts("/slow", 1)[0]
    settle(db, make_payment(db, "m2"))  # queued behind the hanging POST on the only claim loop

    fast = receiver.wait_posts("/fast", 1, timeout=15)[0]
    assert fast.at - first.at < 1.0 + 3.0  # the read timeout, plus fan-out and claims
    row = wait_until(lambda: (r := deliver_job(db, slow["id"])) and not r[1] and r,
                     what="the hanging delivery rescheduled")
    assert row[0] == 1 and "timeout" in row[3] and row[2] > 1
    # the endpoint itself is backed off (vpay.webhooks.backoff); move both clocks
    assert db.execute("SELECT timeouts_in_row, backoff_until > now() FROM webhook_endpoints WHERE id = %s",
                      (slow["id"],)).fetchone() == (1, True)
    db.execute("UPDATE webhook_endpoints SET backoff_until = now() WHERE id = %s", (slow["id"],))
    db.execute("UPDATE jobs SET run_at = now() WHERE kind = 'deliver'")
    second = receiver.wait_posts("/slow", 2)[1]
    wait_until(lambda: webhook_jobs(db) == 0, what="retried delivery done")
    assert second.headers["webhook-id"] == first.headers["webhook-id"]
    assert verify(slow["secret"], second)
    stop(worker)


def _cli(db_url, *args, **env):
    return subprocess.run([script("vpay-server"), "webhooks", *args, "--json"], env=base_env(db_url, **env),
                          capture_output=True, text=True, timeout=60)


def _json_out(stdout: str):
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line in ("{", "["))
    return json.loads("\n".join(lines[start:]))


def test_cli_add_list_disable_enable_rotate(db, db_url):
    merchants.create_merchant(db, "m1")
    refused = _cli(db_url, "add", "--merchant", "m1", "--url", "http://127.0.0.1:9/hook")
    assert refused.returncode == 2 and "https" in refused.stderr
    refused = _cli(db_url, "add", "--merchant", "m1", "--url", "https://127.0.0.1:9/hook")
    assert refused.returncode == 2 and "loopback" in refused.stderr
    assert db.execute("SELECT count(*) FROM webhook_endpoints").fetchone() == (0,)
    unknown = _cli(db_url, "add", "--merchant", "nobody", "--url", "http://127.0.0.1:9/hook",
                   VPAY_WEBHOOKS_ALLOW_PRIVATE="1")
    assert unknown.returncode == 1 and "unknown merchant" in unknown.stderr

    added = _cli(db_url, "add", "--merchant", "m1", "--url", "http://127.0.0.1:9/hook",
                 VPAY_WEBHOOKS_ALLOW_PRIVATE="1")
    assert added.returncode == 0, added.stderr
    ep = _json_out(added.stdout)
    assert ep["secret"].startswith("whsec_") and ep["merchant_id"] == "m1"
    stored = db.execute("SELECT secret FROM webhook_endpoints WHERE id = %s", (ep["id"],)).fetchone()[0]
    # sealed at rest under the run's key (vpay/base/secretbox.py), never the secret itself
    assert stored.startswith("fernet:") and secretbox.default().open(stored) == ep["secret"]

    listed = _cli(db_url, "list", "--merchant", "m1")
    assert listed.returncode == 0 and "whsec_" not in listed.stdout
    assert [e["id"] for e in _json_out(listed.stdout)] == [ep["id"]]

    disabled = _cli(db_url, "disable", ep["id"])
    assert disabled.returncode == 0 and _json_out(disabled.stdout)["enabled"] is False
    assert _json_out(_cli(db_url, "enable", ep["id"]).stdout)["enabled"] is True
    assert _cli(db_url, "disable", "we_nope").returncode == 1

    rotated = _cli(db_url, "rotate-secret", ep["id"])
    assert rotated.returncode == 0
    new = _json_out(rotated.stdout)
    assert new["secret"].startswith("whsec_") and new["secret"] != ep["secret"]
    assert new["previous_secret_expires_at"] is not None
    row = db.execute("SELECT secret, previous_secret FROM webhook_endpoints").fetchone()
    assert tuple(map(secretbox.default().open, row)) == (new["secret"], ep["secret"])
    assert "whsec_" not in "".join(row)
    for proc in (added, listed, disabled, rotated):  # secrets go to stdout only, never to the log
        assert "whsec_" not in proc.stderr
        assert not re.search(r'"(level|logger)".*whsec_', proc.stdout)
