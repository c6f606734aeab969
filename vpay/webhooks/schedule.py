"""The retry schedule: what one attempt's answer means for the next.

2xx is delivered; 410 disables the endpoint; 429/503 with ``Retry-After``
delay the next attempt at least that long, bounded by
``RETRY_AFTER_CAP_SECONDS``; anything else, redirects included, timeouts and
connection errors, is retried on ``RETRY_SCHEDULE`` (Standard Webhooks,
"Deliverability": the example schedule, about three days, with jitter) and
then dead-lettered.
"""

from __future__ import annotations

import random
from dataclasses import dataclass




from vpay.webhooks.transport import Attempt


RETRY_AFTER_CAP_SECONDS = 3600.0
RETRY_SCHEDULE: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
"""Seconds before attempt n + 1 after attempt n failed (n = 1 … 9): 5 s,
5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h. Standard Webhooks' example
schedule; about 3.1 days from the first attempt to the tenth."""
MAX_ATTEMPTS = len(RETRY_SCHEDULE) + 1
JITTER = 0.1  # each delay is scaled by a uniform factor in [1 - JITTER, 1 + JITTER]


def retry_delay(attempt: int, rng: random.Random | None = None) -> float | None:
    """Seconds to wait after attempt number ``attempt`` (1-based: the job's
    ``attempts``) failed: ``RETRY_SCHEDULE[attempt - 1]`` with ±10 % jitter;
    None once ``attempt`` >= ``MAX_ATTEMPTS`` (the delivery is given up).
    Raises ``ValueError`` for ``attempt`` < 1. Source: the issue (point 3)
    and Standard Webhooks' example schedule."""
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    if attempt > len(RETRY_SCHEDULE):
        return None
    return RETRY_SCHEDULE[attempt - 1] * (rng or random).uniform(1 - JITTER, 1 + JITTER)


@dataclass(frozen=True)
class Decision:
    """What to do after an attempt: ``action`` is ``"delivered"``,
    ``"gone"`` (410: disable the endpoint), ``"retry"`` (in ``delay``
    seconds) or ``"give_up"``; ``note`` is for ``last_error`` and logs."""

    action: str
    delay: float = 0.0
    note: str = ""


def decide(attempt: Attempt, attempt_no: int, rng: random.Random | None = None) -> Decision:
    """The rule of the issue (point 3) and Standard Webhooks ("Delivery
    success and failure"): 2xx → delivered; 410 → gone; a permanent policy
    refusal → give up; otherwise retry after ``retry_delay(attempt_no)``,
    or give up when the schedule is spent. On 429 and 503, ``Retry-After``
    is honoured as a lower bound capped at ``RETRY_AFTER_CAP_SECONDS``: the
    next attempt is never sooner than the receiver asked (up to an hour),
    nor sooner than the schedule, so a receiver answering ``Retry-After:
    1`` cannot spend the ten attempts in ten seconds."""
    code = attempt.status_code
    if code is not None and 200 <= code < 300:
        return Decision("delivered", note=attempt.summary)
    if code == 410:
        return Decision("gone", note="receiver answered 410 Gone")
    if attempt.permanent:
        return Decision("give_up", note=f"{attempt.summary} (permanent)")
    delay = retry_delay(attempt_no, rng)
    if delay is None:
        return Decision("give_up", note=f"webhook delivery gave up after {attempt_no} attempts; "
                                        f"last: {attempt.summary}")
    if code in (429, 503) and attempt.retry_after is not None:
        delay = max(delay, min(attempt.retry_after, RETRY_AFTER_CAP_SECONDS))
    return Decision("retry", delay=delay, note=f"attempt {attempt_no}: {attempt.summary}")


