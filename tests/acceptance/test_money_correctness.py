"""Issue 12 end to end: the installed vpay-worker and vpay-server (subprocesses)
against the sandbox MoMo rail (a real HTTP server on 127.0.0.1) and a real
Postgres.

* Unreadable is not unreported: a terminal status whose amount is present but
  unreadable settles nothing (charge or refund), raises exactly one
  ``rail_contradiction`` alert, and no settlement event is written.
* Configuration is not a decline: answers that blame our configuration raise
  one ``rail_misconfigured`` alert per rail and code; a payment ends as
  ``rail_configuration_refused`` only when no payer was asked, and is kept
  pending (and recovers once the configuration is fixed) otherwise.

Time moves by writing ``run_at`` (``TimeMachine``), never by sleeping."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import TimeMachine, base_env, rail_env, script, wait_until
from vpay.money import payments, refunds
from vpay.rails.mtn import MtnMomo

pytestmark = pytest.mark.slow

PAYER = "256770000031"
CONFIG_REASONS = {"46733123458": "NOT_ALLOWED_TARGET_ENVIRONMENT", "46733123459": "INVALID_CALLBACK_URL_HOST",
                  "46733123460": "INVALID_CURRENCY"}


def _create(pool, env, merchant, payer=PAYER, amount=1500):
    adapter = MtnMomo.from_env(env)
    return payments.create_and_submit(pool, lambda code: adapter, merchant_id=merchant, amount=amount,
                                      currency="EUR", rail="mtn", payer=payer)


def _one(db, sql, *args):
    return db.execute(sql, args).fetchone()


def _events(db, intent_id):
    return db.execute("SELECT type, data FROM events WHERE payment_intent_id = %s ORDER BY created_at, id",
                      (intent_id,)).fetchall()


def _alerts(db):
    return db.execute("SELECT kind, charge_id, refund_id, details FROM alerts ORDER BY id").fetchall()


def _polls(db, key):
    row = _one(db, "SELECT attempts FROM jobs WHERE dedupe_key = %s", key)
    return row[0] if row else 0


def _worker(spawn, db_url, env):
    return spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, VPAY_WEBHOOKS_ALLOW_PRIVATE="1", **env))


def _live_poll(db, key) -> bool:
    row = _one(db, "SELECT run_at <> 'infinity' FROM jobs WHERE dedupe_key = %s", key)
    return bool(row and row[0])


# ---- unreadable is not unreported --------------------------------------------------


@pytest.mark.parametrize("status,reason,amount", [
    ("SUCCESSFUL", None, "15.001"),      # too many decimals for EUR
    ("SUCCESSFUL", None, "fifteen"),
    ("SUCCESSFUL", None, "1,500"),       # a thousands separator
    ("SUCCESSFUL", None, ""),
    ("FAILED", "APPROVAL_REJECTED", "fifteen"),
])
def test_a_terminal_status_with_an_unreadable_amount_settles_nothing_and_raises_one_alert(
        db, db_url, pool, sandbox, merchant, spawn, status, reason, amount):
    # Found by blind checks: {"status":"SUCCESSFUL","amount":"15.001","currency":"EUR"} settled a 15.00 EUR charge.
    sandbox.script(PAYER, outcome="PENDING")
    env = rail_env(sandbox)
    created = _create(pool, env, merchant)  # 1500 minor units = "15.00" EUR
    charge_id, ref = created["charge"]["id"], created["charge"]["rail_reference"]
    sandbox.set_status(ref, status, reason, amount=amount)
    _worker(spawn, db_url, env)
    with TimeMachine(db_url):
        wait_until(lambda: _polls(db, f"poll:{charge_id}") >= 3, timeout=60, what="three status reads")
    assert _one(db, "SELECT status, settled_at FROM charges WHERE id = %s", charge_id) == ("pending", None)
    assert [t for t, _ in _events(db, created["payment_intent"]["id"])] == ["payment_intent.processing"]
    assert [(k, c, d["where"], d["rail_says"], d["rail_reason"]) for k, c, _, d in _alerts(db)] == [
        ("rail_contradiction", charge_id, "unreadable_answer", f"{status.lower().replace('successful', 'succeeded')}"
         "_unreadable", "amount")]
    assert _live_poll(db, f"poll:{charge_id}")


def _paid_charge(db, pool, sandbox, merchant, env):
    from vpay.money import charges
    from vpay.rails.port import StatusKind
    created = _create(pool, env, merchant, amount=2500)
    charge = created["charge"]
    wait_until(lambda: (sandbox.transaction(charge["rail_reference"]) or {}).get("status") == "SUCCESSFUL",
               timeout=10, what="the collection to succeed at the rail")
    assert charges.settle(db, charge["id"], StatusKind.SUCCEEDED).transitioned
    db.execute("DELETE FROM jobs WHERE dedupe_key = %s", (f"poll:{charge['id']}",))
    return charge


@pytest.mark.parametrize("amount,where,rail_says", [
    ("25.001", "unreadable_answer", "succeeded_unreadable"),
    ("twenty-five", "unreadable_answer", "succeeded_unreadable"),
    ("24.99", "amount_mismatch", "succeeded_other_amount"),   # refunds now compare amounts like charges
])
def test_a_refund_success_with_an_unreadable_or_other_amount_settles_nothing_and_raises_one_alert(
        db, db_url, pool, sandbox, merchant, spawn, amount, where, rail_says):
    env = rail_env(sandbox)
    charge = _paid_charge(db, pool, sandbox, merchant, env)
    sandbox.script(PAYER, refund_outcome="PENDING")
    adapter = MtnMomo.from_env(env)
    refund = refunds.create_and_submit(pool, lambda code: adapter, charge_id=charge["id"])["refund"]
    assert refund["status"] == "pending" and refund["amount"] == 2500
    sandbox.set_refund_status(refund["rail_reference"], "SUCCESSFUL", amount=amount)
    _worker(spawn, db_url, env)
    with TimeMachine(db_url, kinds=("refund_poll",)):
        wait_until(lambda: _polls(db, f"refund_poll:{refund['id']}") >= 3, timeout=60, what="three refund reads")
    assert _one(db, "SELECT status FROM refunds WHERE id = %s", refund["id"]) == ("pending",)
    assert _one(db, "SELECT count(*) FROM events WHERE type LIKE 'refund.%%'") == (0,)
    assert [(k, r, d["where"], d["rail_says"]) for k, _, r, d in _alerts(db)] == [
        ("rail_contradiction", refund["id"], where, rail_says)]
    assert _live_poll(db, f"refund_poll:{refund['id']}")


# ---- configuration is not a decline ------------------------------------------------


def _payments_create(db_url, env, payer=PAYER):
    return subprocess.run([script("vpay-server"), "payments", "create", "--merchant", "m_test", "--amount",
                           "1500", "--currency", "EUR", "--rail", "mtn", "--payer", payer, "--json"],
                          env=base_env(db_url, **env), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("wrong,code", [
    ({"VPAY_MTN_API_KEY": "not-the-key"}, "LOGIN_FAILED"),
    ({"VPAY_MTN_SUBSCRIPTION_KEY": "0" * 32}, "ACCESS_DENIED"),
    ({"VPAY_MTN_CALLBACK_URL": "http://callbacks.invalid/provider/mtn/callback"}, "INVALID_CALLBACK_URL_HOST"),
])
def test_payments_create_refused_for_our_configuration_exits_78_and_fails_as_configuration(
        db, db_url, sandbox, merchant, wrong, code):
    env = rail_env(sandbox, **wrong)
    out = _payments_create(db_url, env)
    assert out.returncode == 78, out.stderr
    refusal = [line for line in out.stderr.splitlines() if line.startswith("vpay: ")]
    assert refusal == [f"vpay: configuration refused: rail mtn refused our configuration ({code}); payment "
                       f"{json.loads(out.stdout)['payment_intent']['id']} failed with rail_configuration_refused, "
                       "not sent to the payer: fix the VPAY_MTN_* settings (rail_misconfigured alert)"]
    shown = json.loads(out.stdout)
    charge_id, intent_id = shown["charge"]["id"], shown["payment_intent"]["id"]
    assert _one(db, "SELECT status, failure_code FROM charges WHERE id = %s", charge_id) == (
        "failed", "rail_configuration_refused")
    assert _one(db, "SELECT status FROM payment_intents WHERE id = %s", intent_id) == ("requires_payment_method",)
    events = _events(db, intent_id)
    assert [t for t, _ in events] == ["payment_intent.processing", "payment_intent.payment_failed"]
    failed = events[1][1]
    assert (failed["failure_code"], failed["failure_kind"]) == ("rail_configuration_refused", "configuration")
    alerts = _alerts(db)
    assert [(k, c, d["rail"], d["code"], d["operation"], d["effect"]) for k, c, _, d in alerts] == [
        ("rail_misconfigured", charge_id, "mtn", code, "request_to_pay", "failed")]
    # nothing reached a payer, nothing is re-sent: no resubmit job, no request-to-pay recorded
    assert _one(db, "SELECT count(*) FROM jobs WHERE kind = 'resubmit'") == (0,)
    assert sandbox.transactions() == []
    # the same cause again: the payment fails the same way, the alert stays one
    again = _payments_create(db_url, env)
    assert again.returncode == 78
    assert len(_alerts(db)) == 1


def test_a_refusal_names_this_payments_cause_not_an_older_open_alert(db, db_url, sandbox, merchant):
    # Issue 28: with an INVALID_CURRENCY alert still open from an earlier
    # charge, a payment refused for LOGIN_FAILED named both codes.
    first = subprocess.run([script("vpay-server"), "payments", "create", "--merchant", "m_test", "--amount", "1500",
                            "--currency", "XAF", "--payer", PAYER], env=base_env(db_url, **rail_env(sandbox)),
                           capture_output=True, text=True, timeout=60)  # the sandbox environment takes EUR only
    assert first.returncode == 78 and "(INVALID_CURRENCY)" in first.stderr, first.stderr
    out = _payments_create(db_url, rail_env(sandbox, VPAY_MTN_API_KEY="not-the-key"))
    assert out.returncode == 78
    [line] = out.stderr.splitlines()
    assert "refused our configuration (LOGIN_FAILED);" in line and "INVALID_CURRENCY" not in line, line
    assert sorted(d["code"] for _, _, _, d in _alerts(db)) == ["INVALID_CURRENCY", "LOGIN_FAILED"]


def test_a_payer_decline_is_not_a_configuration_failure(db, db_url, pool, sandbox, merchant, spawn):
    env = rail_env(sandbox)
    created = _create(pool, env, merchant, payer="46733123451")  # APPROVAL_REJECTED
    _worker(spawn, db_url, env)
    with TimeMachine(db_url):
        wait_until(lambda: _one(db, "SELECT status FROM charges WHERE id = %s", created["charge"]["id"])[0]
                   == "failed", timeout=60, what="the decline")
    failed = _events(db, created["payment_intent"]["id"])[-1][1]
    assert (failed["failure_code"], failed["failure_kind"]) == ("APPROVAL_REJECTED", "payer")
    assert _alerts(db) == []


@pytest.mark.parametrize("payer", sorted(CONFIG_REASONS))
def test_a_failed_status_that_blames_our_configuration_ends_as_configuration_with_one_alert(
        db, db_url, pool, sandbox, merchant, spawn, payer):
    env = rail_env(sandbox)
    created = _create(pool, env, merchant, payer=payer)
    charge_id = created["charge"]["id"]
    _worker(spawn, db_url, env)
    with TimeMachine(db_url):
        wait_until(lambda: _one(db, "SELECT status FROM charges WHERE id = %s", charge_id)[0] == "failed",
                   timeout=60, what="the charge to end")
    assert _one(db, "SELECT failure_code FROM charges WHERE id = %s", charge_id) == ("rail_configuration_refused",)
    events = _events(db, created["payment_intent"]["id"])
    assert [t for t, _ in events] == ["payment_intent.processing", "payment_intent.payment_failed"]
    assert events[1][1]["failure_kind"] == "configuration"
    assert [(k, c, d["code"], d["operation"], d["effect"]) for k, c, _, d in _alerts(db)] == [
        ("rail_misconfigured", charge_id, CONFIG_REASONS[payer], "charge_status", "failed")]


def test_a_status_read_refused_for_our_configuration_keeps_the_charge_pending_until_it_is_fixed(
        db, db_url, pool, sandbox, merchant, spawn):
    sandbox.script(PAYER, pending_reads=1, outcome="SUCCESSFUL")
    good = rail_env(sandbox)
    created = _create(pool, good, merchant)  # the request-to-pay went through
    charge_id, intent_id = created["charge"]["id"], created["payment_intent"]["id"]
    # the operator breaks the worker's target environment: every status read is refused (400)
    worker = _worker(spawn, db_url, rail_env(sandbox, VPAY_MTN_TARGET_ENVIRONMENT="mtnuganda"))
    with TimeMachine(db_url):
        wait_until(lambda: _polls(db, f"poll:{charge_id}") >= 3, timeout=60, what="three refused reads")
    worker.signal()
    assert worker.wait() == 0
    assert _one(db, "SELECT status FROM charges WHERE id = %s", charge_id) == ("pending",)
    assert _live_poll(db, f"poll:{charge_id}")
    assert [t for t, _ in _events(db, intent_id)] == ["payment_intent.processing"]
    assert [(k, d["code"], d["operation"], d["effect"]) for k, _, _, d in _alerts(db)] == [
        ("rail_misconfigured", "NOT_ALLOWED_TARGET_ENVIRONMENT", "charge_status", "kept_pending")]
    # fixed: the same charge settles, nothing was lost
    _worker(spawn, db_url, good)
    with TimeMachine(db_url):
        wait_until(lambda: _one(db, "SELECT status FROM charges WHERE id = %s", charge_id)[0] == "succeeded",
                   timeout=60, what="the charge to settle once fixed")
    assert [t for t, _ in _events(db, intent_id)] == ["payment_intent.processing", "payment_intent.succeeded"]


def test_a_resend_refused_for_our_credentials_keeps_the_charge_pending_without_looping(
        db, db_url, pool, sandbox, merchant, spawn):
    # the first request-to-pay got no answer (so it may have reached the payer); then the credentials broke
    sandbox.script(PAYER, rtp_errors=[500])
    good = rail_env(sandbox)
    created = _create(pool, good, merchant)
    charge_id = created["charge"]["id"]
    assert _one(db, "SELECT count(*) FROM jobs WHERE dedupe_key = %s", f"resubmit:{charge_id}") == (1,)
    sandbox.script(PAYER)
    worker = _worker(spawn, db_url, rail_env(sandbox, VPAY_MTN_API_KEY="rotated-away"))
    with TimeMachine(db_url):
        wait_until(lambda: _one(db, "SELECT count(*) FROM jobs WHERE kind = 'resubmit'")[0] == 0
                   and _polls(db, f"poll:{charge_id}") >= 2, timeout=60, what="the resubmit to stop")
        tokens_then = sandbox.count(path_prefix="/collection/token/")
    worker.signal()
    assert worker.wait() == 0
    assert _one(db, "SELECT status, failure_code FROM charges WHERE id = %s", charge_id) == ("pending", None)
    assert _live_poll(db, f"poll:{charge_id}")
    assert sandbox.count(path_prefix="/collection/v1_0/requesttopay") == 1  # only the first send, unanswered
    assert tokens_then < 20  # the token failure is remembered, not hammered
    assert {(k, d["code"], d["effect"]) for k, _, _, d in _alerts(db)} == {
        ("rail_misconfigured", "LOGIN_FAILED", "kept_pending")}
    # fixed: the poll reads 404, the resubmit sends it, the payer approves
    _worker(spawn, db_url, good)
    with TimeMachine(db_url):
        wait_until(lambda: _one(db, "SELECT status FROM charges WHERE id = %s", charge_id)[0] == "succeeded",
                   timeout=60, what="the charge to settle once fixed")


def test_refunds_create_refused_for_our_configuration_exits_78_and_fails_as_configuration(
        db, db_url, pool, sandbox, merchant):
    env = rail_env(sandbox)
    charge = _paid_charge(db, pool, sandbox, merchant, env)
    out = subprocess.run([script("vpay-server"), "refunds", "create", "--charge", charge["id"], "--json"],
                         env=base_env(db_url, **rail_env(sandbox, VPAY_MTN_DISBURSEMENT_API_KEY="wrong")),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 78, out.stderr
    refund = json.loads(out.stdout)["refund"]
    assert (refund["status"], refund["failure_code"]) == ("failed", "rail_configuration_refused")
    failed = _one(db, "SELECT data FROM events WHERE type = 'refund.failed'")[0]
    assert (failed["failure_code"], failed["failure_kind"]) == ("rail_configuration_refused", "configuration")
    assert [(k, r, d["code"], d["operation"]) for k, _, r, d in _alerts(db)] == [
        ("rail_misconfigured", refund["id"], "LOGIN_FAILED", "refund")]
    assert sandbox.refunds() == []
