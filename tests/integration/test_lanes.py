"""Lanes against a real Postgres and real worker processes (issue #11):
every job gets its lane where it is born, a loop claims only its lanes,
``--queues`` narrows a replica, bad lane flags are refused, and a webhooks
lane that hangs does not hold up MTN status reads."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from psycopg import sql

from vpay.base import db as vdb
from vpay import handlers, webhooks
from vpay.money import charges, refunds
from vpay.engine import queue
from vpay.money.ids import new_id, new_rail_reference
from vpay.money.charges import StatusKind


def _lane(db, key):
    return db.execute("SELECT lane FROM jobs WHERE dedupe_key = %s", (key,)).fetchone()[0]


def _charge_on(db, merchant, rail, status="pending"):
    created = charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail=rail,
                                   payer="256770000001" if rail == "mtn" else "237690000001")
    return created.charge


# ---- the lane is set where each job is born -----------------------------------------


def test_every_kind_is_born_in_its_lane(db, pool, merchant):
    # an endpoint, so events get their deliver job (none without: docs/webhooks.md)
    webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    mtn, orange = _charge_on(db, merchant, "mtn"), _charge_on(db, merchant, "orange")
    # poll: born with the charge (charges.create_payment)
    assert _lane(db, f"poll:{mtn['id']}") == "mtn"
    assert _lane(db, f"poll:{orange['id']}") == "orange"
    # deliver: born with the event, in the same transaction
    delivers = db.execute("SELECT DISTINCT lane FROM jobs WHERE kind = 'deliver'").fetchall()
    assert delivers == [("webhooks",)]
    # resubmit: enqueued by charge id only, the rail is read from the charge
    for charge in (mtn, orange):
        assert queue.enqueue(db, "resubmit", f"resubmit:{charge['id']}", {"charge_id": charge["id"]})
        assert _lane(db, f"resubmit:{charge['id']}") == charge["rail"]
    # scan and sweep: the hourly jobs every worker ensures
    db.execute("DELETE FROM jobs WHERE kind IN ('scan', 'sweep')")
    handlers.ensure_scheduled(db)
    assert _lane(db, "scan:live") == _lane(db, "sweep:expired") == "housekeeping"
    # a test kind
    queue.enqueue(db, "test.count", "t:1")
    assert _lane(db, "t:1") == "housekeeping"


def test_refund_poll_is_born_in_its_rail_lane(db, merchant):
    for rail in ("mtn", "orange"):
        charge = _charge_on(db, merchant, rail)
        assert charges.settle(db, charge["id"], StatusKind.SUCCEEDED).transitioned
        refund = refunds.create_refund(db, charge_id=charge["id"], amount=100)
        assert _lane(db, f"refund_poll:{refund['id']}") == rail


def test_the_scan_backstop_puts_each_poll_in_its_charges_rail_lane(db, merchant):
    made_charges = [_charge_on(db, merchant, "mtn"), _charge_on(db, merchant, "orange")]
    db.execute("DELETE FROM jobs WHERE kind = 'poll'")
    db.execute("UPDATE charges SET created_at = now() - interval '2 hours'")
    rows = db.execute(queue.Q["scan_live"], {"untouched": 60}).fetchall()
    assert len(rows) == 2
    for charge in made_charges:
        assert _lane(db, f"poll:{charge['id']}") == charge["rail"]


def test_deliveries_born_with_their_events_are_in_the_webhooks_lane(db, merchant):
    webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    charge = _charge_on(db, merchant, "mtn")
    assert charges.settle(db, charge["id"], StatusKind.SUCCEEDED).transitioned
    lanes = db.execute("SELECT lane, count(*) FROM jobs WHERE kind = 'deliver' GROUP BY 1").fetchall()
    assert lanes == [("webhooks", 2)]  # the processing event's and the succeeded one's


def test_a_fanout_job_left_by_an_older_release_puts_deliveries_in_the_webhooks_lane(db, merchant):
    endpoint = webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    _charge_on(db, merchant, "mtn")
    # as an older release left it: the event, its deliveries not yet made
    db.execute("DELETE FROM webhook_deliveries")
    db.execute("DELETE FROM jobs WHERE kind = 'deliver'")
    event_id = db.execute("SELECT id FROM events").fetchone()[0]
    assert db.execute(queue.Q["fanout_deliveries"], {"event_id": event_id}).fetchall()
    assert _lane(db, f"deliver:{event_id}:{endpoint['id']}") == "webhooks"


def test_a_rail_job_whose_charge_does_not_exist_is_refused_and_nothing_is_written(db):
    from vpay.engine.lanes import LaneError
    with pytest.raises(LaneError):
        queue.enqueue(db, "poll", "poll:ch_missing", {"charge_id": "ch_missing"})
    with pytest.raises(LaneError):
        queue.enqueue(db, "test.count", "x", lane="nowhere")
    assert db.execute("SELECT count(*) FROM jobs WHERE dedupe_key IN ('poll:ch_missing', 'x')").fetchone()[0] == 0


# ---- the claim ------------------------------------------------------------------------


def test_a_lane_claim_never_takes_another_lanes_job(db):
    db.execute("DELETE FROM jobs")
    # older due jobs in every other lane: an all-lane claim would take these first
    for lane in ("orange", "webhooks", "housekeeping"):
        queue.enqueue(db, "test.count", f"old:{lane}", lane=lane)
    db.execute("UPDATE jobs SET run_at = now() - interval '1 hour'")
    assert queue.claim(db, "w", lanes=("mtn",)) is None
    queue.enqueue(db, "test.count", "new:mtn", lane="mtn")
    job = queue.claim(db, "w", lanes=("mtn",))
    assert (job.dedupe_key, job.lane) == ("new:mtn", "mtn")
    assert queue.claim(db, "w", lanes=("mtn",)) is None
    # a loop that shares lanes takes the oldest due job among them, and only them
    both = queue.claim(db, "w", lanes=("mtn", "orange"))
    assert (both.dedupe_key, both.lane) == ("old:orange", "orange")
    assert queue.claim(db, "w", lanes=("mtn", "orange")) is None
    untouched = db.execute("SELECT dedupe_key FROM jobs WHERE attempts = 0 ORDER BY 1").fetchall()
    assert untouched == [("old:housekeeping",), ("old:webhooks",)]


def test_the_lane_claim_walks_the_lane_index_in_order_without_a_sort(db):
    # What the lane index is for: another lane's burst (due jobs by the
    # thousand) must not be walked by this lane's claim. With statistics that
    # show it, the plan must take the lane's own index. (Left to its default
    # guesses on an unanalysed table, or on lanes evenly mixed, the planner may
    # fairly pick jobs_claimable and filter: a LIMIT 1 that stops within a few
    # rows; that choice is not what this test is about.)
    db.execute("INSERT INTO jobs (kind, lane, dedupe_key) SELECT 'test.count', "
               "(ARRAY['orange','webhooks','housekeeping'])[1 + g % 3], 'burst:' || g "
               "FROM generate_series(1, 3000) g")
    db.execute("INSERT INTO jobs (kind, lane, dedupe_key) SELECT 'test.count', 'mtn', 'mtn:' || g "
               "FROM generate_series(1, 5) g")
    db.execute("ANALYZE jobs")
    plan_sql = sql.SQL("EXPLAIN (FORMAT TEXT) ") + sql.SQL(queue.Q["claim_lane"])
    with db.transaction():
        db.execute("SET LOCAL enable_seqscan = off")
        db.execute("SET LOCAL enable_bitmapscan = off")
        plan = "\n".join(r[0] for r in db.execute(plan_sql, {"id": None, "token": None, "worker": "w",
                                                               "new_token": uuid.uuid4(),
                                                               "lease": 30.0, "lane": "mtn", "lent": [], "skip": []}))
    assert "jobs_claimable_lane" in plan, plan
    # The lane's own probes never sort; the only sorts pick the oldest of the
    # lent lanes' heads (one row per lane: timeshare.py, lending).
    assert plan.count("Sort Key") == plan.count("Sort Key: head"), plan
    assert "LockRows" in plan, plan  # FOR UPDATE SKIP LOCKED stays


def _prepare(name: str) -> tuple[sql.Composable, list[str]]:
    """``PREPARE s`` of a named query, and its parameters' names in $n order."""
    order: list[str] = []

    def number(m: re.Match) -> str:
        if m[1] not in order:
            order.append(m[1])
        return f"${order.index(m[1]) + 1}"

    return sql.SQL("PREPARE s AS " + re.sub(r"%\((\w+)\)s", number, queue.Q[name])), order


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_a_claim_with_nothing_to_finish_reads_nothing_for_the_finish(db, mode):
    # claim_lane and claim_lanes carry the fenced finish of the loop's last
    # job; a claim alone passes id and token NULL, prepared (psycopg prepares
    # after 5 executions) and so maybe planned once for any id.
    for i in range(3):
        queue.enqueue(db, "test.count", f"nf:{i}", lane="mtn")
    args = {"id": None, "token": None, "worker": "w", "new_token": uuid.uuid4(), "lease": 30.0, "lane": "mtn", "lanes": ["mtn", "orange"], "lent": [], "skip": []}
    for name in ("claim_lane", "claim_lanes"):
        prepare, order = _prepare(name)
        with db.transaction(force_rollback=True):
            db.execute(sql.SQL("SET LOCAL plan_cache_mode = {}").format(sql.SQL(mode)))
            db.execute(prepare)
            try:
                plan = "\n".join(r[0] for r in db.execute(
                    sql.SQL("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) EXECUTE s({})").format(
                        sql.SQL(", ").join(sql.Literal(args[n]) for n in order))))
            finally:
                db.execute("DEALLOCATE s")
        finish = plan[plan.index("CTE finished"):plan.index("CTE claimed")]
        assert "actual rows=0" in finish and "Buffers:" not in finish, plan
        assert "Index Scan using jobs_pkey" in finish or "One-Time Filter: false" in finish, plan
        assert re.search(r"Update on jobs .*actual rows=1 ", plan), plan  # and the claim claims


def test_the_migration_backfills_the_lane_of_existing_jobs(server_url, worker_id):
    name = f"vpay_lanes_mig_{worker_id}"
    admin = psycopg.connect(psycopg.conninfo.make_conninfo(server_url, dbname="postgres"), autocommit=True)
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        with psycopg.connect(psycopg.conninfo.make_conninfo(server_url, dbname=name), autocommit=True) as conn:
            before = [(n, s) for n, s in vdb.migration_files() if n < "0008"]
            for _, text in before:
                conn.execute(text)
            conn.execute("INSERT INTO merchants (id) VALUES ('m1')")
            ids = {}
            for rail in ("mtn", "orange"):
                ids[rail] = (new_id("pi"), new_id("ch"), new_id("re"))
                pi, ch, re_ = ids[rail]
                conn.execute("INSERT INTO payment_intents (id, merchant_id, amount, currency, status) "
                             "VALUES (%s, 'm1', 100, 'EUR', 'succeeded')", (pi,))
                conn.execute("INSERT INTO charges (id, payment_intent_id, rail, rail_reference, payer, amount, "
                             "currency, status, settled_at) VALUES (%s, %s, %s, %s, '256770000001', 100, 'EUR', "
                             "'succeeded', now())", (ch, pi, rail, new_rail_reference()))
                conn.execute("INSERT INTO refunds (id, charge_id, rail, rail_reference, amount, currency) "
                             "VALUES (%s, %s, %s, %s, 50, 'EUR')", (re_, ch, rail, new_rail_reference()))
                for kind, key, payload in (("poll", f"poll:{ch}", {"charge_id": ch}),
                                           ("resubmit", f"resubmit:{ch}", {"charge_id": ch}),
                                           ("refund_poll", f"refund_poll:{re_}", {"refund_id": re_})):
                    conn.execute("INSERT INTO jobs (kind, dedupe_key, payload) VALUES (%s, %s, %s)",
                                 (kind, key, psycopg.types.json.Jsonb(payload)))
            for kind, key in (("fanout", "fanout:evt_1"), ("deliver", "deliver:evt_1:we_1"),
                              ("scan", "scan:live"), ("sweep", "sweep:expired"), ("test.count", "t"),
                              ("poll", "poll:ch_gone")):
                conn.execute("INSERT INTO jobs (kind, dedupe_key) VALUES (%s, %s)", (kind, key))
            for name_, text in vdb.migration_files():
                if name_ >= "0008":
                    conn.execute(text)
            got = dict(conn.execute("SELECT dedupe_key, lane FROM jobs").fetchall())
        for rail, (_, ch, re_) in ids.items():
            assert got[f"poll:{ch}"] == got[f"resubmit:{ch}"] == got[f"refund_poll:{re_}"] == rail
        assert got["fanout:evt_1"] == got["deliver:evt_1:we_1"] == "webhooks"
        assert got["scan:live"] == got["sweep:expired"] == got["t"] == got["poll:ch_gone"] == "housekeeping"
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.close()
