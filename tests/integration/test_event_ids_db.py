"""Deterministic event ids against a real Postgres (vpay.money.charges.emit_event):
every transition's event has the id of that transition, a transition
written again on a timeline that lost its first write (an asynchronous
standby promoted; modelled here by putting the rows back as the standby
had them) gets the same id and one delivery per endpoint, and an id that
exists already is kept once. Also the commit mode (vpay.base.replication) as the test
server reports it, in the log hook and the scrape's gauge.

The failover itself, with a real standby: tests/acceptance/test_failover.py."""

from __future__ import annotations

import logging

import psycopg
import pytest
from psycopg.types.json import Jsonb

from vpay import webhooks
from vpay.base import replication
from vpay.engine import lanes
from vpay.money import charges, gauges, ids, refunds
from vpay.rails.port import StatusKind


def _new(db, merchant, payer="256770000001"):
    return charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail="mtn",
                                  payer=payer)


def _events(db, intent_id) -> list[tuple[str, str]]:
    return db.execute("SELECT id, type FROM events WHERE payment_intent_id = %s ORDER BY created_at, id",
                      (intent_id,)).fetchall()


def test_each_transition_writes_the_id_of_that_transition(db, merchant):
    created = _new(db, merchant)
    charge_id = created.charge["id"]
    assert charges.expire_prompt(db, charge_id, ttl_seconds=0)
    assert charges.settle(db, charge_id, StatusKind.SUCCEEDED, rail_transaction_id="tx1").transitioned
    refund = refunds.create_refund(db, charge_id=charge_id, amount=500)
    assert refunds.settle_refund(db, refund["id"], StatusKind.SUCCEEDED).transitioned
    assert _events(db, created.intent["id"]) == [
        (ids.event_id(charge_id, "payment_intent.processing"), "payment_intent.processing"),
        (ids.event_id(charge_id, "payment_intent.processing", "expired"), "payment_intent.processing"),
        (ids.event_id(charge_id, "payment_intent.succeeded"), "payment_intent.succeeded"),
        (ids.event_id(refund["id"], "refund.succeeded"), "refund.succeeded")]


def _lose_the_settle(db, charge_id: str, intent_id: str, event_id: str) -> None:
    """The rows as a standby that never received the settle has them: the
    charge pending, its intent processing, no event, no delivery, no deliver job."""
    with db.transaction():
        db.execute("DELETE FROM jobs WHERE dedupe_key LIKE %s", (f"deliver:{event_id}:%",))
        db.execute("DELETE FROM events WHERE id = %s", (event_id,))  # its deliveries go with it
        db.execute("UPDATE charges SET status = 'pending', settled_at = NULL, failure_code = NULL, "
                   "rail_transaction_id = NULL WHERE id = %s", (charge_id,))
        db.execute("UPDATE payment_intents SET status = 'processing' WHERE id = %s", (intent_id,))


@pytest.mark.parametrize("kind, event_type", [(StatusKind.SUCCEEDED, "payment_intent.succeeded"),
                                              (StatusKind.FAILED, "payment_intent.payment_failed")])
def test_a_settle_written_again_after_its_first_write_was_lost_keeps_its_event_id(db, merchant, kind, event_type):
    webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    created = _new(db, merchant)
    charge_id, intent_id = created.charge["id"], created.intent["id"]
    assert charges.settle(db, charge_id, kind, failure_code="EXPIRED").transitioned
    [(first, _)] = [e for e in _events(db, intent_id) if e[1] == event_type]
    _lose_the_settle(db, charge_id, intent_id, first)

    assert charges.settle(db, charge_id, kind, failure_code="EXPIRED").transitioned
    assert [e for e in _events(db, intent_id) if e[1] == event_type] == [(first, event_type)]
    # one delivery, under the same key: deliveries are keyed by the event id
    endpoint_id = db.execute("SELECT id FROM webhook_endpoints").fetchone()[0]
    assert db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = %s",
                      (f"deliver:{first}:{endpoint_id}",)).fetchone() == (1,)
    assert db.execute("SELECT count(*) FROM webhook_deliveries WHERE event_id = %s", (first,)).fetchone() == (1,)


def test_an_event_whose_id_exists_is_kept_once_with_no_second_delivery(db, merchant, caplog):
    webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    created = _new(db, merchant)
    [(event_id, _)] = _events(db, created.intent["id"])
    db.execute("DELETE FROM jobs WHERE kind = 'deliver'")  # as after its delivery ran
    with caplog.at_level(logging.WARNING, logger="vpay.money"):
        with db.transaction():
            again = charges.emit_event(db, "payment_intent.processing", created.intent, created.charge,
                                       {"expired": False})
    assert again["id"] == event_id
    assert db.execute("SELECT count(*) FROM events").fetchone() == (1,)
    assert db.execute("SELECT count(*) FROM jobs WHERE kind = 'deliver'").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM webhook_deliveries").fetchone() == (1,)
    [record] = [r for r in caplog.records if r.getMessage().startswith("event already written")]
    assert record.event_id == event_id


def test_a_settle_whose_event_exists_settles_once_with_no_second_event_or_delivery(db, merchant, caplog):
    # The one-statement settle (charge_settle) keeps emit_event's rule: the
    # event of this transition written before (restored around the state
    # machine) is kept as it is, and nobody is told twice.
    webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    created = _new(db, merchant)
    charge_id, intent_id = created.charge["id"], created.intent["id"]
    assert charges.settle(db, charge_id, StatusKind.SUCCEEDED).transitioned
    [(first, _)] = [e for e in _events(db, intent_id) if e[1] == "payment_intent.succeeded"]
    db.execute("DELETE FROM jobs WHERE kind = 'deliver'")  # as after the deliveries ran
    db.execute("UPDATE charges SET status = 'pending', settled_at = NULL WHERE id = %s", (charge_id,))
    with caplog.at_level(logging.WARNING, logger="vpay.money"):
        assert charges.settle(db, charge_id, StatusKind.SUCCEEDED).transitioned
    assert [e for e in _events(db, intent_id) if e[1] == "payment_intent.succeeded"] == \
        [(first, "payment_intent.succeeded")]
    assert db.execute("SELECT count(*) FROM jobs WHERE kind = 'deliver'").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM webhook_deliveries WHERE event_id = %s", (first,)).fetchone() == (1,)
    [record] = [r for r in caplog.records if r.getMessage().startswith("event already written")]
    assert record.event_id == first and record.charge_id == charge_id


def test_an_id_taken_by_another_transition_is_refused_and_writes_nothing(db, merchant):
    created = _new(db, merchant)
    taken = charges.event_id_of("payment_intent.succeeded", created.charge)
    # a row under that id that is not this transition (only a hash collision could make one)
    db.execute("INSERT INTO events (id, type, payment_intent_id, data) "
               "VALUES (%s, 'payment_intent.payment_failed', %s, %s)", (taken, created.intent["id"], Jsonb({})))
    with pytest.raises(RuntimeError, match="is taken by"):
        charges.settle(db, created.charge["id"], StatusKind.SUCCEEDED)
    assert db.execute("SELECT status FROM charges").fetchone() == ("pending",)  # rolled back whole


def test_the_test_server_commits_asynchronously_and_says_so(db, pool, caplog):
    # The shared test server has no standby: synchronous_standby_names is empty.
    with pool.connection() as conn:
        mode = replication.read(conn)
    assert mode.synchronous_standby_names == "" and mode.synchronous is False
    values = {s.name: s.value for f in gauges.DatabaseCollector(pool, lanes=lanes.LANES).collect()
              for s in f.samples}
    assert values["vpay_database_synchronous_commit"] == 0 and values["vpay_database_up"] == 1


def test_the_commit_mode_is_logged_once_and_again_when_it_changes(db_url, caplog):
    hook = replication.CommitModeLog("worker")
    with caplog.at_level(logging.INFO, logger="vpay.db"), \
            psycopg.connect(db_url, autocommit=True) as a, psycopg.connect(db_url, autocommit=True) as b:
        hook(a)
        hook(b)  # the same answer: not logged again
        b.execute("SET synchronous_commit = local")
        hook(b)
        a.close()
        hook(a)  # a broken connection: no log, no raise
    lines = [r for r in caplog.records if r.getMessage() == "database commit mode"]
    assert [(r.service, r.synchronous, r.synchronous_commit) for r in lines] == \
        [("worker", False, "on"), ("worker", False, "local")]
    assert all(r.failover_may_lose_commits for r in lines)
