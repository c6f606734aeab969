"""``sample:overview``: once a minute, the queue's depth per lane (due,
leased, dead, the oldest due job's age) into ``console_samples``, so the
console's overview draws the last 24 hours without Prometheus
(docs/console.md, "Overview"). Samples older than two days are deleted as it
samples; it never ends (``RetryAfter`` one minute)."""

from __future__ import annotations

from vpay.engine.outcome import RetryAfter
from vpay.handlers.registry import register
from vpay.money import overview

EVERY_SECONDS = 60.0


@register("sample")
def sample(job, ctx):
    with ctx.pool.connection() as conn:
        overview.sample(conn)
    return RetryAfter(EVERY_SECONDS)
