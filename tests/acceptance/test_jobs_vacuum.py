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

import pytest

from support import base_env, script, wait_until
from vpay.engine import vacuum

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
