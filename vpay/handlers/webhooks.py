"""Webhook fan-out and delivery on the same queue (design page: "the same
queue carries webhook fan-out and delivery").

* Each event is born with its deliveries (``money.emit_event``,
  ``charge_settle``: a ``webhook_deliveries`` row and a
  ``deliver:<event_id>:<endpoint_id>`` job per enabled endpoint of the
  event's merchant that receives it, in the event's transaction; issue 30).
  ``fanout:<event_id>``, which made them in a job of its own before that,
  still runs for a job an older release left queued: the same deliveries,
  re-running creates nothing new.
* ``deliver:<event_id>:<endpoint_id>`` makes one signed POST
  (``vpay.webhooks.post``) and answers the queue: 2xx → ``Done``; 410 → the
  endpoint is disabled, ``Done``; otherwise ``RetryAfter`` on the webhook
  schedule, then ``DeadLetter`` (the loop parks the job and writes a
  ``job_dead_lettered`` alert). A URL the worker's policy refuses for good
  (an endpoint registered under ``VPAY_WEBHOOKS_ALLOW_PRIVATE=1``, delivered
  by a worker without it) holds the endpoint instead: disabled once, one
  ``webhook_endpoint_disabled`` alert naming the reason, the delivery
  ``held`` (``webhooks enable`` re-queues what was held). A disabled
  endpoint's pending deliveries end ``Done`` without a request (``held``
  after a policy hold, else ``skipped``). The attempt number is the job's
  ``attempts``.
* An endpoint that is timing out is backed off as a whole
  (``vpay.webhooks.backoff``): while it is, its deliveries are deferred to
  the end of the back-off without a POST and without spending an attempt,
  so one merchant's hanging endpoint cannot take the webhook lane.

No database connection is held during the POST. Delivery is at-least-once:
a worker that dies (or whose drain times out) after the receiver got the
request but before the job's row was finished delivers again, with the same
``webhook-id``.
"""

from __future__ import annotations

import logging
import random
from typing import Any
from urllib.parse import urlsplit

from psycopg.rows import dict_row

from vpay.base import metrics, secretbox
from vpay.base.db import ConfigError
from vpay import webhooks
from vpay.engine.outcome import DeadLetter, Done, RetryAfter
from vpay.base.queries import Q
from vpay.webhooks import backoff
from vpay.handlers.registry import register

log = logging.getLogger("vpay.webhooks")


@register("fanout")
def fanout(job, ctx):
    """One delivery per enabled endpoint of the event's merchant
    (``fanout_deliveries``); answers ``Done`` with the count created. Only
    for ``fanout:`` jobs an older release left queued at an upgrade: events
    are born with their deliveries now."""
    event_id = job.payload.get("event_id")
    if not event_id:
        return DeadLetter(f"fanout job without an event_id: {job.payload!r}")
    with ctx.pool.connection() as conn:
        rows = conn.execute(Q["fanout_deliveries"], {"event_id": event_id}).fetchall()
    log.info("webhook fan-out", extra=_fields(job, ctx, event_id=event_id, deliveries=len(rows)))
    return Done(f"{len(rows)} deliveries")


@register("deliver")
def deliver(job, ctx):
    """One attempt to deliver one event to one endpoint; see the module doc.
    Two statements around the POST (issue 30): ``webhook_attempt_start``
    (the event, the endpoint and its back-off gate) and
    ``webhook_attempt_end`` (the delivery's outcome and the attempt's word on
    the endpoint); a disabled endpoint, a policy hold and a 410 add theirs."""
    event_id = job.payload.get("event_id")
    endpoint_id = job.payload.get("endpoint_id")
    if not event_id or not endpoint_id:
        return DeadLetter(f"deliver job without event_id/endpoint_id: {job.payload!r}")
    connect_timeout, read_timeout = webhooks.timeouts()  # ConfigError: the loop retries, loudly
    with ctx.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["webhook_attempt_start"], {
            "event_id": event_id, "endpoint_id": endpoint_id,
            "probe_seconds": webhooks.attempt_deadline(connect_timeout, read_timeout) + 5.0}).fetchone()
    fields = _fields(job, ctx, event_id=event_id, endpoint_id=endpoint_id)
    if row is None:
        log.warning("webhook delivery dropped: its event or endpoint no longer exists", extra=fields)
        return Done("event or endpoint gone")
    fields["host"] = urlsplit(row["url"]).hostname
    if not row["enabled"]:
        held = row["disabled_cause"] == "url_policy"
        _record(ctx, event_id, endpoint_id, "held" if held else "skipped", job.attempts, None,
                "endpoint disabled")
        log.info("webhook delivery ended: endpoint disabled", extra=fields | {"held": held})
        return Done("endpoint disabled")
    backed_off = backoff.gate(row)
    if backed_off.wait_seconds > 0:
        wait = backed_off.wait_seconds + random.uniform(0.0, 1.0)  # spread the waiters' wake-up
        log.info("webhook delivery deferred: endpoint backed off",
                 extra=fields | {"retry_in_seconds": round(wait, 1)})
        return RetryAfter(wait, "endpoint backed off: it is timing out", attempt_spent=False)

    body = webhooks.payload({"id": row["event_id"], "type": row["type"],
                             "created_at": row["created_at"], "data": row["data"]})
    try:  # stored sealed (vpay.base.secretbox): opened only here, for this attempt
        box = secretbox.default()
        secrets = [box.open(row["secret"])]
        if row["previous_secret"]:
            secrets.append(box.open(row["previous_secret"]))
    except ConfigError as exc:  # no key, or none that opens it: the operator's to fix
        log.error("webhook delivery deferred: the endpoint's secret cannot be opened",
                  extra=fields | {"error": str(exc)})
        return RetryAfter(300.0, "the endpoint's secret cannot be opened (VPAY_SECRET_KEYS)",
                          attempt_spent=False)
    headers = webhooks.signed_headers(row["event_id"], row["now_epoch"], body, secrets)
    attempt = webhooks.post(row["url"], body, headers, connect_timeout=connect_timeout,
                            read_timeout=read_timeout, allow_private=webhooks.allow_private())
    fields |= {"status_code": attempt.status_code, "seconds": round(attempt.elapsed, 3),
               "result": attempt.summary, "address": attempt.address}
    if attempt.permanent:  # the policy refuses this URL for good: hold the endpoint, not the job
        metrics.webhook_attempt("held")
        with ctx.pool.connection() as conn:
            first = webhooks.hold_endpoint(conn, endpoint_id, attempt.summary)
        _record(ctx, event_id, endpoint_id, "held", job.attempts, None, attempt.summary, attempt)
        log.log(logging.ERROR if first else logging.INFO, "webhook endpoint held by the URL policy",
                extra=fields | {"first": first})
        return Done(f"held: {attempt.summary}")
    decision = webhooks.decide(attempt, job.attempts)
    metrics.webhook_attempt(decision.action)

    if decision.action == "delivered":
        _record(ctx, event_id, endpoint_id, "delivered", job.attempts, attempt.status_code, None, attempt)
        log.info("webhook delivered", extra=fields)
        return Done(attempt.summary)
    if decision.action == "gone":
        with ctx.pool.connection() as conn:
            webhooks.disable_endpoint(conn, endpoint_id, "receiver answered 410 Gone")
        _record(ctx, event_id, endpoint_id, "gone", job.attempts, attempt.status_code,
                decision.note, attempt)
        log.warning("webhook endpoint answered 410 Gone: endpoint disabled", extra=fields)
        return Done(decision.note)
    if decision.action == "retry":
        _record(ctx, event_id, endpoint_id, "pending", job.attempts, attempt.status_code,
                _error_text(attempt), attempt)
        log.warning("webhook delivery failed; will retry",
                    extra=fields | {"retry_in_seconds": round(decision.delay, 1),
                                    "error": attempt.error, "body": attempt.body_excerpt[:200]})
        return RetryAfter(decision.delay, decision.note)
    _record(ctx, event_id, endpoint_id, "dead_lettered", job.attempts, attempt.status_code,
            _error_text(attempt), attempt)
    log.error("webhook delivery given up", extra=fields | {"reason": decision.note,
                                                           "error": attempt.error})
    return DeadLetter(decision.note)


def _record(ctx, event_id: str, endpoint_id: str, status: str, attempts: int,
            status_code: int | None, error: str | None,
            attempt: webhooks.Attempt | None = None) -> None:
    """The delivery's outcome, with what ``attempt`` (None: none was made)
    says about the endpoint (``backoff.said``), in one statement."""
    with ctx.pool.connection() as conn:
        row = conn.execute(Q["webhook_attempt_end"], {
            "event_id": event_id, "endpoint_id": endpoint_id, "status": status,
            "attempts": attempts, "status_code": status_code,
            "error": error[:2000] if error else None,
            "said": backoff.said(attempt) if attempt is not None else None,
            **backoff.END_PARAMS}).fetchone()
    backoff.noted(endpoint_id, row)


def _error_text(attempt: webhooks.Attempt) -> str:
    text = attempt.summary
    if attempt.body_excerpt:
        text += f": {attempt.body_excerpt}"
    return text


def _fields(job, ctx, **more: Any) -> dict[str, Any]:
    return {"worker_id": ctx.worker_id, "job_id": job.id, "kind": job.kind,
            "dedupe_key": job.dedupe_key, "attempts": job.attempts, **more}
