"""``sweep:expired``: the hourly housekeeping sweep (design page, "Leases and
crash recovery": the third place leases are reaped). It reaps expired leases,
deletes the ``workers`` rows of workers dead or stopped for longer than
``workers.DEAD_WORKER_RETENTION_SECONDS`` (a week), escalates every charge and
every refund still pending past the 24-hour horizon (even one whose poll job was dead-lettered: "The escalation does not
depend on the rail answering"), deletes Idempotency-Key records past their 24 hours,
prunes finished rows older than ``VPAY_RETENTION_DAYS`` (``vpay.money.operator.prune``, and
``vpay.money.overview.prune`` for ``rail_calls``;
0 keeps everything), and reschedules itself; it never ends (``RetryAfter``
one hour)."""

from __future__ import annotations

import logging

from vpay.money import charges, operator, overview, pollable, refunds
from vpay.engine import queue, workers
from vpay.engine.outcome import RetryAfter
from vpay.base.queries import Q
from vpay.handlers.registry import HOURLY, register

log = logging.getLogger("vpay.handlers.sweep")


@register("sweep")
def sweep(job, ctx):
    with ctx.pool.connection() as conn:
        reaped = queue.reap_expired_leases(conn)
        keys = conn.execute(Q["delete_expired_idempotency_keys"]).rowcount
        # rows of workers dead or stopped for a week (workers.DEAD_WORKER_RETENTION_SECONDS)
        gone_workers = workers.prune(conn)
        horizon = ctx.settings.escalate_after_seconds
        escalated = charges.escalate(conn, None, horizon)
        escalated_refunds = pollable.escalate(conn, refunds.REFUNDS, None, horizon)
        days = ctx.settings.retention_days
        pruned = operator.prune(conn, days) if days > 0 else {}
        if days > 0:  # the console's rail-call log and sign-in failures, under the same retention
            pruned = {**pruned, **overview.prune(conn, days)}
    log.info("sweep", extra={"worker_id": ctx.worker_id, "reaped": len(reaped),
                             "idempotency_keys_deleted": keys, "escalated": len(escalated),
                             "worker_rows_deleted": gone_workers,
                             "escalated_refunds": len(escalated_refunds),
                             "retention_days": days, "pruned": pruned,
                             "dedupe_key": job.dedupe_key})
    return RetryAfter(HOURLY)
