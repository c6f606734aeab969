"""The worker vacuums ``jobs`` itself after every VPAY_JOBS_VACUUM_EVERY
finished jobs (vpay/engine/vacuum.py; issue #15, "Churn"). Real Postgres and the
installed ``vpay-worker``; whether a vacuum ran is Postgres's own count
(``pg_stat_user_tables.vacuum_count``: manual vacuums; the shared test server
runs no autovacuum, and autovacuum has a count of its own anyway).

The workers here serve only the ``webhooks`` lane and the jobs are put there,
so the boot's own jobs (``scan``, ``sweep``: housekeeping) are not counted
and the finished jobs are exactly the test's.
"""

from __future__ import annotations

import subprocess
import threading

import psycopg
import pytest

from support import base_env, script, wait_until
from vpay.base import metrics
from vpay.engine import vacuum
from vpay.base.db import ConfigError

EVERY = 20


def _vacuums(db) -> int:
    return db.execute("SELECT vacuum_count FROM pg_stat_user_tables "
                      "WHERE relid = 'jobs'::regclass").fetchone()[0]


def _noops(db, n: int, prefix: str) -> None:
    db.execute("INSERT INTO jobs (kind, lane, dedupe_key) "
               "SELECT 'test.noop', 'webhooks', %s || g FROM generate_series(1, %s) g", (prefix, n))


def _none_left(db) -> bool:
    return db.execute("SELECT count(*) FROM jobs WHERE kind = 'test.noop'").fetchone()[0] == 0


def _worker(spawn, db_url, every: str | None):
    extra = {"VPAY_TEST_HANDLERS": "1"}
    if every is not None:
        extra["VPAY_JOBS_VACUUM_EVERY"] = every
    worker = spawn("vpay-worker", "--queues", "webhooks", "--worker-concurrency", "2",
                   env=base_env(db_url, **extra))
    worker.wait_for_log("worker started")
    return worker


def _drained(worker) -> dict:
    """SIGTERM, a clean exit, and the final gauge line."""
    worker.signal()
    assert worker.wait(60) == 0, worker.text()[-3000:]
    return worker.find("gauge", final=True)[0]


def test_the_nth_finished_job_starts_a_vacuum_of_jobs(db, db_url, spawn):
    before = _vacuums(db)
    worker = _worker(spawn, db_url, str(EVERY))
    _noops(db, EVERY, "v:")
    wait_until(lambda: _vacuums(db) > before, timeout=60, what="the worker's vacuum of jobs")
    line = worker.wait_for_log("jobs vacuumed")
    assert line["result"] == "done" and line["finished"] == EVERY
    assert _none_left(db)
    final = _drained(worker)
    assert final["jobs_vacuum"]["runs"] == {"done": 1, "skipped": 0, "error": 0}
    assert final["jobs_vacuum"]["since"] == 0
    assert _vacuums(db) == before + 1


def test_one_finished_job_fewer_starts_no_vacuum(db, db_url, spawn):
    before = _vacuums(db)
    worker = _worker(spawn, db_url, str(EVERY))
    _noops(db, EVERY - 1, "v:")
    wait_until(lambda: _none_left(db), timeout=60, what="the jobs to be done")
    # The count is kept by the loops as they write each outcome, before the
    # drain ends them: the final line says exactly where it stood, and a
    # process that has exited vacuums nothing later.
    final = _drained(worker)
    assert final["jobs_vacuum"] == {"every": EVERY, "since": EVERY - 1, "due": False,
                                    "runs": {"done": 0, "skipped": 0, "error": 0}}
    assert not worker.find("jobs vacuumed")
    assert _vacuums(db) == before


def test_vpay_jobs_vacuum_every_0_turns_the_workers_vacuum_off(db, db_url, spawn):
    before = _vacuums(db)
    worker = _worker(spawn, db_url, "0")
    assert worker.find("worker started")[0]["jobs_vacuum_every"] == 0
    _noops(db, 5 * EVERY, "v:")
    wait_until(lambda: _none_left(db), timeout=60, what="the jobs to be done")
    final = _drained(worker)
    assert "jobs_vacuum" not in final  # no vacuum thread was started at all
    assert _vacuums(db) == before


@pytest.mark.parametrize("bad", ["-1", str(vacuum.MAX_VACUUM_EVERY + 1), "many", "1.5"])
def test_a_vacuum_setting_that_cannot_be_meant_is_refused_at_boot_with_78(db, db_url, bad):
    res = subprocess.run([script("vpay-worker")], env=base_env(db_url, VPAY_JOBS_VACUUM_EVERY=bad),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 78, res.stdout[-2000:] + res.stderr[-2000:]
    assert "VPAY_JOBS_VACUUM_EVERY" in res.stderr
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0  # booted nothing


def test_the_setting_is_read_to_its_bounds():
    assert vacuum.every_from_env({}) == vacuum.VACUUM_EVERY == 5000
    assert vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": " "}) == vacuum.VACUUM_EVERY
    assert vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": "0"}) == 0
    assert vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": "1"}) == 1
    top = str(vacuum.MAX_VACUUM_EVERY)
    assert vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": top}) == vacuum.MAX_VACUUM_EVERY
    with pytest.raises(ConfigError):
        vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": str(vacuum.MAX_VACUUM_EVERY + 1)})
    with pytest.raises(ConfigError):
        vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": "-1"})


def test_a_vacuum_is_skipped_at_once_while_jobs_is_being_vacuumed_by_someone_else(db, db_url):
    before = _vacuums(db)
    # What a running vacuum (another replica's, autovacuum) holds on jobs.
    with psycopg.connect(db_url) as other:
        other.execute("LOCK TABLE jobs IN SHARE UPDATE EXCLUSIVE MODE")
        result, detail = vacuum.vacuum_jobs(db_url)
        assert result == "skipped" and "lock not available" in detail
    assert _vacuums(db) == before
    assert vacuum.vacuum_jobs(db_url) == ("done", None)
    assert _vacuums(db) == before + 1


def test_a_vacuum_longer_than_its_timeout_is_cancelled_and_reported(db, db_url):
    # 100,000 dead rows: far more than a vacuum gets through in a millisecond.
    db.execute("INSERT INTO jobs (kind, lane, dedupe_key) "
               "SELECT 'test.noop', 'webhooks', 'dead:' || g FROM generate_series(1, 100000) g")
    db.execute("DELETE FROM jobs")
    before = _vacuums(db)
    result, detail = vacuum.vacuum_jobs(db_url, timeout=0.001)
    assert result == "error" and "statement timeout" in detail
    assert _vacuums(db) == before


def test_a_vacuum_that_cannot_run_is_counted_and_the_thread_goes_on(db, db_url):
    def count(result):
        return metrics.REGISTRY.get_sample_value("vpay_jobs_vacuums_total", {"result": result}) or 0.0

    halt = threading.Event()
    errors, skipped, done = count("error"), count("skipped"), count("done")
    thread = vacuum.JobsVacuum(db_url, 3, halt, "t", min_interval=0.0)
    thread.start()
    try:
        with psycopg.connect(db_url) as other:
            other.execute("LOCK TABLE jobs IN SHARE UPDATE EXCLUSIVE MODE")
            thread.finished(3)
            wait_until(lambda: thread.snapshot()["runs"]["skipped"] == 1, timeout=30,
                       what="the vacuum to be skipped")
        thread.finished(2)
        assert thread.snapshot()["due"] is False and thread.snapshot()["since"] == 2
        thread.finished(1)
        wait_until(lambda: thread.snapshot()["runs"]["done"] == 1, timeout=30, what="a vacuum")
        thread.url = "postgresql://vpay@127.0.0.1:9/nowhere"  # nothing listens on port 9
        thread.finished(3)
        wait_until(lambda: thread.snapshot()["runs"]["error"] == 1, timeout=30,
                   what="the failed vacuum to be counted")
        assert thread.is_alive()
    finally:
        thread.stop()
        thread.join(10)
    assert (count("skipped") - skipped, count("done") - done, count("error") - errors) == (1, 1, 1)


def test_two_vacuums_of_one_process_begin_at_least_the_minimum_interval_apart():
    thread = vacuum.JobsVacuum("postgresql://unused/x", 1, threading.Event())
    assert thread.min_interval == vacuum.MIN_INTERVAL_SECONDS == 1.0
    assert thread.pause_before(0.0) == 0.0  # no vacuum yet: at once
    thread._last_start = 100.0
    assert thread.pause_before(100.0) == 1.0
    assert 0 < thread.pause_before(100.999) <= 0.001 + 1e-9
    assert thread.pause_before(101.0) == 0.0
    assert thread.pause_before(250.0) == 0.0
