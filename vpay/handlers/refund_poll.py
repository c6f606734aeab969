"""``refund_poll:<refund_id>``: ask the rail how a refund ended, on the poll
ladder (docs/flows/refunds.md).

The body is the one every pollable operation shares
(``vpay.handlers.polling``; the rules: ``vpay.money.pollable``). What is a
refund's own is in ``vpay.money.refunds.REFUNDS``: its status read is
``Rail.refund_status``, its event hangs off the refunded charge's intent, and
a 404 for a refund the rail never confirmed re-sends it at once with the same
``X-Reference-Id`` (a rejection then fails the refund).
"""

from __future__ import annotations

from vpay.money.refunds import REFUNDS
from vpay.handlers.polling import register_pollable

refund_poll = register_pollable(REFUNDS)
