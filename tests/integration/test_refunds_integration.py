"""The refund state machine's compare-and-swaps in process against a real
Postgres: concurrent refunds, settling twice, escalation. The integration
half of tests/acceptance/test_refunds.py (refunds end to end).
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from vpay.money import refunds
from vpay.rails.port import StatusKind
from vpay.money.refunds import InvalidRefund
# helpers kept in tests/acceptance/test_refunds.py
from test_refunds import _refund_events, _row, _status, _succeeded_charge


def test_concurrent_refunds_of_one_charge_never_exceed_its_amount(db, db_url, merchant):
    for _ in range(5):
        charge_id = _succeeded_charge(db, merchant, amount=2500)
        barrier, results = threading.Barrier(4), []

        def attempt():
            with psycopg.connect(db_url, autocommit=True) as conn:
                barrier.wait()
                try:
                    results.append(refunds.create_refund(conn, charge_id=charge_id, amount=1000)["amount"])
                except InvalidRefund as exc:
                    results.append(exc.code)

        threads = [threading.Thread(target=attempt) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(map(str, results)) == ["1000", "1000", "amount_exceeds_refundable",
                                             "amount_exceeds_refundable"]
        assert db.execute("SELECT sum(amount), count(*) FROM refunds WHERE charge_id = %s",
                          (charge_id,)).fetchone() == (2000, 2)
        assert db.execute("SELECT count(*) FROM jobs WHERE kind = 'refund_poll' AND payload->>'charge_id' = %s",
                          (charge_id,)).fetchone() == (2,)


# ---- compare-and-swap ------------------------------------------------------


def test_settle_twice_or_concurrently_is_one_transition(db, db_url, merchant):
    charge_id = _succeeded_charge(db, merchant)
    refund = refunds.create_refund(db, charge_id=charge_id, amount=500)
    first = refunds.settle_refund(db, refund["id"], StatusKind.SUCCEEDED, rail_transaction_id="1")
    second = refunds.settle_refund(db, refund["id"], StatusKind.SUCCEEDED, rail_transaction_id="2")
    assert (first.transitioned, second.transitioned, second.contradiction) == (True, False, False)
    assert _refund_events(db, refund["id"]) == ["refund.succeeded"]
    assert _row(db, refund["id"])["rail_transaction_id"] == "1"
    with pytest.raises(ValueError):
        refunds.settle_refund(db, refund["id"], StatusKind.PENDING)
    with pytest.raises(LookupError):
        refunds.settle_refund(db, "re_doesnotexist", StatusKind.FAILED)

    # eight settles racing, half of them the opposite way: one transition,
    # one event; every loser of the other outcome is an alert
    for _ in range(3):
        racing = refunds.create_refund(db, charge_id=charge_id, amount=100)
        barrier, answers = threading.Barrier(8), []

        def settle(kind):
            with psycopg.connect(db_url, autocommit=True) as conn:
                barrier.wait()
                answers.append((kind, refunds.settle_refund(conn, racing["id"], kind, failure_code="X")))

        kinds = [StatusKind.SUCCEEDED, StatusKind.FAILED] * 4
        threads = [threading.Thread(target=settle, args=(k,)) for k in kinds]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        winners = [(k, a) for k, a in answers if a.transitioned]
        assert len(answers) == 8 and len(winners) == 1
        won = winners[0][0]
        assert len(_refund_events(db, racing["id"])) == 1
        assert sum(1 for k, a in answers if a.contradiction) == 4 and all(
            a.contradiction == (k is not won) for k, a in answers if not a.transitioned)
        # four losers of the other outcome, one open alert (sql/0007_one_open_contradiction.sql)
        assert db.execute("SELECT count(*) FROM alerts WHERE kind = 'rail_contradiction' AND refund_id = %s",
                          (racing["id"],)).fetchone() == (1,)


def test_escalation_is_one_transition_and_one_alert(db, db_url, merchant):
    charge_id = _succeeded_charge(db, merchant)
    refund = refunds.create_refund(db, charge_id=charge_id)
    assert refunds.escalate_refund(db, refund["id"], 24 * 3600) is False  # not at the horizon yet
    db.execute("UPDATE refunds SET created_at = now() - interval '25 hours' WHERE id = %s", (refund["id"],))
    barrier, answers = threading.Barrier(4), []

    def escalate():
        with psycopg.connect(db_url, autocommit=True) as conn:
            barrier.wait()
            answers.append(refunds.escalate_refund(conn, refund["id"], 24 * 3600))

    threads = [threading.Thread(target=escalate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(answers) == [False, False, False, True]
    assert db.execute("SELECT kind, refund_id FROM alerts").fetchall() == [("refund_unresolved", refund["id"])]
    # unresolved may still settle, and never goes back to pending
    assert refunds.settle_refund(db, refund["id"], StatusKind.FAILED, failure_code="EXPIRED").transitioned
    assert refunds.escalate_refund(db, refund["id"], 24 * 3600) is False
    assert _status(db, refund["id"]) == "failed"
