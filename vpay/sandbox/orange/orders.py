"""The Orange sandbox's orders: the status words, the payment record, how
an argument names an order, and the per-order script.

A payment starts ``INITIATED`` and stays so for ever unless scripted or
forced (design/rails.md: "an abandoned payment stays INITIATED for ever").
The payer is identified on Orange's page, so scripting is per order, not per
payer; an order is named by its ``order_id`` or by the vpay
``rail_reference`` it was derived from (``vpay.rails.orange.order_id_for``).
Script options (``script_order`` / ``set_default``):

- ``pending_reads: int`` and ``outcome: str``: the first N (non-error)
  status reads answer ``waiting_status`` (``INITIATED`` by default, or
  ``PENDING``: the payer confirmed), then ``outcome`` for good.
  ``outcome`` alone is ``pending_reads=0``.
- ``status_errors: list[int]``: the next status reads answer these HTTP
  codes, in order, before normal behaviour (not counted as reads).
- ``status_delay_seconds: float``: sleep before every status answer.
- ``notify: bool`` (default: the constructor's ``auto_notify``): post the
  notification when the payment becomes SUCCESS or FAILED.
- ``notify_token: "right" | "wrong" | "missing"``: what that automatic
  notification carries as ``notif_token``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

INITIATED, PENDING, EXPIRED, SUCCESS, FAILED = "INITIATED", "PENDING", "EXPIRED", "SUCCESS", "FAILED"
STATUSES = (INITIATED, PENDING, EXPIRED, SUCCESS, FAILED)
TERMINAL = (EXPIRED, SUCCESS, FAILED)
NOTIFIED = (SUCCESS, FAILED)
TOKEN_KINDS = ("right", "wrong", "missing")
_SCRIPT_KEYS = frozenset({"pending_reads", "outcome", "waiting_status", "status_errors",
                          "status_delay_seconds", "notify", "notify_token"})
_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_MAX_DELAY = 600.0
ORDER_ID_MAX = 30


def order_of(order_or_ref: str) -> str:
    """The order id an argument names: a UUID is a vpay ``rail_reference``
    (its order id is derived as ``vpay.rails.orange.order_id_for`` does);
    anything else is an order id already."""
    if _UUID_RE.match(order_or_ref):
        return order_or_ref.lower().replace("-", "")[:ORDER_ID_MAX]
    return order_or_ref


@dataclass
class _Script:
    """One order's script (the options above)."""

    pending_reads: int = 0
    outcome: str | None = None          # None: stay waiting for ever
    waiting_status: str = INITIATED
    status_errors: list[int] = field(default_factory=list)
    status_delay_seconds: float = 0.0
    notify: bool | None = None          # None: the sandbox's auto_notify
    notify_token: str = "right"

    def as_dict(self) -> dict[str, Any]:
        return {"pending_reads": self.pending_reads, "outcome": self.outcome,
                "waiting_status": self.waiting_status, "status_errors": list(self.status_errors),
                "status_delay_seconds": self.status_delay_seconds, "notify": self.notify,
                "notify_token": self.notify_token}


def _parse_script(opts: Mapping[str, Any]) -> _Script:
    """A script from its options; ValueError naming the first bad one."""
    unknown = set(opts) - _SCRIPT_KEYS
    if unknown:
        raise ValueError(f"unknown script option(s): {', '.join(sorted(unknown))}")
    s = _Script()
    if opts.get("pending_reads") is not None:
        n = opts["pending_reads"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError("pending_reads must be a non-negative integer")
        s.pending_reads = n
    if opts.get("outcome") is not None:
        if opts["outcome"] not in STATUSES:
            raise ValueError(f"outcome must be one of {', '.join(STATUSES)}")
        s.outcome = opts["outcome"]
    if opts.get("waiting_status") is not None:
        if opts["waiting_status"] not in (INITIATED, PENDING):
            raise ValueError("waiting_status must be INITIATED or PENDING")
        s.waiting_status = opts["waiting_status"]
    if opts.get("status_errors") is not None:
        codes = opts["status_errors"]
        if not isinstance(codes, (list, tuple)) or not all(
                isinstance(c, int) and not isinstance(c, bool) and 400 <= c <= 599 for c in codes):
            raise ValueError("status_errors must be a list of HTTP error codes (400-599)")
        s.status_errors = list(codes)
    if opts.get("status_delay_seconds") is not None:
        d = opts["status_delay_seconds"]
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= _MAX_DELAY:
            raise ValueError(f"status_delay_seconds must be between 0 and {_MAX_DELAY:g}")
        s.status_delay_seconds = float(d)
    if opts.get("notify") is not None:
        if not isinstance(opts["notify"], bool):
            raise ValueError("notify must be true or false")
        s.notify = opts["notify"]
    if opts.get("notify_token") is not None:
        if opts["notify_token"] not in TOKEN_KINDS:
            raise ValueError(f"notify_token must be one of {', '.join(TOKEN_KINDS)}")
        s.notify_token = opts["notify_token"]
    return s


@dataclass
class _Payment:
    """One order as the sandbox holds it."""

    order_id: str
    amount: int
    currency: str
    pay_token: str
    notif_token: str
    payment_url: str
    notif_url: str
    return_url: str
    cancel_url: str
    lang: str
    reference: str
    created_at: float
    status: str = INITIATED
    txnid: str | None = None
    reads: int = 0              # answered status reads (errors excluded)
    forced: bool = False
    notified: bool = False

    def view(self) -> dict[str, Any]:
        return {"order_id": self.order_id, "amount": self.amount, "currency": self.currency,
                "pay_token": self.pay_token, "notif_token": self.notif_token,
                "payment_url": self.payment_url, "notif_url": self.notif_url,
                "return_url": self.return_url, "cancel_url": self.cancel_url, "lang": self.lang,
                "reference": self.reference, "status": self.status, "txnid": self.txnid,
                "reads": self.reads, "forced": self.forced, "notified": self.notified}
