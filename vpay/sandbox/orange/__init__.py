"""A local test/demo double of Orange Money's Web Payment API ("OM WebPay"):
``OrangeSandbox``.

This is **not** Orange's sandbox and never talks to Orange: it is an
in-process HTTP server that answers the shapes recorded in
``design/rails.md`` ("Orange Money Web Payment") closely enough that vpay's
Orange adapter (``vpay.rails.orange``) works against it unchanged, for
end-to-end tests and demos. Standard library only. Its parts:

* ``webpay``: the HTTP API (token, webpayment, transaction status, payment page).
* ``orders``: the status words, the payment record, per-order scripts.
* ``notify``: the notifications posted to ``notif_url``.
* ``sandbox``: ``OrangeSandbox``, its configuration and Python control API.
* ``cli``: ``python -m vpay.sandbox.orange --port 8091``."""

from __future__ import annotations

from vpay.sandbox.orange.cli import main
from vpay.sandbox.orange.orders import STATUSES, order_of
from vpay.sandbox.orange.sandbox import DEFAULT_CLIENT_ID, DEFAULT_CLIENT_SECRET, DEFAULT_MERCHANT_KEY, OrangeSandbox

__all__ = ["OrangeSandbox", "DEFAULT_CLIENT_ID", "DEFAULT_CLIENT_SECRET", "DEFAULT_MERCHANT_KEY",
           "STATUSES", "main", "order_of"]
