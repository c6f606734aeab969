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
* ``test.hold``: no database work. On its first attempt it waits until the
  file ``payload["until"]`` exists (``HOLD_MAX_SECONDS`` at most), so a test
  decides when the handler returns (after a SIGKILL, a SIGSTOP, an outage);
  a later attempt (the job reaped and run elsewhere) does not wait. Answers
  ``RetryAfter(payload["retry_after"])`` when given, else ``Done``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

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


HOLD_MAX_SECONDS = 600.0
"""The longest ``test.hold`` waits for its file: a test that never writes it
leaves no handler behind for ever."""


@register("test.hold")
def hold(job, ctx):
    if job.attempts == 1 and job.payload.get("until"):
        deadline = time.monotonic() + HOLD_MAX_SECONDS
        until = Path(job.payload["until"])
        while not until.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    if "retry_after" in job.payload:
        return RetryAfter(float(job.payload["retry_after"]))
    return Done()
