"""The one poll handler body, for every pollable operation (``vpay.pollable``):
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
* A SUCCEEDED answer for another amount or currency settles nothing: one
  ``rail_contradiction`` alert (``where: amount_mismatch``), and the row
  keeps its ladder and its 24-hour escalation.
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

from .. import testhooks
from ..outcome import DeadLetter, Done, Outcome, RetryAfter
from ..pollable import (RAIL_KNOWS, SETTLED, UNRESOLVED_EVERY, Pollable, escalate, final_status,
                        note_contradiction, poll_delay, record_poll, same_money, settle)
from ..queue import Job
from ..rails.port import RailStatus, StatusKind
from .registry import REGISTRY, Context, Handler

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

    with ctx.pool.connection() as conn:
        # Stamped even for a settled row, so the callback route's 10 s rule
        # also spaces verification reads.
        record_poll(conn, p, row["id"], answer.kind in RAIL_KNOWS)
        if row["status"] in SETTLED:
            theirs = final_status(answer.kind) if answer.terminal else None
            if theirs is not None and theirs != row["status"]:
                note_contradiction(conn, p, row, theirs, answer.reason, where=p.kind)
            return Done()
        if answer.kind is StatusKind.SUCCEEDED and not same_money(row, answer):
            # Money moved, but not this row's money: a human reconciles it.
            note_contradiction(conn, p, row, "succeeded_other_amount",
                               f"{answer.amount} {answer.currency}", where="amount_mismatch")
        elif answer.terminal:
            before, after = p.kill_points
            testhooks.pause(before)
            settle(conn, p, row["id"], answer.kind, failure_code=answer.reason,
                   rail_transaction_id=answer.financial_transaction_id)
            testhooks.pause(after)
            return Done()

    if answer.kind is StatusKind.NOT_FOUND and row["submitted_at"] is None:
        ended = p.resend(ctx, rail, row)
        if ended is not None:
            return ended
    with ctx.pool.connection() as conn:
        return next_rung(conn, p, ctx, job, row, answer)


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
