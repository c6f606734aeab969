"""What a worker leaves to the reapers, in process against a real Postgres: an
answer that is not an outcome keeps its lease for the reaper, and a claim loop
that dies never ends in a clean drain. The integration half of
tests/acceptance/test_crash_safety.py (the kill -9 tests).
"""

from __future__ import annotations

from vpay.engine import queue
from test_crash_safety import _job  # helpers kept in tests/acceptance/test_crash_safety.py


# ---- claim loops never die quietly -------------------------------------------


def _in_process_worker(pool, wid="w-loop", concurrency=1):
    from vpay import handlers
    from vpay.worker.loop import Worker, WorkerConfig
    from vpay.worker.sdnotify import Notifier
    from vpay.worker.signals import ShutdownSignals
    ctx = handlers.Context(pool=pool, worker_id=wid)
    return Worker(pool, ctx, WorkerConfig(worker_id=wid, concurrency=concurrency, idle_sleep=0.1),
                  ShutdownSignals(), Notifier(None))


def test_an_answer_that_is_not_an_outcome_leaves_the_lease_to_the_reaper(db, pool, monkeypatch):
    from vpay import handlers
    monkeypatch.setitem(handlers.REGISTRY, "test.garbage", lambda job, ctx: "not an Outcome")
    queue.enqueue(db, "test.garbage", "garbage")
    worker = _in_process_worker(pool)
    job = queue.claim(db, "w-loop")
    worker._run(job)  # returns: the claim loop that ran it lives on
    assert _job(db, "garbage")["locked_by"] == "w-loop"  # left for the reaper to count and park
    db.execute("UPDATE jobs SET locked_at = now() - interval '1 hour', "
               "lease_expires_at = now() - interval '1 hour' + interval '300 seconds'")
    assert [r["parked"] for r in queue.reap_expired_leases(db)] == [False]
    assert _job(db, "garbage")["failures"] == 1


def test_a_claim_loop_that_dies_never_ends_in_a_clean_drain(db, pool, monkeypatch):
    from vpay import handlers
    from vpay.worker.signals import Drain

    def escapes(job, ctx):
        raise SystemExit(5)  # a BaseException: no handler error path catches it

    monkeypatch.setitem(handlers.REGISTRY, "test.escape", escapes)
    queue.enqueue(db, "test.escape", "escape")
    drain = _in_process_worker(pool, concurrency=2).run()  # no signal: the dead loop ends it
    assert drain is Drain.CRASHED
    assert drain.value not in (0, 1, 2, 78)  # contract: anything else is a crash
