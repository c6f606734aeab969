"""Lanes against a real Postgres and real worker processes (issue #11):
every job gets its lane where it is born, a loop claims only its lanes,
``--queues`` narrows a replica, bad lane flags are refused, and a webhooks
lane that hangs does not hold up MTN status reads."""

from __future__ import annotations

import re
import uuid
import socket
import subprocess
import threading

import psycopg
import pytest
from psycopg import sql

from support import ConnCounter, TimeMachine, base_env, rail_env, script, wait_until
from vpay.base import db as vdb
from vpay import handlers, webhooks
from vpay.money import charges, payments, refunds
from vpay.engine import queue
from vpay.money.ids import new_id, new_rail_reference
from vpay.money.merchants import create_merchant
from vpay.money.charges import StatusKind
from vpay.rails.mtn import MtnMomo


def _lane(db, key):
    return db.execute("SELECT lane FROM jobs WHERE dedupe_key = %s", (key,)).fetchone()[0]


def _charge_on(db, merchant, rail, status="pending"):
    created = charges.create_payment(db, merchant_id=merchant, amount=1500, currency="EUR", rail=rail,
                                   payer="256770000001" if rail == "mtn" else "237690000001")
    return created.charge


# ---- the lane is set where each job is born -----------------------------------------


def test_every_kind_is_born_in_its_lane(db, pool, merchant):
    # an endpoint, so events get their fan-out job (none without: docs/webhooks.md)
    webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    mtn, orange = _charge_on(db, merchant, "mtn"), _charge_on(db, merchant, "orange")
    # poll: born with the charge (charges.create_payment)
    assert _lane(db, f"poll:{mtn['id']}") == "mtn"
    assert _lane(db, f"poll:{orange['id']}") == "orange"
    # fanout: born with the event, in the same transaction
    fanouts = db.execute("SELECT DISTINCT lane FROM jobs WHERE kind = 'fanout'").fetchall()
    assert fanouts == [("webhooks",)]
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


def test_fanout_puts_deliveries_in_the_webhooks_lane(db, merchant):
    webhooks.add_endpoint(db, merchant, "http://127.0.0.1:9/hook", permit_private=True)
    charge = _charge_on(db, merchant, "mtn")
    assert charges.settle(db, charge["id"], StatusKind.SUCCEEDED).transitioned
    for event_id, in db.execute("SELECT payload ->> 'event_id' FROM jobs WHERE kind = 'fanout'").fetchall():
        db.execute(queue.Q["fanout_deliveries"], {"event_id": event_id})
    lanes = db.execute("SELECT lane, count(*) FROM jobs WHERE kind = 'deliver' GROUP BY 1").fetchall()
    assert lanes == [("webhooks", 2)]


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
                                                               "lease": 30.0, "lane": "mtn"}))
    assert "jobs_claimable_lane" in plan, plan
    assert "Sort" not in plan, plan
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
    args = {"id": None, "token": None, "worker": "w", "new_token": uuid.uuid4(), "lease": 30.0, "lane": "mtn", "lanes": ["mtn", "orange"]}
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


# ---- the worker's flags ----------------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["--queues", "mtn,airtel"], "unknown lane 'airtel'"),
    (["--queues", ""], None),  # empty means all lanes: accepted (checked below: boots)
    (["--lane-concurrency", "mtn=x"], "mtn='x' is not a whole number"),
    (["--lane-concurrency", "mtn=0"], "is not a whole number >= 1"),
    (["--lane-concurrency", "mtn=3,webhooks=2"], "adds up to 5 loops, above --worker-concurrency 4"),
    (["--lane-concurrency", "mtn=2,orange=1,webhooks=1"], "leaves none for housekeeping"),
    (["--lane-concurrency", "airtel=1"], "unknown lane 'airtel'"),
    (["--queues", "mtn", "--lane-concurrency", "webhooks=1"], "not among --queues mtn"),
    (["--queues", "mtn,webhooks", "--lane-concurrency", "mtn=1,webhooks=1"], "below --worker-concurrency 4"),
])
def test_bad_lane_flags_are_refused_with_78_and_one_line_before_any_connection(args, says):
    if says is None:
        return
    counter = ConnCounter()
    try:
        env = base_env(f"postgresql://nobody@127.0.0.1:{counter.port}/x?connect_timeout=2")
        res = subprocess.run([script("vpay-worker"), *args], env=env, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 78, res.stderr
        assert says in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert counter.accepted == 0
    finally:
        counter.close()


def test_lane_flags_come_from_the_environment_too():
    counter = ConnCounter()
    try:
        env = base_env(f"postgresql://nobody@127.0.0.1:{counter.port}/x?connect_timeout=2",
                       VPAY_WORKER_QUEUES="mtn,nope", VPAY_WORKER_LANE_CONCURRENCY="mtn=1")
        res = subprocess.run([script("vpay-worker")], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 78 and "unknown lane 'nope'" in res.stderr
        env["VPAY_WORKER_QUEUES"] = "mtn"
        env["VPAY_WORKER_LANE_CONCURRENCY"] = "mtn=9"
        res = subprocess.run([script("vpay-worker")], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 78 and "above --worker-concurrency 4" in res.stderr
        assert counter.accepted == 0
    finally:
        counter.close()


@pytest.mark.parametrize("args, env, says", [
    (("--queues", ""), {}, "--queues is empty"),
    ((), {"VPAY_WORKER_QUEUES": ""}, "VPAY_WORKER_QUEUES (env, for --queues) is empty"),
    ((), {"VPAY_WORKER_QUEUES": "mtn,nope"}, "VPAY_WORKER_QUEUES (env, for --queues): unknown lane 'nope'"),
    ((), {"VPAY_WORKER_LANE_CONCURRENCY": "mtn=x"},
     "VPAY_WORKER_LANE_CONCURRENCY (env, for --lane-concurrency): mtn='x'"),
])
def test_an_empty_or_bad_lane_setting_is_refused_naming_where_it_came_from(args, env, says):
    counter = ConnCounter()
    try:
        full = base_env(f"postgresql://nobody@127.0.0.1:{counter.port}/x?connect_timeout=2", **env)
        res = subprocess.run([script("vpay-worker"), *args], env=full, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 78, res.stderr
        assert says in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert counter.accepted == 0
    finally:
        counter.close()


def _executions(db):
    db.execute("CREATE TABLE IF NOT EXISTS test_executions (job_key text NOT NULL, worker text NOT NULL)")


def test_a_worker_on_queues_mtn_leaves_webhook_jobs_untouched(db, db_url, spawn):
    _executions(db)
    db.execute("DELETE FROM jobs")
    for i in range(3):  # older than the mtn jobs: an all-lane worker would take them first
        queue.enqueue(db, "test.count", f"hook:{i}", lane="webhooks")
    db.execute("UPDATE jobs SET run_at = now() - interval '1 minute'")
    for i in range(3):
        queue.enqueue(db, "test.count", f"mtn:{i}", lane="mtn")
    worker = spawn("vpay-worker", "--queues", "mtn", "--idle-sleep", "0.1",
                   env=base_env(db_url, VPAY_TEST_HANDLERS="1"))
    started = worker.wait_for_log("worker started")
    assert started["loops"] == {"mtn": 4} and started["queues"] == ["mtn"]
    wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE lane = 'mtn'").fetchone()[0] == 0,
               timeout=30, what="the mtn jobs to run")
    worker.signal()
    assert worker.wait(30) == 0
    assert sorted(k for k, in db.execute("SELECT job_key FROM test_executions")) == ["mtn:0", "mtn:1", "mtn:2"]
    hooks = db.execute("SELECT attempts, locked_by FROM jobs WHERE lane = 'webhooks'").fetchall()
    assert hooks == [(0, None)] * 3
    handled = worker.find("job handled")
    assert len(handled) == 3 and {h["lane"] for h in handled} == {"mtn"}
    final = worker.find("gauge", final=True)[0]
    assert final["claimed"] == final["lanes"]["mtn"]["claimed"] == 3
    assert final["lanes"]["webhooks"]["claimed"] == 0 and final["lanes"]["webhooks"]["due"] == 3
    assert final["lanes"]["mtn"]["loops"] == 4 and final["lanes"]["webhooks"]["loops"] == 0


# ---- the isolation property -------------------------------------------------------------


class Tarpit:
    """A merchant endpoint that accepts every connection, reads the request
    and never answers: each delivery to it holds its claim loop until the
    webhook read timeout."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with self._lock:
                self.held.append(conn)

    @property
    def accepted(self) -> int:
        with self._lock:
            return len(self.held)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def close(self):
        self._stop.set()
        self.thread.join(2)
        with self._lock:
            for conn in self.held:
                conn.close()
        self.sock.close()


@pytest.fixture
def tarpit():
    pit = Tarpit()
    yield pit
    pit.close()


def _pending_webhook_payment(db, merchant) -> str:
    """A processing intent with a pending charge (no rail, no poll job),
    settled at once: one payment_intent.succeeded event to deliver."""
    intent_id, charge_id = new_id("pi"), new_id("ch")
    db.execute("INSERT INTO payment_intents (id, merchant_id, amount, currency, status) "
               "VALUES (%s, %s, 900, 'EUR', 'processing')", (intent_id, merchant))
    db.execute("INSERT INTO charges (id, payment_intent_id, rail, rail_reference, payer, amount, currency) "
               "VALUES (%s, %s, 'mtn', %s, '46733123453', 900, 'EUR')", (charge_id, intent_id,
                                                                          new_rail_reference()))
    assert charges.settle(db, charge_id, StatusKind.SUCCEEDED).transitioned
    return charge_id


@pytest.mark.slow
def test_a_hanging_webhook_lane_does_not_hold_up_mtn_status_reads(db, db_url, pool, sandbox, spawn, tarpit):
    create_merchant(db, "m_hook")
    create_merchant(db, "m_calm")
    webhooks.add_endpoint(db, "m_hook", tarpit.url, permit_private=True)
    # More hanging deliveries than the worker has claim loops in all: without
    # lanes every loop would sit in one of them and no poll would be read.
    for _ in range(6):
        _pending_webhook_payment(db, "m_hook")
    env = base_env(db_url, VPAY_WEBHOOKS_ALLOW_PRIVATE="1", VPAY_WEBHOOK_READ_TIMEOUT_SECONDS="300",
                   **rail_env(sandbox))
    worker = spawn("vpay-worker", "--idle-sleep", "0.1", "--shutdown-grace-seconds", "1", env=env)
    started = worker.wait_for_log("worker started")
    webhook_loops = sum(n for group, n in started["loops"].items() if "webhooks" in group.split("+"))
    assert webhook_loops >= 1 and sum(started["loops"].values()) == 4

    def hanging():
        return db.execute("SELECT count(*) FROM jobs WHERE kind = 'deliver' AND locked_by IS NOT NULL"
                          ).fetchone()[0]
    wait_until(lambda: tarpit.accepted == webhook_loops and hanging() == webhook_loops, timeout=30,
               what="every webhooks loop stuck in a delivery")

    adapter = MtnMomo.from_env(rail_env(sandbox))
    created = [payments.create_and_submit(pool, lambda code: adapter, merchant_id="m_calm", amount=1500,
                                          currency="EUR", rail="mtn", payer=f"2567700001{i:02d}")
               for i in range(3)]
    made_charges = [c["charge"]["id"] for c in created]
    with TimeMachine(db_url, kinds=("poll",)):
        wait_until(lambda: db.execute("SELECT count(*) FROM charges WHERE id = ANY(%s) AND status = 'succeeded'",
                                      (made_charges,)).fetchone()[0] == 3,
                   timeout=60, what="the MTN charges to settle while the webhooks lane hangs")
    # ... and the deliveries are still hanging: nothing finished, nothing retried
    assert hanging() == webhook_loops and tarpit.accepted == webhook_loops
    assert db.execute("SELECT count(*) FROM jobs WHERE kind = 'deliver' AND attempts > 0").fetchone()[0]\
        == webhook_loops
    for c in created:
        assert sandbox.count(method="GET", reference=c["charge"]["rail_reference"]) >= 1
    polls = [h for h in worker.find("job handled") if h["kind"] == "poll"]
    assert polls and {h["lane"] for h in polls} == {"mtn"}
    worker.signal()
    assert worker.wait(60) == 1  # the hanging deliveries outlive the grace: released, timed-out drain
    final = worker.find("gauge", final=True)[0]
    assert final["lanes"]["mtn"]["done"] >= 3
    assert final["lanes"]["webhooks"]["leased"] + final["lanes"]["webhooks"]["due"] >= 6
