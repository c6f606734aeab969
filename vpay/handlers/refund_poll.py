"""``refund_poll:<refund_id>``: ask the rail how a refund ended, on the poll
ladder (docs/flows/refunds.md; the charge's rules from the design page, "The
poll ladder" and "Timers assert nothing").

* Terminal answer → ``refunds.settle_refund`` (one event) → ``Done``; but a
  terminal answer for another amount or currency, or with a field present but
  unreadable, settles nothing: one ``rail_contradiction`` alert, the ladder
  goes on (as for a charge, ``vpay.handlers.poll``).
* Refused for our configuration: a status read → one ``rail_misconfigured``
  alert, the refund stays pending on its ladder; a FAILED blaming our
  configuration → ``rail_configuration_refused`` with the alert; a re-send
  refused that way → the alert, the refund stays pending.
* Pending or no answer (5xx, timeout, refused) → ``RetryAfter(poll_delay)``;
  never a decline.
* 404 for a refund the rail never confirmed (``submitted_at`` NULL): the
  request never arrived, so it is re-sent now with the same
  ``X-Reference-Id``; a rejection fails the refund, otherwise the ladder goes
  on. A 404 for a confirmed refund is "no answer".
* At the 24-hour horizon (from ``refunds.created_at``) a pending refund is
  escalated to ``unresolved`` with one alert, whether the rail answers or
  not, and polled every hour from then on, for ever.
* A refund already terminal gets one verification read: the opposite
  terminal answer raises a ``rail_contradiction`` alert and changes nothing.
"""

from __future__ import annotations

import logging

from .. import misconfiguration, refunds, testhooks
from ..outcome import DeadLetter, Done, RetryAfter
from ..rails.port import StatusKind, SubmitKind
from .registry import register
from .poll import UNRESOLVED_EVERY, contradiction_details, poll_delay

log = logging.getLogger("vpay.handlers.refund_poll")


@register("refund_poll")
def refund_poll(job, ctx):
    """One status read of the refund named by ``job.payload["refund_id"]``,
    and what follows from it (module docstring). Answers ``Done`` once the
    refund is terminal, ``RetryAfter`` on the ladder otherwise, and
    ``DeadLetter`` only for a payload naming no refund."""
    refund_id = job.payload.get("refund_id")
    with ctx.pool.connection() as conn:
        refund = refunds.load_refund(conn, refund_id) if refund_id else None
    if refund is None:
        return DeadLetter(f"refund_poll names no refund: {refund_id!r}")
    rail = ctx.rail(refund["rail"])
    request = refunds.refund_request(refund)

    if refund["status"] in ("succeeded", "failed"):
        return _verify_settled(ctx, refund, rail.refund_status(request))

    answer = rail.refund_status(request)
    rail_knows = answer.kind in (StatusKind.PENDING, StatusKind.SUCCEEDED, StatusKind.FAILED)
    with ctx.pool.connection() as conn:
        refunds.record_poll(conn, refund_id, rail_knows)
        if answer.kind is StatusKind.MISCONFIGURED:
            misconfiguration.alert(conn, refund["rail"], answer.reason, operation="refund_status",
                                   http_status=answer.http_status, charge_id=refund["charge_id"],
                                   refund_id=refund_id, effect="kept_pending")
            return _next_rung(conn, ctx, job, refund, answer)
        why = answer.disagreement(refund["amount"], refund["currency"])
        if why:
            rail_says, rail_reason, where = contradiction_details(answer, why)
            refunds.note_contradiction(conn, refund, rail_says, rail_reason, where=where)
            return _next_rung(conn, ctx, job, refund, answer)
        if answer.terminal:
            testhooks.pause("before_refund_settle_commit")
            if answer.configuration:
                with conn.transaction():  # the alert and the failure together, or neither
                    misconfiguration.alert(conn, refund["rail"], answer.reason, operation="refund_status",
                                           http_status=answer.http_status, charge_id=refund["charge_id"],
                                           refund_id=refund_id, effect="failed")
                    refunds.settle_refund(conn, refund_id, answer.kind,
                                          failure_code=misconfiguration.FAILURE_CODE)
            else:
                refunds.settle_refund(conn, refund_id, answer.kind, failure_code=answer.reason,
                                      rail_transaction_id=answer.financial_transaction_id)
            return Done()
    if answer.kind is StatusKind.NOT_FOUND and refund["submitted_at"] is None:
        with ctx.pool.connection() as conn:
            sent = refunds.submit(conn, rail, refund, resend=True)
        if sent.kind is SubmitKind.REJECTED:
            return Done("refund rejected on re-send")
        log.info("refund re-sent after a 404", extra={"refund_id": refund_id,
                                                      "answer": sent.kind.value})
    with ctx.pool.connection() as conn:
        return _next_rung(conn, ctx, job, refund, answer)


def _next_rung(conn, ctx, job, refund, answer) -> RetryAfter:
    age, horizon = refund["age_seconds"], ctx.settings.escalate_after_seconds
    note = f"rail: {answer.kind.value}" + (f" {answer.detail or answer.reason or ''}".rstrip()
                                          if answer.kind is not StatusKind.PENDING else "")
    if refund["status"] == "unresolved" or age >= horizon:
        # escalates once (a CAS); a racing worker's escalation counts the same
        refunds.escalate_refund(conn, refund["id"], horizon)
        return RetryAfter(UNRESOLVED_EVERY, note)
    # Never sleep past the horizon: the escalation happens on time.
    delay = min(poll_delay(max(job.attempts - 1, 0) + 1), max(horizon - age, 1.0))
    return RetryAfter(delay, note)


def _verify_settled(ctx, refund, answer) -> Done:
    """One status read of a terminal refund: the opposite terminal answer is
    a contradiction; anything else, including a stale PENDING, changes nothing."""
    if answer.terminal:
        theirs = "succeeded" if answer.kind is StatusKind.SUCCEEDED else "failed"
        if theirs != refund["status"]:
            with ctx.pool.connection() as conn:
                refunds.note_contradiction(conn, refund, theirs, answer.reason, where="refund_poll")
    return Done()
