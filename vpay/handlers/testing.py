"""Job kinds for the queue's own tests, loaded only when the worker runs with
``VPAY_TEST_HANDLERS=1``. They exercise the loop with no rail involved.

* ``test.count``: inserts one row into ``test_executions`` (a side table the
  test creates) per execution, then ``Done``. Payload ``{"sleep": s}`` sleeps
  first.
* ``test.noop``: ``Done`` and nothing else, no database work: the benches'
  job (bench/peers.py), so a job's cost is the queue's alone.
* ``test.exit``: ``os._exit(3)``: the process dies mid-job every time (a
  poison job).
* ``test.raise``: raises ``RuntimeError`` every time.
* ``test.retry``: ``RetryAfter(payload["delay"])``.
"""

from __future__ import annotations

import os
import time

from vpay.engine.outcome import Done, RetryAfter
from vpay.handlers.registry import register


@register("test.count")
def count(job, ctx):
    time.sleep(float(job.payload.get("sleep", 0)))
    with ctx.pool.connection() as conn:
        conn.execute("INSERT INTO test_executions (job_key, worker) VALUES (%s, %s)",
                     (job.dedupe_key, ctx.worker_id))
    return Done()


@register("test.noop")
def noop(job, ctx):
    return Done()


@register("test.exit")
def exit_now(job, ctx):
    os._exit(3)


@register("test.raise")
def raise_always(job, ctx):
    raise RuntimeError(f"test.raise on attempt {job.attempts}")


@register("test.retry")
def retry(job, ctx):
    return RetryAfter(float(job.payload.get("delay", 60)))
