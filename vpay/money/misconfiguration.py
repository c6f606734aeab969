"""Configuration is not a decline: what vpay does when a rail blames OUR
configuration (docs/flows/reconciler.md, "Configuration is not a decline";
design/rails.md, "Rail errors that mean *our* configuration is wrong").

The adapters classify (``SubmitKind.MISCONFIGURED``,
``StatusKind.MISCONFIGURED``, ``RailStatus.configuration``); this module
holds the two consequences, so that every caller acts the same way:

* ``alert``: one open ``rail_misconfigured`` alert per rail and code (a
  unique index; the first charge or refund that hit it is named), logged at
  error. Always, whatever happens to the payment.
* ``FAILURE_CODE`` (``rail_configuration_refused``): the failure code of a
  payment that ends because of it, distinct from every payer outcome; its
  ``payment_intent.payment_failed`` / ``refund.failed`` event says
  ``"failure_kind": "configuration"`` (``failure_kind``).

When a payment ends and when it waits is the callers' rule, written once in
the flow document: it ends only when the rail says no payer was or will be
asked (a first request refused, or a status that is FAILED for our
configuration); a status read refused, or a re-send refused after an earlier
send of unknown fate, leaves it pending on its ladder, so a fixable operator
mistake never loses a payment.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from vpay.base.logs import after_commit
from vpay.base.queries import Q

log = logging.getLogger("vpay.misconfiguration")

FAILURE_CODE = "rail_configuration_refused"
"""``charges.failure_code`` / ``refunds.failure_code`` when the rail refused
our configuration: never a payer decline."""

CONFIGURATION, PAYER, NOT_SUBMITTED = "configuration", "payer", "not_submitted"


def failure_kind(failure_code: str | None) -> str:
    """Who a failure code blames, for the merchant's event (``failure_kind``):
    ``configuration`` (``rail_configuration_refused``: ours), ``not_submitted``
    (the request never reached the rail), else ``payer`` (the payment's own
    outcome as the rail reported it)."""
    if failure_code == FAILURE_CODE:
        return CONFIGURATION
    if failure_code == NOT_SUBMITTED:
        return NOT_SUBMITTED
    return PAYER


def code_of(reason: str | None, http_status: int | None = None) -> str:
    """The code a refusal is known by: the rail's own (``LOGIN_FAILED``),
    else ``HTTP_<status>``, else ``UNKNOWN``. The alert's ``details.code``
    and what a command names when it refuses (``refusal``)."""
    return reason or (f"HTTP_{http_status}" if http_status else "UNKNOWN")


def refusal(answer: Any) -> dict[str, Any] | None:
    """``{"code": …}`` when a rail's ``Submit`` answer refused our
    configuration, else None: what ``create_and_submit`` hands its caller
    under ``rail_refusal``, so that a command names this payment's cause
    and not the codes of older open alerts of the same rail."""
    from vpay.rails.port import SubmitKind
    if getattr(answer, "kind", None) is not SubmitKind.MISCONFIGURED:
        return None
    return {"code": code_of(answer.reason, answer.http_status)}


def alert(conn: psycopg.Connection, rail: str, code: str | None, *, operation: str,
          http_status: int | None = None, charge_id: str | None = None,
          refund_id: str | None = None, effect: str) -> bool:
    """Raise the ``rail_misconfigured`` alert for ``rail`` (``mtn``,
    ``orange``) and the rail's ``code`` (e.g. ``INVALID_CALLBACK_URL_HOST``,
    ``LOGIN_FAILED``; ``HTTP_<status>`` when the rail gave none).
    ``operation`` names the call (``request_to_pay``, ``charge_status``,
    ``refund``, ``refund_status``); ``effect`` what it did to the payment
    (``failed``, ``kept_pending``). One open alert per (rail, code): answers
    whether this call wrote it. Never raises for a duplicate."""
    code = code_of(code, http_status)
    details: dict[str, Any] = {"rail": rail, "code": code, "operation": operation,
                               "http_status": http_status, "effect": effect,
                               "refund_id": refund_id}
    written = conn.execute(Q["insert_misconfiguration_alert"], {
        "charge_id": charge_id, "refund_id": refund_id, "details": Jsonb(details)}).fetchone() is not None
    # Logged every time (not only when written): each payment it touches is news to an operator.
    extra = {"rail": rail, "code": code, "operation": operation, "http_status": http_status,
             "charge_id": charge_id, "refund_id": refund_id, "effect": effect, "alert_written": written}
    after_commit(conn, lambda: log.error(
        "rail refused our configuration: fix the rail settings, this is not a payer decline", extra=extra))
    return written


def open_codes(conn: psycopg.Connection, rail: str) -> list[str]:
    """The rail's codes of the open ``rail_misconfigured`` alerts of
    ``rail``, newest first. Not the cause of one payment's refusal (an
    older alert may still be open): that is ``refusal``."""
    return [row[0] for row in conn.execute(Q["open_misconfiguration_codes"], {"rail": rail}).fetchall()]
