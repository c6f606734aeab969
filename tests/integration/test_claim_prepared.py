"""A cold worker's planning (issue 30, docs/performance.md "A fifth run"):
psycopg prepares a statement once per set of parameter types, and Postgres
plans each prepared statement afresh on every connection (five custom
plans, then a generic one). A claim statement costs about 1 ms to plan, so
the claims keep one set of types whatever their values (an id of any size,
no job to finish, lent and skipped lists empty or not), and the worker's
pool prepares a statement on its second run (vpay.base.db.PREPARE_AT_ONCE),
leaving nothing prepared on the server for its idle check or a failed run."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from vpay.base import db as vdb
from vpay.engine import queue
from vpay.money import lanes as _money_lanes  # noqa: F401 - registers the rail and webhook lanes


def _claim_statements(conn) -> dict[str, int]:
    """This session's prepared claim statements: ``{"claim_lane": n,
    "claim_lanes": m}`` (``pg_prepared_statements``: this session's only)."""
    rows = conn.execute("SELECT statement FROM pg_prepared_statements "
                        "WHERE statement LIKE '%%WITH finished AS%%'", prepare=False).fetchall()
    many = sum(1 for (text,) in rows if "lane = ANY(" in text)
    return {"claim_lane": len(rows) - many, "claim_lanes": many}


def _jobs(db, n: int, lane: str = "housekeeping") -> None:
    for i in range(n):
        queue.enqueue(db, "noop", f"prep-{lane}-{uuid.uuid4()}", {}, lane=lane)


def test_claims_prepare_one_statement_each_whatever_the_values(db, db_url):
    _jobs(db, 12)
    _jobs(db, 3, lane="webhooks")
    pool = vdb.make_pool(db_url, max_size=1, prepare_at_once=True)
    try:
        with pool.connection() as conn:
            for lanes in (("housekeeping",), ("housekeeping", "mtn")):
                # a plain claim: nothing to finish, nothing lent, nobody skipped
                job, _ = queue.claim_or_next_due(conn, "w1", 30.0, lanes)
                assert job is not None
                # a small id, then lent lanes and a party skipped
                _, job, _ = queue.finish_and_claim(conn, job, 30.0, lanes)
                _, job, _ = queue.finish_and_claim(conn, job, 30.0, lanes, lent=["webhooks"],
                                                   skip=["housekeeping/noop/m_nobody"])
                # ids past int2 and int4 (psycopg sends an int by its size)
                for big in (40_000, 3_000_000_000):
                    conn.execute("UPDATE jobs SET id = %s WHERE id = %s", (big, job.id))
                    job = queue.Job(**{**job.__dict__, "id": big})
                    finished, job, _ = queue.finish_and_claim(conn, job, 30.0, lanes)
                    assert finished
                # the plain claim again, with lists given empty
                queue.finish_and_claim(conn, job, 30.0, lanes)
                queue.claim_or_next_due(conn, "w1", 30.0, lanes, lent=[], skip=[])
            assert _claim_statements(conn) == {"claim_lane": 1, "claim_lanes": 1}
    finally:
        pool.close()


@pytest.mark.parametrize("setting, at_once, prepared", [
    ("on", True, [0, 1]),     # the worker's pool: prepared on the second run
    ("on", False, [0, 0]),    # psycopg's default: after five runs
    ("off", True, [0, 0]),    # behind a transaction pooler, never
])
def test_the_workers_pool_prepares_a_statement_on_its_second_run(db, db_url, monkeypatch,
                                                                 setting, at_once, prepared):
    monkeypatch.setenv("VPAY_DATABASE_PREPARED_STATEMENTS", setting)
    pool = vdb.make_pool(db_url, max_size=1, prepare_at_once=at_once)
    seen = []
    try:
        with pool.connection() as conn:
            for _ in range(2):
                conn.execute("SELECT count(*) FROM jobs WHERE lane = %s", ("mtn",)).fetchone()
                seen.append(_prepared_like(conn, "%FROM jobs WHERE lane%"))
    finally:
        pool.close()
    assert seen == prepared


def _prepared_like(conn, pattern: str) -> int:
    return conn.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                        (pattern,), prepare=False).fetchone()[0]


def test_the_pools_idle_check_and_failed_runs_leave_nothing_prepared(db, db_url, monkeypatch):
    # A fresh-clone review (issue 30): at psycopg's threshold 0 each idle
    # check (an empty query) and each run that failed before a first success
    # left a prepared statement on the server, never deallocated.
    monkeypatch.setattr(vdb, "CHECK_IDLE_SECONDS", 0.0)  # every checkout checks
    pool = vdb.make_pool(db_url, max_size=1, prepare_at_once=True)
    try:
        for _ in range(5):
            with pool.connection() as conn:
                with pytest.raises(psycopg.errors.DivisionByZero):
                    conn.execute("SELECT 1 / %s", (0,))
        with pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM pg_prepared_statements",
                                prepare=False).fetchone()[0] == 0
    finally:
        pool.close()
