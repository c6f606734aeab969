"""A settled payment's cost (issue 30, "Speed II"): the settle is one
statement (``charge_settle``: the charge's compare-and-swap, its intent, the
one event and its deliveries with their deliver jobs), a status read that
settles costs the worker two round trips, and the event's data is what the
Python views write. Round trips are counted at the wire (bench/pgcount.py,
a proxy counting ``Sync`` and ``Query`` messages)."""

from __future__ import annotations

import sys
import threading
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from support import wait_until
from vpay import handlers, webhooks
from vpay.base import db as vdb
from vpay.engine import queue
from vpay.handlers import polling
from vpay.money import charges, misconfiguration
from vpay.money.charges import CHARGES, charge_view, intent_view
from vpay.money.merchants import create_merchant
from vpay.rails.port import RailStatus, StatusKind

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from pgcount import CountingProxy  # noqa: E402


class _Answers:
    """The rail port's status read, answering what the test says."""

    code = "mtn"

    def __init__(self, answer: RailStatus):
        self.answer = answer

    def status(self, request) -> RailStatus:
        return self.answer


def _payment(db, merchant, amount=1500):
    return charges.create_payment(db, merchant_id=merchant, amount=amount, currency="EUR", rail="mtn",
                                  payer="256770000001")


def _poll_job(db, charge_id) -> queue.Job:
    db.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s", (f"poll:{charge_id}",))
    job = queue.claim(db, "w1", lanes=("mtn",))
    assert job is not None and job.dedupe_key == f"poll:{charge_id}"
    return job


def _counts(db) -> tuple:
    return db.execute("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM webhook_deliveries), "
                      "(SELECT count(*) FROM jobs WHERE kind IN ('deliver', 'fanout')), "
                      "(SELECT count(*) FROM alerts)").fetchone()


def _rows(db, charge_id):
    with db.cursor(row_factory=dict_row) as cur:
        charge = cur.execute("SELECT * FROM charges WHERE id = %s", (charge_id,)).fetchone()
        intent = cur.execute("SELECT * FROM payment_intents WHERE id = %s",
                             (charge["payment_intent_id"],)).fetchone()
    return charge, intent


# ---- round trips -----------------------------------------------------------------


def test_a_status_read_that_settles_costs_the_worker_two_round_trips(db, db_url, merchant):
    # The poll handler's own statements, at the wire: the charge's row, then
    # the settle (which stamps the read). Before issue 30: the row, the
    # stamp, and BEGIN, the CAS, the intent, the event, COMMIT (7).
    webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    created = _payment(db, merchant)
    job = _poll_job(db, created.charge["id"])
    proxy = CountingProxy(db_url).start()
    pool = vdb.make_pool(proxy.url, max_size=2)
    try:
        ctx = handlers.Context(pool=pool, worker_id="w1", rail_factory=lambda code: _Answers(
            RailStatus(StatusKind.SUCCEEDED, amount=1500, currency="EUR", financial_transaction_id="ft-1")))
        with pool.connection():
            pass  # the pool's first connection is made before counting
        before, checks = proxy.total(), proxy.by_statement()[""]
        outcome = handlers.handle(job, ctx)
        # the pool's liveness check after 1 s idle (a slow box) is the pool's, not the settle's
        trips = proxy.total() - before - (proxy.by_statement()[""] - checks)
    finally:
        pool.close()
        proxy.stop()
    assert type(outcome).__name__ == "Done"
    assert trips == 2, proxy.by_statement().most_common(8)
    assert db.execute("SELECT status FROM charges").fetchone() == ("succeeded",)
    # the deliveries were born with the event: no fan-out job to run
    assert db.execute("SELECT kind, count(*) FROM jobs WHERE lane = 'webhooks' GROUP BY 1").fetchall() == \
        [("deliver", 2)]


def test_the_settle_stamps_the_status_read_in_the_same_statement(db, merchant):
    created = _payment(db, merchant)
    charge_id = created.charge["id"]
    assert charges.settle(db, charge_id, StatusKind.SUCCEEDED).transitioned  # not a read: not stamped
    assert _rows(db, charge_id)[0]["last_polled_at"] is None
    other = _payment(db, merchant).charge["id"]
    result = charges.pollable.settle(db, CHARGES, other, StatusKind.FAILED, failure_code="EXPIRED", polled=True)
    assert result.transitioned
    charge, _ = _rows(db, other)
    assert charge["last_polled_at"] == charge["settled_at"] and charge["submitted_at"] is not None


# ---- the compare-and-swap ----------------------------------------------------------


def test_the_one_statement_settle_is_a_compare_and_swap_that_changes_nothing_when_lost(db, merchant):
    webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    created = _payment(db, merchant)
    charge_id = created.charge["id"]
    first = charges.settle(db, charge_id, StatusKind.SUCCEEDED, rail_transaction_id="ft-1")
    assert first.transitioned and first.status == "succeeded"
    rows, counts = _rows(db, charge_id), _counts(db)

    # the same answer again (a racing worker, a re-run after a crash): nothing
    again = charges._settle_in_one(db, charge_id, "succeeded", None, "ft-2", True)
    assert again is None
    assert charges.settle(db, charge_id, StatusKind.SUCCEEDED) == charges.Settled(False, "succeeded")
    assert _rows(db, charge_id) == rows and _counts(db) == counts

    # the other answer: no transition, one contradiction alert, nothing else
    lost = charges.settle(db, charge_id, StatusKind.FAILED, failure_code="EXPIRED")
    assert lost == charges.Settled(False, "succeeded", contradiction=True)
    assert _rows(db, charge_id) == rows
    events, deliveries, jobs, alerts = _counts(db)
    assert (events, deliveries, jobs, alerts) == counts[:3] + (counts[3] + 1,)

    with pytest.raises(LookupError):
        charges.settle(db, "ch_nosuchcharge", StatusKind.SUCCEEDED)


def test_an_intent_that_moved_on_its_own_is_kept_and_the_merchant_still_told(db, merchant):
    created = _payment(db, merchant)
    db.execute("UPDATE payment_intents SET status = 'canceled' WHERE id = %s", (created.intent["id"],))
    assert charges.settle(db, created.charge["id"], StatusKind.SUCCEEDED).transitioned
    charge, intent = _rows(db, created.charge["id"])
    assert (charge["status"], intent["status"]) == ("succeeded", "canceled")
    [(data,)] = db.execute("SELECT data FROM events WHERE type = 'payment_intent.succeeded'").fetchall()
    assert data["object"]["status"] == "canceled" and data["charge"]["status"] == "succeeded"


# ---- what changed while the settle waited for the charge's row -------------------------


def _settle_behind_a_lock(db_url, db, charge_id, meanwhile) -> charges.Settled:
    """Hold the charge's row in another transaction, start the settle (which
    waits for it), run ``meanwhile`` (committed) while it waits, release."""
    result: list = []
    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT 1 FROM charges WHERE id = %s FOR UPDATE", (charge_id,))
        settler = psycopg.connect(db_url, autocommit=True)
        pid = settler.info.backend_pid
        thread = threading.Thread(target=lambda: result.append(
            charges.settle(settler, charge_id, StatusKind.SUCCEEDED)), daemon=True)
        thread.start()
        wait_until(lambda: db.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                      (pid,)).fetchone() == (True,), what="the settle to wait for the row")
        meanwhile()
        holder.rollback()
    thread.join(timeout=30)
    settler.close()
    assert result, "the settle did not end"
    return result[0]


def test_an_endpoint_enabled_while_the_settle_waited_for_the_charge_gets_its_delivery(db_url, db, merchant):
    # One statement reads the database as of its start: a settle that waited
    # for the charge's row missed an endpoint enabled meanwhile (review of
    # the one-statement settle). The row locks come first now.
    created = _payment(db, merchant)
    added: list = []
    settled = _settle_behind_a_lock(db_url, db, created.charge["id"], lambda: added.append(
        webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/late", permit_private=True)))
    assert settled.transitioned
    event_id = charges.event_id_of("payment_intent.succeeded", created.charge)
    assert db.execute("SELECT endpoint_id FROM webhook_deliveries WHERE event_id = %s",
                      (event_id,)).fetchall() == [(added[0]["id"],)]
    assert db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = %s",
                      (f"deliver:{event_id}:{added[0]['id']}",)).fetchone() == (1,)


def test_an_intent_moved_while_the_settle_waited_is_told_as_it_is(db_url, db, merchant):
    created = _payment(db, merchant)
    settled = _settle_behind_a_lock(db_url, db, created.charge["id"], lambda: db.execute(
        "UPDATE payment_intents SET status = 'canceled' WHERE id = %s", (created.intent["id"],)))
    assert settled.transitioned
    _, intent = _rows(db, created.charge["id"])
    [(data,)] = db.execute("SELECT data FROM events WHERE type = 'payment_intent.succeeded'").fetchall()
    assert intent["status"] == "canceled" and data["object"] == intent_view(intent)


def test_a_settle_that_waited_behind_another_settle_writes_nothing(db_url, db, merchant):
    created = _payment(db, merchant)
    charge_id = created.charge["id"]
    result: list = []
    with psycopg.connect(db_url) as first:
        assert charges.settle(first, charge_id, StatusKind.SUCCEEDED).transitioned  # not committed yet
        second = psycopg.connect(db_url, autocommit=True)
        pid = second.info.backend_pid
        thread = threading.Thread(target=lambda: result.append(
            charges.settle(second, charge_id, StatusKind.SUCCEEDED)), daemon=True)
        thread.start()
        wait_until(lambda: db.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                      (pid,)).fetchone() == (True,), what="the second settle to wait")
        first.commit()
    thread.join(timeout=30)
    second.close()
    assert result == [charges.Settled(False, "succeeded")]
    assert db.execute("SELECT count(*) FROM events WHERE type = 'payment_intent.succeeded'").fetchone() == (1,)
    assert db.execute("SELECT count(*) FROM alerts").fetchone() == (0,)


# ---- deliveries born with the event --------------------------------------------------


def test_deliver_jobs_are_born_with_the_settle_event_one_per_endpoint_that_receives_it(db, merchant):
    create_merchant(db, "m_other")
    both = webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/a", permit_private=True)
    failures = webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/b", permit_private=True,
                                     enabled_events=["payment_intent.payment_failed"])
    off = webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/c", permit_private=True)
    webhooks.disable_endpoint(db, off["id"], "test")
    webhooks.add_endpoint(db, "m_other", "http://127.0.0.1:9/d", permit_private=True)
    created = _payment(db, merchant)
    db.execute("DELETE FROM jobs WHERE kind = 'deliver'")
    db.execute("DELETE FROM webhook_deliveries")

    assert charges.settle(db, created.charge["id"], StatusKind.SUCCEEDED).transitioned
    event_id = charges.event_id_of("payment_intent.succeeded", created.charge)
    assert db.execute("SELECT kind, lane, dedupe_key, payload, fair_key, run_at <= now() FROM jobs "
                      "WHERE lane = 'webhooks'").fetchall() == [
        ("deliver", "webhooks", f"deliver:{event_id}:{both['id']}",
         {"event_id": event_id, "endpoint_id": both["id"]}, merchant, True)]
    assert db.execute("SELECT event_id, endpoint_id, status FROM webhook_deliveries").fetchall() == \
        [(event_id, both["id"], "pending")]

    failed = _payment(db, merchant, amount=900)
    assert charges.settle(db, failed.charge["id"], StatusKind.FAILED, failure_code="EXPIRED").transitioned
    failed_id = charges.event_id_of("payment_intent.payment_failed", failed.charge)
    assert sorted(r[0] for r in db.execute("SELECT endpoint_id FROM webhook_deliveries WHERE event_id = %s",
                                           (failed_id,))) == sorted([both["id"], failures["id"]])


# ---- the event's data ------------------------------------------------------------------


def _expected(db, charge_id, failed_kind=None):
    charge, intent = _rows(db, charge_id)
    data = {"object": intent_view(intent), "charge": charge_view(charge)}
    if failed_kind is not None:
        data |= {"failure_code": charge["failure_code"], "failure_kind": failed_kind}
    return data


@pytest.mark.parametrize("time_zone", ["UTC", "Africa/Nairobi", "America/St_Johns"])
def test_the_settle_events_data_is_what_the_views_write(db_url, merchant, db, time_zone):
    # Built in SQL (iso_8601, sql/0027), read back by psycopg in the same
    # session's TimeZone: equal to the views of the same rows, whatever the zone.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"SET TIME ZONE '{time_zone}'")
        won = _payment(conn, merchant)
        assert charges.pollable.settle(conn, CHARGES, won.charge["id"], StatusKind.SUCCEEDED,
                                       rail_transaction_id="ft-1", polled=True).transitioned
        lost = _payment(conn, merchant)
        charges.settle(conn, lost.charge["id"], StatusKind.FAILED,
                       failure_code=misconfiguration.FAILURE_CODE)
        for charge_id, event_type, kind in (
                (won.charge["id"], "payment_intent.succeeded", None),
                (lost.charge["id"], "payment_intent.payment_failed", misconfiguration.CONFIGURATION)):
            (data,) = conn.execute("SELECT data FROM events e JOIN charges c ON c.payment_intent_id = "
                                   "e.payment_intent_id WHERE c.id = %s AND e.type = %s",
                                   (charge_id, event_type)).fetchone()
            assert data == _expected(conn, charge_id, kind)


@pytest.mark.parametrize("text", ["2026-12-05 06:54:20.664123+00", "2026-12-05 06:54:20+00",
                                  "2026-12-05 06:54:20.000001+05:30", "1999-01-01 00:00:00.5-03:30"])
def test_iso_8601_writes_a_time_as_python_writes_it(db, text):
    db.execute("SET TIME ZONE 'America/St_Johns'")
    sql_text, value = db.execute("SELECT iso_8601(%s::timestamptz), %s::timestamptz", (text, text)).fetchone()
    assert isinstance(value, datetime) and sql_text == value.isoformat()
    assert db.execute("SELECT iso_8601(NULL)").fetchone() == (None,)


def test_the_settle_statement_is_short_enough_for_psycopg_to_prepare():
    # psycopg caches (and so prepares) a query's conversion only up to this length
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH
    assert len(charges.Q["charge_settle"].encode()) <= MAX_CACHED_STATEMENT_LENGTH


def test_the_poll_handler_settles_through_the_one_statement(db, pool, merchant):
    created = _payment(db, merchant)
    job = _poll_job(db, created.charge["id"])
    ctx = handlers.Context(pool=pool, worker_id="w1", rail_factory=lambda code: _Answers(
        RailStatus(StatusKind.FAILED, reason="EXPIRED", amount=1500, currency="EUR")))
    assert type(polling.poll_once(CHARGES, job, ctx)).__name__ == "Done"
    charge, intent = _rows(db, created.charge["id"])
    assert (charge["status"], charge["failure_code"], intent["status"]) == \
        ("failed", "EXPIRED", "requires_payment_method")
    assert charge["last_polled_at"] == charge["settled_at"]


def test_the_settle_plans_its_statements_once_per_connection(db_url, db, merchant):
    # sql/0029: generic plans from the first call (every read is by primary
    # key), not five custom plans per pooled connection first. A fresh
    # connection's first six settles all run under that setting and each
    # settles its own charge.
    assert db.execute("SELECT proconfig FROM pg_proc WHERE proname = 'vpay_charge_settle'").fetchone() == \
        (["plan_cache_mode=force_generic_plan"],)
    ids = [_payment(db, merchant).charge["id"] for _ in range(6)]
    with psycopg.connect(db_url, autocommit=True) as fresh:
        for charge_id in ids:
            assert charges.settle(fresh, charge_id, StatusKind.SUCCEEDED).transitioned
        # the setting is the function's: the session's own is left as it was
        assert fresh.execute("SHOW plan_cache_mode").fetchone() == ("auto",)
    assert db.execute("SELECT count(*) FROM charges WHERE status = 'succeeded'").fetchone() == (6,)
    assert db.execute("SELECT count(*) FROM events WHERE type = 'payment_intent.succeeded'").fetchone() == (6,)
