"""The worker's own vacuum of ``jobs`` (vpay/engine/vacuum.py; issue #15, "Churn"),
in process against a real Postgres: a vacuum skipped while another runs, one
cancelled past its timeout, one that cannot run. The integration half of
tests/acceptance/test_jobs_vacuum.py (the installed ``vpay-worker``).
"""

from __future__ import annotations

import threading

import psycopg

from support import wait_until
from vpay.base import metrics
from vpay.engine import vacuum
from test_jobs_vacuum import _vacuums  # helpers kept in tests/acceptance/test_jobs_vacuum.py


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
