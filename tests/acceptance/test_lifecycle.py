"""The whole charge lifecycle with the real worker against the sandbox rail:
24-hour escalation, prompt expiry, resubmit, scan:live, contradictions.

Time moves by writing ``created_at`` / ``run_at`` in the database, never by
sleeping for real minutes."""

from __future__ import annotations

import socket

import pytest

from support import TimeMachine, base_env, rail_env, wait_until
from vpay.money import charges, payments
from vpay.engine import queue
from vpay.rails.mtn import MtnMomo
from vpay.rails.port import StatusKind

pytestmark = pytest.mark.slow
PAYER = "256770000011"


def _create(pool, env, merchant, payer=PAYER):
    adapter = MtnMomo.from_env(env)
    return payments.create_and_submit(pool, lambda code: adapter, merchant_id=merchant, amount=2500,
                                      currency="EUR", rail="mtn", payer=payer)


def _age(db, charge_id, seconds):
    """Pretend the charge was created ``seconds`` ago (and make its jobs due)."""
    db.execute("UPDATE charges SET created_at = now() - make_interval(secs => %s) WHERE id = %s",
               (seconds, charge_id))
    db.execute("UPDATE jobs SET run_at = now() WHERE payload->>'charge_id' = %s AND run_at <> 'infinity'",
               (charge_id,))


def _row(db, sql, *args):
    return db.execute(sql, args).fetchone()


def _events(db, intent_id):
    return db.execute("SELECT type, data->'expired' FROM events WHERE payment_intent_id = %s "
                      "ORDER BY created_at, id", (intent_id,)).fetchall()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _assert_escalated(db, created):
    charge_id, intent_id = created["charge"]["id"], created["payment_intent"]["id"]
    wait_until(lambda: _row(db, "SELECT status FROM charges WHERE id = %s", charge_id)[0] == "unresolved",
               timeout=30, what="escalation")
    # escalated by the poll or by the sweep (which runs at boot too): either
    # way the poll ends rescheduled an hour out
    wait_until(lambda: _row(db, "SELECT locked_at IS NULL AND run_at > now() + interval '50 minutes' "
                                "FROM jobs WHERE dedupe_key = %s", f"poll:{charge_id}")[0],
               timeout=30, what="the poll to be rescheduled")
    assert _row(db, "SELECT unresolved_at IS NOT NULL FROM charges WHERE id = %s", charge_id) == (True,)
    alerts = db.execute("SELECT kind, charge_id FROM alerts").fetchall()
    assert alerts == [("charge_unresolved", charge_id)]
    assert _row(db, "SELECT status FROM payment_intents WHERE id = %s", intent_id) == ("processing",)
    next_poll = _row(db, "SELECT EXTRACT(EPOCH FROM run_at - now()) FROM jobs WHERE dedupe_key = %s",
                     f"poll:{charge_id}")[0]
    assert 3500 < next_poll <= 3600
    # no settlement event: only the creation and the prompt expiry
    assert [t for t, _ in _events(db, intent_id)] == ["payment_intent.processing"] * 2


def test_pending_at_24_hours_is_escalated_once_and_polled_hourly(db, db_url, pool, sandbox, merchant, spawn):
    sandbox.script(PAYER, outcome="PENDING")
    env = rail_env(sandbox)
    created = _create(pool, env, merchant)
    _age(db, created["charge"]["id"], 24 * 3600 + 60)
    worker = spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **env))
    _assert_escalated(db, created)
    # polled again (an hour later, pulled forward here): still one alert, still unresolved
    reads = sandbox.count(method="GET", reference=created["charge"]["rail_reference"])
    db.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s", (f"poll:{created['charge']['id']}",))
    wait_until(lambda: sandbox.count(method="GET", reference=created["charge"]["rail_reference"]) > reads,
               timeout=30, what="another status read")
    wait_until(lambda: _row(db, "SELECT locked_at IS NULL FROM jobs WHERE dedupe_key = %s",
                            f"poll:{created['charge']['id']}")[0], timeout=30, what="the poll to end")
    assert db.execute("SELECT count(*) FROM alerts").fetchone()[0] == 1
    assert len(worker.find("charge unresolved at the horizon: reconcile against the rail's statement")) == 1
    assert _row(db, "SELECT run_at <> 'infinity' FROM jobs WHERE dedupe_key = %s",
                f"poll:{created['charge']['id']}") == (True,)


def test_escalation_does_not_depend_on_the_rail_answering(db, db_url, pool, merchant, spawn):
    down = {"VPAY_MTN_BASE_URL": f"http://127.0.0.1:{_closed_port()}", "VPAY_MTN_SUBSCRIPTION_KEY": "k",
            "VPAY_MTN_API_USER": "u", "VPAY_MTN_API_KEY": "p"}
    created = _create(pool, down, merchant)
    assert created["charge"]["submitted_at"] is None  # connection refused: not confirmed
    _age(db, created["charge"]["id"], 24 * 3600 + 60)
    spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **down))
    _assert_escalated(db, created)
    assert _row(db, "SELECT status FROM charges WHERE id = %s", created["charge"]["id"]) == ("unresolved",)


def test_unresolved_charge_succeeding_at_hour_30_settles_normally(db, db_url, pool, sandbox, merchant, spawn):
    sandbox.script(PAYER, outcome="PENDING")
    env = rail_env(sandbox)
    created = _create(pool, env, merchant)
    charge_id = created["charge"]["id"]
    _age(db, charge_id, 24 * 3600 + 60)
    spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **env))
    wait_until(lambda: _row(db, "SELECT status FROM charges WHERE id = %s", charge_id)[0] == "unresolved",
               timeout=30, what="escalation")
    # the sweep may escalate while the poll is still leased: wait for its hourly reschedule
    wait_until(lambda: _row(db, "SELECT locked_at IS NULL AND run_at > now() + interval '50 minutes' "
                                "FROM jobs WHERE dedupe_key = %s", f"poll:{charge_id}")[0],
               timeout=30, what="the poll to be rescheduled an hour out")
    sandbox.set_status(created["charge"]["rail_reference"], "SUCCESSFUL")
    _age(db, charge_id, 30 * 3600)  # hour 30: the hourly poll comes round
    wait_until(lambda: _row(db, "SELECT status FROM charges WHERE id = %s", charge_id)[0] == "succeeded",
               timeout=30, what="the late success")
    types = [t for t, _ in _events(db, created["payment_intent"]["id"])]
    assert types.count("payment_intent.succeeded") == 1
    assert _row(db, "SELECT status FROM payment_intents WHERE id = %s",
                created["payment_intent"]["id"]) == ("succeeded",)


def test_prompt_expiry_happens_exactly_once_across_restarts_and_two_workers(db, db_url, pool, sandbox,
                                                                          merchant, spawn):
    sandbox.script(PAYER, outcome="PENDING")
    env = rail_env(sandbox)
    created = _create(pool, env, merchant)
    charge_id, intent_id = created["charge"]["id"], created["payment_intent"]["id"]
    assert created["payment_intent"]["next_action"]["type"] == "mobile_money_prompt"
    _age(db, charge_id, 16 * 60)  # past the 900 s TTL
    workers = [spawn("vpay-worker", "--idle-sleep", "0.05", env=base_env(db_url, **env)) for _ in range(2)]
    for w in workers:
        w.wait_for_log("worker started")
    with TimeMachine(db_url, interval=0.05):
        wait_until(lambda: _row(db, "SELECT attempts FROM jobs WHERE dedupe_key = %s", f"poll:{charge_id}")[0] >= 6,
                   timeout=60, what="six polls by two workers")
        for w in workers:
            w.signal()
            assert w.wait(30) == 0
        before = _row(db, "SELECT attempts FROM jobs WHERE dedupe_key = %s", f"poll:{charge_id}")[0]
        restarted = spawn("vpay-worker", "--idle-sleep", "0.05", env=base_env(db_url, **env))
        restarted.wait_for_log("worker started")
        wait_until(lambda: _row(db, "SELECT attempts FROM jobs WHERE dedupe_key = %s",
                                f"poll:{charge_id}")[0] >= before + 3,
                   timeout=60, what="three more polls after a restart")
        restarted.signal()
        assert restarted.wait(30) == 0
    expired = [e for t, e in _events(db, intent_id) if t == "payment_intent.processing" and e is True]
    assert len(expired) == 1
    assert _row(db, "SELECT prompt_expired_at IS NOT NULL, status FROM charges WHERE id = %s", charge_id) == \
        (True, "pending")
    assert _row(db, "SELECT next_action FROM payment_intents WHERE id = %s", intent_id) == (None,)
    # polling goes on and a later success still settles
    sandbox.set_status(created["charge"]["rail_reference"], "SUCCESSFUL")
    spawn("vpay-worker", "--idle-sleep", "0.05", env=base_env(db_url, **env))
    with TimeMachine(db_url):
        wait_until(lambda: _row(db, "SELECT status FROM charges WHERE id = %s", charge_id)[0] == "succeeded",
                   timeout=30, what="the success after expiry")


def test_request_to_pay_without_answer_is_resubmitted_and_succeeds(db, db_url, pool, sandbox, merchant, spawn):
    sandbox.script(PAYER, rtp_errors=[500])  # the rail did not take it
    other = "256770000012"
    sandbox.script(other, rtp_record_then_error=[500])  # the rail took it, we did not hear
    env = rail_env(sandbox)
    lost = _create(pool, env, merchant, PAYER)
    unheard = _create(pool, env, merchant, other)
    for c in (lost, unheard):
        assert c["charge"]["submitted_at"] is None
        assert _row(db, "SELECT kind FROM jobs WHERE dedupe_key = %s", f"resubmit:{c['charge']['id']}") == ("resubmit",)
    spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **env))
    with TimeMachine(db_url):
        for c in (lost, unheard):
            wait_until(lambda: _row(db, "SELECT status FROM charges WHERE id = %s", c["charge"]["id"])[0] == "succeeded",
                       timeout=60, what="the resubmitted charge to succeed")
    rtp = "/collection/v1_0/requesttopay"
    # the rail never took it: only a re-send can have made it succeed
    assert sandbox.count(method="POST", path_prefix=rtp, reference=lost["charge"]["rail_reference"]) >= 2
    # the rail took it: either the re-send (409, accepted) or the poll finding it recovered it
    assert sandbox.transaction(unheard["charge"]["rail_reference"]) is not None
    for c in (lost, unheard):
        assert _row(db, "SELECT submitted_at IS NOT NULL FROM charges WHERE id = %s", c["charge"]["id"]) == (True,)
        assert [t for t, _ in _events(db, c["payment_intent"]["id"])].count("payment_intent.succeeded") == 1
    assert db.execute("SELECT count(*) FROM jobs WHERE kind = 'resubmit'").fetchone()[0] == 0


def test_a_charge_the_rail_never_learns_of_fails_not_submitted_after_the_ttl(db, db_url, pool, sandbox,
                                                                           merchant, spawn):
    sandbox.script(PAYER, rtp_errors=[500] * 1000)
    env = rail_env(sandbox)
    created = _create(pool, env, merchant)
    charge_id = created["charge"]["id"]
    spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **env))
    with TimeMachine(db_url):
        wait_until(lambda: sandbox.count(method="POST", path_prefix="/collection/v1_0/requesttopay") >= 3,
                   timeout=30, what="resubmits while the TTL runs")
        assert _row(db, "SELECT status FROM charges WHERE id = %s", charge_id) == ("pending",)
        _age(db, charge_id, 20 * 60)
        wait_until(lambda: _row(db, "SELECT status FROM charges WHERE id = %s", charge_id)[0] == "failed",
                   timeout=30, what="not_submitted")
    assert _row(db, "SELECT failure_code FROM charges WHERE id = %s", charge_id) == ("not_submitted",)
    assert [t for t, _ in _events(db, created["payment_intent"]["id"])].count("payment_intent.payment_failed") == 1


def test_a_404_for_a_confirmed_charge_is_no_answer_never_a_failure(db, db_url, pool, sandbox, merchant, spawn):
    sandbox.script(PAYER, outcome="PENDING")
    env = rail_env(sandbox)
    created = _create(pool, env, merchant)
    assert created["charge"]["submitted_at"] is not None
    sandbox.forget(created["charge"]["rail_reference"])
    _age(db, created["charge"]["id"], 20 * 60)
    spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **env))
    with TimeMachine(db_url):
        wait_until(lambda: _row(db, "SELECT attempts FROM jobs WHERE dedupe_key = %s",
                                f"poll:{created['charge']['id']}")[0] >= 4, timeout=30, what="four polls")
    assert _row(db, "SELECT status FROM charges WHERE id = %s", created["charge"]["id"]) == ("pending",)
    assert _row(db, "SELECT count(*) FROM jobs WHERE kind = 'resubmit'") == (0,)


def test_scan_live_finds_a_charge_whose_poll_job_was_deleted(db, db_url, pool, sandbox, merchant, spawn):
    env = rail_env(sandbox)
    created = _create(pool, env, merchant)
    charge_id = created["charge"]["id"]
    db.execute("DELETE FROM jobs WHERE dedupe_key = %s", (f"poll:{charge_id}",))
    db.execute("UPDATE charges SET created_at = now() - interval '11 minutes' WHERE id = %s", (charge_id,))
    worker = spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **env))
    # scan:live exists from boot (and ran at once); settle follows through the re-created poll
    with TimeMachine(db_url):
        wait_until(lambda: _row(db, "SELECT status FROM charges WHERE id = %s", charge_id)[0] == "succeeded",
                   timeout=30, what="scan:live to recover the charge")
    scan = worker.find("scan")
    assert scan and scan[0]["enqueued"] == 1 and scan[0]["charges"] == [charge_id]
    assert _row(db, "SELECT EXTRACT(EPOCH FROM run_at - now()) > 3000 FROM jobs WHERE dedupe_key = 'scan:live'") == (True,)
    assert _row(db, "SELECT count(*) FROM jobs WHERE dedupe_key = 'sweep:expired'") == (1,)


@pytest.mark.parametrize("rail_says,alert", [("FAILED", True), ("PENDING", False), ("SUCCESSFUL", False)])
def test_a_settled_charge_is_verified_once_and_never_changed(db, db_url, pool, sandbox, merchant, spawn,
                                                            rail_says, alert):
    env = rail_env(sandbox)
    created = _create(pool, env, merchant)
    charge_id, ref = created["charge"]["id"], created["charge"]["rail_reference"]
    charges.settle(db, charge_id, StatusKind.SUCCEEDED)
    db.execute("DELETE FROM jobs WHERE dedupe_key = %s", (f"poll:{charge_id}",))
    sandbox.set_status(ref, rail_says, "APPROVAL_REJECTED" if rail_says == "FAILED" else None)
    before = sandbox.count(method="GET", reference=ref)
    queue.enqueue(db, "poll", f"poll:{charge_id}", {"charge_id": charge_id})  # as a callback would
    spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **env))
    wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = %s",
                                  (f"poll:{charge_id}",)).fetchone()[0] == 0, timeout=30,
               what="the verification poll")
    assert sandbox.count(method="GET", reference=ref) == before + 1
    assert _row(db, "SELECT status FROM charges WHERE id = %s", charge_id) == ("succeeded",)
    assert [t for t, _ in _events(db, created["payment_intent"]["id"])] == \
        ["payment_intent.processing", "payment_intent.succeeded"]
    alerts = db.execute("SELECT kind, details->>'rail_says', details->>'where' FROM alerts").fetchall()
    assert alerts == ([("rail_contradiction", "failed", "poll")] if alert else [])
    assert _row(db, "SELECT last_polled_at IS NOT NULL FROM charges WHERE id = %s", charge_id) == (True,)
    # asked again (anyone can send a callback): one more read, still one open alert
    queue.enqueue(db, "poll", f"poll:{charge_id}", {"charge_id": charge_id})
    wait_until(lambda: sandbox.count(method="GET", reference=ref) == before + 2, timeout=30,
               what="the second verification read")
    wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = %s",
                                  (f"poll:{charge_id}",)).fetchone()[0] == 0, timeout=30,
               what="the second verification poll to end")
    assert db.execute("SELECT count(*) FROM alerts").fetchone()[0] == (1 if alert else 0)


def test_a_charge_whose_poll_was_dead_lettered_is_still_escalated_by_the_sweep(db, db_url, pool, sandbox,
                                                                             merchant, spawn):
    env = rail_env(sandbox)
    created = _create(pool, env, merchant)
    charge_id = created["charge"]["id"]
    db.execute("UPDATE jobs SET run_at = 'infinity', last_error = 'parked by the test' WHERE dedupe_key = %s",
               (f"poll:{charge_id}",))
    db.execute("UPDATE charges SET created_at = now() - interval '25 hours' WHERE id = %s", (charge_id,))
    worker = spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **env))
    # sweep:expired exists from boot and runs at once
    wait_until(lambda: _row(db, "SELECT status FROM charges WHERE id = %s", charge_id)[0] == "unresolved",
               timeout=30, what="the sweep to escalate the stranded charge")
    assert db.execute("SELECT kind, charge_id FROM alerts").fetchall() == [("charge_unresolved", charge_id)]
    assert _row(db, "SELECT run_at = 'infinity' FROM jobs WHERE dedupe_key = %s", f"poll:{charge_id}") == (True,)
    assert worker.wait_for_log("sweep")["escalated"] == 1


@pytest.mark.parametrize("amount", ["0.01", "250.00"])
def test_a_success_for_another_amount_settles_nothing_and_raises_one_alert(db, db_url, pool, sandbox, merchant,
                                                                          spawn, amount):
    # Found by review: SUCCESSFUL settled a 25.00 EUR charge whatever amount the rail reported.
    sandbox.script(PAYER, outcome="PENDING")
    env = rail_env(sandbox)
    created = _create(pool, env, merchant)  # 2500 minor units = "25.00" EUR
    charge_id, ref = created["charge"]["id"], created["charge"]["rail_reference"]
    sandbox.set_status(ref, "SUCCESSFUL", amount=amount)
    spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, **env))
    with TimeMachine(db_url):
        wait_until(lambda: _row(db, "SELECT attempts FROM jobs WHERE dedupe_key = %s", f"poll:{charge_id}")[0] >= 3,
                   timeout=30, what="three polls")
    assert _row(db, "SELECT status FROM charges WHERE id = %s", charge_id) == ("pending",)
    assert [t for t, _ in _events(db, created["payment_intent"]["id"])] == ["payment_intent.processing"]
    alerts = db.execute("SELECT kind, details->>'where', details->>'rail_reason' FROM alerts").fetchall()
    expected_minor = int(amount.replace(".", ""))
    assert alerts == [("rail_contradiction", "amount_mismatch", f"{expected_minor} EUR")]
