"""The refund state machine: every refund transition, in one module.

Refunds: ``pending`` → ``succeeded`` | ``failed`` | ``unresolved``;
``unresolved`` → ``succeeded`` | ``failed``. Only a ``succeeded`` charge can
be refunded, and the refunds of a charge that have not failed never add up
to more than its amount. A refund changes neither its charge nor its intent:
a charge that was paid stays ``succeeded``; the refund is its own record.

The rules are the charge's, written once in ``vpay.money.pollable`` (design page,
"The job queue" and "Timers assert nothing"; docs/flows/refunds.md);
``REFUNDS`` (at the end) describes what is a refund's own. In short:

* The ``refund_poll:<refund_id>`` job is born with the refund, in the same
  transaction, and the rail is asked only after that commits (``submit``), so
  every kill point leaves the poll behind.
* Only the authenticated refund status read (``Rail.refund_status``) settles
  a refund. 5xx, timeouts and unreadable answers are "no answer", never a
  decline. A status 404 for a refund the rail never confirmed means the
  request never arrived: the poll re-sends it with the same
  ``X-Reference-Id`` (MoMo answers 409 if it did arrive after all).
* Every transition is one transaction and a compare-and-swap on the status,
  writes exactly one event (``refund.succeeded`` / ``refund.failed``, on the
  charge's intent, with its ``fanout:`` job), and no status moves backwards.
  A terminal refund the rail reports the other way gets a
  ``rail_contradiction`` alert and is not changed.
* Still pending 24 hours after ``created_at``: ``unresolved``, one
  ``refund_unresolved`` alert, polled hourly for ever.

Amounts are integers in minor units; ages and horizons are seconds, measured
by the database's clock.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from vpay.money import misconfiguration, charges, pollable
from vpay.engine import queue
from vpay.base import testhooks
from vpay.money.ids import new_id, new_rail_reference
from vpay.base.logs import committed
from vpay.engine.outcome import Done, Outcome
from vpay.money.pollable import FIRST_POLL_SECONDS, Pollable, Settled
from vpay.base.queries import Q
from vpay.rails.port import REFUNDS_REFUSED, Rail, RailPaused, RailStatus, RefundRequest, StatusKind, Submit, SubmitKind

log = logging.getLogger("vpay.refunds")

REASON_MAX_CHARS = 160


class InvalidRefund(ValueError):
    """A refund that may not be created. ``param`` names the offending input
    (``charge``, ``amount``, ``reason``); ``code`` says why:
    ``charge_not_found``, ``charge_not_succeeded``, ``invalid_amount``,
    ``amount_exceeds_refundable``, ``nothing_to_refund``, ``invalid_reason``,
    ``refunds_unsupported`` (the charge's rail gives no refunds: Orange Money
    Web Payment). Nothing was written."""

    def __init__(self, param: str, code: str, message: str):
        super().__init__(message)
        self.param = param
        self.code = code


def create_refund(conn: psycopg.Connection, *, charge_id: str, amount: int | None = None,
                  reason: str | None = None, refund_id: str | None = None) -> dict[str, Any]:
    """Create a pending refund of ``charge_id`` and its
    ``refund_poll:<refund_id>`` job (due in ``FIRST_POLL_SECONDS``), in ONE
    transaction. Answers the refund row. The rail is not asked here: call
    ``submit`` after this returns (``create_and_submit`` does both).

    ``amount`` is in minor units, default the whole refundable remainder;
    ``reason`` (optional, at most 160 characters) is the merchant's, kept on
    the row. The charge row is locked (``SELECT … FOR UPDATE``) before the
    charge's non-failed refunds are summed, so two concurrent creates cannot
    together give back more than the charge's amount.

    Raises ``InvalidRefund`` (nothing written) when the charge is unknown,
    is not ``succeeded``, is on a rail whose refunds are refused
    (``rails.port.REFUNDS_REFUSED``: M-Pesa), or ``amount`` is not a positive int or exceeds the
    charge's amount minus its other non-failed refunds.

    ``refund_id`` (default: a fresh ``re_…``) lets a caller name the refund
    before creating it (the API's Idempotency-Key records, as for intents);
    an id that exists already raises ``psycopg.errors.UniqueViolation``.
    """
    if amount is not None and (isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0):
        raise InvalidRefund("amount", "invalid_amount", "amount must be a positive whole number of minor units")
    if reason is not None and (not isinstance(reason, str) or len(reason) > REASON_MAX_CHARS):
        raise InvalidRefund("reason", "invalid_reason",
                            f"reason must be text of at most {REASON_MAX_CHARS} characters")
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        charge = cur.execute(Q["lock_charge_for_refund"], {"charge_id": charge_id}).fetchone()
        if charge is None:
            raise InvalidRefund("charge", "charge_not_found", f"no charge {charge_id!r}")
        if charge["status"] != "succeeded":
            raise InvalidRefund("charge", "charge_not_succeeded",
                                f"charge {charge_id} is {charge['status']}: only a succeeded charge "
                                "can be refunded")
        if charge["rail"] in REFUNDS_REFUSED:
            raise InvalidRefund("charge", "refunds_unsupported", REFUNDS_REFUSED[charge["rail"]])
        refunded = cur.execute(Q["refunded_amount"], {"charge_id": charge_id}).fetchone()["refunded"]
        remaining = charge["amount"] - refunded
        if remaining <= 0:
            raise InvalidRefund("amount", "nothing_to_refund",
                                f"charge {charge_id} is fully refunded (or being refunded)")
        if amount is None:
            amount = remaining
        if amount > remaining:
            raise InvalidRefund("amount", "amount_exceeds_refundable",
                                f"amount {amount} exceeds what charge {charge_id} can still refund: "
                                f"{remaining} of {charge['amount']} {charge['currency']} minor units")
        refund = cur.execute(Q["insert_refund"], {
            "id": refund_id or new_id("re"), "charge_id": charge_id, "rail": charge["rail"],
            "rail_reference": new_rail_reference(), "amount": amount,
            "currency": charge["currency"], "reason": reason}).fetchone()
        queue.enqueue(conn, REFUNDS.kind, REFUNDS.job_key(refund["id"]),
                      {"refund_id": refund["id"], "charge_id": charge_id}, delay=FIRST_POLL_SECONDS)
    log.info("refund created", extra={"refund_id": refund["id"], "charge_id": charge_id,
                                      "amount": amount, "currency": refund["currency"],
                                      "remaining_before": remaining})
    return refund


def load_refund(conn: psycopg.Connection, refund_id: str) -> dict[str, Any] | None:
    """A refund row plus ``age_seconds`` (database clock), and from its
    charge ``charge_rail_reference``, ``payer`` and ``payment_intent_id``;
    ``None`` when unknown."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["load_refund"], {"id": refund_id}).fetchone()


def refund_request(refund: dict[str, Any]) -> RefundRequest:
    """The rail port's view of a ``load_refund`` row."""
    return RefundRequest(refund_id=refund["id"], rail_reference=refund["rail_reference"],
                         charge_rail_reference=refund["charge_rail_reference"],
                         amount=refund["amount"], currency=refund["currency"], payer=refund["payer"])


def mark_submitted(conn: psycopg.Connection, refund_id: str) -> bool:
    """The rail accepted the refund request: set ``submitted_at`` once."""
    return pollable.mark_submitted(conn, REFUNDS, refund_id)


def record_poll(conn: psycopg.Connection, refund_id: str, rail_knows: bool) -> None:
    """Stamp ``last_polled_at``; when the rail knew the reference, also
    ``submitted_at`` (``vpay.money.pollable.record_poll``)."""
    pollable.record_poll(conn, REFUNDS, refund_id, rail_knows)


def submit(conn: psycopg.Connection, rail: Rail, refund: dict[str, Any], *,
           resend: bool = False) -> Submit:
    """Send the refund request for a ``load_refund`` row (or one with
    ``charge_rail_reference`` and ``payer``) and record the answer: accepted
    → ``submitted_at``; rejected for good → the refund fails with the rail's
    reason (one ``refund.failed``); no answer → nothing: the poll job reads
    the status and re-sends on a 404. Same ``X-Reference-Id`` every time.
    Refused for our configuration: one ``rail_misconfigured`` alert; on the
    first send the refund fails with ``rail_configuration_refused`` (no money
    moved), on a re-send (``resend``, the poll after a 404) it stays pending
    on its ladder. Never raises for the rail's answer; a paused rail
    (``RailPaused``, nothing sent) is "no answer" like any other."""
    try:
        answer = rail.refund(refund_request(refund))
    except RailPaused as paused:
        log.warning("rail paused; refund request not sent, the poll will ask and re-send",
                    extra={"refund_id": refund["id"], "rail": paused.rail})
        return Submit(SubmitKind.NO_ANSWER, reason="RAIL_PAUSED")
    if answer.kind is SubmitKind.ACCEPTED:
        testhooks.pause("after_refund_accepted")
        mark_submitted(conn, refund["id"])
    elif answer.kind is SubmitKind.REJECTED:
        settle_refund(conn, refund["id"], StatusKind.FAILED, failure_code=answer.reason or "rejected")
    elif answer.kind is SubmitKind.MISCONFIGURED:
        with committed(conn):  # the alert and the failure together, or neither
            misconfiguration.alert(conn, refund["rail"], answer.reason, operation="refund",
                                   http_status=answer.http_status, charge_id=refund["charge_id"],
                                   refund_id=refund["id"], effect="kept_pending" if resend else "failed")
            if not resend:
                settle_refund(conn, refund["id"], StatusKind.FAILED,
                              failure_code=misconfiguration.FAILURE_CODE)
    else:
        log.warning("refund request not confirmed; the poll will ask and re-send",
                    extra={"refund_id": refund["id"], "reason": answer.reason,
                           "http_status": answer.http_status})
    return answer


def settle_refund(conn: psycopg.Connection, refund_id: str, kind: StatusKind, *,
                  failure_code: str | None = None,
                  rail_transaction_id: str | None = None) -> Settled:
    """Move a live refund (``pending`` / ``unresolved``) to ``succeeded``
    (``kind`` SUCCEEDED) or ``failed`` (FAILED, ``failure_code`` kept,
    default ``unknown``), with one ``refund.succeeded`` / ``refund.failed``
    event on the charge's intent, in one transaction.

    The shared compare-and-swap (``vpay.money.pollable.settle``): a refund already
    terminal is not changed (``transitioned`` False); if it ended the other
    way, a ``rail_contradiction`` alert is written (``contradiction`` True,
    ``where: settle_refund``). The charge and intent are never changed.
    Raises ``ValueError`` for a non-terminal ``kind`` and ``LookupError``
    for an unknown refund.
    """
    return pollable.settle(conn, REFUNDS, refund_id, kind, failure_code=failure_code,
                           rail_transaction_id=rail_transaction_id)


def escalate_refund(conn: psycopg.Connection, refund_id: str, horizon_seconds: float) -> bool:
    """At the horizon (``horizon_seconds`` after ``created_at``, 24 h by
    default), a refund still ``pending`` becomes ``unresolved`` and one
    ``refund_unresolved`` alert is written (logged at error, once). No event:
    the merchant hears when it settles. Answers whether this call escalated."""
    return bool(pollable.escalate(conn, REFUNDS, refund_id, horizon_seconds))


def _refund_event(conn: psycopg.Connection, refund: dict[str, Any], event_type: str) -> None:
    """The rest of a refund's settle, in its transaction: ``event_type`` on
    the refunded charge's intent, the refund in its data. The charge and
    the intent do not change."""
    charge = charges.load_charge(conn, refund["charge_id"])
    with conn.cursor(row_factory=dict_row) as cur:
        intent = cur.execute(Q["load_intent"], {"id": charge["payment_intent_id"]}).fetchone()
    charges.emit_event(conn, event_type, intent, charge, {"refund": refund_view(refund)})


def _resend(ctx, rail: Rail, refund: dict[str, Any]) -> Outcome | None:
    """A 404 for a refund never confirmed: the request never arrived, so it
    is sent again now, same ``X-Reference-Id``. A rejection has failed the
    refund (``Done``); otherwise the ladder goes on (a refusal of our
    configuration too: an earlier send's fate is unknown, ``submit``)."""
    with ctx.pool.connection() as conn:
        sent = submit(conn, rail, refund, resend=True)
    if sent.kind is SubmitKind.REJECTED:
        return Done("refund rejected on re-send")
    log.info("refund re-sent after a 404", extra={"refund_id": refund["id"], "answer": sent.kind.value})
    return None


def _read_status(rail: Rail, refund: dict[str, Any]) -> RailStatus:
    return rail.refund_status(refund_request(refund))


def refund_view(refund: dict[str, Any]) -> dict[str, Any]:
    """The merchant-facing JSON of a refund (times as ISO 8601; amount in
    minor units)."""
    keys = ("id", "charge_id", "rail", "rail_reference", "amount", "currency", "status",
            "failure_code", "rail_transaction_id", "reason")
    times = ("created_at", "submitted_at", "settled_at", "unresolved_at", "last_polled_at")
    return ({"object": "refund"} | {k: refund.get(k) for k in keys}
            | {k: _iso(refund.get(k)) for k in times})


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def show(conn: psycopg.Connection, refund_id: str) -> dict[str, Any] | None:
    """``{"refund", "charge", "events"}`` as JSON-ready dicts (the refund's
    own events only); ``None`` when unknown."""
    refund = load_refund(conn, refund_id)
    if refund is None:
        return None
    charge = charges.load_charge(conn, refund["charge_id"])
    with conn.cursor(row_factory=dict_row) as cur:
        events = cur.execute(Q["events_of_refund"], {"payment_intent_id": refund["payment_intent_id"],
                                                     "refund_id": refund_id}).fetchall()
    return {"refund": refund_view(refund), "charge": charges.charge_view(charge),
            "events": [{"id": e["id"], "type": e["type"], "created": _iso(e["created_at"])}
                       for e in events]}


def refunds_supported(rail: Rail | None) -> bool:
    """Whether a rail adapter can give money back (``Rail.refunds_supported``;
    an adapter that does not say can)."""
    return bool(getattr(rail, "refunds_supported", True))


def create_and_submit(pool: ConnectionPool, rail_for: Callable[[str], Rail], *, charge_id: str,
                      amount: int | None = None, reason: str | None = None,
                      refund_id: str | None = None) -> dict[str, Any]:
    """Create (one transaction), then submit, then read back: the one path of
    ``vpay-server refunds create`` and ``POST /v1/refunds``. Answers
    ``{"refund": refund_view}``, with ``rail_refusal`` (``{"code"}``) when
    the rail refused our configuration for this request. Raises
    ``InvalidRefund`` (nothing written; ``refunds_unsupported`` for a rail
    without refunds, before anything is written) and ``RailError`` when the
    charge's rail is not configured (checked before writing)."""
    with pool.connection() as conn:
        row = conn.execute("SELECT rail FROM charges WHERE id = %s", (charge_id,)).fetchone()
    adapter = rail_for(row[0]) if row else None
    if row is not None and not refunds_supported(adapter):
        raise InvalidRefund("charge", "refunds_unsupported",
                            f"charge {charge_id} was paid on rail {row[0]}, which gives no refunds: "
                            "refund the payer outside vpay")
    with pool.connection() as conn:
        created = create_refund(conn, charge_id=charge_id, amount=amount, reason=reason,
                                refund_id=refund_id)
    testhooks.pause("after_refund_commit")
    with pool.connection() as conn:
        answer = submit(conn, adapter, load_refund(conn, created["id"]))
        result = {"refund": refund_view(load_refund(conn, created["id"]))}
    refused = misconfiguration.refusal(answer)
    if refused is not None:
        result["rail_refusal"] = refused
    return result


REFUNDS = Pollable(
    kind="refund_poll", noun="refund", table="refunds", payload_key="refund_id",
    events={"succeeded": "refund.succeeded", "failed": "refund.failed"},
    unresolved_alert="refund_unresolved",
    load=load_refund,
    read_status=_read_status,
    apply=_refund_event,
    alert_refs=lambda refund: {"charge_id": refund["charge_id"], "refund_id": refund["id"]},
    details=lambda refund: {"refund_id": refund["id"]},
    resend=_resend,
    settle_where="settle_refund",
    kill_points=("before_refund_settle_commit", "after_refund_settle_commit"),
)
"""Refunds as a pollable operation (``refund_poll:<refund_id>``; vpay.money.pollable)."""


def settle_refund_with_evidence(conn: psycopg.Connection, refund_id: str, outcome: str,
                                evidence: charges.Evidence, *, failure_code: str | None = None,
                                rail_transaction_id: str | None = None) -> Settled:
    """``settle_refund`` on evidence instead of a status read:
    ``charges.settle_proven`` for a refund (one ``refund.*`` event on its
    charge's intent; the charge and intent never change)."""
    return charges.settle_proven(conn, REFUNDS, refund_id, outcome, evidence, failure_code=failure_code,
                               rail_transaction_id=rail_transaction_id)
