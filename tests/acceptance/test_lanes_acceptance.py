"""Lanes with real worker processes (issue #11): ``--queues`` narrows a
replica, bad lane flags are refused, and a webhooks lane that hangs does not
hold up MTN status reads. The acceptance half of
tests/integration/test_lanes.py.
"""

from __future__ import annotations

import socket
import subprocess
import threading

import pytest

from support import ConnCounter, TimeMachine, base_env, rail_env, script, wait_until
from vpay.money import charges, payments
from vpay.engine import queue
from vpay import webhooks
from vpay.money.ids import new_id, new_rail_reference
from vpay.money.merchants import create_merchant
from vpay.money.charges import StatusKind
from vpay.rails.mtn import MtnMomo


# ---- the worker's flags ----------------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["--queues", "mtn,airtel"], "unknown lane 'airtel'"),
    (["--queues", ""], None),  # empty means all lanes: accepted (checked below: boots)
    (["--lane-concurrency", "mtn=x"], "mtn='x' is not a whole number"),
    (["--lane-concurrency", "mtn=0"], "is not a whole number >= 1"),
    (["--lane-concurrency", "mtn=3,webhooks=2"], "adds up to 5 loops, above --worker-concurrency 4"),
    (["--lane-concurrency", "mtn=2,orange=1,webhooks=1"], "leaves none for mpesa,pawapay,housekeeping"),
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
    charges = [c["charge"]["id"] for c in created]
    with TimeMachine(db_url, kinds=("poll",)):
        wait_until(lambda: db.execute("SELECT count(*) FROM charges WHERE id = ANY(%s) AND status = 'succeeded'",
                                      (charges,)).fetchone()[0] == 3,
                   timeout=60, what="the MTN charges to settle while the webhooks lane hangs")
    # ... and the deliveries are still hanging: nothing finished, nothing retried
    assert hanging() == webhook_loops and tarpit.accepted == webhook_loops
    assert db.execute("SELECT count(*) FROM jobs WHERE kind = 'deliver' AND attempts > 0").fetchone()[0] \
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
