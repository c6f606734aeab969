"""``poll:<charge_id>``: ask the rail how a charge ended, on the poll ladder.

Design page, "The poll ladder" and "Timers assert nothing". Only this
authenticated status read moves money; callbacks only pull it forward.

* Terminal answer → ``money.settle`` → ``Done``.
* Pending or no answer (5xx, timeout, refused) → ``RetryAfter(poll_delay)``;
  never a decline.
* The clocks do not depend on the rail answering: past the prompt TTL the
  prompt expires (once); at the 24-hour horizon a pending charge is escalated
  to ``unresolved`` and polled every hour from then on, for ever.
* A charge already terminal gets one verification read: a rail reporting the
  opposite raises a ``rail_contradiction`` alert and changes nothing.
* A terminal answer that does not agree with the charge settles nothing: one
  ``rail_contradiction`` alert, and the charge keeps its ladder (and its
  24-hour escalation). Disagreeing is another amount or currency (``where:
  amount_mismatch``) or, since unreadable is not unreported, any field
  present but unreadable (``where: unreadable_answer``,
  ``RailStatus.disagreement``).
* Configuration is not a decline (docs/flows/reconciler.md): a status read
  refused for our configuration raises one ``rail_misconfigured`` alert per
  rail and code and keeps the charge pending on its ladder (it says nothing
  about the payer); a FAILED whose reason blames our configuration ends the
  charge as ``rail_configuration_refused``, with the alert.
* 404 for a charge the rail never confirmed → ``resubmit:<charge_id>``; for a
  confirmed one it is "no answer".
"""

from __future__ import annotations

import logging

from .. import misconfiguration, money, queue, testhooks
from ..outcome import DeadLetter, Done, RetryAfter
from ..rails.port import StatusKind
from .registry import register

log = logging.getLogger("vpay.handlers.poll")

LADDER = (10.0, 20.0, 30.0, 45.0, 60.0, 90.0)
UNRESOLVED_EVERY = 3600.0  # after escalation: once an hour, for ever


def poll_delay(attempt: int) -> float:
    """Seconds until the next status read after poll number ``attempt``
    (0-based): 0–5 → 10, 20, 30, 45, 60, 90 s; 6–19 → 120 s; 20+ → 900 s
    (15 min) out to the 24-hour horizon. Monotonic non-decreasing."""
    if attempt < 0:
        raise ValueError("attempt must be >= 0")
    if attempt < len(LADDER):
        return LADDER[attempt]
    if attempt < 20:
        return 120.0
    return 900.0


@register("poll")
def poll(job, ctx):
    charge_id = job.payload.get("charge_id")
    with ctx.pool.connection() as conn:
        charge = money.load_charge(conn, charge_id) if charge_id else None
    if charge is None:
        return DeadLetter(f"poll names no charge: {charge_id!r}")
    rail = ctx.rail(charge["rail"])
    request = money.charge_request(charge)

    if charge["status"] in ("succeeded", "failed"):
        return _verify_settled(ctx, charge, rail.status(request))

    answer = rail.status(request)
    rail_knows = answer.kind in (StatusKind.PENDING, StatusKind.SUCCEEDED, StatusKind.FAILED)
    with ctx.pool.connection() as conn:
        money.record_poll(conn, charge_id, rail_knows)
        if answer.kind is StatusKind.MISCONFIGURED:
            misconfiguration.alert(conn, charge["rail"], answer.reason, operation="status",
                                   http_status=answer.http_status, charge_id=charge_id,
                                   effect="kept_pending")
            return _next_rung(conn, ctx, job, charge, answer)
        why = answer.disagreement(charge["amount"], charge["currency"])
        if why:
            # Not this charge's money, or not readable as it: a human reconciles it.
            rail_says, rail_reason, where = contradiction_details(answer, why)
            money.note_contradiction(conn, charge_id, charge["status"], None, rail_says, rail_reason,
                                     where=where)
            return _next_rung(conn, ctx, job, charge, answer)
        if answer.terminal:
            testhooks.pause("before_settle_commit")
            if answer.configuration:
                with conn.transaction():  # the alert and the failure together, or neither
                    misconfiguration.alert(conn, charge["rail"], answer.reason, operation="status",
                                           http_status=answer.http_status, charge_id=charge_id,
                                           effect="failed")
                    money.settle(conn, charge_id, answer.kind, failure_code=misconfiguration.FAILURE_CODE)
            else:
                money.settle(conn, charge_id, answer.kind, failure_code=answer.reason,
                             rail_transaction_id=answer.financial_transaction_id)
            testhooks.pause("after_settle_commit")
            return Done()
        if answer.kind is StatusKind.NOT_FOUND and charge["submitted_at"] is None and not rail_knows:
            queue.enqueue(conn, "resubmit", f"resubmit:{charge_id}", {"charge_id": charge_id})
        return _next_rung(conn, ctx, job, charge, answer)


def _next_rung(conn, ctx, job, charge, answer) -> RetryAfter:
    settings = ctx.settings
    age = charge["age_seconds"]
    ttl, horizon = settings.prompt_ttl_seconds, settings.escalate_after_seconds
    if charge["prompt_expired_at"] is None and age >= ttl:
        money.expire_prompt(conn, charge["id"], ttl)
    unresolved = charge["status"] == "unresolved"
    if not unresolved and age >= horizon:
        # Escalated now, by this CAS, or a moment ago by the sweep: hourly either way.
        money.escalate(conn, charge["id"], horizon)
        unresolved = True
    note = f"rail: {answer.kind.value}" + (f" {answer.detail or answer.reason or ''}".rstrip()
                                          if answer.kind is not StatusKind.PENDING else "")
    if unresolved:
        return RetryAfter(UNRESOLVED_EVERY, note)
    delay = poll_delay(max(job.attempts - 1, 0) + 1)
    # Never sleep past a clock: the prompt expiry and the horizon happen on time.
    for clock in ((ttl,) if charge["prompt_expired_at"] is None and age < ttl else ()) + (horizon,):
        if age < clock:
            delay = min(delay, max(clock - age, 1.0))
    return RetryAfter(delay, note)


def contradiction_details(answer, why: str) -> tuple[str, str, str]:
    """``(rail_says, rail_reason, where)`` of the contradiction alert for a
    terminal answer that disagrees (``RailStatus.disagreement`` → ``why``):
    ``succeeded_other_amount`` with ``"<minor units> <currency>"`` and
    ``where: amount_mismatch``; or ``succeeded_unreadable`` /
    ``failed_unreadable`` with the unreadable field names and ``where:
    unreadable_answer``. One open alert per charge (or refund) and
    ``rail_says`` (sql/0007_one_open_contradiction.sql)."""
    said = answer.kind.value
    if why == "unreadable":
        return f"{said}_unreadable", ",".join(answer.unreadable), "unreadable_answer"
    return f"{said}_other_amount", f"{answer.amount} {answer.currency}", "amount_mismatch"


def _verify_settled(ctx, charge, answer) -> Done:
    """One status read of a terminal charge (a callback or a scan asked):
    the opposite terminal answer is a contradiction; anything else, including
    a stale PENDING, changes nothing."""
    ours = charge["status"]
    with ctx.pool.connection() as conn:
        # Stamped, so the callback route's 10 s rule also spaces these reads.
        money.record_poll(conn, charge["id"], rail_knows=answer.kind in (
            StatusKind.PENDING, StatusKind.SUCCEEDED, StatusKind.FAILED))
        if answer.kind is StatusKind.MISCONFIGURED:
            misconfiguration.alert(conn, charge["rail"], answer.reason, operation="status",
                                   http_status=answer.http_status, charge_id=charge["id"],
                                   effect="none")
        if answer.terminal:
            theirs = "succeeded" if answer.kind is StatusKind.SUCCEEDED else "failed"
            if theirs != ours:
                money.note_contradiction(conn, charge["id"], ours, charge["failure_code"],
                                         theirs, answer.reason, where="poll")
    return Done()
