"""The money state machine against a real Postgres, with real concurrency."""

from __future__ import annotations

import threading

import psycopg
import pytest

from vpay.money import charges
from vpay.rails.port import StatusKind

COUNT_ALL = "SELECT (SELECT count(*) FROM payment_intents), (SELECT count(*) FROM charges), " \
            "(SELECT count(*) FROM jobs), (SELECT count(*) FROM events)"


def _new(db, merchant, payer="256770000001"):
    return charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail="mtn",
                                payer=payer)


def test_create_payment_writes_intent_charge_poll_job_and_event_together(db, merchant):
    # The merchant receives webhooks, so the event is born with its delivery
    # and its deliver job (a merchant without an endpoint gets none: test_wake.py).
    from vpay import webhooks
    webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    created = _new(db, merchant)
    assert created.intent["status"] == "processing"
    assert created.intent["next_action"]["type"] == "mobile_money_prompt"
    assert created.charge["status"] == "pending" and created.charge["submitted_at"] is None
    job = db.execute("SELECT kind, payload->>'charge_id', run_at > now() FROM jobs WHERE dedupe_key = %s",
                     (f"poll:{created.charge['id']}",)).fetchone()
    assert job == ("poll", created.charge["id"], True)
    assert db.execute(COUNT_ALL).fetchone() == (1, 1, 2, 1)
    event_id = db.execute("SELECT id FROM events").fetchone()[0]
    endpoint_id = db.execute("SELECT id FROM webhook_endpoints").fetchone()[0]
    assert db.execute("SELECT kind FROM jobs WHERE dedupe_key = %s",
                      (f"deliver:{event_id}:{endpoint_id}",)).fetchone() == ("deliver",)
    assert db.execute("SELECT status FROM webhook_deliveries WHERE event_id = %s",
                      (event_id,)).fetchall() == [("pending",)]
    import uuid
    assert uuid.UUID(created.charge["rail_reference"]).version == 4


@pytest.mark.parametrize("field,value", [
    ("amount", 0), ("amount", -5), ("amount", 1.5), ("amount", True), ("amount", "100"),
    ("currency", "XXX"), ("currency", "EURO"), ("currency", None),
    ("payer", "abc"), ("payer", "1234"), ("payer", "2567700000012345678"), ("payer", "+25677 000"),
    ("payer", "256770000097\n"), ("merchant_id", "m_test\n"), ("description", "a\x01b"),
    ("description", "x" * 161), ("description", 5),
    ("rail", "visa"), ("merchant_id", "no_such_merchant"), ("merchant_id", ""),
])
def test_bad_input_raises_a_clear_error_and_writes_nothing(db, merchant, field, value):
    args = dict(merchant_id=merchant, amount=1500, currency="EUR", rail="mtn", payer="256770000001",
                description=None)
    args[field] = value
    with pytest.raises(charges.InvalidPayment) as err:
        charges.create_payment(db, **args)
    assert err.value.param == {"merchant_id": "merchant"}.get(field, field)
    assert db.execute(COUNT_ALL).fetchone() == (0, 0, 0, 0)


def test_settle_twice_gives_one_transition_and_one_event(db, merchant):
    created = _new(db, merchant)
    first = charges.settle(db, created.charge["id"], StatusKind.SUCCEEDED)
    second = charges.settle(db, created.charge["id"], StatusKind.SUCCEEDED)
    assert (first.transitioned, second.transitioned) == (True, False)
    assert second.status == "succeeded" and not second.contradiction
    types = [r[0] for r in db.execute("SELECT type FROM events ORDER BY created_at, id")]
    assert types == ["payment_intent.processing", "payment_intent.succeeded"]
    assert db.execute("SELECT status, next_action FROM payment_intents").fetchone() == ("succeeded", None)


def _race(db_url, charge_id, kinds):
    barrier = threading.Barrier(len(kinds))
    results = [None] * len(kinds)

    def run(i, kind):
        with psycopg.connect(db_url, autocommit=True) as conn:
            barrier.wait()
            results[i] = charges.settle(conn, charge_id, kind, failure_code="APPROVAL_REJECTED")

    threads = [threading.Thread(target=run, args=(i, k)) for i, k in enumerate(kinds)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_threads_settling_the_same_charge_at_once_give_one_transition(db, db_url, merchant):
    for _ in range(5):
        created = _new(db, merchant)
        results = _race(db_url, created.charge["id"], [StatusKind.SUCCEEDED] * 4)
        assert sum(r.transitioned for r in results) == 1
        events = db.execute("SELECT count(*) FROM events WHERE type = 'payment_intent.succeeded' "
                            "AND payment_intent_id = %s", (created.intent["id"],)).fetchone()[0]
        assert events == 1
    assert db.execute("SELECT count(*) FROM alerts").fetchone()[0] == 0


def test_a_settle_losing_to_the_opposite_outcome_raises_a_contradiction(db, db_url, merchant):
    created = _new(db, merchant)
    results = _race(db_url, created.charge["id"], [StatusKind.SUCCEEDED, StatusKind.FAILED])
    winner = next(r for r in results if r.transitioned)
    loser = next(r for r in results if not r.transitioned)
    assert loser.contradiction and loser.status == winner.status
    assert db.execute("SELECT status FROM charges").fetchone() == (winner.status,)
    assert db.execute("SELECT count(*) FROM events WHERE type <> 'payment_intent.processing'").fetchone() == (1,)
    [(kind, details)] = db.execute("SELECT kind, details FROM alerts").fetchall()
    assert kind == "rail_contradiction" and details["where"] == "settle"


def test_no_status_moves_backwards(db, merchant):
    created = _new(db, merchant)
    charges.settle(db, created.charge["id"], StatusKind.FAILED, failure_code="EXPIRED")
    assert not charges.settle(db, created.charge["id"], StatusKind.SUCCEEDED).transitioned
    assert not charges.escalate(db, created.charge["id"], horizon_seconds=0)
    assert not charges.expire_prompt(db, created.charge["id"], ttl_seconds=0)
    assert db.execute("SELECT status, failure_code FROM charges").fetchone() == ("failed", "EXPIRED")
    with pytest.raises(ValueError):
        charges.settle(db, created.charge["id"], StatusKind.PENDING)


def test_settle_sets_the_failure_code_and_intent_requires_payment_method(db, merchant):
    created = _new(db, merchant)
    assert charges.settle(db, created.charge["id"], StatusKind.FAILED, failure_code="PAYER_NOT_FOUND").transitioned
    assert db.execute("SELECT c.status, c.failure_code, i.status, i.next_action FROM charges c "
                      "JOIN payment_intents i ON i.id = c.payment_intent_id").fetchone() == \
        ("failed", "PAYER_NOT_FOUND", "requires_payment_method", None)
