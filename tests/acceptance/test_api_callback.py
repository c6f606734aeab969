"""POST|PUT /provider/{code}/callback against a real gunicorn (`vpay-server
api`), a real worker, the sandbox MoMo rail and a real Postgres.

Design page, "Callbacks are hints": a callback only pulls a poll forward or
enqueues one; the worker's authenticated status read is what moves money.
"""

from __future__ import annotations

import datetime
import http.client
import socket
import subprocess
import time

import pytest

from api_support import (api_stack, charge_of, make_payment, new_key, random_reference,  # noqa: F401
                         snapshot, stack)
from support import base_env, script, wait_until

SUCCESS_CLAIM = {"amount": "15.00", "currency": "EUR", "financialTransactionId": "999",
                 "externalId": "x", "status": "SUCCESSFUL"}


def _park(db, charge_id: str, seconds: float = 90) -> None:
    db.execute("UPDATE jobs SET run_at = now() + make_interval(secs => %s) WHERE dedupe_key = %s",
               (seconds, f"poll:{charge_id}"))


def _poll_job(db, charge_id: str):
    return db.execute("SELECT run_at, run_at <= now() AS due, attempts, locked_by FROM jobs "
                      "WHERE dedupe_key = %s", (f"poll:{charge_id}",)).fetchone()


def _status_reads(rail, reference: str) -> int:
    return rail.count(method="GET", path_prefix="/collection/v1_0/requesttopay/", reference=reference)


def _create(stack, db, payer: str) -> tuple[dict, dict]:
    key = new_key(db)
    resp = stack.create(key, payer=payer)
    assert resp.status_code == 201, resp.text
    intent = resp.json()
    return intent, charge_of(db, intent["id"])


def test_the_rails_callback_pulls_a_parked_poll_forward_and_the_worker_settles_it(stack, db, spawn):
    stack.rail.script("256770000101", outcome="PENDING")  # terminal only when forced below
    intent, charge = _create(stack, db, "256770000101")
    ref = charge["rail_reference"]
    _park(db, charge["id"], 90)
    worker = spawn("vpay-worker", "--idle-sleep", "0.2", "--lease-seconds", "300", env=stack.env())
    worker.wait_for_log("worker started")
    assert stack.rail.transaction(ref)["callbackUrl"].endswith(f"/provider/mtn/callback?ref={ref}")

    # The rail's own callback (POST to the X-Callback-Url we sent) is the only nudge.
    stack.rail.set_status(ref, "SUCCESSFUL")
    started = time.monotonic()
    wait_until(lambda: db.execute("SELECT status FROM charges WHERE id = %s",
                                  (charge["id"],)).fetchone()[0] == "succeeded",
               timeout=15, what="the charge to settle")
    assert time.monotonic() - started < 15  # not the 90 s it was parked for
    assert [c["status_code"] for c in stack.rail.callbacks()] == [202]
    assert _status_reads(stack.rail, ref) == 1  # one read, the pulled-forward poll
    intent_status = db.execute("SELECT status FROM payment_intents WHERE id = %s", (intent["id"],)).fetchone()
    assert intent_status == ("succeeded",)
    events = [r[0] for r in db.execute("SELECT type FROM events ORDER BY created_at, id")]
    assert events == ["payment_intent.processing", "payment_intent.succeeded"]
    assert stack.proc.find("callback hint", charge_id=charge["id"], action="pulled_forward")


def test_the_apis_request_to_pay_and_every_callback_are_stored_for_the_consoles_timeline(stack, db):
    stack.rail.script("256770000102", outcome="PENDING")  # no callback of the rail's own
    _, charge = _create(stack, db, "256770000102")
    ref = charge["rail_reference"]
    # the API process records its own rail calls (the worker made none here)
    assert db.execute("SELECT operation, answer, http_status FROM rail_calls WHERE charge_id = %s",
                      (charge["id"],)).fetchall() == [("request_to_pay", "accepted", 202)]
    _park(db, charge["id"], 90)
    unknown = random_reference()
    for reference in (ref, ref, unknown):
        assert stack.callback(reference, SUCCESS_CLAIM).status_code == 202
    assert db.execute("SELECT rail, reference, charge_id, action FROM rail_callbacks ORDER BY id").fetchall() == [
        ("mtn", ref, charge["id"], "pulled_forward"), ("mtn", ref, charge["id"], "due_soon"),
        ("mtn", unknown, None, "unknown_reference")]


def test_a_second_callback_within_10_seconds_changes_nothing(stack, db):
    charge = make_payment(db)
    _park(db, charge["id"], 90)
    assert stack.callback(charge["rail_reference"], SUCCESS_CLAIM).status_code == 202
    assert _poll_job(db, charge["id"])[1] is True  # pulled forward: due now
    before = snapshot(db)
    assert stack.callback(charge["rail_reference"], SUCCESS_CLAIM).status_code == 202
    assert snapshot(db) == before



def test_a_callback_3_s_after_a_read_schedules_the_read_at_that_read_plus_10_s(stack, db):
    # Issue "Isolation", input 4: a poll parked 15 min out (attempt 25), the
    # rail's callback 3 s after the last read. MoMo sends it once: the 10 s
    # spacing may delay the read, never drop it.
    charge = make_payment(db)
    db.execute("UPDATE jobs SET attempts = 25 WHERE dedupe_key = %s", (f"poll:{charge['id']}",))
    _park(db, charge["id"], 15 * 60)
    db.execute("UPDATE charges SET last_polled_at = now() - interval '3 seconds' WHERE id = %s",
               (charge["id"],))
    others = snapshot(db, "payment_intents", "charges", "events", "alerts")
    assert stack.callback(charge["rail_reference"], SUCCESS_CLAIM, method="PUT").status_code == 202
    run_at, last_polled_at, attempts = db.execute(
        "SELECT j.run_at, c.last_polled_at, j.attempts FROM jobs j JOIN charges c ON j.dedupe_key = 'poll:' || c.id "
        "WHERE c.id = %s", (charge["id"],)).fetchone()
    assert run_at == last_polled_at + datetime.timedelta(seconds=10)
    assert attempts == 25  # the ladder is untouched: only the next read moved
    assert snapshot(db, "payment_intents", "charges", "events", "alerts") == others
    assert stack.proc.wait_for_log("callback hint", charge_id=charge["id"], action="spaced", timeout=5)


@pytest.mark.parametrize("state, sql", [
    ("leased", "UPDATE jobs SET run_at = now() + interval '90 seconds', locked_by = 'w9', "
               "locked_at = now(), lease_expires_at = now() + interval '300 seconds', "
               "lease_token = gen_random_uuid() WHERE dedupe_key = %s"),
    ("dead_lettered", "UPDATE jobs SET run_at = 'infinity', last_error = 'parked' WHERE dedupe_key = %s"),
    ("due_soon", "UPDATE jobs SET run_at = now() + interval '5 seconds' WHERE dedupe_key = %s"),
])
def test_a_leased_dead_lettered_or_soon_due_poll_is_left_alone(stack, db, state, sql):
    charge = make_payment(db)
    db.execute(sql, (f"poll:{charge['id']}",))
    before = snapshot(db)
    assert stack.callback(charge["rail_reference"], SUCCESS_CLAIM).status_code == 202
    assert snapshot(db) == before
    assert stack.proc.wait_for_log("callback hint", charge_id=charge["id"], action=state, timeout=5)


def test_a_callback_claiming_success_moves_no_money_while_the_rail_says_pending(stack, db, spawn):
    stack.rail.script("256770000102", outcome="PENDING", callback=False)
    intent, charge = _create(stack, db, "256770000102")
    ref = charge["rail_reference"]
    _park(db, charge["id"], 90)
    spawn("vpay-worker", "--idle-sleep", "0.2", "--lease-seconds", "300", env=stack.env())

    assert stack.callback(ref, SUCCESS_CLAIM).status_code == 202
    # The pulled-forward poll happens, reads PENDING, and goes back on the ladder.
    wait_until(lambda: _status_reads(stack.rail, ref) >= 1 and db.execute(
        "SELECT last_polled_at IS NOT NULL FROM charges WHERE id = %s", (charge["id"],)).fetchone()[0]
        and _poll_job(db, charge["id"])[3] is None and not _poll_job(db, charge["id"])[1],
        timeout=15, what="the pulled-forward poll to read PENDING and reschedule")
    row = db.execute("SELECT c.status, c.settled_at, i.status, i.next_action IS NOT NULL FROM charges c "
                     "JOIN payment_intents i ON i.id = c.payment_intent_id WHERE c.id = %s",
                     (charge["id"],)).fetchone()
    assert row == ("pending", None, "processing", True)
    assert [r[0] for r in db.execute("SELECT type FROM events")] == ["payment_intent.processing"]

    # The money moves when, and only when, the rail's status read says so.
    stack.rail.set_status(ref, "SUCCESSFUL")
    db.execute("UPDATE charges SET last_polled_at = now() - interval '1 minute' WHERE id = %s",
               (charge["id"],))
    assert stack.callback(ref, {}).status_code == 202
    wait_until(lambda: db.execute("SELECT status FROM charges WHERE id = %s",
                                  (charge["id"],)).fetchone()[0] == "succeeded", timeout=15,
               what="settlement on the status read")


def test_a_charge_without_a_poll_job_gets_one_and_a_terminal_charge_one_verification_read(stack, db, spawn):
    stack.rail.script("256770000103", pending_reads=0, outcome="SUCCESSFUL", callback=False)
    intent, charge = _create(stack, db, "256770000103")
    ref = charge["rail_reference"]
    db.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s", (f"poll:{charge['id']}",))
    worker = spawn("vpay-worker", "--idle-sleep", "0.2", "--lease-seconds", "300", env=stack.env())
    # Settled, and the worker is done with the settlement's fan-out too: the
    # snapshots below must see only what the callback does.
    wait_until(lambda: db.execute("SELECT status FROM charges WHERE id = %s", (charge["id"],)).fetchone()[0]
               == "succeeded" and _poll_job(db, charge["id"]) is None
               and db.execute("SELECT count(*) FROM jobs WHERE kind IN ('fanout', 'deliver')").fetchone()[0] == 0,
               timeout=15, what="settlement and its fan-out")
    assert _status_reads(stack.rail, ref) == 1

    # Just read: a callback now is not dropped; its read waits for the 10 s spacing.
    before = snapshot(db, "payment_intents", "charges", "events", "alerts")
    assert stack.callback(ref, SUCCESS_CLAIM).status_code == 202
    assert snapshot(db, "payment_intents", "charges", "events", "alerts") == before
    # enqueued for the read + 10 s (give or take the milliseconds between two statements)
    assert db.execute("SELECT abs(extract(epoch FROM j.run_at - (c.last_polled_at + interval '10 seconds'))) < 1 "
                      "FROM jobs j JOIN charges c ON j.dedupe_key = 'poll:' || c.id WHERE c.id = %s",
                      (charge["id"],)).fetchone() == (True,)

    # That poll (a second callback leaves it alone: due within 10 s) makes one
    # verification read and changes no money.
    db.execute("UPDATE charges SET last_polled_at = now() - interval '1 minute' WHERE id = %s",
               (charge["id"],))
    money_sql = ("SELECT id, status, failure_code, amount, settled_at, submitted_at, rail_transaction_id "
                 "FROM charges ORDER BY id")
    money_before = snapshot(db, "payment_intents", "events"), db.execute(money_sql).fetchall()
    assert stack.callback(ref, SUCCESS_CLAIM).status_code == 202
    wait_until(lambda: _status_reads(stack.rail, ref) == 2 and _poll_job(db, charge["id"]) is None,
               timeout=30, what="the verification read")
    assert (snapshot(db, "payment_intents", "events"), db.execute(money_sql).fetchall()) == money_before
    # the read is stamped, so the route's 10 s rule spaces verification reads too
    assert db.execute("SELECT last_polled_at > now() - interval '30 seconds' FROM charges WHERE id = %s",
                      (charge["id"],)).fetchone() == (True,)
    assert stack.proc.find("callback hint", charge_id=charge["id"], action="enqueued")
    assert worker.popen.poll() is None


def _raw(stack, method: str, path: str, body: bytes = b"{}") -> tuple[int, list[tuple[str, str]], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, [(k.lower(), v) for k, v in resp.getheaders()], resp.read()
    finally:
        conn.close()


def test_existing_and_unknown_references_get_byte_identical_answers(stack, db):
    charge = make_payment(db)
    _park(db, charge["id"], 90)
    body = b'{"status": "SUCCESSFUL", "externalId": "1"}'
    for method in ("POST", "PUT"):
        hit = _raw(stack, method, f"/provider/mtn/callback?ref={charge['rail_reference']}", body)
        miss = _raw(stack, method, f"/provider/mtn/callback?ref={random_reference()}", body)
        assert hit[0] == miss[0] == 202
        assert hit[2] == miss[2]
        # Every header but the clock is the same, in the same order.
        assert [h for h in hit[1] if h[0] != "date"] == [h for h in miss[1] if h[0] != "date"]
    assert stack.proc.wait_for_log("callback for an unknown reference", timeout=5)["level"] == "INFO"


def test_unknown_rail_and_unreadable_callbacks_write_nothing(stack, db):
    charge = make_payment(db)
    _park(db, charge["id"], 90)
    ref = charge["rail_reference"]
    before = snapshot(db)
    cases = [
        ("/provider/orange/callback?ref=" + ref, b"{}", 404),
        ("/provider/nope/callback?ref=" + ref, b"{}", 404),
        ("/provider/mtn/callback", b"{}", 400),                       # no reference
        ("/provider/mtn/callback?ref=not-a-uuid", b"{}", 400),
        (f"/provider/mtn/callback?ref={ref}&ref={ref}", b"{}", 400),   # ambiguous
        (f"/provider/mtn/callback?ref={ref}", b"{not json", 400),
        (f"/provider/mtn/callback?ref={ref}", b"[1, 2]", 400),
        (f"/provider/mtn/callback?ref={ref}", b"\xff\xfe\x00", 400),
        (f"/provider/mtn/callback?ref={ref}", b"[" * 50_000 + b"]" * 10_000, 400),
    ]
    for path, body, status in cases:
        got, headers, text = _raw(stack, "POST", path, body)
        assert got == status, (path, body[:20], text)
        assert b"Traceback" not in text and b"File " not in text
        if status == 400:
            assert text == b'{"error":{"type":"invalid_request_error","code":"callback_unreadable",' \
                           b'"message":"The callback could not be read."}}'
    assert snapshot(db) == before


def _answer(sock) -> tuple[int, bytes]:
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    return resp.status, resp.read()


def test_a_body_over_64_kib_is_413_without_being_read(stack, db):
    charge = make_payment(db)
    before = snapshot(db)
    path = f"/provider/mtn/callback?ref={charge['rail_reference']}"
    with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        # Declares 50 MB, sends 1 KiB: an answer now proves nobody waited for the rest.
        sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: 50000000\r\n\r\n").encode() + b"x" * 1024)
        status, body = _answer(sock)
    assert status == 413 and b'"request_too_large"' in body

    with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
        chunk = b"x" * 8192
        for _ in range(9):  # 72 KiB, never terminated
            sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        status, body = _answer(sock)
    assert status == 413 and b'"request_too_large"' in body
    assert snapshot(db) == before


def test_api_refuses_to_start_without_its_rail_configured(db_url):
    res = subprocess.run([script("vpay-server"), "api", "--bind", "127.0.0.1:1"], env=base_env(db_url),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 78
    assert "VPAY_MTN_BASE_URL" in res.stderr
