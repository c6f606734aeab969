"""The one poll handler body, for every pollable operation (``vpay.money.pollable``):
``poll:<charge_id>`` and ``refund_poll:<refund_id>`` are registrations of it
(``register_pollable``).

Design page, "The poll ladder" and "Timers assert nothing"; only this
authenticated status read moves money, callbacks only pull it forward. One
run of ``poll_once``:

* A payload naming no row → ``DeadLetter``: no retry could make it exist.
* The row is already terminal (a callback, a scan or an operator asked):
  one verification read, stamped; the opposite terminal answer raises a
  ``rail_contradiction`` alert (``where`` = the job kind) and changes
  nothing; anything else, a stale PENDING included, changes nothing → ``Done``.
* A terminal answer that does not agree with the row settles nothing: one
  ``rail_contradiction`` alert, and the row keeps its ladder and its 24-hour
  escalation. Disagreeing is another amount or currency (``where:
  amount_mismatch``) or, since unreadable is not unreported, any field the
  rail sent but we cannot read (``where: unreadable_answer``;
  ``RailStatus.disagreement``).
* Configuration is not a decline (docs/flows/reconciler.md, "Configuration
  is not a decline"): a status read refused for our configuration
  (MISCONFIGURED) says nothing about the payer, so the row stays on its
  ladder, with one ``rail_misconfigured`` alert per rail and code; a FAILED
  whose reason blames our configuration ends the row as
  ``rail_configuration_refused``, with the alert, in one transaction.
* Terminal answer → ``pollable.settle`` (one event) → ``Done``.
* NOT_FOUND for a row the rail never confirmed (``submitted_at`` NULL): the
  request never arrived, so the operation's ``resend`` acts (a charge
  schedules ``resubmit:<charge_id>``; a refund is re-sent now). A NOT_FOUND
  for a confirmed row is "no answer".
* Pending or no answer (5xx, timeout, refused) → ``RetryAfter`` on the
  ladder; never a decline. The clocks do not depend on the rail answering:
  at the 24-hour horizon a pending row is escalated to ``unresolved`` and
  polled every hour from then on, for ever; the ladder never sleeps past a
  clock (the horizon, and the operation's own, e.g. the prompt TTL).
"""

from __future__ import annotations

import logging

from vpay.money import misconfiguration
from vpay.base import testhooks
from vpay.base.logs import committed
from vpay.engine.outcome import DeadLetter, Done, Outcome, RetryAfter
from vpay.money.pollable import RAIL_KNOWS, SETTLED, UNRESOLVED_EVERY, Pollable, escalate, final_status, note_contradiction, poll_delay, record_poll, settle
from vpay.engine.queue import Job
from vpay.rails.port import RailStatus, StatusKind
from vpay.handlers.registry import REGISTRY, Context, Handler

log = logging.getLogger("vpay.handlers.polling")


def poll_once(p: Pollable, job: Job, ctx: Context) -> Outcome:
    """One status read of the row named by ``job.payload[p.payload_key]``
    and what follows from it (module docstring). No database connection is
    held during a rail call."""
    item_id = job.payload.get(p.payload_key)
    with ctx.pool.connection() as conn:
        row = p.load(conn, item_id) if item_id else None
    if row is None:
        return DeadLetter(f"{p.kind} names no {p.noun}: {item_id!r}")
    rail = ctx.rail(row["rail"])
    answer = p.read_status(rail, row)

    live = row["status"] not in SETTLED
    why = answer.disagreement(row["amount"], row["currency"]) if live else None
    # The path of nearly every payment: the settle stamps the read in its own
    # statement (issue 30); every other answer stamps it first.
    plain_settle = live and not why and answer.terminal and not answer.configuration
    with ctx.pool.connection() as conn:
        if not plain_settle:
            # Stamped even for a settled row, so the callback route's 10 s rule
            # also spaces verification reads.
            record_poll(conn, p, row["id"], answer.kind in RAIL_KNOWS)
        if answer.kind is StatusKind.MISCONFIGURED:
            _misconfigured(conn, p, row, answer, "none" if not live else "kept_pending")
        if not live:
            theirs = final_status(answer.kind) if answer.terminal else None
            if theirs is not None and theirs != row["status"]:
                note_contradiction(conn, p, row, theirs, answer.reason, where=p.kind)
            return Done()
        if why:
            # Not this row's money, or not readable as it: a human reconciles it.
            rail_says, rail_reason, where = contradiction_details(answer, why)
            note_contradiction(conn, p, row, rail_says, rail_reason, where=where)
        elif answer.terminal:
            before, after = p.kill_points
            testhooks.pause(before)
            if answer.configuration:
                with committed(conn):  # the alert and the failure together, or neither
                    _misconfigured(conn, p, row, answer, "failed")
                    settle(conn, p, row["id"], answer.kind, failure_code=misconfiguration.FAILURE_CODE)
            else:
                settle(conn, p, row["id"], answer.kind, failure_code=answer.reason,
                       rail_transaction_id=answer.financial_transaction_id, polled=True)
            testhooks.pause(after)
            return Done()

    if answer.kind is StatusKind.NOT_FOUND and row["submitted_at"] is None:
        ended = p.resend(ctx, rail, row)
        if ended is not None:
            return ended
    with ctx.pool.connection() as conn:
        return next_rung(conn, p, ctx, job, row, answer)


def contradiction_details(answer: RailStatus, why: str) -> tuple[str, str, str]:
    """``(rail_says, rail_reason, where)`` of the contradiction alert for a
    terminal answer that disagrees (``RailStatus.disagreement`` → ``why``):
    ``succeeded_other_amount`` (or ``failed_…``) with ``"<minor units>
    <currency>"`` and ``where: amount_mismatch``; or ``succeeded_unreadable``
    / ``failed_unreadable`` with the unreadable field names and ``where:
    unreadable_answer``. One open alert per row and ``rail_says``
    (sql/0007_one_open_contradiction.sql)."""
    said = answer.kind.value
    if why == "unreadable":
        return f"{said}_unreadable", ",".join(answer.unreadable), "unreadable_answer"
    return f"{said}_other_amount", f"{answer.amount} {answer.currency}", "amount_mismatch"


def _misconfigured(conn, p: Pollable, row: dict, answer: RailStatus, effect: str) -> None:
    refs = p.alert_refs(row)
    misconfiguration.alert(conn, row["rail"], answer.reason, operation=f"{p.noun}_status",
                           http_status=answer.http_status, charge_id=refs.get("charge_id"),
                           refund_id=refs.get("refund_id"), effect=effect)


def next_rung(conn, p: Pollable, ctx: Context, job: Job, row: dict, answer: RailStatus) -> RetryAfter:
    """When to read again: hourly once ``unresolved`` (escalating now, by
    the shared CAS, a row past the horizon: a racing sweep's escalation
    counts the same); otherwise the ladder's next rung, but never past a
    clock, so the escalation (and the operation's own clocks) happen on
    time. ``note`` says what the rail answered (it lands in ``last_error``)."""
    age, horizon = row["age_seconds"], ctx.settings.escalate_after_seconds
    clocks = p.clocks(conn, ctx.settings, row)
    unresolved = row["status"] == "unresolved"
    if not unresolved and age >= horizon:
        escalate(conn, p, row["id"], horizon)
        unresolved = True
    note = f"rail: {answer.kind.value}" + (f" {answer.detail or answer.reason or ''}".rstrip()
                                          if answer.kind is not StatusKind.PENDING else "")
    if unresolved:
        return RetryAfter(UNRESOLVED_EVERY, note)
    delay = poll_delay(max(job.attempts - 1, 0) + 1)
    for clock in (*clocks, horizon):
        if age < clock:
            delay = min(delay, max(clock - age, 1.0))
    return RetryAfter(delay, note)


def register_pollable(p: Pollable) -> Handler:
    """Register ``poll_once`` for ``p`` under its job kind ``p.kind``;
    answers the handler (a plain ``(job, ctx) -> Outcome`` function)."""
    def handler(job: Job, ctx: Context) -> Outcome:
        return poll_once(p, job, ctx)

    handler.__name__ = handler.__qualname__ = p.kind
    REGISTRY[p.kind] = handler
    return handler
