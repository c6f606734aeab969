"""The main job end to end: the installed vpay-worker (a subprocess) against
the sandbox rail (a real HTTP server) and a real Postgres."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import TimeMachine, base_env, rail_env, script, wait_until
from vpay.money import payments
from vpay.rails.mtn import MtnMomo

pytestmark = pytest.mark.slow

SUCCESS, DECLINE, SLOW, FLAKY = "256770000001", "46733123451", "256770000003", "256770000004"


def _create(pool, rail, merchant, payer, amount=1500):
    adapter = MtnMomo.from_env(rail_env(rail))
    return payments.create_and_submit(pool, lambda code: adapter, merchant_id=merchant, amount=amount,
                                      currency="EUR", rail="mtn", payer=payer)


def _charge(db, charge_id):
    return db.execute("SELECT status, failure_code FROM charges WHERE id = %s", (charge_id,)).fetchone()


def _events(db, intent_id):
    return [r[0] for r in db.execute(
        "SELECT type FROM events WHERE payment_intent_id = %s ORDER BY created_at, id", (intent_id,))]


def test_worker_settles_success_decline_and_slow_payer_once_each(db, db_url, pool, sandbox, merchant, spawn):
    sandbox.script(SLOW, pending_reads=3, outcome="SUCCESSFUL")
    # one payment through the operator's command, as a shell user would
    out = subprocess.run([script("vpay-server"), "payments", "create", "--merchant", merchant,
                          "--amount", "1500", "--currency", "EUR", "--rail", "mtn", "--payer", SUCCESS, "--json"],
                         env=base_env(db_url, **rail_env(sandbox)), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    created = {"ok": json.loads(out.stdout)}
    assert created["ok"]["payment_intent"]["status"] == "processing"
    assert created["ok"]["charge"]["submitted_at"] is not None
    created["decline"] = _create(pool, sandbox, merchant, DECLINE)
    created["slow"] = _create(pool, sandbox, merchant, SLOW)
    charges = {k: v["charge"]["id"] for k, v in created.items()}

    worker = spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **rail_env(sandbox)))
    with TimeMachine(db_url):
        wait_until(lambda: all(_charge(db, c)[0] != "pending" for c in charges.values()),
                   timeout=60, what="every charge to settle")
    assert _charge(db, charges["ok"]) == ("succeeded", None)
    assert _charge(db, charges["decline"]) == ("failed", "APPROVAL_REJECTED")
    assert _charge(db, charges["slow"]) == ("succeeded", None)
    for key, outcome in (("ok", "succeeded"), ("decline", "payment_failed"), ("slow", "succeeded")):
        intent = created[key]["payment_intent"]["id"]
        assert _events(db, intent) == ["payment_intent.processing", f"payment_intent.{outcome}"]
    intents = dict(db.execute("SELECT c.id, i.status FROM charges c JOIN payment_intents i "
                              "ON i.id = c.payment_intent_id").fetchall())
    assert intents[charges["ok"]] == "succeeded"
    assert intents[charges["decline"]] == "requires_payment_method"
    # the slow payer was read exactly four times: three PENDING, then SUCCESSFUL
    slow_ref = created["slow"]["charge"]["rail_reference"]
    assert sandbox.count(method="GET", reference=slow_ref) == 4
    # settled charges have no poll job left: the rail is never asked again (the
    # settle commits before the loop's fenced finish deletes the job: wait for it)
    wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE kind = 'poll'").fetchone()[0] == 0,
               timeout=30, what="the settled charges' poll jobs to be finished")
    reads = {k: sandbox.count(method="GET", reference=v["charge"]["rail_reference"])
             for k, v in created.items()}
    worker.signal()
    assert worker.wait(30) == 0
    assert {k: sandbox.count(method="GET", reference=v["charge"]["rail_reference"])
            for k, v in created.items()} == reads


def test_rail_errors_and_timeouts_never_fail_a_charge(db, db_url, pool, sandbox, merchant, spawn):
    sandbox.script(FLAKY, status_errors=[500, 500, 500, 503, 503, 503], pending_reads=0,
                   outcome="SUCCESSFUL")
    slow = "256770000005"
    sandbox.script(slow, status_delay_seconds=1.5, outcome="PENDING")
    flaky = _create(pool, sandbox, merchant, FLAKY)["charge"]
    hung = _create(pool, sandbox, merchant, slow)["charge"]
    env = base_env(db_url, **rail_env(sandbox, VPAY_MTN_READ_TIMEOUT_SECONDS="0.5"))
    spawn("vpay-worker", "--idle-sleep", "0.1", env=env)
    with TimeMachine(db_url):
        # a 500 or 503 is "no answer": the charge waits on the ladder and then succeeds
        wait_until(lambda: _charge(db, flaky["id"])[0] == "succeeded", timeout=60,
                   what="the flaky rail's charge to succeed")
        # a rail that never answers in time: still pending, polled again and again
        wait_until(lambda: db.execute("SELECT attempts FROM jobs WHERE dedupe_key = %s",
                                      (f"poll:{hung['id']}",)).fetchone()[0] >= 3, timeout=60,
                   what="three polls of the hung charge")
    assert _charge(db, hung["id"]) == ("pending", None)
    note = db.execute("SELECT last_error FROM jobs WHERE dedupe_key = %s", (f"poll:{hung['id']}",)).fetchone()[0]
    assert note.startswith("rail: no_answer")
    assert _events(db, flaky["payment_intent_id"]) == ["payment_intent.processing",
                                                       "payment_intent.succeeded"]
