"""Endpoint back-off: a merchant endpoint that is timing out waits as a whole.

Issue "Isolation", input 1: an endpoint that accepts the connection and never
answers costs every one of its deliveries a whole attempt deadline (connect
+ 2 x read, 35 s by default), one after the other, in the webhook lane;
with a burst of events to that merchant the lane is theirs and every other
merchant's deliveries wait. The retry schedule is per delivery and does not
help: each new event's first attempt is due at once.

So the endpoint is backed off, not only the delivery (rules applied by
``vpay.handlers.webhooks.deliver``):

* an attempt that timed out (no answer within the attempt's deadline, or no
  connection within the connect timeout) counts one more timeout in a row on
  the endpoint and sets ``backoff_until`` to now + ``BASE_SECONDS`` x
  2^(timeouts before it), at most ``CAP_SECONDS``: 30 s, 60 s, 120 s, ...,
  10 min;
* any answer (whatever its status) or a connection refused at once resets it;
* while ``backoff_until`` is in the future, a delivery to that endpoint is
  deferred to then without a POST (``gate`` answers the wait): no attempt
  spent, no failure, the delivery's own retry schedule untouched;
* when the back-off has passed, one delivery (the probe) takes the endpoint
  for one attempt's deadline and tries; the others keep waiting until the
  probe answers (reset) or times out (a longer back-off).

Columns ``webhook_endpoints.timeouts_in_row`` and ``backoff_until``
(migration 0012). The gate is asked in the statement that reads an attempt's
context (``webhook_attempt_start``), and an attempt's word on the endpoint is
written with its outcome (``webhook_attempt_end``), both in
``sql/queries/webhooks.sql``: two statements per delivery (issue 30).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from vpay.webhooks.transport import Attempt

log = logging.getLogger("vpay.webhooks")

BASE_SECONDS = 30.0
"""Back-off after the first timeout in a row; doubles with each further one."""
CAP_SECONDS = 600.0
"""The longest back-off (10 min)."""


@dataclass(frozen=True)
class Gate:
    """``wait_seconds`` before this delivery may POST (0: go now);
    ``probe`` when this delivery is the one trying a backed-off endpoint."""

    wait_seconds: float
    probe: bool = False


def timed_out(attempt: Attempt) -> bool:
    """Whether ``attempt`` ended because the endpoint did not answer in time
    (connect timeout, read timeout, or the attempt's total deadline), as
    opposed to an answer or a quick refusal."""
    return attempt.status_code is None and bool(attempt.error) and \
        attempt.error.startswith(("timeout", "connect timeout"))


def gate(row: dict) -> Gate:
    """The gate from an attempt's start (``webhook_attempt_start``'s
    ``wait_seconds`` and ``probe``; that statement wrote ``backoff_until`` only
    when this delivery became the probe)."""
    return Gate(float(row.get("wait_seconds") or 0.0), bool(row.get("probe")))


def said(attempt: Attempt) -> str:
    """What ``attempt`` says about its endpoint, for ``webhook_attempt_end``:
    ``timed_out`` (back it off) or ``answered`` (clear a back-off)."""
    return "timed_out" if timed_out(attempt) else "answered"


END_PARAMS = {"base_seconds": BASE_SECONDS, "cap_seconds": CAP_SECONDS}
"""The back-off's bounds, as ``webhook_attempt_end`` takes them."""


def noted(endpoint_id: str, row: tuple | None) -> float | None:
    """Log what ``webhook_attempt_end`` did to the endpoint (``row``: its
    ``timeouts_in_row, backoff_until, backoff_seconds, cleared``) and answer
    the back-off set, in seconds (None when none was)."""
    if row is None:
        return None
    timeouts, until, seconds, cleared = row
    if until is not None:
        log.warning("webhook endpoint backed off: it is timing out", extra={
            "endpoint_id": endpoint_id, "timeouts_in_row": timeouts,
            "backoff_until": until.isoformat(), "backoff_seconds": round(seconds, 1)})
        return float(seconds)
    if cleared:
        log.info("webhook endpoint answering again: back-off cleared", extra={"endpoint_id": endpoint_id})
    return None
