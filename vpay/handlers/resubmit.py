"""``resubmit:<charge_id>``: a request-to-pay we could not confirm.

Issue "the whole charge lifecycle", item 3. A timeout, 5xx or refused
connection on the request-to-pay does not fail the charge. While the prompt
TTL runs, this job re-sends it with the same ``X-Reference-Id`` (MoMo answers
409 when it already had it: accepted) on a backoff. Past the TTL it stops
sending and asks the rail instead: a reference the rail still does not know
fails the charge with ``failure_code = 'not_submitted'`` (one event); one it
knows is left to the poll job.

A rail that cannot take a request twice (``Rail.resend_safe`` False:
M-Pesa) is never re-sent one that may have reached the payer
(``charges.request_may_have_left``), and its "not found" past the TTL fails
nothing then: the job ends, and the poll, a callback's identifier, the
24-hour escalation and the statement take it from there
(docs/flows/mpesa.md, "A lost answer"). One surely never sent is sent.

Refused for our configuration (docs/flows/reconciler.md, "Configuration is
not a decline"): a re-send or a status read refused that way leaves the
charge pending with one ``rail_misconfigured`` alert, and this job ends
instead of looping: the poll keeps reading, and once the configuration is
fixed a 404 from the rail enqueues this job again.
"""

from __future__ import annotations

from vpay.money import misconfiguration, charges
from vpay.engine.outcome import Done, RetryAfter
from vpay.money.payments import answer_lost, resubmit_delay, submit
from vpay.rails.port import StatusKind, SubmitKind, resend_safe
from vpay.handlers.registry import register

NOT_SUBMITTED = "not_submitted"


@register("resubmit")
def resubmit(job, ctx):
    charge_id = job.payload.get("charge_id")
    with ctx.pool.connection() as conn:
        charge = charges.load_charge(conn, charge_id) if charge_id else None
    if charge is None or charge["status"] not in ("pending", "unresolved") or charge["submitted_at"]:
        return Done("nothing to resubmit")
    rail = ctx.rail(charge["rail"])
    if not resend_safe(rail) and charges.request_may_have_left(charge):
        # Neither a second prompt nor "not found" means anything here: the
        # first push may be with the payer and we never learnt its id.
        return Done("request-to-pay may have reached the payer and the rail cannot take it twice: "
                    "not sent again; waiting for a callback's identifier, the horizon and the statement")
    if charge["age_seconds"] < ctx.settings.prompt_ttl_seconds:
        with ctx.pool.connection() as conn:
            answer = submit(conn, rail, charge, schedule_resubmit=False, resend=True, pool=ctx.pool)
        if answer_lost(rail, answer):
            return Done(f"request-to-pay answer lost ({answer.reason}); not sent again")
        if answer.kind is SubmitKind.NO_ANSWER:
            return RetryAfter(resubmit_delay(job.attempts + 1), f"request-to-pay: {answer.reason}")
        if answer.kind is SubmitKind.MISCONFIGURED:
            return Done(f"request-to-pay refused for our configuration ({answer.reason}); the poll carries on")
        return Done()
    # The prompt is over: a re-send would ask the payer about a stale prompt.
    status = rail.status(charges.charge_request(charge))
    with ctx.pool.connection() as conn:
        if status.kind is StatusKind.NOT_FOUND:
            charges.settle(conn, charge_id, StatusKind.FAILED, failure_code=NOT_SUBMITTED)
            return Done()
        if status.kind is StatusKind.NO_ANSWER:
            return RetryAfter(resubmit_delay(job.attempts + 1), f"status: {status.detail}")
        if status.kind is StatusKind.MISCONFIGURED:
            misconfiguration.alert(conn, charge["rail"], status.reason, operation="charge_status",
                                   http_status=status.http_status, charge_id=charge_id,
                                   effect="kept_pending")
            return Done(f"status read refused for our configuration ({status.reason}); the poll carries on")
        charges.record_poll(conn, charge_id, rail_knows=True)
    return Done("the rail knows it; the poll job carries on")

