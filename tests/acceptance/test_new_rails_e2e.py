"""M-Pesa (Daraja) and pawaPay end to end (issue 29): the installed
vpay-worker, a real `vpay-server api` (gunicorn) configured for both rails
only, the two sandboxes (vpay/sandbox/mpesa.py, pawapay.py: real HTTP
servers in this process) and a real Postgres.

Each scripted outcome settles through the authenticated status read only:
settle, decline, expire, in flight then success, a token revoked early
(M-Pesa), a lost push answer never pushed again and settled through the
callback's CheckoutRequestID (M-Pesa), a duplicate deposit id after a lost
answer and a read that lags the write (pawaPay); creation refuses what a rail can never carry; M-Pesa
refunds are refused, pawaPay's go through the pollable refund path."""

from __future__ import annotations

import json
import subprocess

import pytest
import requests
from psycopg.rows import dict_row

from api_support import free_port, new_key
from support import Proc, TimeMachine, base_env, script, wait_until
from vpay.sandbox.mpesa import MpesaSandbox
from vpay.sandbox.pawapay import PawaPaySandbox

pytestmark = pytest.mark.slow

MPESA_PAYER = "254708374149"
PAWA_PAYER = "260763456789"


class Stack:
    def __init__(self, url, port, daraja, pawa, proc, db_url):
        self.url, self.port, self.daraja, self.pawa, self.proc, self.db_url = url, port, daraja, pawa, proc, db_url

    def env(self, **extra):
        return base_env(self.db_url, **self.daraja.env(f"{self.url}/provider/mpesa/callback"),
                        **self.pawa.env(), **extra)

    def create(self, key, method, amount, currency, msisdn):
        return requests.post(f"{self.url}/v1/payment_intents", timeout=30,
                             headers={"Authorization": f"Bearer {key}"},
                             json={"amount": amount, "currency": currency,
                                   "payment_method": {"type": method, "msisdn": msisdn}})


@pytest.fixture(scope="module")
def rails_stack(db_url, tmp_path_factory):
    daraja, pawa = MpesaSandbox().start(), PawaPaySandbox().start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = base_env(db_url, **daraja.env(f"{url}/provider/mpesa/callback"), **pawa.env())
    proc = Proc([script("vpay-server"), "api", "--bind", f"127.0.0.1:{port}", "--workers", "1",
                 "--threads", "4"], env, tmp_path_factory.mktemp("rails-api") / "api.log")

    def healthy():
        if proc.popen.poll() is not None:
            raise AssertionError(f"vpay-server api exited {proc.popen.returncode}:\n{proc.text()[-4000:]}")
        try:
            return requests.get(f"{url}/healthz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_until(healthy, timeout=30, what="the API to answer /healthz")
        yield Stack(url, port, daraja, pawa, proc, db_url)
    finally:
        proc.close()
        daraja.stop()
        pawa.stop()


@pytest.fixture
def stack(rails_stack, db):
    rails_stack.daraja.reset()
    rails_stack.pawa.reset()
    return rails_stack


def _charge(db, intent_id):
    with db.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM charges WHERE payment_intent_id = %s", (intent_id,)).fetchone()


def _status(db, charge_id):
    return db.execute("SELECT c.status, c.failure_code, i.status FROM charges c JOIN payment_intents i "
                      "ON i.id = c.payment_intent_id WHERE c.id = %s", (charge_id,)).fetchone()


def _create(stack, db, method):
    args = (("mpesa", 150_00, "KES", MPESA_PAYER) if method == "mpesa" else ("pawapay", 15_00, "ZMW", PAWA_PAYER))
    resp = stack.create(new_key(db), *args)
    assert resp.status_code == 201, resp.text
    return resp.json(), _charge(db, resp.json()["id"])


def _settle(stack, db, spawn, charge_id):
    spawn("vpay-worker", "--idle-sleep", "0.1", env=stack.env())
    with TimeMachine(stack.db_url):
        wait_until(lambda: _status(db, charge_id)[0] != "pending", timeout=60, what="settlement")
    return _status(db, charge_id)


@pytest.mark.parametrize("outcome,expected", [
    ("approve", ("succeeded", None, "succeeded")),
    ("decline", ("failed", "MPESA_1032", "requires_payment_method")),
    ("expire", ("failed", "MPESA_1037", "requires_payment_method")),
])
def test_mpesa_outcomes_settle_through_the_stk_query(stack, db, spawn, outcome, expected):
    stack.daraja.script_payer(MPESA_PAYER, outcome)
    intent, charge = _create(stack, db, "mpesa")
    push = stack.daraja.push(charge["rail_reference"])
    assert push["amount"] == 150 and charge["rail_data"]["checkout_request_id"] == push["checkout"]
    assert charge["submitted_at"] is not None
    assert _settle(stack, db, spawn, charge["id"]) == expected
    events = [r[0] for r in db.execute("SELECT type FROM events WHERE payment_intent_id = %s ORDER BY created_at",
                                       (intent["id"],))]
    assert events[-1] == ("payment_intent.succeeded" if outcome == "approve" else "payment_intent.payment_failed")


def test_mpesa_in_flight_then_success_and_a_token_revoked_early(stack, db, spawn):
    stack.daraja.script_payer(MPESA_PAYER, "approve", in_flight=3)
    intent, charge = _create(stack, db, "mpesa")
    spawn("vpay-worker", "--idle-sleep", "0.1", env=stack.env())
    ref = charge["rail_reference"]
    with TimeMachine(stack.db_url):
        wait_until(lambda: stack.daraja.count("/query", reference=ref) >= 1, timeout=60, what="a first query")
        stack.daraja.expire_tokens()
        wait_until(lambda: _status(db, charge["id"])[0] != "pending", timeout=60, what="settlement")
    assert _status(db, charge["id"]) == ("succeeded", None, "succeeded")
    codes = [e["status_code"] for e in stack.daraja.requests_log() if e["path"].endswith("/query")]
    assert codes.count(500) == 3 and 401 in codes and codes[-1] == 200   # in flight x3, token refused once


def test_mpesa_refuses_at_creation_what_it_cannot_carry_and_refuses_refunds(stack, db):
    key = new_key(db)
    before = db.execute("SELECT count(*) FROM charges").fetchone()[0]
    cents = stack.create(key, "mpesa", 150_50, "KES", MPESA_PAYER)
    assert cents.status_code == 422 and "whole shillings" in cents.json()["error"]["message"]
    other = stack.create(key, "mpesa", 100_00, "UGX", MPESA_PAYER)
    assert other.status_code == 422 and other.json()["error"]["param"] == "currency"
    assert db.execute("SELECT count(*) FROM charges").fetchone()[0] == before
    assert stack.daraja.pushes() == []
    stack.daraja.script_payer(MPESA_PAYER, "approve")
    intent, charge = _create(stack, db, "mpesa")
    db.execute("UPDATE charges SET status = 'succeeded', settled_at = now() WHERE id = %s", (charge["id"],))
    done = subprocess.run([script("vpay-server"), "refunds", "create", "--charge", charge["id"]],
                          env=stack.env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "M-Pesa refunds are not supported" in done.stderr
    assert db.execute("SELECT count(*) FROM refunds WHERE charge_id = %s", (charge["id"],)).fetchone()[0] == 0


def test_pawapay_callback_is_a_hint_named_by_its_deposit_id(stack, db):
    intent, charge = _create(stack, db, "pawapay")
    db.execute("UPDATE jobs SET run_at = now() + interval '90 seconds' WHERE dedupe_key = %s",
               (f"poll:{charge['id']}",))
    body = {"depositId": charge["rail_reference"], "status": "COMPLETED", "providerTransactionId": "FAKE"}
    resp = requests.post(f"{stack.url}/provider/pawapay/callback", json=body, timeout=10)
    assert resp.status_code == 202
    assert _status(db, charge["id"])[0] == "pending"          # a hint moves no money
    due = db.execute("SELECT run_at <= now() FROM jobs WHERE dedupe_key = %s", (f"poll:{charge['id']}",)).fetchone()
    assert due == (True,)                                     # it pulled the parked poll forward
    unknown = requests.post(f"{stack.url}/provider/pawapay/callback", timeout=10,
                            json={**body, "depositId": "6f0c2a8e-1111-4c2e-8f1a-5b6d7e8f9a0b"})
    assert (unknown.status_code, unknown.content) == (resp.status_code, resp.content)


def test_mpesa_callback_is_a_hint(stack, db):
    intent, charge = _create(stack, db, "mpesa")
    body = {"Body": {"stkCallback": {"MerchantRequestID": "m", "CheckoutRequestID": "ws_CO_x", "ResultCode": 0,
                                     "ResultDesc": "paid, trust me"}}}
    resp = requests.post(f"{stack.url}/provider/mpesa/callback?ref={charge['rail_reference']}", json=body, timeout=10)
    assert resp.status_code == 202
    assert _status(db, charge["id"])[0] == "pending"
    # its push was answered: the callback's CheckoutRequestID is not adopted over the one Daraja gave us
    assert _charge(db, intent["id"])["rail_data"]["checkout_request_id"] == charge["rail_data"]["checkout_request_id"]


def test_mpesa_lost_answer_is_pushed_once_and_settles_by_the_callbacks_checkout_request_id(stack, db, spawn):
    stack.daraja.script_payer(MPESA_PAYER, "approve")
    stack.daraja.lose_next_answers(500)                      # Daraja took the push; we never heard its id
    intent, charge = _create(stack, db, "mpesa")
    ref = charge["rail_reference"]
    assert charge["submitted_at"] is None and "checkout_request_id" not in charge["rail_data"]
    spawn("vpay-worker", "--idle-sleep", "0.1", env=stack.env())
    with TimeMachine(stack.db_url):
        wait_until(lambda: db.execute("SELECT attempts FROM jobs WHERE dedupe_key = %s",
                                      (f"poll:{charge['id']}",)).fetchone()[0] >= 3,
                   timeout=60, what="three polls that cannot read the prompt")
        assert _status(db, charge["id"])[0] == "pending" and stack.daraja.count("/processrequest", reference=ref) == 1
        assert stack.daraja.notify(ref) == 202               # Daraja's callback names the CheckoutRequestID
        wait_until(lambda: _status(db, charge["id"])[0] != "pending", timeout=60, what="settlement")
    assert _status(db, charge["id"]) == ("succeeded", None, "succeeded")
    assert _charge(db, intent["id"])["rail_data"]["checkout_request_id"] == stack.daraja.push(ref)["checkout"]
    assert stack.daraja.count("/processrequest", reference=ref) == 1      # one prompt, ever


@pytest.mark.parametrize("outcome,expected", [
    ("approve", ("succeeded", None, "succeeded")),
    ("decline", ("failed", "INSUFFICIENT_BALANCE", "requires_payment_method")),
    ("expire", ("failed", "PAYMENT_NOT_APPROVED", "requires_payment_method")),
])
def test_pawapay_outcomes_settle_through_the_deposit_read(stack, db, spawn, outcome, expected):
    stack.pawa.script_payer(PAWA_PAYER, outcome, in_flight=2 if outcome == "approve" else 0)
    intent, charge = _create(stack, db, "pawapay")
    deposit = stack.pawa.deposit(charge["rail_reference"])
    assert deposit["body"]["amount"] == "15.00" and deposit["body"]["payer"]["accountDetails"]["provider"] == "MTN_MOMO_ZMB"
    assert _settle(stack, db, spawn, charge["id"]) == expected
    if outcome == "approve":
        settled = _charge(db, intent["id"])
        assert settled["rail_transaction_id"] == stack.pawa.deposit(charge["rail_reference"])["provider_transaction_id"]


def test_pawapay_lost_answer_resent_with_the_same_deposit_id_is_duplicate_ignored(stack, db, spawn):
    stack.pawa.lose_next_answers(500)
    stack.pawa.script_payer(PAWA_PAYER, "approve", lag_reads=1)
    intent, charge = _create(stack, db, "pawapay")
    assert charge["submitted_at"] is None   # the API never heard pawaPay's answer
    assert _settle(stack, db, spawn, charge["id"]) == ("succeeded", None, "succeeded")
    dep = charge["rail_reference"]
    assert stack.pawa.count("POST", "/v2/deposits", dep) >= 2       # the re-send met DUPLICATE_IGNORED
    assert len([d for d in [stack.pawa.deposit(dep)] if d]) == 1


def test_pawapay_not_found_right_after_accepted_is_not_a_failure(stack, db, spawn):
    stack.pawa.script_payer(PAWA_PAYER, "approve", lag_reads=2)
    intent, charge = _create(stack, db, "pawapay")
    assert charge["submitted_at"] is not None
    assert _settle(stack, db, spawn, charge["id"]) == ("succeeded", None, "succeeded")
    assert stack.pawa.count("POST", "/v2/deposits", charge["rail_reference"]) == 1   # never re-sent


def test_pawapay_unsupported_pairing_is_refused_at_creation(stack, db):
    key = new_key(db)
    resp = stack.create(key, "pawapay", 100_00, "KES", "255700000001")
    assert resp.status_code == 422 and resp.json()["error"]["param"] == "payment_method[msisdn]"
    resp = stack.create(key, "pawapay", 100_00, "RWF", PAWA_PAYER)
    assert resp.status_code == 422 and "MTN_MOMO_ZMB" in resp.json()["error"]["message"]
    assert stack.pawa.requests_log() == []


def test_pawapay_refund_goes_through_the_pollable_refund_path(stack, db, spawn):
    intent, charge = _create(stack, db, "pawapay")
    assert _settle(stack, db, spawn, charge["id"])[0] == "succeeded"
    done = subprocess.run([script("vpay-server"), "refunds", "create", "--charge", charge["id"], "--amount", "500",
                           "--json"],
                          env=stack.env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    refund_id = json.loads(done.stdout)["refund"]["id"]
    with TimeMachine(stack.db_url, kinds=("refund_poll",)):
        wait_until(lambda: db.execute("SELECT status FROM refunds WHERE id = %s", (refund_id,)).fetchone()[0]
                   != "pending", timeout=60, what="the refund to settle")
    assert db.execute("SELECT status FROM refunds WHERE id = %s", (refund_id,)).fetchone()[0] == "succeeded"
    assert stack.pawa.count("GET", "/v2/refunds/") >= 1
