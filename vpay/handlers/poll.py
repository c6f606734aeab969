"""``poll:<charge_id>``: ask the rail how a charge ended, on the poll ladder.

The body is the one every pollable operation shares
(``vpay.handlers.polling``; the rules: ``vpay.money.pollable``). What is a
charge's own is in ``vpay.money.CHARGES``: its intent settles with it, its
prompt expires (once) past the prompt TTL, and a 404 for a request-to-pay the
rail never confirmed enqueues ``resubmit:<charge_id>``.
"""

from __future__ import annotations

from vpay.money.charges import CHARGES
from vpay.money.pollable import LADDER, UNRESOLVED_EVERY, poll_delay
from vpay.handlers.polling import register_pollable

__all__ = ["LADDER", "UNRESOLVED_EVERY", "poll", "poll_delay"]

poll = register_pollable(CHARGES)
