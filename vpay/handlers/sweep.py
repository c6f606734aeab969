"""``sweep:expired``: the hourly housekeeping sweep (design page, "Leases and
crash recovery": the third place leases are reaped). It reaps expired leases,
deletes Idempotency-Key records past their 24 hours, and reschedules itself;
it never ends (``RetryAfter`` one hour)."""

from __future__ import annotations

import logging

from .. import queue
from ..outcome import RetryAfter
from ..queries import Q
from . import HOURLY, register

log = logging.getLogger("vpay.handlers.sweep")


@register("sweep")
def sweep(job, ctx):
    lease = ctx.lease_seconds
    with ctx.pool.connection() as conn:
        reaped = queue.reap_expired_leases(conn, lease)
        keys = conn.execute(Q["delete_expired_idempotency_keys"]).rowcount
    log.info("sweep", extra={"worker_id": ctx.worker_id, "reaped": len(reaped),
                             "idempotency_keys_deleted": keys, "dedupe_key": job.dedupe_key})
    return RetryAfter(HOURLY)
