"""``sweep:expired``: the hourly housekeeping sweep (design page, "Leases and
crash recovery": the third place leases are reaped). It reaps expired leases,
escalates every charge and every refund still pending past the 24-hour
horizon (even one whose poll job was dead-lettered: "The escalation does not
depend on the rail answering"), deletes Idempotency-Key records past their 24 hours,
prunes finished rows older than ``VPAY_RETENTION_DAYS`` (``vpay.money.operator.prune``, and
``vpay.money.overview.prune`` for ``rail_calls``;
0 keeps everything), and reschedules itself; it never ends (``RetryAfter``
one hour)."""

from __future__ import annotations

import logging

from vpay.money import charges, operator, overview, pollable, refunds
from vpay.engine import queue
from vpay.engine.outcome import RetryAfter
from vpay.base.queries import Q
from vpay.handlers.registry import HOURLY, register

log = logging.getLogger("vpay.handlers.sweep")


@register("sweep")
def sweep(job, ctx):
    with ctx.pool.connection() as conn:
        reaped = queue.reap_expired_leases(conn)
        keys = conn.execute(Q["delete_expired_idempotency_keys"]).rowcount
        horizon = ctx.settings.escalate_after_seconds
        escalated = charges.escalate(conn, None, horizon)
        escalated_refunds = pollable.escalate(conn, refunds.REFUNDS, None, horizon)
        days = ctx.settings.retention_days
        pruned = operator.prune(conn, days) if days > 0 else {}
        if days > 0:  # the console's rail-call log and sign-in failures, under the same retention
            pruned = {**pruned, **overview.prune(conn, days)}
    log.info("sweep", extra={"worker_id": ctx.worker_id, "reaped": len(reaped),
                             "idempotency_keys_deleted": keys, "escalated": len(escalated),
                             "escalated_refunds": len(escalated_refunds),
                             "retention_days": days, "pruned": pruned,
                             "dedupe_key": job.dedupe_key})
    return RetryAfter(HOURLY)
