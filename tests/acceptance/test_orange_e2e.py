"""Orange Money Web Payment end to end: the installed vpay-worker, a real
`vpay-server api` (gunicorn) configured for Orange only, the Orange sandbox
(vpay/sandbox/orange/, a real HTTP server in this process) and a real
Postgres.

Design page, "Callbacks are hints" and "What the worker does not do" (the
notif_token row): Orange's notification is a hint whose only proof of origin
is its notif_token (design/rails.md); a missing or wrong one is answered and
logged like an unknown reference and changes nothing; only the authenticated
transactionstatus read moves money.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import time
import uuid

import pytest
import requests
from psycopg.rows import dict_row

from api_support import free_port, new_key, snapshot
from support import Proc, TimeMachine, base_env, script, wait_until
from vpay.rails.orange import order_id_for
from vpay.sandbox.orange import OrangeSandbox

pytestmark = pytest.mark.slow


class OrangeStack:
    def __init__(self, url: str, port: int, orange: OrangeSandbox, proc: Proc, db_url: str):
        self.url, self.port, self.orange, self.proc, self.db_url = url, port, orange, proc, db_url

    @property
    def notif_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/provider/orange/callback"

    def env(self, **extra: str) -> dict[str, str]:
        return base_env(self.db_url, **self.orange.env(self.notif_url), **extra)

    def create(self, key: str, amount: int = 5000, currency: str = "XAF") -> requests.Response:
        return requests.post(f"{self.url}/v1/payment_intents", timeout=30,
                             headers={"Authorization": f"Bearer {key}"},
                             json={"amount": amount, "currency": currency,
                                   "payment_method": {"type": "orange_money", "msisdn": "237690000001"}})

    def raw(self, path: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, [(k.lower(), v) for k, v in resp.getheaders()], resp.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def orange_stack(db_url, tmp_path_factory):
    """One Orange sandbox and one `vpay-server api` with only Orange configured
    (so the API also shows that one configured rail is enough to start)."""
    orange = OrangeSandbox().start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = base_env(db_url, **orange.env(f"{url}/provider/orange/callback"))
    proc = Proc([script("vpay-server"), "api", "--bind", f"127.0.0.1:{port}", "--workers", "2",
                 "--threads", "4"], env, tmp_path_factory.mktemp("orange-api") / "api.log")

    def healthy():
        if proc.popen.poll() is not None:
            raise AssertionError(f"vpay-server api exited {proc.popen.returncode}:\n{proc.text()[-4000:]}")
        try:
            return requests.get(f"{url}/healthz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_until(healthy, timeout=30, what="the API to answer /healthz")
        yield OrangeStack(url, port, orange, proc, db_url)
    finally:
        proc.close()
        orange.stop()


@pytest.fixture
def stack(orange_stack, db):
    orange_stack.orange.reset()
    return orange_stack


def _charge(db, intent_id: str) -> dict:
    with db.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM charges WHERE payment_intent_id = %s", (intent_id,)).fetchone()


def _status(db, charge_id: str) -> tuple:
    return db.execute("SELECT c.status, c.failure_code, i.status FROM charges c JOIN payment_intents i "
                      "ON i.id = c.payment_intent_id WHERE c.id = %s", (charge_id,)).fetchone()


def _events(db) -> list[str]:
    return [r[0] for r in db.execute("SELECT type FROM events ORDER BY created_at, id")]


def _park(db, charge_id: str, seconds: float = 90) -> None:
    db.execute("UPDATE jobs SET run_at = now() + make_interval(secs => %s) WHERE dedupe_key = %s",
               (seconds, f"poll:{charge_id}"))


def _poll_due(db, charge_id: str):
    row = db.execute("SELECT run_at <= now() FROM jobs WHERE dedupe_key = %s", (f"poll:{charge_id}",)).fetchone()
    return None if row is None else row[0]


def _status_reads(orange, ref: str) -> int:
    return orange.count(path_suffix="/transactionstatus", order_id=ref)


def _create(stack, db) -> tuple[dict, dict]:
    resp = stack.create(new_key(db))
    assert resp.status_code == 201, resp.text
    intent = resp.json()
    return intent, _charge(db, intent["id"])


def _everything(db) -> str:
    """Every row of every table, as text: to prove a value is stored nowhere."""
    tables = [r[0] for r in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    return "\n".join(str(db.execute(f'SELECT * FROM "{t}"').fetchall()) for t in tables)


def test_a_success_settles_once_with_only_the_notif_tokens_hash_stored(stack, db, spawn):
    intent, charge = _create(stack, db)
    ref = charge["rail_reference"]
    paid = stack.orange.payment(ref)
    assert paid is not None and paid["order_id"] == order_id_for(ref) and paid["amount"] == 5000
    assert paid["notif_url"] == f"{stack.notif_url}?ref={ref}"

    # The payer is sent to Orange's page; the token for its status read is kept.
    assert intent["status"] == "processing"
    assert intent["next_action"]["type"] == "redirect_to_url"
    assert intent["next_action"]["url"] == paid["payment_url"]
    assert intent["next_action"]["expires_at"].endswith("Z")
    assert charge["rail_data"] == {"pay_token": paid["pay_token"], "payment_url": paid["payment_url"]}
    assert charge["notif_token_sha256"] == hashlib.sha256(paid["notif_token"].encode()).hexdigest()
    assert charge["submitted_at"] is not None
    assert paid["notif_token"] not in _everything(db)

    stack.orange.script_order(ref, pending_reads=1, outcome="SUCCESS")
    spawn("vpay-worker", "--idle-sleep", "0.1", env=stack.env())
    with TimeMachine(stack.db_url):
        wait_until(lambda: _status(db, charge["id"])[0] != "pending", timeout=60, what="settlement")
    assert _status(db, charge["id"]) == ("succeeded", None, "succeeded")
    assert _events(db) == ["payment_intent.processing", "payment_intent.succeeded"]
    settled = _charge(db, intent["id"])
    assert settled["rail_transaction_id"] == stack.orange.payment(ref)["txnid"]
    shown = requests.get(f"{stack.url}/v1/payment_intents/{intent['id']}", timeout=10,
                         headers={"Authorization": f"Bearer {new_key(db)}"}).json()
    assert shown["status"] == "succeeded" and shown["next_action"] is None
    # Orange's notification (posted from the sandbox's own thread) got the one answer.
    wait_until(lambda: stack.orange.notifications(), timeout=10, what="the notification")
    assert [n["status_code"] for n in stack.orange.notifications()] == [202]
    assert paid["notif_token"] not in stack.proc.text()


def test_a_notification_with_the_right_token_pulls_a_parked_poll_forward(stack, db, spawn):
    intent, charge = _create(stack, db)
    ref = charge["rail_reference"]
    _park(db, charge["id"], 90)
    worker = spawn("vpay-worker", "--idle-sleep", "0.2", env=stack.env())
    worker.wait_for_log("worker started")
    assert _status_reads(stack.orange, ref) == 0

    # The payer pays; Orange posts its notification (right notif_token) to our notif_url.
    stack.orange.set_status(ref, "SUCCESS")
    started = time.monotonic()
    wait_until(lambda: _status(db, charge["id"])[0] == "succeeded", timeout=20, what="the charge to settle")
    assert time.monotonic() - started < 20  # not the 90 s it was parked for
    wait_until(lambda: stack.orange.notifications(), timeout=10, what="the notification's log entry")
    assert [n["status_code"] for n in stack.orange.notifications()] == [202]
    assert _status_reads(stack.orange, ref) == 1  # one read: the pulled-forward poll
    assert _events(db) == ["payment_intent.processing", "payment_intent.succeeded"]
    assert stack.proc.find("callback hint", charge_id=charge["id"], action="pulled_forward")


def test_a_wrong_or_missing_notif_token_changes_nothing_and_reads_like_an_unknown_reference(stack, db):
    intent, charge = _create(stack, db)
    ref = charge["rail_reference"]
    right = stack.orange.payment(ref)["notif_token"]
    _park(db, charge["id"], 90)
    before = snapshot(db)

    claim = {"status": "SUCCESS", "txnid": "MP1"}
    miss = stack.raw(f"/provider/orange/callback?ref={uuid.uuid4()}",
                     json.dumps({**claim, "notif_token": right}).encode())
    assert miss[0] == 202
    for body in ({**claim, "notif_token": "0" * 32}, {**claim, "notif_token": right.upper()},
                 {**claim, "notif_token": right[:-1]}, claim, {}, {**claim, "notif_token": None}):
        got = stack.raw(f"/provider/orange/callback?ref={ref}", json.dumps(body).encode())
        assert got[0] == 202 and got[2] == miss[2]
        # Every header but the clock is the same, in the same order.
        assert [h for h in got[1] if h[0] != "date"] == [h for h in miss[1] if h[0] != "date"]
    assert stack.orange.notify(ref, token="wrong") == 202
    assert stack.orange.notify(ref, token="missing") == 202
    assert snapshot(db) == before
    assert _poll_due(db, charge["id"]) is False  # still parked 90 s out

    mismatch = stack.proc.wait_for_log("notif_token mismatch", timeout=5, rail_reference=ref)
    assert mismatch["level"] == "INFO"
    assert stack.proc.find("callback for an unknown reference")
    assert not stack.proc.find("callback hint", charge_id=charge["id"])
    assert right not in stack.proc.text()

    # The one thing that differs is the token: the right one is acted on.
    assert stack.orange.notify(ref, token="right") == 202
    assert _poll_due(db, charge["id"]) is True
    assert stack.proc.wait_for_log("callback hint", timeout=5, charge_id=charge["id"], action="pulled_forward")
    # A rail this API has not configured has no callback route.
    assert stack.raw(f"/provider/mtn/callback?ref={uuid.uuid4()}", b"{}")[0] == 404


def test_a_notification_claiming_success_moves_no_money_while_orange_says_initiated(stack, db, spawn):
    intent, charge = _create(stack, db)
    ref = charge["rail_reference"]
    _park(db, charge["id"], 90)
    spawn("vpay-worker", "--idle-sleep", "0.2", env=stack.env())

    # Right token, false claim: the poll is pulled forward, reads INITIATED, goes back on the ladder.
    assert stack.orange.notify(ref, token="right", status="SUCCESS") == 202
    wait_until(lambda: _status_reads(stack.orange, ref) >= 1 and db.execute(
        "SELECT last_polled_at IS NOT NULL FROM charges WHERE id = %s", (charge["id"],)).fetchone()[0]
        and _poll_due(db, charge["id"]) is False, timeout=20,
        what="the pulled-forward poll to read INITIATED and reschedule")
    assert _status(db, charge["id"]) == ("pending", None, "processing")
    assert _events(db) == ["payment_intent.processing"]
    assert _charge(db, intent["id"])["settled_at"] is None

    # The money moves when, and only when, Orange's status read says so.
    db.execute("UPDATE charges SET last_polled_at = now() - interval '1 minute' WHERE id = %s", (charge["id"],))
    stack.orange.set_status(ref, "SUCCESS")  # its notification pulls the poll forward again
    wait_until(lambda: _status(db, charge["id"])[0] == "succeeded", timeout=20, what="settlement on the read")
    assert _events(db) == ["payment_intent.processing", "payment_intent.succeeded"]


def test_expired_fails_the_charge_with_reason_expired(stack, db, spawn):
    intent, charge = _create(stack, db)
    stack.orange.script_order(charge["rail_reference"], pending_reads=1, outcome="EXPIRED")
    spawn("vpay-worker", "--idle-sleep", "0.1", env=stack.env())
    with TimeMachine(stack.db_url):
        wait_until(lambda: _status(db, charge["id"])[0] != "pending", timeout=60, what="settlement")
    assert _status(db, charge["id"]) == ("failed", "EXPIRED", "requires_payment_method")
    assert _events(db) == ["payment_intent.processing", "payment_intent.payment_failed"]
    assert db.execute("SELECT next_action FROM payment_intents WHERE id = %s", (intent["id"],)).fetchone() == (None,)


def test_an_init_that_got_no_answer_is_sent_again_and_its_tokens_kept(stack, db, spawn):
    stack.orange.fail_next_inits(503)  # Orange did not take it
    intent, charge = _create(stack, db)
    ref = charge["rail_reference"]
    assert intent["status"] == "processing" and intent["next_action"]["type"] == "mobile_money_prompt"
    assert charge["rail_data"] == {} and charge["submitted_at"] is None

    spawn("vpay-worker", "--idle-sleep", "0.1", env=stack.env())
    with TimeMachine(stack.db_url, kinds=("resubmit",)):
        wait_until(lambda: _charge(db, intent["id"])["submitted_at"] is not None, timeout=60,
                   what="the re-sent init to be accepted")
    paid = stack.orange.payment(ref)
    kept = _charge(db, intent["id"])
    assert kept["rail_data"] == {"pay_token": paid["pay_token"], "payment_url": paid["payment_url"]}
    next_action = db.execute("SELECT next_action FROM payment_intents WHERE id = %s", (intent["id"],)).fetchone()[0]
    assert next_action["type"] == "redirect_to_url" and next_action["url"] == paid["payment_url"]
    stack.orange.set_status(ref, "SUCCESS")
    wait_until(lambda: _status(db, charge["id"])[0] == "succeeded", timeout=30, what="settlement")


def test_a_lost_init_answer_never_fails_the_charge_early_and_ends_not_submitted(stack, db, spawn):
    stack.orange.lose_next_init_answers(504)  # Orange took it; we never heard
    intent, charge = _create(stack, db)
    ref = charge["rail_reference"]
    assert stack.orange.payment(ref)["status"] == "INITIATED"

    # Re-sends get 403 (the order id is used): not a decline. The prompt TTL ends it.
    spawn("vpay-worker", "--idle-sleep", "0.1", env=stack.env(VPAY_PROMPT_TTL_SECONDS="6"))
    with TimeMachine(stack.db_url):
        wait_until(lambda: stack.orange.count(path_suffix="/webpayment", order_id=ref) >= 2, timeout=30,
                   what="a re-sent init")
        assert _status(db, charge["id"])[0] == "pending"
        wait_until(lambda: _status(db, charge["id"])[0] != "pending", timeout=60, what="the TTL to end it")
    assert _status(db, charge["id"]) == ("failed", "not_submitted", "requires_payment_method")
    inits = [r["status_code"] for r in stack.orange.requests_log() if r["path"].endswith("/webpayment")]
    assert inits[0] == 504 and set(inits[1:]) == {403}
    assert len(stack.orange.payments()) == 1  # never a second payment at Orange
