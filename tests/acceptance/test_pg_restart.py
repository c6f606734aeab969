"""Postgres going away under a running vpay-worker.

This test owns its Postgres (a separate pgserver instance in tmp_path), so it
can restart it, stop it, or kill every backend without touching the shared
test server. Each scenario strikes while a status read is inside the rail:

* ``pg_ctl_restart``: ``pg_ctl -m fast restart``;
* ``stopped_mid_read``: Postgres is stopped, the read comes back to a worker
  that cannot write its answer, Postgres is started again;
* ``down_past_the_pool_timeout``: Postgres stays down until the in-flight
  handler gives up waiting for a connection (the pool's 30 s timeout) and
  fails; then it is started;
* ``backends_terminated``: ``pg_terminate_backend`` on every backend of the
  worker, from a superuser connection;
* ``read_only_failover``: the database turns read-only (sessions are ended and
  come back with ``default_transaction_read_only``), as a demoted primary
  would, until the worker has seen a claim fail; then writable again.

The worker's pool checks each connection on checkout and reconnects
(vpay.base.db.make_pool), so after the database comes back: every charge still
settles as the rail holds it, with one event per transition; the worker
neither exits nor spins (its warnings stay bounded); a job whose handler
failed on the database is run again to an outcome, and nothing is left
leased or dead-lettered.
"""

from __future__ import annotations

import signal
from datetime import datetime

import psycopg
import pytest

from support import TimeMachine, base_env, rail_env, wait_until
from vpay.base import db as vdb
from vpay.money import payments
from vpay.engine.queue import MAX_FAILURES
from vpay.money.merchants import create_merchant
from vpay.rails.mtn import MtnMomo

pytestmark = pytest.mark.slow

# payer -> sandbox script: immediate success, decline, a few pending reads, slow reads
PAYERS = {
    "256770000041": {},
    "256770000042": {},
    "46733123451": {},  # declined (APPROVAL_REJECTED)
    "46733123452": {},  # declined (EXPIRED)
    "256770000043": {"pending_reads": 3, "outcome": "SUCCESSFUL"},
    "256770000044": {"pending_reads": 3, "outcome": "FAILED", "reason": "NOT_ENOUGH_FUNDS"},
    "256770000045": {"status_delay_seconds": 1.5, "pending_reads": 1, "outcome": "SUCCESSFUL"},
    "256770000046": {"status_delay_seconds": 1.5, "pending_reads": 1, "outcome": "SUCCESSFUL"},
}
RAIL_TO_CHARGE = {"SUCCESSFUL": "succeeded", "FAILED": "failed"}
TERMINAL_EVENT = {"succeeded": "payment_intent.succeeded", "failed": "payment_intent.payment_failed"}
CONCURRENCY = 4  # the worker's default --worker-concurrency
LEASE = 5.0  # the --lease-seconds the worker runs with here
MAX_POOL_WARNINGS = 120  # psycopg.pool: one per reconnect attempt, on a doubling backoff


class OwnPostgres:
    """A pgserver instance of this test's own, with pg_ctl at hand."""

    def __init__(self, root):
        import pgserver
        self.server = pgserver.get_server(root, cleanup_mode="stop")
        self.socket_dir = str(self.server.get_postmaster_info().socket_dir)

    def url(self, dbname: str) -> str:
        return self.server.get_uri(dbname)

    def pg_ctl(self, *args: str) -> None:
        from pgserver._commands import pg_ctl
        pg_ctl(["-w", *args], pgdata=self.server.pgdata, user=self.server.system_user, timeout=60)

    def restart(self) -> None:
        self.pg_ctl("-m", "fast", "-l", str(self.server.log), "restart")
        self._refresh()

    def stop(self) -> None:
        self.pg_ctl("-m", "fast", "stop")

    def start(self) -> None:
        self.pg_ctl("-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.server.log), "start")
        self._refresh()

    def _refresh(self) -> None:
        # pgserver remembers the postmaster it started; tell it about the new one
        # so that its cleanup stops the right process.
        from pgserver.utils import PostmasterInfo
        self.server._postmaster_info = PostmasterInfo.read_from_pgdata(self.server.pgdata)

    def close(self) -> None:
        self.server.cleanup()


@pytest.fixture
def own_pg(tmp_path):
    pg = OwnPostgres(tmp_path / "pg")
    try:
        with psycopg.connect(pg.url("postgres"), autocommit=True) as admin:
            admin.execute("CREATE DATABASE vpay")
        with psycopg.connect(pg.url("vpay"), autocommit=True) as conn:
            vdb.migrate(conn)
            create_merchant(conn, "m_pg", "Restart test merchant")
        yield pg
    finally:
        pg.close()


class SteadyTimeMachine(TimeMachine):
    """``TimeMachine`` that reconnects when its database goes away."""

    def _run(self):
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.db_url, autocommit=True, connect_timeout=2) as conn:
                    while not self._stop.wait(self.interval):
                        conn.execute("UPDATE jobs SET run_at = now() WHERE kind = ANY(%s) "
                                     "AND locked_at IS NULL AND run_at > now() "
                                     "AND run_at <> 'infinity'", (self.kinds,))
            except psycopg.Error:  # away, restarting, or read-only for a while
                self._stop.wait(self.interval)


def _terminate_backends(pg) -> int:
    with psycopg.connect(pg.url("postgres"), autocommit=True) as admin:
        return len(admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = 'vpay' AND pid <> pg_backend_pid()").fetchall())


def _set_read_only(pg, read_only: bool) -> None:
    """Make every new session of the vpay database read-only (or not again),
    and end the current ones so that the worker's pool reconnects into it."""
    with psycopg.connect(pg.url("postgres"), autocommit=True) as admin:
        admin.execute("ALTER DATABASE vpay SET default_transaction_read_only = %s"
                      % ("on" if read_only else "off"))
    _terminate_backends(pg)


def _statuses(conn) -> dict[str, str]:
    return dict(conn.execute("SELECT id, status FROM charges").fetchall())


def _read_in_flight(sandbox) -> bool:
    return any(e["method"] == "GET" and e["status_code"] is None for e in sandbox.requests_log())


def _at(line: dict) -> float:
    return datetime.strptime(line["time"], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _backoff_failures(span: float) -> int:
    """How many claims one loop can fail in ``span`` seconds of outage: it
    waits 0.5 s after the first, doubling to 10 s (vpay.worker.loop._claim_loop)."""
    failures, waited, backoff = 1, 0.0, 0.5
    while waited + backoff <= span:
        waited += backoff
        backoff = min(backoff * 2, 10.0)
        failures += 1
    return failures


def _assert_no_spinning(ours: list[dict], rail_requests: int) -> None:
    """Each warning the worker logs during an outage, bounded by what logs it
    (a busy loop would log thousands): a claim loop's failures by its
    back-off over the outage, a timer's by its period, a job's by the
    failure streak that would park it (nothing is parked here), a rail
    adapter's by the requests the rail saw. The outage
    is the span of these lines' own timestamps. A message not listed here
    fails the test: a new warning must say what bounds it."""
    by_message: dict[str, list[dict]] = {}
    rail_lines = [l for l in ours if str(l.get("logger", "")).startswith("vpay.rails")]
    # an adapter's warning (a read with no answer, a refused token) is about one request
    assert len(rail_lines) <= rail_requests, (len(rail_lines), rail_requests)
    for line in ours:
        if line not in rail_lines:
            by_message.setdefault(line["message"], []).append(line)

    def span(lines):
        return max(map(_at, lines)) - min(map(_at, lines))

    claims = by_message.pop("claim failed; database unavailable", [])
    if claims:
        assert len(claims) <= CONCURRENCY * _backoff_failures(span(claims)), (len(claims), span(claims))
    for message, period in (("could not renew leases", max(LEASE / 3, 0.3)),
                            # once per run of failed beats, on the heartbeat's thread
                            ("worker heartbeat failed; database unavailable", max(LEASE / 3, 0.3)),
                            ("reaper could not reach the database", max(LEASE / 2, 0.5))):
        ticks = by_message.pop(message, [])
        if ticks:
            # one thread, one line per period (+1 for where the span starts)
            assert len(ticks) <= span(ticks) / period + 1, (message, len(ticks), span(ticks))
    for message in ("handler raised", "could not record the job's outcome; its lease will be reaped",
                    "could not record the job's outcome; kept, to be written when the database answers",
                    "kept outcome written: the database answers again",
                    "lease lost: the kept outcome was discarded",
                    "lease reaped", "lease lost: the outcome was discarded"):
        per_job: dict[str, int] = {}
        for line in by_message.pop(message, []):
            per_job[line["dedupe_key"]] = per_job.get(line["dedupe_key"], 0) + 1
        assert all(n < MAX_FAILURES for n in per_job.values()), (message, per_job)
    assert by_message == {}, {m: len(v) for m, v in by_message.items()}


@pytest.mark.parametrize("disruption", ["pg_ctl_restart", "stopped_mid_read", "down_past_the_pool_timeout",
                                        "backends_terminated", "read_only_failover"])
def test_worker_survives_postgres_going_away(disruption, own_pg, sandbox, spawn):
    url = own_pg.url("vpay")
    for payer, script in PAYERS.items():
        if script:
            sandbox.script(payer, **script)
    adapter = MtnMomo.from_env(rail_env(sandbox))
    pool = vdb.make_pool(url, max_size=2)
    try:
        charges = [payments.create_and_submit(pool, lambda code: adapter, merchant_id="m_pg", amount=900,
                                              currency="EUR", rail="mtn", payer=payer)["charge"]
                   for payer in PAYERS]
    finally:
        pool.close()
    conn = psycopg.connect(url, autocommit=True)
    worker = spawn("vpay-worker", "--lease-seconds", str(LEASE), "--idle-sleep", "0.1",
                   env=base_env(url, **rail_env(sandbox)))
    with SteadyTimeMachine(url):
        # mid-run: some charges settled, some still polling, a status read inside the rail
        wait_until(lambda: "pending" in _statuses(conn).values()
                   and set(_statuses(conn).values()) - {"pending"} and _read_in_flight(sandbox),
                   timeout=60, what="a run in progress with a status read in flight")
        conn.close()
        if disruption == "pg_ctl_restart":
            own_pg.restart()
        elif disruption == "stopped_mid_read":
            own_pg.stop()
            # the read in flight returns to a worker that cannot write its answer
            wait_until(lambda: not _read_in_flight(sandbox), timeout=30, what="the read to come back")
            own_pg.start()
        elif disruption == "down_past_the_pool_timeout":
            own_pg.stop()
            # the in-flight job comes back from the rail and cannot get a
            # connection within the pool's timeout: its handler fails
            worker.wait_for_log("handler raised", timeout=90)
            own_pg.start()
        elif disruption == "read_only_failover":
            # The database refuses writes for a while (a demoted primary, a
            # standby promoted late): claims and settles fail with
            # ReadOnlySqlTransaction, not a connection error.
            _set_read_only(own_pg, True)
            worker.wait_for_log("claim failed; database unavailable", timeout=60)
            _set_read_only(own_pg, False)
        else:
            assert _terminate_backends(own_pg) >= 1  # the worker's pooled connections
        conn = psycopg.connect(url, autocommit=True)
        wait_until(lambda: "pending" not in _statuses(conn).values(), timeout=90,
                   what="every charge to settle after the disruption")

    assert worker.popen.poll() is None, worker.text()[-3000:]  # it never exited
    # no spinning: each of the worker's own warnings is bounded by the
    # mechanism that logs it (see _assert_no_spinning), and the pool's
    # reconnect attempts stay few
    noisy = [l for l in worker.lines() if l.get("level") in ("WARNING", "ERROR", "CRITICAL") or l.get("raw")]
    ours = [l for l in noisy if str(l.get("logger", "")).startswith("vpay")]
    _assert_no_spinning(ours, len(sandbox.requests_log()))
    assert len(noisy) - len(ours) <= MAX_POOL_WARNINGS, noisy[-10:]
    for charge in charges:
        held = sandbox.transaction(charge["rail_reference"])
        status = conn.execute("SELECT status FROM charges WHERE id = %s", (charge["id"],)).fetchone()[0]
        assert status == RAIL_TO_CHARGE[held["status"]], (charge["payer"], held)
        events = [r[0] for r in conn.execute("SELECT type FROM events WHERE payment_intent_id = %s "
                                             "ORDER BY created_at, id", (charge["payment_intent_id"],))]
        assert events == ["payment_intent.processing", TERMINAL_EVENT[status]], charge["payer"]

    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.text()[-3000:]
    # every job whose handler failed on the database was retried, not lost:
    # run again to an outcome, or queued again (unleased, due after its backoff)
    lines = worker.lines()
    for i, line in enumerate(lines):
        if line.get("message") != "handler raised":
            continue
        key = line["dedupe_key"]
        rerun = [l for l in lines[i + 1:] if l.get("message") == "job handled"
                 and l.get("dedupe_key") == key and l.get("outcome") != "error"]
        queued = conn.execute("SELECT locked_at IS NULL AND run_at <> 'infinity' AND failures >= 1 "
                              "FROM jobs WHERE dedupe_key = %s", (key,)).fetchone()
        assert rerun or queued == (True,), line
    # nothing lost, nothing stranded, nothing dead-lettered
    assert conn.execute("SELECT dedupe_key FROM jobs WHERE locked_at IS NOT NULL "
                        "OR run_at = 'infinity' OR kind IN ('poll', 'resubmit')").fetchall() == []
    assert conn.execute("SELECT kind, details FROM alerts").fetchall() == []
    conn.close()
