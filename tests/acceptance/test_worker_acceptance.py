"""The worker command as a process: boot refusals and their exit codes,
migrations run twice and concurrently, and two worker processes sharing 2000
jobs. The acceptance half of tests/integration/test_worker.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading

import psycopg
import pytest
from psycopg import sql

from support import ConnCounter, base_env, script, wait_until


def test_concurrency_above_half_the_pool_is_refused_with_78_before_any_connection(tmp_path):
    counter = ConnCounter()
    try:
        env = base_env(f"postgresql://nobody@127.0.0.1:{counter.port}/x?connect_timeout=2")
        res = subprocess.run([script("vpay-worker"), "--worker-concurrency", "6"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 78
        assert "--worker-concurrency 6" in res.stderr and res.stderr.count("\n") == 1
        # and on the embedded default: no data directory is created
        env = base_env("", VPAY_DATA_DIR=str(tmp_path / "data"))
        del env["VPAY_DATABASE_URL"]
        res = subprocess.run([script("vpay-worker"), "--worker-concurrency", "6"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 78
        assert not (tmp_path / "data").exists()
        assert counter.accepted == 0
    finally:
        counter.close()


def test_usage_error_exits_2():
    res = subprocess.run([script("vpay-worker"), "--worker-concurrency", "lots"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2


@pytest.fixture
def fresh_db(server_url, worker_id):
    name = f"vpay_mig_{worker_id}_{threading.get_ident() % 10000}"
    admin = psycopg.connect(psycopg.conninfo.make_conninfo(server_url, dbname="postgres"), autocommit=True)
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield psycopg.conninfo.make_conninfo(server_url, dbname=name)
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.close()


def _schema(url):
    with psycopg.connect(url) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                              "ORDER BY 1").fetchall()
        applied = conn.execute("SELECT name FROM schema_migrations ORDER BY 1").fetchall()
    return [t[0] for t in tables], [a[0] for a in applied]


def test_migrate_twice_and_concurrently_leaves_one_schema(fresh_db):
    env = base_env(fresh_db)
    procs = [subprocess.Popen([script("vpay-server"), "migrate", "--json"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [(p.wait(120), p.stdout.read(), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _, _ in results), results
    applied_counts = sorted(len(json.loads(out)["applied"])
                            for _, out, _ in results)
    from vpay.base.db import migration_files
    assert applied_counts == [0, 0, len(migration_files())]
    tables, applied = _schema(fresh_db)
    assert {"jobs", "charges", "payment_intents", "events", "webhook_endpoints", "alerts",
            "schema_migrations"} <= set(tables)
    assert applied == [n for n, _ in migration_files()]
    again = subprocess.run([script("vpay-server"), "migrate", "--json"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0 and '"applied": []' in again.stdout
    assert _schema(fresh_db) == (tables, applied)


@pytest.mark.slow
def test_two_worker_processes_handle_each_of_2000_jobs_exactly_once(db, db_url, spawn):
    db.execute("CREATE TABLE test_executions (job_key text NOT NULL, worker text NOT NULL)")
    with db.cursor() as cur:
        cur.executemany("INSERT INTO jobs (kind, lane, dedupe_key) VALUES ('test.count', 'housekeeping', %s)",
                        [(f"count:{i}",) for i in range(2000)])
    env = base_env(db_url, VPAY_TEST_HANDLERS="1")
    workers = [spawn("vpay-worker", "--worker-concurrency", "5", "--idle-sleep", "0.1",
                     "--worker-id", f"proc{i}", env=env) for i in range(2)]
    wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE kind = 'test.count'").fetchone()[0] == 0,
               timeout=240, interval=0.5, what="the queue to drain")
    for w in workers:
        w.signal()
    assert [w.wait(60) for w in workers] == [0, 0]
    total, distinct = db.execute("SELECT count(*), count(DISTINCT job_key) FROM test_executions").fetchone()
    assert (total, distinct) == (2000, 2000)
    per_worker = dict(db.execute("SELECT worker, count(*) FROM test_executions GROUP BY 1").fetchall())
    assert set(per_worker) == {"proc0", "proc1"}  # both processes really competed
    for w in workers:
        final = w.find("gauge", final=True)
        assert final and final[0]["lost"] == 0


def test_database_unreachable_at_boot_exits_69_not_a_drain_code():
    counter = ConnCounter()  # accepts and closes: no Postgres there
    try:
        env = base_env(f"postgresql://nobody@127.0.0.1:{counter.port}/x?connect_timeout=1",
                       VPAY_DATABASE_OPEN_TIMEOUT_SECONDS="2")
        res = subprocess.run([script("vpay-worker")], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 69, res.stdout[-2000:] + res.stderr[-2000:]
        assert "database unreachable at boot" in res.stdout
        lines = res.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("vpay: database unavailable"), res.stderr
    finally:
        counter.close()


def test_a_rail_base_url_with_a_space_refuses_the_worker_at_boot():
    counter = ConnCounter()
    try:
        env = base_env(f"postgresql://nobody@127.0.0.1:{counter.port}/x?connect_timeout=1",
                       VPAY_MTN_BASE_URL="http://127.0.0.1:1/ momo", VPAY_MTN_SUBSCRIPTION_KEY="k",
                       VPAY_MTN_API_USER="u", VPAY_MTN_API_KEY="s")
        res = subprocess.run([script("vpay-worker")], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 78, res.stdout[-2000:] + res.stderr[-2000:]
        assert res.stderr.count("\n") == 1 and "VPAY_MTN_BASE_URL contains whitespace" in res.stderr
        assert counter.accepted == 0
    finally:
        counter.close()


@pytest.mark.parametrize("args", [["--idle-sleep", "nan"], ["--lease-seconds", "inf"], ["--lease-seconds", "nan"],
                                  ["--shutdown-grace-seconds", "nan"], ["--shutdown-grace-seconds", "-inf"],
                                  ["--idle-sleep", "0s"], ["--lease-seconds", "5 minutes"]], ids=" ".join)
def test_a_flag_that_is_not_a_duration_is_a_usage_error_and_boots_nothing(db, db_url, args):
    res = subprocess.run([script("vpay-worker"), *args], env=base_env(db_url), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stderr.startswith("vpay: usage: ") and len(res.stderr.splitlines()) == 1
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


@pytest.mark.parametrize("args,env", [
    ([], {"VPAY_MTN_BASE_URL": "http://127.0.0.1:9"}),  # half a rail: its credentials are missing
    ([], {"VPAY_MTN_BASE_URL": "http://127.0.0.1:9", "VPAY_MTN_SUBSCRIPTION_KEY": "k", "VPAY_MTN_API_USER": "u",
          "VPAY_MTN_API_KEY": "p", "VPAY_MTN_READ_TIMEOUT_SECONDS": "abc"}),
    *[([], {"VPAY_MTN_BASE_URL": "http://127.0.0.1:9", "VPAY_MTN_SUBSCRIPTION_KEY": "k", "VPAY_MTN_API_USER": "u",
            "VPAY_MTN_API_KEY": "p", "VPAY_MTN_READ_TIMEOUT_SECONDS": bad}) for bad in ("0", "-1", "inf", "nan")],
    ([], {"VPAY_WEBHOOK_READ_TIMEOUT_SECONDS": "abc"}),
], ids=["half-a-rail",
        "bad-rail-timeout", "rail-timeout-0", "rail-timeout-negative", "rail-timeout-inf", "rail-timeout-nan",
        "bad-webhook-timeout"])
def test_a_configuration_that_cannot_work_is_refused_at_boot_with_78(db, db_url, args, env):
    res = subprocess.run([script("vpay-worker"), *args], env=base_env(db_url, **env), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 78, res.stdout[-2000:] + res.stderr[-2000:]
    assert "configuration refused" in res.stderr
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0  # booted nothing, enqueued nothing


BLANK = {"ZZZ_UNRELATED": "", "VPAY_WORKER_DEAD_AFTER_SECONDS": "", "VPAY_LISTENER_DEAD_AFTER_SECONDS": "",
         "VPAY_MTN_BASE_URL": ""}
"""Variables set to "": one unrelated (any shell's `X= cmd`), the two bounds
(blank means their default, as every blank setting), a rail's (not configured)."""


def test_a_blank_variable_boots_the_worker_and_lists_the_rails(db, db_url, spawn):
    # `ZZZ_UNRELATED= vpay-worker` exited 70 ("internal error (KeyError)"):
    # the credentials mapping listed a name it then refused to read.
    worker = spawn("vpay-worker", "--worker-id", "blank", "--queues", "housekeeping", "--idle-sleep", "0.2",
                   env=base_env(db_url, **BLANK))
    started = worker.wait_for_log("worker started", timeout=60)
    assert (started["dead_after_seconds"], started["listener_dead_after_seconds"]) == (30.0, 30.0)  # the defaults
    res = subprocess.run([script("vpay-server"), "rails", "list", "--json"], env=base_env(db_url, **BLANK),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert not any(r["configured"] for r in json.loads(res.stdout))
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.text()[-3000:]


@pytest.mark.parametrize("wid", ["", "   ", "a\nb", "a\tb", "x" * 201], ids=["empty", "spaces", "newline", "tab",
                                                                         "201-chars"])
def test_a_worker_id_that_cannot_be_meant_is_refused_with_78_before_any_connection(wid):
    # '' silently became <hostname>:<pid>; '   ' and 'a\nb' were taken as ids
    counter = ConnCounter()
    try:
        res = subprocess.run([script("vpay-worker"), "--worker-id", wid],
                             env=base_env(f"postgresql://nobody@127.0.0.1:{counter.port}/x?connect_timeout=1"),
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 78, res.stdout[-2000:] + res.stderr[-2000:]
        [line] = res.stderr.splitlines()
        assert line.startswith("vpay: configuration refused: --worker-id "), line
        assert counter.accepted == 0
    finally:
        counter.close()


def test_a_worker_id_at_its_bound_boots(db, db_url, spawn):
    wid = "x" * 200  # MAX_WORKER_ID_CHARS
    worker = spawn("vpay-worker", "--worker-id", wid, "--queues", "housekeeping", env=base_env(db_url))
    assert worker.wait_for_log("worker started", timeout=60)["worker_id"] == wid
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert db.execute("SELECT id FROM workers").fetchall() == [(wid,)]
