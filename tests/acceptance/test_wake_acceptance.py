"""Waking on commit with a real ``vpay-worker`` (issue #15). Behaviour, never
timing: a worker whose idle sleep is 30 s (each loop sleeps 15 to 30 s,
jittered) claims a job within a deadline far below that, which it can only do
if something woke it; round trips per no-op job counted through a proxy
(bench/pgcount.py). The acceptance half of tests/integration/test_wake.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from api_support import free_port
from pg_relay import BlackholeRelay
from support import base_env, wait_until
from vpay.engine import queue

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from pgcount import CountingProxy  # noqa: E402

LONG_SLEEP = "30"
WELL_UNDER = 10.0  # seconds: a wake-up, not the 15-30 s fallback sleep


def _worker(spawn, url, *args):
    return spawn("vpay-worker", "--idle-sleep", LONG_SLEEP, *args,
                 env=base_env(url, VPAY_TEST_HANDLERS="1"))


def _settled(db) -> bool:
    """The worker has booted, run its boot jobs and gone idle: the hourly
    jobs are rescheduled and unleased, and every other session of this
    database has been idle for a second (its loops are asleep)."""
    boot = db.execute("SELECT count(*) FROM jobs WHERE dedupe_key IN ('scan:live', 'sweep:expired') "
                      "AND attempts >= 1 AND locked_at IS NULL").fetchone()[0]
    busy = db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
                      "AND (state <> 'idle' OR state_change > now() - interval '1 second')").fetchone()[0]
    return boot == 2 and busy == 0


def _listener_pid(db, worker_id: str | None = None):
    """The backend pid of a worker's wake-up listener (of ``worker_id``'s when
    given: another process's listener on this database, e.g. one an earlier
    test left behind, must not be taken for it)."""
    name = f"vpay-listener {worker_id}" if worker_id else "vpay-listener%"
    row = db.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                     "AND application_name LIKE %s", (name,)).fetchone()
    return row[0] if row else None


def _gone(db, key) -> bool:
    return db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = %s", (key,)).fetchone()[0] == 0


def test_a_job_committed_while_the_worker_idles_is_claimed_long_before_its_idle_sleep(db, db_url, spawn):
    worker = _worker(spawn, db_url)
    worker.wait_for_log("worker started")
    wait_until(lambda: _listener_pid(db) and _settled(db), timeout=60, what="an idle worker")
    queue.enqueue(db, "test.noop", "wake:1")
    wait_until(lambda: _gone(db, "wake:1"), timeout=WELL_UNDER,
               what="the committed job to be claimed and finished (woken, not after the idle sleep)")


def test_a_job_due_later_is_claimed_when_due_not_after_the_idle_sleep(db, db_url, spawn):
    # Nothing notifies for a job due in 2 s: the claim told the loop when the
    # next one is due, and it sleeps until then.
    queue.enqueue(db, "test.noop", "later:1", delay=2.0)
    worker = _worker(spawn, db_url)
    worker.wait_for_log("worker started")
    wait_until(lambda: _gone(db, "later:1"), timeout=WELL_UNDER,
               what="the job due in 2 s to be run when due")


def test_the_listener_reconnects_after_its_backend_is_terminated_and_still_wakes(db, db_url, spawn):
    worker = _worker(spawn, db_url, "--worker-id", "wake-reconnect")
    worker.wait_for_log("worker started")
    first = wait_until(lambda: _listener_pid(db, "wake-reconnect"), timeout=60, what="the listener")
    assert db.execute("SELECT pg_terminate_backend(%s)", (first,)).fetchone()[0]
    wait_until(lambda: (_listener_pid(db, "wake-reconnect") or first) != first, timeout=30,
               what="a new listener session")
    worker.wait_for_log("listener reconnected")
    wait_until(lambda: _settled(db), timeout=60, what="an idle worker")
    queue.enqueue(db, "test.noop", "wake:after-reconnect")
    wait_until(lambda: _gone(db, "wake:after-reconnect"), timeout=WELL_UNDER,
               what="the job to be claimed through the new listener")
    assert worker.popen.poll() is None


def test_no_more_than_two_round_trips_per_no_op_job_with_a_real_worker(db, db_url, spawn):
    # Every connection of the worker goes through a wire-protocol proxy that
    # counts Sync and Query messages (one wait for the server each). Before
    # issue #15: claim, finish, and a pool check on each of the two checkouts.
    proxy = CountingProxy(db_url).start()
    try:
        # the long idle sleep keeps idle polling out of the count (bench/peers.py
        # counts at the default flags, idle claims included)
        worker = _worker(spawn, proxy.url, "--worker-concurrency", "5", "--queues", "housekeeping")
        worker.wait_for_log("worker started")
        wait_until(lambda: _settled(db), timeout=60, what="an idle worker")
        before = proxy.total()
        n = 400
        db.execute("INSERT INTO jobs (kind, lane, dedupe_key) "
                   "SELECT 'test.noop', 'housekeeping', 'rt:' || g FROM generate_series(1, %s) g", (n,))
        wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE kind = 'test.noop'").fetchone()[0] == 0,
                   timeout=120, what="the jobs to be done")
        per_job = (proxy.total() - before) / n
        assert per_job <= 2.0, (per_job, proxy.by_statement().most_common(6))
        # and the pool's liveness check (the empty query) is not one of them per job
        assert proxy.by_statement()[""] < n / 10, proxy.by_statement().most_common(6)
    finally:
        proxy.stop()


def _reconnects(port: int, cause: str) -> float:
    """``vpay_listener_reconnects_total{cause}`` scraped from the worker."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "vpay_listener_reconnects_total" and sample.labels.get("cause") == cause)


def test_a_listener_whose_traffic_is_silently_dropped_is_replaced_within_the_bound_and_wakes_again(
        db, db_url, spawn):
    # Issue 25, item 5: a NAT or a firewall drops the wake-up connection and
    # the socket stays open. Here a relay between the worker and Postgres
    # stops forwarding the listener's connection (both sockets stay open and
    # read: no FIN, no RST, every byte acknowledged). The worker's other
    # connections go through the same relay and keep working. Before: the
    # listener waited on the silent socket for ever (its 30 s ping blocked
    # with it), nothing was logged, and every claim waited for the idle
    # sleep. The idle sleep here is 10 minutes (loops sleep 5 to 10): only a
    # wake-up claims the last job within the deadline.
    relay = BlackholeRelay(db_url)
    port = free_port()
    try:
        worker = spawn("vpay-worker", "--idle-sleep", "600", "--worker-id", "wake-silent",
                       "--metrics-port", str(port),
                       env=base_env(relay.url, VPAY_TEST_HANDLERS="1", VPAY_LISTENER_DEAD_AFTER_SECONDS="10"))
        started = worker.wait_for_log("worker started")
        assert started["listener_dead_after_seconds"] == 10
        wait_until(lambda: _listener_pid(db, "wake-silent"), timeout=60, what="the listener")
        wait_until(lambda: _settled(db), timeout=60, what="an idle worker")
        assert relay.blackhole(b"vpay-listener") == 1

        # Found by its ping's own deadline, logged once, replaced, counted.
        replaced = worker.wait_for_log("listener unresponsive; replacing it", timeout=60)
        assert replaced["dead_after_seconds"] == 10 and replaced["level"] == "WARNING"
        worker.wait_for_log("listener reconnected", timeout=60, cause="unresponsive")
        wait_until(lambda: _reconnects(port, "unresponsive") == 1, timeout=30, what="the reconnect counted")
        assert len(worker.find("listener unresponsive; replacing it")) == 1
        # a new session: the silent one is still open on the server (the relay holds it)
        wait_until(lambda: _listener_pids(db, "wake-silent") == 2, timeout=30, what="a new listener session")

        wait_until(lambda: _settled(db), timeout=60, what="an idle worker")
        queue.enqueue(db, "test.noop", "wake:after-silence")
        wait_until(lambda: _gone(db, "wake:after-silence"), timeout=60,
                   what="the job to be claimed through the new listener (a wake-up, not the 5-10 min sleep)")
        assert worker.popen.poll() is None
    finally:
        relay.close()


def _listener_pids(db, worker_id: str) -> int:
    return db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND application_name = %s", (f"vpay-listener {worker_id}",)).fetchone()[0]
