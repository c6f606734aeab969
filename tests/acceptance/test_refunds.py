"""Refunds end to end: the installed vpay-worker (a subprocess) and the
``vpay-server refunds`` commands against the sandbox rail's Disbursement
refunds (a real HTTP server) and a real Postgres; the state machine's
compare-and-swaps in-process against the same Postgres.

Time moves by writing ``created_at`` / ``run_at``, never by sleeping for
real minutes (docs/flows/refunds.md)."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from standardwebhooks.webhooks import Webhook

from support import TimeMachine, base_env, rail_env, script, wait_until
from test_webhooks import Receiver
from vpay.money import charges, payments, refunds
from vpay.engine import queue
from vpay import webhooks
from vpay.money.ids import new_id, new_rail_reference
from vpay.rails.mtn import MtnMomo
from vpay.rails.port import StatusKind
from vpay.money.refunds import InvalidRefund

pytestmark = pytest.mark.slow

PAYER, OTHER = "256770000021", "256770000022"
DECLINE = "46733123451"
REFUND_PATH = "/disbursement/v1_0/refund"


# ---- helpers ---------------------------------------------------------------


def _adapter(sandbox, **extra):
    adapter = MtnMomo.from_env(rail_env(sandbox, **extra))
    return lambda code: adapter


def _paid(db, pool, sandbox, merchant, payer=PAYER, amount=2500) -> dict:
    """A charge the rail collected and vpay settled ``succeeded`` (its poll
    job removed, so the worker only does refund work)."""
    created = payments.create_and_submit(pool, _adapter(sandbox), merchant_id=merchant, amount=amount,
                                         currency="EUR", rail="mtn", payer=payer)
    charge = created["charge"]
    wait_until(lambda: (sandbox.transaction(charge["rail_reference"]) or {}).get("status") == "SUCCESSFUL",
               timeout=10, what="the collection to succeed at the rail")
    assert charges.settle(db, charge["id"], StatusKind.SUCCEEDED).transitioned
    db.execute("DELETE FROM jobs WHERE dedupe_key = %s", (f"poll:{charge['id']}",))
    return charge


def _succeeded_charge(db, merchant, amount=2500) -> str:
    """A succeeded charge written directly (no rail): for tests that never
    ask the rail anything."""
    intent_id, charge_id = new_id("pi"), new_id("ch")
    db.execute("INSERT INTO payment_intents (id, merchant_id, amount, currency, status) "
               "VALUES (%s, %s, %s, 'EUR', 'processing')", (intent_id, merchant, amount))
    db.execute("INSERT INTO charges (id, payment_intent_id, rail, rail_reference, payer, amount, currency) "
               "VALUES (%s, %s, 'mtn', %s, %s, %s, 'EUR')",
               (charge_id, intent_id, new_rail_reference(), PAYER, amount))
    assert charges.settle(db, charge_id, StatusKind.SUCCEEDED).transitioned
    return charge_id


def _refund(pool, sandbox, charge_id, amount=None, **extra) -> dict:
    return refunds.create_and_submit(pool, _adapter(sandbox, **extra), charge_id=charge_id,
                                     amount=amount)["refund"]


def _row(db, refund_id) -> dict:
    cols = ("status", "failure_code", "submitted_at", "settled_at", "unresolved_at", "rail_transaction_id",
            "amount", "reason")
    row = db.execute(f"SELECT {', '.join(cols)} FROM refunds WHERE id = %s", (refund_id,)).fetchone()
    return dict(zip(cols, row))


def _status(db, refund_id) -> str:
    return db.execute("SELECT status FROM refunds WHERE id = %s", (refund_id,)).fetchone()[0]


def _refund_events(db, refund_id) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT type FROM events WHERE data -> 'refund' ->> 'id' = %s ORDER BY created_at, id", (refund_id,))]


def _poll_job(db, refund_id):
    return db.execute("SELECT attempts, locked_at IS NOT NULL, EXTRACT(EPOCH FROM run_at - now())::float8, "
                      "last_error FROM jobs WHERE dedupe_key = %s", (f"refund_poll:{refund_id}",)).fetchone()


def _worker(spawn, db_url, sandbox, **extra):
    env = base_env(db_url, VPAY_WEBHOOKS_ALLOW_PRIVATE="1", **rail_env(sandbox, **extra))
    return spawn("vpay-worker", "--idle-sleep", "0.1", env=env)


def _counts(db) -> tuple:
    return db.execute("SELECT (SELECT count(*) FROM refunds), (SELECT count(*) FROM jobs), "
                      "(SELECT count(*) FROM events), (SELECT count(*) FROM alerts)").fetchone()


def _cli(db_url, sandbox, *args):
    return subprocess.run([script("vpay-server"), "refunds", *args, "--json"],
                          env=base_env(db_url, **rail_env(sandbox)), capture_output=True, text=True,
                          timeout=60)


# ---- the happy path, through the operator's command and a webhook ----------


def test_refund_of_a_succeeded_charge_settles_succeeded_with_one_event(db, db_url, pool, sandbox, merchant,
                                                                      spawn):
    rx = Receiver()
    try:
        endpoint = webhooks.add_endpoint(db, merchant, rx.url("/hook"), permit_private=True)
        charge = _paid(db, pool, sandbox, merchant)
        out = _cli(db_url, sandbox, "create", "--charge", charge["id"], "--amount", "1000",
                   "--reason", "damaged in transit")
        assert out.returncode == 0, out.stderr
        created = json.loads(out.stdout)["refund"]
        assert created["status"] == "pending" and created["submitted_at"] is not None
        assert created["amount"] == 1000 and created["currency"] == "EUR"
        refund_id, ref = created["id"], created["rail_reference"]
        assert refund_id.startswith("re_") and ref != charge["rail_reference"]
        job = _poll_job(db, refund_id)
        assert job is not None and 0 < job[2] <= 10  # born with the refund, due at the first rung

        worker = _worker(spawn, db_url, sandbox)
        with TimeMachine(db_url, kinds=("refund_poll",)):
            wait_until(lambda: _status(db, refund_id) != "pending", timeout=60, what="the refund to settle")
            wait_until(lambda: _poll_job(db, refund_id) is None, timeout=30, what="the refund poll to end")
        row = _row(db, refund_id)
        assert row["status"] == "succeeded" and row["failure_code"] is None
        assert row["settled_at"] is not None and row["rail_transaction_id"]
        assert row["reason"] == "damaged in transit"
        assert _refund_events(db, refund_id) == ["refund.succeeded"]
        # the refund is its own record: charge and intent are unchanged
        assert db.execute("SELECT c.status, i.status FROM charges c JOIN payment_intents i "
                          "ON i.id = c.payment_intent_id WHERE c.id = %s", (charge["id"],)).fetchone() == \
            ("succeeded", "succeeded")
        at_rail = sandbox.refund(ref)
        assert at_rail["referenceIdToRefund"] == charge["rail_reference"]
        assert at_rail["amount"] == "10.00" and at_rail["externalId"] == refund_id
        assert sandbox.count(method="POST", path_prefix=REFUND_PATH, reference=ref) == 1

        # the merchant hears it through its webhook, signed
        posted = wait_until(lambda: [p for p in rx.posts("/hook")
                                     if json.loads(p.body)["type"] == "refund.succeeded"],
                            timeout=30, what="the refund.succeeded webhook")
        assert len(posted) == 1
        doc = Webhook(endpoint["secret"]).verify(posted[0].body, posted[0].headers)
        assert doc["data"]["refund"]["id"] == refund_id
        assert doc["data"]["refund"]["status"] == "succeeded"
        assert doc["data"]["charge"]["id"] == charge["id"]

        shown = _cli(db_url, sandbox, "show", refund_id)
        assert shown.returncode == 0, shown.stderr
        shown = json.loads(shown.stdout)
        assert shown["refund"]["status"] == "succeeded"
        assert [e["type"] for e in shown["events"]] == ["refund.succeeded"]

        # a rail that later reports the opposite: one verification read, an
        # alert, nothing changed
        sandbox.set_refund_status(ref, "FAILED", "INTERNAL_PROCESSING_ERROR")
        queue.enqueue(db, "refund_poll", f"refund_poll:{refund_id}", {"refund_id": refund_id})
        wait_until(lambda: _poll_job(db, refund_id) is None, timeout=30, what="the verification read")
        assert _status(db, refund_id) == "succeeded"
        assert _refund_events(db, refund_id) == ["refund.succeeded"]
        assert db.execute("SELECT kind, charge_id, refund_id, details->>'rail_says', details->>'where' "
                          "FROM alerts").fetchall() == \
            [("rail_contradiction", charge["id"], refund_id, "failed", "refund_poll")]
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        rx.close()


@pytest.mark.parametrize("how,code", [("declined_at_status", "NOT_ENOUGH_FUNDS"),
                                      ("rejected_at_submit", "BAD_REQUEST")])
def test_a_refund_the_rail_declines_settles_failed_with_the_reason(db, db_url, pool, sandbox, merchant,
                                                                  spawn, how, code):
    charge = _paid(db, pool, sandbox, merchant)
    if how == "declined_at_status":
        sandbox.script(PAYER, refund_pending_reads=1, refund_outcome="FAILED", refund_reason=code)
    else:
        sandbox.script(PAYER, refund_errors=[400])  # MoMo refuses the request itself
    refund = _refund(pool, sandbox, charge["id"])
    assert refund["amount"] == 2500  # the default: all of it
    if how == "rejected_at_submit":
        assert refund["status"] == "failed" and refund["failure_code"] == code
    else:
        _worker(spawn, db_url, sandbox)
        with TimeMachine(db_url, kinds=("refund_poll",)):
            wait_until(lambda: _status(db, refund["id"]) == "failed", timeout=60, what="the refund to fail")
    row = _row(db, refund["id"])
    assert row["failure_code"] == code and row["settled_at"] is not None
    assert _refund_events(db, refund["id"]) == ["refund.failed"]
    assert db.execute("SELECT status FROM charges WHERE id = %s", (charge["id"],)).fetchone() == ("succeeded",)
    # a failed refund gave nothing back: the whole amount can be refunded again
    sandbox.script(PAYER)
    again = _refund(pool, sandbox, charge["id"])
    assert again["amount"] == 2500 and again["status"] == "pending"


# ---- what may not be refunded ---------------------------------------------


def test_over_refund_and_refund_of_a_charge_not_succeeded_are_errors_that_write_nothing(
        db, db_url, pool, sandbox, merchant):
    paid = _paid(db, pool, sandbox, merchant, amount=2500)
    sandbox.script(OTHER, outcome="PENDING")
    pending = payments.create_and_submit(pool, _adapter(sandbox), merchant_id=merchant, amount=900,
                                         currency="EUR", rail="mtn", payer=OTHER)["charge"]
    declined = payments.create_and_submit(pool, _adapter(sandbox), merchant_id=merchant, amount=900,
                                          currency="EUR", rail="mtn", payer=DECLINE)["charge"]
    charges.settle(db, declined["id"], StatusKind.FAILED, failure_code="APPROVAL_REJECTED")
    before = _counts(db)
    for charge_id, amount, code in ((pending["id"], None, "charge_not_succeeded"),
                                    (declined["id"], 100, "charge_not_succeeded"),
                                    ("ch_doesnotexist", None, "charge_not_found"),
                                    (paid["id"], 2501, "amount_exceeds_refundable"),
                                    (paid["id"], 0, "invalid_amount"),
                                    (paid["id"], -5, "invalid_amount"),
                                    (paid["id"], True, "invalid_amount")):
        with pytest.raises(InvalidRefund) as caught:
            _refund(pool, sandbox, charge_id, amount)
        assert caught.value.code == code, (charge_id, amount)
    assert _counts(db) == before
    assert sandbox.count(path_prefix="/disbursement") == 0

    # the operator's command: clear messages, exit codes, nothing written; what
    # the charge refuses is refused by the data (1), not a usage error
    out = _cli(db_url, sandbox, "create", "--charge", pending["id"])
    assert out.returncode == 1 and "only a succeeded charge can be refunded" in out.stderr
    out = _cli(db_url, sandbox, "create", "--charge", paid["id"], "--amount", "2501")
    assert out.returncode == 1 and "exceeds what charge" in out.stderr
    out = _cli(db_url, sandbox, "create", "--charge", paid["id"], "--amount", "0")
    assert out.returncode == 2 and "--amount" in out.stderr
    out = _cli(db_url, sandbox, "create", "--charge", "ch_doesnotexist")
    assert out.returncode == 1 and "no charge" in out.stderr
    assert _counts(db) == before

    # partial refunds add up to the charge's amount, never more
    first = _refund(pool, sandbox, paid["id"], 1000)
    with pytest.raises(InvalidRefund) as caught:
        _refund(pool, sandbox, paid["id"], 1501)
    assert caught.value.code == "amount_exceeds_refundable"
    rest = _refund(pool, sandbox, paid["id"])
    assert (first["amount"], rest["amount"]) == (1000, 1500)
    with pytest.raises(InvalidRefund) as caught:
        _refund(pool, sandbox, paid["id"], 1)
    assert caught.value.code == "nothing_to_refund"
    assert db.execute("SELECT count(*) FROM refunds").fetchone() == (2,)


# ---- the rail does not answer ----------------------------------------------


@pytest.mark.parametrize("how", ["lost", "unheard"])
def test_a_refund_request_without_an_answer_is_recovered_and_settles(db, db_url, pool, sandbox, merchant,
                                                                    spawn, how):
    charge = _paid(db, pool, sandbox, merchant)
    if how == "lost":
        sandbox.script(PAYER, refund_errors=[500])            # the rail did not take it
    else:
        sandbox.script(PAYER, refund_record_then_error=[500])  # the rail took it, we did not hear
    refund = _refund(pool, sandbox, charge["id"])
    assert refund["status"] == "pending" and refund["submitted_at"] is None
    ref = refund["rail_reference"]
    _worker(spawn, db_url, sandbox)
    with TimeMachine(db_url, kinds=("refund_poll",)):
        wait_until(lambda: _status(db, refund["id"]) == "succeeded", timeout=60, what="the refund to succeed")
    # lost: the poll read 404 for a refund never confirmed and re-sent it with
    # the same X-Reference-Id; unheard: the rail knew it, nothing was re-sent
    assert sandbox.count(method="POST", path_prefix=REFUND_PATH, reference=ref) == (2 if how == "lost" else 1)
    assert len(sandbox.refunds()) == 1
    assert _row(db, refund["id"])["submitted_at"] is not None
    assert _refund_events(db, refund["id"]) == ["refund.succeeded"]


def test_a_kill_after_the_refund_commit_is_recovered_by_its_poll(db, db_url, pool, sandbox, merchant, spawn):
    charge = _paid(db, pool, sandbox, merchant)
    env = base_env(db_url, VPAY_TEST_PAUSE_AT="after_refund_commit", **rail_env(sandbox))
    cli = spawn("vpay-server", "--log-level", "INFO", "refunds", "create", "--charge", charge["id"], env=env)
    wait_until(lambda: "test pause" in cli.text(), timeout=30, what="the create to pause after its commit")
    cli.popen.send_signal(signal.SIGKILL)
    cli.wait(10)
    [(refund_id, ref, submitted)] = db.execute("SELECT id, rail_reference, submitted_at FROM refunds").fetchall()
    assert submitted is None and sandbox.count(path_prefix=REFUND_PATH) == 0
    _worker(spawn, db_url, sandbox)
    with TimeMachine(db_url, kinds=("refund_poll",)):
        wait_until(lambda: _status(db, refund_id) == "succeeded", timeout=60, what="the refund to succeed")
    assert sandbox.count(method="POST", path_prefix=REFUND_PATH, reference=ref) == 1
    assert _refund_events(db, refund_id) == ["refund.succeeded"]


def test_refund_status_errors_and_timeouts_never_fail_a_refund(db, db_url, pool, sandbox, merchant, spawn):
    flaky_charge = _paid(db, pool, sandbox, merchant, PAYER)
    hung_charge = _paid(db, pool, sandbox, merchant, OTHER)
    sandbox.script(PAYER, refund_status_errors=[500, 500, 500, 503, 503, 503], refund_pending_reads=0,
                   refund_outcome="SUCCESSFUL")
    sandbox.script(OTHER, refund_status_delay_seconds=1.5, refund_outcome="PENDING")
    flaky = _refund(pool, sandbox, flaky_charge["id"])
    hung = _refund(pool, sandbox, hung_charge["id"])
    _worker(spawn, db_url, sandbox, VPAY_MTN_READ_TIMEOUT_SECONDS="0.5")
    with TimeMachine(db_url, kinds=("refund_poll",)):
        wait_until(lambda: _status(db, flaky["id"]) == "succeeded", timeout=60,
                   what="the flaky rail's refund to succeed")
        wait_until(lambda: (_poll_job(db, hung["id"]) or (0,))[0] >= 3, timeout=60,
                   what="three polls of the hung refund")
    assert _status(db, hung["id"]) == "pending"
    assert _poll_job(db, hung["id"])[3].startswith("rail: no_answer")
    assert _refund_events(db, flaky["id"]) == ["refund.succeeded"]
    assert _refund_events(db, hung["id"]) == []
    # every error read was answered; none was taken for a decline
    assert sandbox.count(method="GET", path_prefix=REFUND_PATH, reference=flaky["rail_reference"]) >= 5


# ---- the 24-hour horizon ---------------------------------------------------


def _age(db, refund_id, seconds):
    """Pretend the refund was created ``seconds`` ago, and make its poll due."""
    db.execute("UPDATE refunds SET created_at = now() - make_interval(secs => %s) WHERE id = %s",
               (seconds, refund_id))
    db.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s AND run_at <> 'infinity'",
               (f"refund_poll:{refund_id}",))


@pytest.mark.parametrize("rail", ["pending", "down"])
def test_a_refund_pending_at_24_hours_is_unresolved_once_and_polled_hourly(db, db_url, pool, sandbox,
                                                                          merchant, spawn, rail):
    charge = _paid(db, pool, sandbox, merchant)
    if rail == "pending":
        sandbox.script(PAYER, refund_outcome="PENDING")
    else:
        sandbox.script(PAYER, refund_outcome="PENDING", refund_status_errors=[500] * 1000)
    refund = _refund(pool, sandbox, charge["id"])
    refund_id, ref = refund["id"], refund["rail_reference"]
    _age(db, refund_id, 24 * 3600 + 60)
    worker = _worker(spawn, db_url, sandbox)
    wait_until(lambda: _status(db, refund_id) == "unresolved", timeout=30, what="escalation")
    wait_until(lambda: not _poll_job(db, refund_id)[1], timeout=30, what="the poll to be rescheduled")
    assert _row(db, refund_id)["unresolved_at"] is not None
    assert db.execute("SELECT kind, charge_id, refund_id, details->>'rail_reference' FROM alerts").fetchall() == \
        [("refund_unresolved", charge["id"], refund_id, ref)]
    assert 3500 < _poll_job(db, refund_id)[2] <= 3600
    assert _refund_events(db, refund_id) == []

    # an hour later (pulled forward here): read again, still one alert
    reads = sandbox.count(method="GET", reference=ref)
    _age(db, refund_id, 25 * 3600)
    wait_until(lambda: sandbox.count(method="GET", reference=ref) > reads, timeout=30, what="another read")
    wait_until(lambda: not _poll_job(db, refund_id)[1] and _poll_job(db, refund_id)[2] > 3500, timeout=30,
               what="the hourly rung")
    assert db.execute("SELECT count(*) FROM alerts").fetchone() == (1,)
    assert len(worker.find("refund unresolved at the horizon: reconcile against the rail's statement")) == 1
    assert _status(db, refund_id) == "unresolved"

    if rail == "pending":
        # a late success is a normal transition
        sandbox.set_refund_status(ref, "SUCCESSFUL")
        _age(db, refund_id, 30 * 3600)
        wait_until(lambda: _status(db, refund_id) == "succeeded", timeout=30, what="the late success")
        assert _refund_events(db, refund_id) == ["refund.succeeded"]
        wait_until(lambda: _poll_job(db, refund_id) is None, timeout=30, what="the poll to end")


def test_a_refund_whose_poll_was_dead_lettered_is_still_escalated_by_the_sweep(db, db_url, merchant, spawn):
    # The hourly sweep escalates refunds as it does charges: a dead-lettered
    # refund_poll must not hide a refund past the horizon ("The escalation does
    # not depend on the rail answering").
    charge_id = _succeeded_charge(db, merchant)
    refund = refunds.create_refund(db, charge_id=charge_id)
    db.execute("UPDATE jobs SET run_at = 'infinity', last_error = 'parked by the test' WHERE dedupe_key = %s",
               (f"refund_poll:{refund['id']}",))
    db.execute("UPDATE refunds SET created_at = now() - interval '25 hours' WHERE id = %s", (refund["id"],))
    worker = spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url))
    # sweep:expired exists from boot and runs at once
    wait_until(lambda: _status(db, refund["id"]) == "unresolved", timeout=30,
               what="the sweep to escalate the refund whose poll is dead-lettered")
    assert db.execute("SELECT kind, refund_id FROM alerts").fetchall() == [("refund_unresolved", refund["id"])]
    assert worker.wait_for_log("sweep")["escalated_refunds"] == 1
