"""``OrangeSandbox``: the Orange Money Web Payment double put together: its
configuration (client credentials, merchant key, country), its state, the
environment that points vpay's adapter at it, and its Python control API:

* ``script_order(order_or_ref, **opts)`` / ``set_default(**opts)`` (orders
  without a script of their own; options: ``orders.py``).
* ``fail_next_inits(*codes)``: the next webpayment calls answer these HTTP
  codes without recording a payment. ``lose_next_init_answers(*codes)``:
  after those, the next calls record the payment but answer these codes
  (Orange took it and we never heard; a re-send then gets 403).
* ``set_status(order_or_ref, status)``: force a status for ever (posts the
  notification when it is SUCCESS or FAILED and notifications are on).
* ``notify(...)`` (``notify.py``).
* Inspection: ``payments()``, ``payment(order_or_ref)`` (including
  ``notif_token`` and ``pay_token``: it is a test double), ``requests_log()``
  (every API request as ``{method, path, order_id, status_code, at}``),
  ``count(method=None, path_suffix=None, order_id=None)``, ``notifications()``.
  ``reset()`` forgets payments, scripts and logs (tokens stay valid)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from vpay.sandbox.server import ServedDouble
from vpay.sandbox.orange.notify import Notifications
from vpay.sandbox.orange.orders import STATUSES, _parse_script, _Payment, _Script, order_of
from vpay.sandbox.orange.webpay import WebPay, _Handler

log = logging.getLogger("vpay.sandbox.orange")

DEFAULT_CLIENT_ID = "orange-sandbox-client"
DEFAULT_CLIENT_SECRET = "orange-sandbox-secret"
DEFAULT_MERCHANT_KEY = "orange-sandbox-merchant-key"


class OrangeSandbox(WebPay, Notifications, ServedDouble):
    """A local Orange Money Web Payment double (see ``vpay.sandbox.orange``).

    ``with OrangeSandbox() as orange: ...`` serves on 127.0.0.1 and an
    ephemeral port in a background thread; ``orange.url`` is the API root to
    give the adapter as ``VPAY_ORANGE_BASE_URL``, with ``client_id``,
    ``client_secret``, ``merchant_key`` and ``country``.
    """

    label = "Orange sandbox"
    thread_prefix = "orange-sandbox"
    lifecycle_log = log

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 client_id: str = DEFAULT_CLIENT_ID, client_secret: str = DEFAULT_CLIENT_SECRET,
                 merchant_key: str = DEFAULT_MERCHANT_KEY, country: str = "dev",
                 token_ttl_seconds: int = 3600, auto_notify: bool = True,
                 max_log_entries: int = 100_000) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.merchant_key = merchant_key
        self.country = country
        self.token_ttl_seconds = token_ttl_seconds
        self.auto_notify = auto_notify
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}        # access token -> monotonic expiry
        self._payments: dict[str, _Payment] = {}   # by order_id
        self._by_pay_token: dict[str, str] = {}    # pay_token -> order_id
        self._scripts: dict[str, _Script] = {}     # by order_id
        self._default = _Script()
        self._init_errors: list[int] = []
        self._init_lost: list[int] = []
        self._log: deque[dict[str, Any]] = deque(maxlen=max_log_entries)
        self._notifications: deque[dict[str, Any]] = deque(maxlen=max_log_entries)
        self._bind(host, port, _Handler)

    def env(self, notif_url: str, **extra: str) -> dict[str, str]:
        """``VPAY_ORANGE_*`` pointing vpay's adapter at this sandbox;
        ``notif_url`` is the API's ``…/provider/orange/callback``."""
        return {"VPAY_ORANGE_BASE_URL": self.url, "VPAY_ORANGE_CLIENT_ID": self.client_id,
                "VPAY_ORANGE_CLIENT_SECRET": self.client_secret,
                "VPAY_ORANGE_MERCHANT_KEY": self.merchant_key, "VPAY_ORANGE_COUNTRY": self.country,
                "VPAY_ORANGE_NOTIF_URL": notif_url,
                "VPAY_ORANGE_RETURN_URL": "http://127.0.0.1/shop/return",
                "VPAY_ORANGE_CANCEL_URL": "http://127.0.0.1/shop/cancel", **extra}

    # ------------------------------------------------------------ scripting

    def script_order(self, order_or_ref: str, **opts: Any) -> dict[str, Any]:
        """Script one order (before or after its init); no options = back to
        the default. Raises ``ValueError`` for a bad option."""
        script = _parse_script(opts)
        with self._lock:
            self._scripts[order_of(order_or_ref)] = script
        return script.as_dict()

    def set_default(self, **opts: Any) -> dict[str, Any]:
        """The script of every order without one of its own."""
        script = _parse_script(opts)
        with self._lock:
            self._default = script
        return script.as_dict()

    def fail_next_inits(self, *codes: int) -> None:
        """The next webpayment calls answer these HTTP codes, recording nothing."""
        with self._lock:
            self._init_errors.extend(int(c) for c in codes)

    def lose_next_init_answers(self, *codes: int) -> None:
        """The next webpayment calls (after ``fail_next_inits``'s) record the
        payment, then answer these HTTP codes."""
        with self._lock:
            self._init_lost.extend(int(c) for c in codes)

    def set_status(self, order_or_ref: str, status: str) -> dict[str, Any]:
        """Force an order's status for ever. Raises ``KeyError`` for an unknown
        order, ``ValueError`` for an unknown status."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}")
        with self._lock:
            payment = self._payments[order_of(order_or_ref)]
            payment.forced = True
            fire = self._become(payment, status)
            view = payment.view()
        if fire:
            threading.Thread(target=fire, daemon=True).start()
        return view

    def reset(self) -> None:
        """Forget payments, scripts, scripted init errors and logs (tokens stay valid)."""
        with self._lock:
            self._payments.clear()
            self._by_pay_token.clear()
            self._scripts.clear()
            self._default = _Script()
            self._init_errors.clear()
            self._init_lost.clear()
            self._log.clear()
            self._notifications.clear()

    # ------------------------------------------------------------ inspection

    def payments(self) -> list[dict[str, Any]]:
        """Every order's view, oldest first."""
        with self._lock:
            return [p.view() for p in self._payments.values()]

    def payment(self, order_or_ref: str) -> dict[str, Any] | None:
        """One order's view, or None."""
        with self._lock:
            p = self._payments.get(order_of(order_or_ref))
            return p.view() if p else None

    def requests_log(self) -> list[dict[str, Any]]:
        """Every API request received, in arrival order."""
        with self._lock:
            return list(self._log)

    def count(self, method: str | None = None, path_suffix: str | None = None,
              order_id: str | None = None) -> int:
        """API requests received matching every given filter; ``order_id``
        may be a vpay ``rail_reference``."""
        wanted = order_of(order_id) if order_id else None
        with self._lock:
            return sum(1 for r in self._log
                       if (method is None or r["method"] == method)
                       and (path_suffix is None or r["path"].endswith(path_suffix))
                       and (wanted is None or r["order_id"] == wanted))
