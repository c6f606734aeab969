"""pgbouncer, both modes, on what Debian ships (issue 25; docs/deployment.md,
"pgbouncer"): a real ``/usr/sbin/pgbouncer`` (tests/pgbouncer_support.py) in
front of the test database, the installed ``vpay-server api`` and
``vpay-worker`` through it, the sandbox MoMo rail.

* Transaction mode with ``VPAY_DATABASE_PREPARED_STATEMENTS=off`` and
  ``VPAY_SESSION_DATABASE_URL`` pointing at Postgres itself; session mode
  with the defaults (prepared statements on, the session URL = the pool's,
  through the bouncer). In each: payments flow through the API and the
  worker to settled; a job committed due is claimed after a notification
  arrived through the session URL (the listener's own count, in the final
  gauge line: not a timing); the worker's vacuum of ``jobs`` runs (its log
  line, ``result`` done: through a session-mode bouncer it used to be
  refused at connect for its startup ``options``); SIGTERM drains clean with
  nothing left leased; ``vpay_database_up`` is 1 and no database error was
  counted.
* Misconfigured, refused at start with 78 and one line naming the setting:
  transaction mode with prepared statements on (worker, API, a one-shot
  command); transaction mode as the session URL (unset, or set to it).

Skipped with one line without pgbouncer, failed under
``VPAY_REQUIRE_PGBOUNCER=1`` (``.ci/run``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from api_support import free_port, mtn_env, new_key, running_api
from pgbouncer_support import Bouncer, pgbouncer_or_skip
from support import TimeMachine, base_env, script, wait_until
from vpay.engine import queue

pytestmark = pytest.mark.slow

PAYMENTS = 8
VACUUM_EVERY = "5"
PAYER = "256770000001"  # the sandbox's payer who approves


@pytest.fixture(autouse=True)
def _needs_pgbouncer():
    pgbouncer_or_skip()


def _settings(mode: str, db_url: str) -> dict[str, str]:
    """What docs/deployment.md prescribes for each mode."""
    if mode == "transaction":
        return {"VPAY_DATABASE_PREPARED_STATEMENTS": "off", "VPAY_SESSION_DATABASE_URL": db_url}
    return {}


def _scrape(port: int) -> dict[str, float]:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def _leased(db) -> int:
    return db.execute("SELECT count(*) FROM jobs WHERE locked_by IS NOT NULL").fetchone()[0]


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_payments_wakeups_vacuum_and_drain_through_pgbouncer(mode, db, db_url, spawn, tmp_path):
    settings = _settings(mode, db_url)
    with Bouncer(db_url, mode, tmp_path) as bouncer, \
            running_api(bouncer.url, tmp_path, **settings) as stack:
        key = new_key(db)
        metrics_port = free_port()
        env = base_env(bouncer.url, **mtn_env(stack.rail, stack.port), **settings,
                       VPAY_TEST_HANDLERS="1", VPAY_JOBS_VACUUM_EVERY=VACUUM_EVERY)
        # A 30 s idle sleep (15-30 s jittered): the loops claim early only when woken.
        worker = spawn("vpay-worker", "--idle-sleep", "30", "--worker-concurrency", "4",
                       "--metrics-port", str(metrics_port), env=env)
        worker.wait_for_log("worker started")

        # payments through the API, each read back more often than psycopg's
        # prepare threshold (5): in transaction mode with prepared statements
        # these are the requests that answered 500, or another query's rows
        intents = []
        for n in range(PAYMENTS):
            resp = stack.create(key, payer=PAYER, idempotency_key=f"{mode}-{n}")
            assert resp.status_code == 201, resp.text
            intents.append(resp.json()["id"])
        for _ in range(3):
            for intent in intents:
                got = requests.get(f"{stack.url}/v1/payment_intents/{intent}",
                                   headers={"Authorization": f"Bearer {key}"}, timeout=30)
                assert got.status_code == 200 and got.json()["id"] == intent, got.text

        with TimeMachine(db_url):  # the polls' ladder, pulled forward (a NOTIFY each)
            wait_until(lambda: db.execute("SELECT count(*) FROM charges WHERE status = 'succeeded'"
                                          ).fetchone()[0] == PAYMENTS,
                       timeout=120, what=f"{PAYMENTS} payments settled through pgbouncer ({mode})")
        statuses = {i: requests.get(f"{stack.url}/v1/payment_intents/{i}",
                                    headers={"Authorization": f"Bearer {key}"}, timeout=30).json()["status"]
                    for i in intents}
        assert set(statuses.values()) == {"succeeded"}, statuses

        # a job committed due now: claimed once its notification arrives
        queue.enqueue(db, "test.noop", f"wake:{mode}")
        wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = %s",
                                      (f"wake:{mode}",)).fetchone()[0] == 0,
                   timeout=60, what="the committed job to be claimed and finished")

        # the worker's own vacuum of jobs, on the session URL
        vacuumed = worker.wait_for_log("jobs vacuumed", timeout=60)
        assert vacuumed["result"] == "done"
        assert not worker.find("could not vacuum jobs; the claims slow down until it can")

        samples = _scrape(metrics_port)
        assert samples["vpay_database_up"] == 1
        assert samples.get("vpay_database_errors_total", 0) == 0

        worker.signal()
        assert worker.wait(60) == 0, worker.text()[-3000:]
        assert worker.find("drain clean")
        final = worker.find("gauge", final=True)[0]
        # notifications arrived through the session URL: the wake-ups work
        assert final["listener"]["connections"] >= 1
        assert final["listener"]["notifications"] >= 1
        assert final["lost"] == 0
        assert _leased(db) == 0
        for message in ("claim failed; database unavailable",
                        "could not record the job's outcome; its lease will be reaped",
                        "listener lost its connection; loops fall back to the idle sleep"):
            assert not worker.find(message), message
    api_log = Path(stack.proc.log_path).read_text(errors="replace")
    assert "prepared statement" not in api_log


def _refused(args: list[str], env: dict[str, str]) -> str:
    res = subprocess.run([script(args[0]), *args[1:]], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 78, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    lines = [line for line in res.stderr.splitlines() if line.startswith("vpay: ")]
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_transaction_mode_with_prepared_statements_on_is_refused_at_start_with_78(db, db_url, tmp_path):
    with Bouncer(db_url, "transaction", tmp_path) as bouncer:
        env = base_env(bouncer.url, VPAY_SESSION_DATABASE_URL=db_url)  # prepared statements: default on
        for args in (["vpay-worker"], ["vpay-server", "jobs", "list"]):
            line = _refused(args, env)
            assert "VPAY_DATABASE_PREPARED_STATEMENTS is on" in line and "pooled per transaction" in line
            assert "set VPAY_DATABASE_PREPARED_STATEMENTS=off" in line
        api = subprocess.run([script("vpay-server"), "api", "--bind", f"127.0.0.1:{free_port()}"],
                             env={**env, **mtn_env_for_refusal()}, capture_output=True, text=True,
                             timeout=120)
        assert api.returncode == 78, api.stderr[-2000:]
        assert "VPAY_DATABASE_PREPARED_STATEMENTS=off" in api.stderr
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0  # the worker booted nothing


def mtn_env_for_refusal() -> dict[str, str]:
    """A configured MoMo rail (the API refuses to start with none) that is never called."""
    return {"VPAY_MTN_BASE_URL": "http://127.0.0.1:9", "VPAY_MTN_SUBSCRIPTION_KEY": "k",
            "VPAY_MTN_API_USER": "u", "VPAY_MTN_API_KEY": "k"}


def test_a_transaction_pooled_session_url_is_refused_at_start_with_78(db, db_url, tmp_path):
    with Bouncer(db_url, "transaction", tmp_path) as bouncer:
        unset = base_env(bouncer.url, VPAY_DATABASE_PREPARED_STATEMENTS="off")
        line = _refused(["vpay-worker"], unset)
        assert "VPAY_SESSION_DATABASE_URL (unset, so VPAY_DATABASE_URL)" in line
        assert "pooled per transaction" in line
        assert "the wake-up LISTEN and the vacuum need a session" in line and "temporary tables" not in line
        explicit = base_env(db_url, VPAY_SESSION_DATABASE_URL=bouncer.url)
        line = _refused(["vpay-worker"], explicit)
        assert line.startswith("vpay: configuration refused: VPAY_SESSION_DATABASE_URL (")
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


def test_a_statement_import_keeps_its_session_on_the_session_url_behind_a_transaction_bouncer(
        db, db_url, pool, sandbox, merchant, tmp_path):
    """Its temporary tables and per-rail lock live in its session: through a
    transaction-mode bouncer it runs on VPAY_SESSION_DATABASE_URL, and with
    no session URL it is refused (78) rather than scattered over server
    connections."""
    from test_statements import Ledger, _write
    ledger = Ledger(db, pool, sandbox, merchant)
    charge = ledger.pay()  # approved at the rail, still pending here: the statement proves it
    ledger.at_rail(charge["rail_reference"], "SUCCESSFUL")
    path = _write(tmp_path, sandbox)
    args = ["vpay-server", "statements", "import", str(path), "--rail", "mtn", "--profile", "sandbox",
            "--lag-minutes", "0", "--apply", "--json"]
    with Bouncer(db_url, "transaction", tmp_path) as bouncer:
        tx = {"VPAY_DATABASE_PREPARED_STATEMENTS": "off"}
        line = _refused(args, base_env(bouncer.url, **tx))
        assert "VPAY_SESSION_DATABASE_URL (unset, so VPAY_DATABASE_URL)" in line
        # its own reason, not the worker's
        assert "the statement import's temporary tables and advisory lock need a session" in line
        assert "LISTEN" not in line
        out = subprocess.run([script(args[0]), *args[1:]],
                             env=base_env(bouncer.url, **tx, VPAY_SESSION_DATABASE_URL=db_url),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["statement"].startswith("st_") and report["applied"] is True
    assert db.execute("SELECT status FROM charges WHERE id = %s", (charge["id"],)).fetchone() == ("succeeded",)
