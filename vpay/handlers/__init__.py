"""Job handlers: one module per job kind, dispatched by ``jobs.kind``.

A handler is a plain function ``(job, ctx) -> Outcome``. It never touches its
own job row (the loop owns it), and it is a compare-and-swap: re-running it
after a crash matches no rows and answers ``Done`` (design page, "The job
queue").
"""

from __future__ import annotations

import os

from vpay.handlers.registry import HOURLY, REGISTRY, SCHEDULED, Context, Handler, ensure_scheduled, handle, register

__all__ = ["HOURLY", "REGISTRY", "SCHEDULED", "Context", "Handler", "ensure_scheduled", "handle", "register"]


def _load() -> None:
    from vpay.handlers import poll, refund_poll, resubmit, sample, scan, sweep, webhooks  # noqa: F401  (registers)
    if os.environ.get("VPAY_TEST_HANDLERS") == "1":
        from vpay.handlers import testing  # noqa: F401


_load()
