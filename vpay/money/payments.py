"""Creating and confirming a payment, as the API and the CLI do it.

``create_and_submit`` commits the intent, the charge and its poll job first
(``charges.create_payment``), and only then asks the rail to pay (``submit``).
The API bounds that: its adapters carry a short total deadline
(``VPAY_API_RAIL_TIMEOUT_SECONDS``), and at most a few requests per process
wait on a rail at once (``slots``); a create that finds no free slot does
not call the rail at all and leaves the submission to the worker's
``resubmit:<charge_id>``, due at once.
A process killed between the two leaves a pending charge with a poll job: the
poll reads 404 from the rail and enqueues ``resubmit:<charge_id>``, which
sends the same ``X-Reference-Id`` again (issue: the whole charge lifecycle).
A rail that cannot take a request twice (``Rail.resend_safe`` False: M-Pesa)
is sent it at most once per charge (``submit``).

The rail's answer to an accepted request is written back through a brief
database outage (``ANSWER_WRITE_SECONDS``, on fresh connections of the
caller's pool): for M-Pesa it holds the only key to the payment's status
(the ``CheckoutRequestID``), and a connection that died in a Postgres
restart between the rail's answer and our write used to throw it away,
leaving the charge to a callback or the 24-hour horizon (docs/flows/mpesa.md,
"A lost answer"; found by the chaos run, docs/chaos.md).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from vpay.money import misconfiguration, charges
from vpay.engine import queue
from vpay.base import testhooks
from vpay.base.logs import committed
from vpay.rails.port import Rail, RailPaused, StatusKind, Submit, SubmitKind, creation_problem, resend_safe

log = logging.getLogger("vpay.payments")


ANSWER_LOST = "ANSWER_LOST"
"""``Submit.reason`` when a rail that cannot take a request twice is not
sent one because an earlier send may have reached the payer."""


def answer_lost(rail: Rail, answer: Submit) -> bool:
    """Whether ``answer`` leaves a request that may have reached ``rail``
    unconfirmed on a rail that cannot take it twice: the charge must wait
    (no resend) for a callback's identifier, the horizon and the statement."""
    return not resend_safe(rail) and answer.kind is SubmitKind.NO_ANSWER and not answer.unsent


ANSWER_WRITE_SECONDS = 30.0
"""How long the write of an accepted request-to-pay's answer (``submitted_at``
and the rail's data: M-Pesa's ``CheckoutRequestID``, Orange's ``pay_token``)
is retried on fresh connections when the database goes away after the rail
answered (seconds; the same outage the worker rides out for a job's outcome,
vpay/worker/outcomes.py ``RETRY_SECONDS``). A fast Postgres restart took
1.5 s in the chaos run and a failover 1.64 s (bench/ha.py). Past it the
answer is given up, logged at error; the charge keeps its poll job (a
resend-safe rail is found by our reference; M-Pesa waits for a callback's
identifier or the horizon)."""

OUTAGE_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout,
                 psycopg.errors.ReadOnlySqlTransaction)
"""The database away, restarting, or refusing writes for a while (a demoted
primary): what ``ANSWER_WRITE_SECONDS`` retries. Any other error is a bug
or a constraint, raised at once."""

RETRY_WAIT_SECONDS = (0.1, 0.2, 0.5, 1.0)
"""Waits between two tries of an accepted answer's write (then the last, 1 s,
again): a fast restart is over within a couple of tries."""


def resubmit_delay(attempt: int) -> float:
    """Seconds before re-sending an unconfirmed request-to-pay: 5, 10, 20,
    40, then every 60 s while the prompt TTL runs."""
    return float(min(5 * 2 ** max(attempt - 1, 0), 60))


def submit(conn: psycopg.Connection, rail: Rail, charge: dict[str, Any],
           description: str | None = None, *, schedule_resubmit: bool = True,
           resend: bool = False, pool: ConnectionPool | None = None) -> Submit:
    """Send the request-to-pay for ``charge`` and record what the rail said:
    accepted → ``submitted_at`` (and, when the rail handed data back,
    ``charges.record_submission``); rejected for good → the charge fails with the
    rail's reason (one event); no answer → ``resubmit:<charge_id>`` is
    enqueued (unless the caller is that job).

    Refused for our configuration (``SubmitKind.MISCONFIGURED``): one
    ``rail_misconfigured`` alert per rail and code, always. On the first send
    (``resend`` False) no payer was asked, so the charge fails with
    ``rail_configuration_refused`` (one ``payment_intent.payment_failed``,
    ``failure_kind: configuration``). On a re-send (the resubmit job) an
    earlier send's fate is unknown (it may have reached the payer), so the
    charge stays pending and its poll carries on (docs/flows/reconciler.md,
    "Configuration is not a decline"). Never raises for the rail's answer.

    A paused rail (``RailPaused``: nothing was sent) is "no answer" with the
    resubmit due at the end of the pause; the resubmit job itself lets
    ``RailPaused`` through to ``handlers.handle``, which defers it.

    A rail that cannot take a request twice (``Rail.resend_safe`` False:
    M-Pesa) is sent it at most once per charge: ``charges.claim_the_one_send``
    commits the mark before the call, and a charge marked before is not sent
    again (answer ``NO_ANSWER`` / ``ANSWER_LOST``, nothing sent). A lost
    answer (``answer_lost``: no answer, and not surely ``unsent``) keeps the
    mark and schedules no resubmit: the charge waits for a callback to name
    its identifier, and escalates at the horizon (docs/flows/mpesa.md, "A
    lost answer"). An answer proving nothing reached the payer (``unsent``,
    a pause, a refusal of our configuration) drops the mark.

    ``pool``: where fresh connections come from when ``conn`` dies after the
    rail accepted (``record_accepted``): the answer in hand is written through
    an outage of up to ``ANSWER_WRITE_SECONDS``. Without one, the write's
    database error is raised at once."""
    request = charges.charge_request(charge, description)
    once = not resend_safe(rail)
    if once and not charges.claim_the_one_send(conn, charge["id"]):
        log.warning("request-to-pay not sent again: the rail cannot take it twice and an earlier "
                    "send may have reached the payer", extra={"charge_id": charge["id"], "rail": charge["rail"]})
        return Submit(SubmitKind.NO_ANSWER, reason=ANSWER_LOST)
    try:
        answer = rail.request_to_pay(dataclasses.replace(request, resend=True) if resend else request)
    except RailPaused as paused:
        if once:
            charges.forget_unsent_request(conn, charge["id"])
        if not schedule_resubmit:
            raise
        queue.enqueue(conn, "resubmit", f"resubmit:{charge['id']}", {"charge_id": charge["id"]},
                      delay=max(paused.seconds, resubmit_delay(1)))
        log.warning("rail paused; request-to-pay not sent, resubmit scheduled after the pause",
                    extra={"charge_id": charge["id"], "rail": paused.rail,
                           "retry_in_seconds": round(paused.seconds, 3)})
        return Submit(SubmitKind.NO_ANSWER, reason="RAIL_PAUSED")
    if answer.kind is SubmitKind.ACCEPTED:
        testhooks.pause("after_rail_accepted")
        record_accepted(conn, charge, answer, pool)
    elif answer.kind is SubmitKind.REJECTED:
        charges.settle(conn, charge["id"], StatusKind.FAILED, failure_code=answer.reason or "rejected")
    elif answer.kind is SubmitKind.MISCONFIGURED:
        if once:  # refused before it reached a payer: once fixed, it may be sent
            charges.forget_unsent_request(conn, charge["id"])
        with committed(conn):  # the alert and the failure together, or neither
            misconfiguration.alert(conn, charge["rail"], answer.reason, operation="request_to_pay",
                                   http_status=answer.http_status, charge_id=charge["id"],
                                   effect="kept_pending" if resend else "failed")
            if not resend:
                charges.settle(conn, charge["id"], StatusKind.FAILED,
                             failure_code=misconfiguration.FAILURE_CODE)
    elif once and not answer.unsent:
        log.warning("request-to-pay answer lost on a rail that cannot take it twice: not sent again; "
                    "waiting for a callback to name it, the 24-hour escalation and the statement",
                    extra={"charge_id": charge["id"], "rail": charge["rail"], "reason": answer.reason,
                           "http_status": answer.http_status})
    elif once and not charges.forget_unsent_request(conn, charge["id"]):
        # Confirmed meanwhile (a callback's identifier, read by the poll): nothing to send.
        log.info("request-to-pay unsent, but the charge is confirmed already", extra={"charge_id": charge["id"]})
    elif schedule_resubmit:
        queue.enqueue(conn, "resubmit", f"resubmit:{charge['id']}", {"charge_id": charge["id"]},
                      delay=resubmit_delay(1))
        log.warning("request-to-pay not confirmed; resubmit scheduled",
                    extra={"charge_id": charge["id"], "reason": answer.reason,
                           "http_status": answer.http_status})
    return answer


def _write_accepted(conn: psycopg.Connection, charge_id: str, answer: Submit) -> None:
    if answer.rail_data:  # e.g. Orange: pay_token, payment_url; notif_token kept as a hash only
        kept = dict(answer.rail_data)
        notif_token = kept.pop("notif_token", None)
        charges.record_submission(conn, charge_id, kept, notif_token)
    charges.mark_submitted(conn, charge_id)


def record_accepted(conn: psycopg.Connection, charge: dict[str, Any], answer: Submit,
                    pool: ConnectionPool | None = None, *,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> None:
    """Write what the rail answered to an accepted request-to-pay for
    ``charge`` (a row): its data (``charges.record_submission``) and
    ``submitted_at``, on ``conn``. Both writes only ever set what is unset or
    merge the same data, so a try whose answer was lost is harmless to repeat.

    When ``conn`` meets the database away (``OUTAGE_ERRORS``: a restart ended
    the session between the rail's answer and this write) and ``pool`` is
    given, the write is tried again on fresh connections of ``pool`` for up
    to ``ANSWER_WRITE_SECONDS`` (``RETRY_WAIT_SECONDS`` apart): the answer is
    in hand, and on a rail that cannot take a request twice it is the only
    key to the payment's status. Past the bound, or without ``pool``, the
    last error is raised (logged at error first when retried). ``clock`` and
    ``sleep`` (seconds) are for tests."""
    try:
        _write_accepted(conn, charge["id"], answer)
        return
    except OUTAGE_ERRORS as exc:
        if pool is None:
            raise
        error: BaseException = exc
    fields = {"charge_id": charge["id"], "rail": charge.get("rail"),
              "rail_data_keys": sorted(answer.rail_data or {})}
    log.warning("the rail accepted the request-to-pay but the database went away before its answer "
                "was written; retrying on a new connection",
                extra={**fields, "error": f"{type(error).__name__}: {error}"[:300],
                       "within_seconds": ANSWER_WRITE_SECONDS})
    deadline = clock() + ANSWER_WRITE_SECONDS
    tries = 1
    while True:
        left = deadline - clock()
        if left <= 0:
            log.error("the rail accepted the request-to-pay but its answer could not be written within "
                      f"{ANSWER_WRITE_SECONDS:g} s: given up; the charge keeps its poll job",
                      extra={**fields, "tries": tries, "error": f"{type(error).__name__}: {error}"[:300]})
            raise error
        sleep(min(RETRY_WAIT_SECONDS[min(tries - 1, len(RETRY_WAIT_SECONDS) - 1)], left))
        tries += 1
        try:
            with pool.connection(timeout=max(deadline - clock(), 0.1)) as fresh:
                _write_accepted(fresh, charge["id"], answer)
        except OUTAGE_ERRORS as exc:
            error = exc
            continue
        log.warning("the rail's answer to the request-to-pay was written after the database came back",
                    extra={**fields, "tries": tries})
        return


def create_and_submit(pool: ConnectionPool, rail_for: Callable[[str], Rail], *, merchant_id: str,
                      amount: int, currency: str, rail: str, payer: str,
                      description: str | None = None, prompt_ttl_seconds: int = 900,
                      intent_id: str | None = None,
                      slots: threading.Semaphore | None = None) -> dict[str, Any]:
    """Create (one transaction) then submit. Answers ``{"payment_intent",
    "charge"}`` as merchant-facing JSON, read back after the submit, and
    ``rail_refusal`` (``{"code"}``, ``misconfiguration.refusal``) when the
    rail refused our configuration for this very request. Raises
    ``charges.InvalidPayment`` on bad input (nothing written), a payment
    the rail can never carry included (``rails.port.creation_problem``:
    M-Pesa's whole KES, pawaPay's configured countries), and
    ``RailError`` when the rail is not configured (checked before writing).
    ``intent_id``: see ``charges.create_payment``. ``slots`` (the API's): when
    given and none is free right now, the rail is not called; the charge's
    ``resubmit`` job, due at once, sends the request-to-pay from the worker
    (the intent reads ``processing`` either way)."""
    adapter = rail_for(rail) if rail in charges.KNOWN_RAILS else None
    refused = creation_problem(adapter, amount, currency, payer) if adapter is not None \
        and not isinstance(amount, bool) and isinstance(amount, int) and isinstance(currency, str) \
        and isinstance(payer, str) else None
    if refused:  # a pairing the rail can never carry: a clear error, nothing written
        raise charges.InvalidPayment(*refused)
    with pool.connection() as conn:
        created = charges.create_payment(conn, merchant_id=merchant_id, amount=amount,
                                       currency=currency, rail=rail, payer=payer,
                                       description=description,
                                       prompt_ttl_seconds=prompt_ttl_seconds,
                                       intent_id=intent_id)
    testhooks.pause("after_charge_commit")
    with pool.connection() as conn:
        answer = None
        if slots is None:
            answer = submit(conn, adapter, created.charge, description, pool=pool)
        elif slots.acquire(blocking=False):
            try:
                answer = submit(conn, adapter, created.charge, description, pool=pool)
            finally:
                slots.release()
        else:
            queue.enqueue(conn, "resubmit", f"resubmit:{created.charge['id']}",
                          {"charge_id": created.charge["id"]})
            log.warning("every rail slot of this process is busy: request-to-pay left to the worker",
                        extra={"charge_id": created.charge["id"], "rail": rail})
    # Read back on a connection of its own: the submit's may have died under
    # a restart that its answer's write rode out on a fresh one.
    with pool.connection() as conn:
        shown = charges.show(conn, created.intent["id"])
    result = {"payment_intent": shown["payment_intent"], "charge": shown["charges"][0]}
    refused = misconfiguration.refusal(answer)
    if refused is not None:
        result["rail_refusal"] = refused
    return result
