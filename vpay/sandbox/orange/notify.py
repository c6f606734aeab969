"""The Orange sandbox's notifications: when an order becomes SUCCESS or
FAILED (and notifications are on), ``POST notif_url`` with JSON ``{status,
notif_token, txnid}`` (no order id: design/rails.md), sent once, never
retried (Orange does not retry, afro.tools), with a 5 s timeout; and
``notify()``, which posts one now, synchronously, carrying the right, a wrong,
no or a literal ``notif_token``.

The ``Notifications`` mixin needs the sandbox's ``_lock``, ``_payments``,
``_scripts``, ``_default``, ``auto_notify`` and ``_notifications``."""

from __future__ import annotations

import json
import logging
import secrets
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from vpay.sandbox.orange.orders import NOTIFIED, SUCCESS, TOKEN_KINDS, _Payment, order_of

log = logging.getLogger("vpay.sandbox.orange")

_NOTIFY_TIMEOUT = 5.0


class Notifications:
    """State changes that notify, and the notifications themselves."""

    def _become(self, payment: _Payment, status: str) -> Callable[[], Any] | None:
        """Set ``status`` (lock held); answer the notification to post once the
        lock is released, or None."""
        payment.status = status
        if status == SUCCESS and payment.txnid is None:
            payment.txnid = "MP" + secrets.token_hex(6).upper()
        script = self._scripts.get(payment.order_id, self._default)
        enabled = self.auto_notify if script.notify is None else script.notify
        if status in NOTIFIED and enabled and not payment.notified:
            payment.notified = True
            kind = script.notify_token
            return lambda: self._post_notification(payment, kind, None)
        return None

    def notify(self, order_or_ref: str, token: str = "right", status: str | None = None) -> int | None:
        """Post a notification for an order now and answer our server's HTTP
        status (None when it could not be reached). ``token``: ``"right"``,
        ``"wrong"``, ``"missing"`` or a literal string; ``status``: what the
        body claims (default: the order's status)."""
        with self._lock:
            payment = self._payments[order_of(order_or_ref)]
        return self._post_notification(payment, token, status)

    def notifications(self) -> list[dict[str, Any]]:
        """Notifications posted: ``{order_id, url, status_claimed, token,
        status_code, error, at}`` (and ``body``, the answer, when there was one)."""
        with self._lock:
            return list(self._notifications)

    def _post_notification(self, payment: _Payment, token: str, status: str | None) -> int | None:
        body: dict[str, Any] = {"status": status or payment.status, "txnid": payment.txnid}
        if token == "right":
            body["notif_token"] = payment.notif_token
        elif token == "wrong":
            body["notif_token"] = secrets.token_hex(16)
        elif token != "missing":
            body["notif_token"] = token
        request = urllib.request.Request(payment.notif_url, data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        entry: dict[str, Any] = {"order_id": payment.order_id, "url": payment.notif_url,
                                 "status_claimed": body["status"], "token": token if token in
                                 TOKEN_KINDS else "literal", "status_code": None, "error": None,
                                 "at": time.time()}
        try:
            with urllib.request.urlopen(request, timeout=_NOTIFY_TIMEOUT) as resp:
                entry["status_code"] = resp.status
                entry["body"] = resp.read()
        except urllib.error.HTTPError as exc:
            entry["status_code"] = exc.code
            entry["body"] = exc.read()
        except (urllib.error.URLError, OSError) as exc:
            entry["error"] = type(exc).__name__
        with self._lock:
            self._notifications.append(entry)
        log.info("orange sandbox: notification for %s (%s, token %s) -> %s", payment.order_id,
                 body["status"], entry["token"], entry["status_code"] or entry["error"])
        return entry["status_code"]
