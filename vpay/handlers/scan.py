"""``scan:live``: the hourly backstop (design page, "The job queue"). Every
``pending`` or ``unresolved`` charge untouched for ten minutes that has no
poll job gets one (``ON CONFLICT DO NOTHING``). The poll job is born with the
charge, so this finds only what something deleted by hand."""

from __future__ import annotations

import logging

from vpay.engine.outcome import RetryAfter
from vpay.base.queries import Q
from vpay.handlers.registry import HOURLY, register

log = logging.getLogger("vpay.handlers.scan")

UNTOUCHED_SECONDS = 600


@register("scan")
def scan(job, ctx):
    with ctx.pool.connection() as conn:
        rows = conn.execute(Q["scan_live"], {"untouched": UNTOUCHED_SECONDS}).fetchall()
    log.info("scan", extra={"worker_id": ctx.worker_id, "dedupe_key": job.dedupe_key,
                            "enqueued": len(rows), "charges": [r[0] for r in rows][:50]})
    return RetryAfter(HOURLY)
