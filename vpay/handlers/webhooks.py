"""Webhook fan-out and delivery on the same queue (design page: "the same
queue carries webhook fan-out and delivery").

``fanout:<event_id>`` creates one ``deliver:<event_id>:<endpoint_id>`` job per
enabled endpoint of the event's merchant; re-running creates nothing new.
"""

from __future__ import annotations

from ..outcome import Done
from ..queries import Q
from . import register


@register("fanout")
def fanout(job, ctx):
    event_id = job.payload.get("event_id")
    with ctx.pool.connection() as conn:
        rows = conn.execute(Q["fanout_deliveries"], {"event_id": event_id}).fetchall()
    return Done(f"{len(rows)} deliveries")
