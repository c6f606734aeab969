"""The money state machine: every charge and intent transition, in one module.

Charges: ``pending`` → ``succeeded`` | ``failed`` | ``unresolved``;
``unresolved`` → ``succeeded`` | ``failed``. Intents follow their charge:
``processing`` → ``succeeded`` | ``requires_payment_method``; an escalated
charge leaves its intent where it was (design page, "Timers assert nothing").

Every transition is one transaction and a compare-and-swap on the current
status: a second call, a racing worker or a re-run after a crash matches no
row and answers "nothing to do", and no status moves backwards. Each
transition writes exactly one event, born with its deliveries (a
``webhook_deliveries`` row and a ``deliver:<event_id>:<endpoint_id>`` job per
enabled endpoint that receives it) in the same transaction, under an id that
is a pure function of the transition (``event_id_of``): written again on
another timeline of the database after a failover, it reaches the merchant
under the same id. A charge's settle, the transition on every payment's
path, is one statement (``charge_settle``; issue 30).
Amounts are integers in minor units.

The rules a charge shares with every polled operation (the ladder, the
24-hour escalation, the settle compare-and-swap, contradictions) are
``vpay.money.pollable``'s; ``CHARGES`` (at the end) describes what is a charge's
own: its intent moves with it, and its prompt has a TTL.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from vpay.money import misconfiguration, pollable
from vpay.engine import queue
from vpay.money.currency import CURRENCIES
from vpay.money.ids import event_id, new_id, new_rail_reference
from vpay.money.pollable import FIRST_POLL_SECONDS, Pollable, Settled
from vpay.base.logs import after_commit, committed
from vpay.base.queries import Q
from vpay.rails.port import KNOWN_RAILS, ChargeRequest, Rail, RailStatus, StatusKind, resend_safe

log = logging.getLogger("vpay.money")

# Used with fullmatch: a "$" anchor would also accept a trailing newline.
MSISDN = re.compile(r"\+?([0-9]{8,15})")
MERCHANT = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_AMOUNT = 10**12  # minor units; well past any mobile-money wallet limit


class InvalidPayment(ValueError):
    """Bad input to ``create_payment``; ``param`` names the offending field.
    Nothing was written."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Created:
    """``create_payment``'s answer: the intent and charge rows as dicts."""

    intent: dict[str, Any]
    charge: dict[str, Any]


def validate(merchant_id: str, amount: Any, currency: Any, rail: Any, payer: Any) -> tuple[str, int, str, str, str]:
    """Normalise and check a payment's input. Raises ``InvalidPayment``.

    amount: a positive int in minor units (bools and floats are refused);
    currency: an ISO 4217 code this service supports (``vpay.money.currency``);
    payer: an MSISDN, 8 to 15 digits, an optional leading ``+`` dropped;
    rail: one of ``vpay.rails.KNOWN_RAILS``.
    """
    if not isinstance(merchant_id, str) or not MERCHANT.fullmatch(merchant_id):
        raise InvalidPayment("merchant", "merchant must be 1-64 letters, digits, '_', '-' or '.'")
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise InvalidPayment("amount", "amount must be a whole number of minor units")
    if not 0 < amount <= MAX_AMOUNT:
        raise InvalidPayment("amount", f"amount must be between 1 and {MAX_AMOUNT} minor units")
    if not isinstance(currency, str) or currency.upper() not in CURRENCIES:
        raise InvalidPayment("currency", f"unknown or unsupported currency {currency!r}")
    if rail not in KNOWN_RAILS:
        raise InvalidPayment("rail", f"unknown rail {rail!r}; known: {', '.join(KNOWN_RAILS)}")
    m = MSISDN.fullmatch(payer) if isinstance(payer, str) else None
    if not m:
        raise InvalidPayment("payer", "payer must be an MSISDN: 8 to 15 digits, international form")
    return merchant_id, amount, currency.upper(), rail, m.group(1)


def emit_event(conn: psycopg.Connection, type_: str, intent: dict[str, Any],
               charge: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write one event and its deliveries, in one statement
    (``insert_event``): a ``webhook_deliveries`` row and a
    ``deliver:<event_id>:<endpoint_id>`` job per endpoint of the merchant
    enabled at this moment that receives the event's type; none when the
    merchant has none (docs/webhooks.md, "Who gets an event"). Call inside
    the transition's transaction so that the event and its deliveries are
    born together. A ``payment_intent.payment_failed`` (the
    charge's) or ``refund.failed`` (``extra["refund"]``'s) event also says
    ``failure_code`` and ``failure_kind`` at the top of its data:
    ``configuration`` for ``rail_configuration_refused``, so that no webhook
    consumer can read our misconfiguration as a payer decline
    (``vpay.money.misconfiguration.failure_kind``).

    The event's id is the transition's, never random (``event_id_of``):
    the same charge's (or refund's) same transition always has the same id,
    so that a transition written again after a failover lost the first
    write (an asynchronous standby promoted before it received it) reaches
    the merchant under the id they already deduplicate on. An event whose
    id exists already is therefore the same transition written before: it
    is kept as it is, no second fan-out is made, and that row is answered
    (logged at warning: on one timeline every transition's compare-and-swap
    lets it happen once, so this means the database was restored or written
    around the state machine). Raises ``RuntimeError`` when the row found
    is another type or intent (a hash collision: ``vpay.money.ids``).
    ``_settle_in_one`` keeps all of these rules for a charge's settle."""
    data = {"object": intent_view(intent), "charge": charge_view(charge), **(extra or {})}
    failed = {"payment_intent.payment_failed": charge,
              "refund.failed": (extra or {}).get("refund") or {}}.get(type_)
    if failed is not None:
        data |= {"failure_code": failed.get("failure_code"),
                 "failure_kind": misconfiguration.failure_kind(failed.get("failure_code"))}
    event_id = event_id_of(type_, charge, extra)
    with conn.cursor(row_factory=dict_row) as cur:
        event = cur.execute(Q["insert_event"], {"id": event_id, "type": type_,
                                                "payment_intent_id": intent["id"],
                                                "data": Jsonb(data)}).fetchone()
        if event is None:
            event = cur.execute(Q["existing_event"], {"id": event_id}).fetchone()
            if event is None or event["type"] != type_ or event["payment_intent_id"] != intent["id"]:
                raise RuntimeError(f"event id {event_id} of {type_} on {intent['id']} is taken by "
                                   f"{event and (event['type'], event['payment_intent_id'])}")
            log.warning("event already written: the same transition again, kept once",
                        extra={"event_id": event_id, "type": type_, "payment_intent": intent["id"],
                               "charge_id": charge["id"]})
    return event


def event_id_of(type_: str, charge: dict[str, Any], extra: dict[str, Any] | None = None) -> str:
    """The id of the event ``emit_event`` writes for this transition
    (``vpay.money.ids.event_id``): its subject is the refund
    (``extra["refund"]["id"]``) for a ``refund.*`` event, else the charge;
    its step is ``expired`` for the prompt expiry's
    ``payment_intent.processing`` (``extra["expired"]`` true), else empty, so
    the charge's two processing events differ. A new event type needs
    nothing here; a second event of one type and subject (another step)
    must say which it is, or it would take the first one's id."""
    extra = extra or {}
    if type_.startswith("refund."):
        return event_id(extra["refund"]["id"], type_)
    return event_id(charge["id"], type_, "expired" if extra.get("expired") else "")


def create_payment(conn: psycopg.Connection, *, merchant_id: str, amount: int, currency: str,
                   rail: str, payer: str, description: str | None = None,
                   prompt_ttl_seconds: int = 900, intent_id: str | None = None) -> Created:
    """Create a confirmed payment: in ONE transaction the intent
    (``processing``, with a ``mobile_money_prompt`` next action), the charge
    (``pending``, a fresh UUIDv4 ``rail_reference``), its ``poll:<charge_id>``
    job (due at the ladder's first rung) and the ``payment_intent.processing``
    event. The rail is asked to pay only after this commits (``submit``), so
    every kill point leaves the poll job behind (design page, "The job queue").

    ``intent_id`` (default: a fresh ``pi_…``) lets a caller choose the id
    before creating, so that it can tell later whether the intent was
    committed (the API's Idempotency-Key records); an id that exists already
    raises ``psycopg.errors.UniqueViolation`` and writes nothing.

    Raises ``InvalidPayment`` on bad input or an unknown merchant; nothing
    is written then.
    """
    merchant_id, amount, currency, rail, payer = validate(merchant_id, amount, currency, rail, payer)
    if description is not None and (not isinstance(description, str) or len(description) > 160
                                    or CONTROL.search(description)):
        raise InvalidPayment("description", "description must be text of at most 160 characters, "
                                            "without control characters")
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            intent = cur.execute(Q["insert_intent"], {
                "id": intent_id or new_id("pi"), "merchant_id": merchant_id, "amount": amount,
                "currency": currency, "ttl": prompt_ttl_seconds,
                "description": description}).fetchone()
            charge = cur.execute(Q["insert_charge"], {
                "id": new_id("ch"), "payment_intent_id": intent["id"], "rail": rail,
                "rail_reference": new_rail_reference(), "payer": payer, "amount": amount,
                "currency": currency}).fetchone()
            queue.enqueue(conn, CHARGES.kind, CHARGES.job_key(charge["id"]), {"charge_id": charge["id"]},
                          delay=FIRST_POLL_SECONDS)
            emit_event(conn, "payment_intent.processing", intent, charge, {"expired": False})
    except psycopg.errors.ForeignKeyViolation:
        raise InvalidPayment("merchant", f"unknown merchant {merchant_id!r}") from None
    log.info("payment created", extra={"payment_intent": intent["id"], "charge_id": charge["id"],
                                       "rail": rail, "amount": amount, "currency": currency})
    return Created(intent=intent, charge=charge)


REQUEST_SENT_AT = "request_sent_at"
"""``charges.rail_data`` key (the database's clock, as text) marking that
the one request-to-pay of a rail that is not ``resend_safe`` may have left
(``claim_the_one_send``). Ours, not the rail's: never shown to the adapter."""
OURS = frozenset({"notif_token", REQUEST_SENT_AT})


def charge_request(charge: dict[str, Any], description: str | None = None) -> ChargeRequest:
    """The rail port's view of a charge row. ``rail_data`` is the charge's
    stored ``rail_data`` (string values only; never a ``notif_token``, which
    is not stored anyway, nor our own ``request_sent_at``)."""
    stored = charge.get("rail_data") or {}
    rail_data = {k: v for k, v in stored.items() if isinstance(v, str) and k not in OURS}
    return ChargeRequest(charge_id=charge["id"], rail_reference=charge["rail_reference"],
                         amount=charge["amount"], currency=charge["currency"],
                         payer=charge["payer"], description=description or "",
                         rail_data=rail_data)


def notif_token_sha256(token: str) -> str:
    """Lower-case hex SHA-256 of a callback proof token (Orange's
    ``notif_token``, UTF-8): what ``charges.notif_token_sha256`` holds and
    what the callback route compares (in constant time)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def record_submission(conn: psycopg.Connection, charge_id: str, rail_data: dict[str, str],
                      notif_token: str | None) -> bool:
    """The rail accepted the request and handed back data to keep: in one
    transaction, merge ``rail_data`` (string values; Orange: ``pay_token``,
    ``payment_url``) into ``charges.rail_data``, store the SHA-256 hex of
    ``notif_token`` (never the token; ``None`` keeps what is stored), set
    ``submitted_at`` once, and, when ``rail_data`` has a ``payment_url``,
    point the intent's ``next_action`` at it (``{type: "redirect_to_url",
    url, expires_at}``, only while the intent is ``processing`` with a live
    prompt). Answers whether the charge exists. Raises ``ValueError`` for a
    non-string value or a ``notif_token`` key in ``rail_data``."""
    if "notif_token" in rail_data or not all(isinstance(v, str) for v in rail_data.values()):
        raise ValueError("rail_data holds strings only, and never a notif_token")
    digest = notif_token_sha256(notif_token) if notif_token else None
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["record_submission"], {"id": charge_id, "rail_data": Jsonb(dict(rail_data)),
                                                   "notif_token_sha256": digest}).fetchone()
        if row is None:
            return False
        if rail_data.get("payment_url"):
            cur.execute(Q["redirect_next_action"], {"id": row["payment_intent_id"],
                                                    "url": rail_data["payment_url"]})
    log.info("submission recorded", extra={"charge_id": charge_id, "rail_data_keys": sorted(rail_data),
                                           "notif_token_stored": digest is not None})
    return True


def claim_the_one_send(conn: psycopg.Connection, charge_id: str) -> bool:
    """For a rail that cannot take a request-to-pay twice (``Rail.resend_safe``
    False): mark, committed before the rail is called, that the charge's one
    request may leave (``rail_data.request_sent_at``). Answers False, and the
    caller must not send, when it was marked before (an earlier send may
    have reached the payer: its answer was lost), or the charge is confirmed,
    ended or unknown. A compare-and-swap: of two racing callers one wins."""
    with conn.transaction():
        return conn.execute(Q["claim_the_one_send"], {"id": charge_id}).fetchone() is not None


def forget_unsent_request(conn: psycopg.Connection, charge_id: str) -> bool:
    """Undo ``claim_the_one_send`` when the request surely never reached the
    rail (``Submit.unsent``, a paused rail) or the rail refused it outright
    (our configuration): it may be sent again. Answers whether a mark of an
    unconfirmed charge was dropped."""
    with conn.transaction():
        return conn.execute(Q["forget_unsent_request"], {"id": charge_id}).fetchone() is not None


def request_may_have_left(charge: dict[str, Any]) -> bool:
    """Whether ``charge`` (a row) was marked by ``claim_the_one_send`` and
    not confirmed: its one request may have reached the rail, and its
    answer, if any, was lost."""
    return charge.get("submitted_at") is None and bool((charge.get("rail_data") or {}).get(REQUEST_SENT_AT))


def adopt_status_keys(conn: psycopg.Connection, rail: str, reference: str,
                      keys: dict[str, str]) -> str | None:
    """Keep ``keys`` (identifiers the rail assigned, from a callback:
    ``CallbackIds.status_keys``, M-Pesa's ``checkout_request_id``) as the
    key of the status read of the charge ``(rail, reference)`` names, and
    answer its id; ``None`` when nothing was stored. Identifiers only, never
    a status: only the status read made with them can settle the charge.

    Stored only when all hold (a forged callback can then at worst name a
    wrong identifier, which the read answers NOT_FOUND: nothing settles, the
    charge escalates at the horizon and the statement decides): the charge
    is live (``pending`` / ``unresolved``), unconfirmed, its one request may
    have left (``request_may_have_left``), it holds none of these keys yet
    (the first callback wins), and no other charge of the rail holds these
    identifiers (so it cannot be pointed at another charge's payment). An
    advisory lock on the identifiers makes two charges adopting one at once
    impossible. Raises ``ValueError`` for empty keys or non-string values."""
    if not keys or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in keys.items()):
        raise ValueError("status keys are non-empty strings")
    lock = "|".join(f"{k}={keys[k]}" for k in sorted(keys))
    with conn.transaction():
        conn.execute(Q["lock_status_keys"], {"lock": f"{rail}:{lock}"})
        row = conn.execute(Q["adopt_status_keys"], {"rail": rail, "reference": reference,
                                                    "keys": Jsonb(dict(keys)), "names": sorted(keys)}).fetchone()
    if row is not None:
        log.info("status key adopted from a callback",
                 extra={"charge_id": row[0], "rail": rail, "keys": sorted(keys)})
    return row[0] if row is not None else None


def load_charge(conn: psycopg.Connection, charge_id: str) -> dict[str, Any] | None:
    """A charge row plus ``age_seconds`` (by the database's clock),
    ``merchant_id`` and ``intent_status``; ``None`` when unknown."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["load_charge"], {"id": charge_id}).fetchone()


def mark_submitted(conn: psycopg.Connection, charge_id: str) -> bool:
    """The rail accepted the request-to-pay: set ``submitted_at`` once."""
    return pollable.mark_submitted(conn, CHARGES, charge_id)


def record_poll(conn: psycopg.Connection, charge_id: str, rail_knows: bool) -> None:
    """Stamp ``last_polled_at``; when the rail knew the reference, also
    ``submitted_at`` (``vpay.money.pollable.record_poll``)."""
    pollable.record_poll(conn, CHARGES, charge_id, rail_knows)


def settle(conn: psycopg.Connection, charge_id: str, kind: StatusKind, *,
           failure_code: str | None = None, rail_transaction_id: str | None = None) -> Settled:
    """Move a live charge to its terminal state, with its intent and one event,
    in one transaction: ``SUCCEEDED`` → charge ``succeeded``, intent
    ``succeeded``, ``payment_intent.succeeded``; ``FAILED`` → charge ``failed``
    (``failure_code`` kept), intent ``requires_payment_method``,
    ``payment_intent.payment_failed``.

    The shared compare-and-swap (``vpay.money.pollable.settle``): when the charge
    is already terminal nothing changes; if it ended the other way the rail
    has contradicted us, and a ``rail_contradiction`` alert is written
    (``where: settle``). Raises ``ValueError`` for a non-terminal ``kind``
    and ``LookupError`` for an unknown charge.
    """
    return pollable.settle(conn, CHARGES, charge_id, kind, failure_code=failure_code,
                           rail_transaction_id=rail_transaction_id)


def escalate(conn: psycopg.Connection, charge_id: str | None, horizon_seconds: float) -> list[str]:
    """At the horizon (24 h from ``created_at``), a charge still ``pending``
    becomes ``unresolved`` and one ``charge_unresolved`` alert is written
    (logged at error, once). The intent is left as it was; no event.
    ``charge_id`` names one charge (the poll handler) or is ``None`` for
    every overdue charge (the hourly sweep, so that a charge whose poll job
    was dead-lettered is escalated all the same). Answers the ids escalated
    by this call."""
    return pollable.escalate(conn, CHARGES, charge_id, horizon_seconds)


def expire_prompt(conn: psycopg.Connection, charge_id: str, ttl_seconds: int) -> bool:
    """The first time a live charge is past the prompt TTL: set
    ``prompt_expired_at``, clear the intent's ``next_action``, and emit
    ``payment_intent.processing`` with ``expired: true``, exactly once (the
    CAS is ``prompt_expired_at IS NULL``). Answers whether this call did it."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        charge = cur.execute(Q["expire_prompt"], {"id": charge_id, "ttl": ttl_seconds}).fetchone()
        if charge is None:
            return False
        intent = cur.execute(Q["clear_next_action"], {"id": charge["payment_intent_id"]}).fetchone()
        emit_event(conn, "payment_intent.processing", intent, charge, {"expired": True})
    log.info("prompt expired", extra={"charge_id": charge_id, "ttl_seconds": ttl_seconds})
    return True


def intent_view(intent: dict[str, Any]) -> dict[str, Any]:
    """The merchant-facing JSON of an intent (times as ISO 8601)."""
    return {
        "id": intent["id"], "object": "payment_intent", "amount": intent["amount"],
        "currency": intent["currency"], "status": intent["status"],
        "next_action": intent["next_action"], "description": intent.get("description"),
        "merchant": intent["merchant_id"],
        "created": _iso(intent["created_at"]), "updated": _iso(intent["updated_at"]),
    }


def charge_view(charge: dict[str, Any]) -> dict[str, Any]:
    """The merchant-facing JSON of a charge (the payer's MSISDN is kept: the
    merchant supplied it)."""
    keys = ("id", "payment_intent_id", "rail", "rail_reference", "payer", "amount", "currency",
            "status", "failure_code", "rail_transaction_id")
    times = ("created_at", "submitted_at", "settled_at", "unresolved_at", "prompt_expired_at",
             "last_polled_at")
    return {k: charge.get(k) for k in keys} | {k: _iso(charge.get(k)) for k in times}


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def show(conn: psycopg.Connection, some_id: str) -> dict[str, Any] | None:
    """An intent (``pi_…``) or a charge (``ch_…``) with its intent, charges
    and events, as JSON-ready dicts; ``None`` when unknown."""
    with conn.cursor(row_factory=dict_row) as cur:
        intent_id = some_id
        if some_id.startswith("ch_"):
            row = cur.execute("SELECT payment_intent_id FROM charges WHERE id = %s", (some_id,)).fetchone()
            if row is None:
                return None
            intent_id = row["payment_intent_id"]
        intent = cur.execute(Q["load_intent"], {"id": intent_id}).fetchone()
        if intent is None:
            return None
        charges = cur.execute(Q["charges_of_intent"], {"id": intent_id}).fetchall()
        events = cur.execute(Q["events_of_intent"], {"id": intent_id}).fetchall()
    return {"payment_intent": intent_view(intent), "charges": [charge_view(c) for c in charges],
            "events": [{"id": e["id"], "type": e["type"], "created": _iso(e["created_at"]),
                        "expired": e["data"].get("expired")} for e in events]}


REFUSED = "VP001"
"""SQLSTATE of ``vpay_refuse`` (sql/0027_settle_in_one.sql): a one-statement
write refused what only a bug or a hash collision can make."""


def _settle_in_one(conn: psycopg.Connection, charge_id: str, status: str, failure_code: str | None,
                   rail_transaction_id: str | None, polled: bool) -> dict[str, Any] | None:
    """A charge's settle as ONE statement (``charge_settle``; issue 30): the
    status CAS, the intent following it (``succeeded``, or
    ``requires_payment_method`` for a failure; an intent that moved on its
    own is kept, the merchant is still told), the one event of the
    transition (``event_id_of``; a ``payment_intent.payment_failed`` with
    ``failure_code`` and ``failure_kind``, as ``emit_event`` writes them)
    and its deliveries. ``polled``: stamp the status read too
    (``pollable.record_poll``). Answers ``{id, payment_intent_id, status,
    failure_code, events, deliveries}``, or ``None`` when the CAS matched
    nothing. An event id that exists already for this transition writes no
    second event (logged at warning, as ``emit_event``); one taken by
    another transition raises ``RuntimeError`` and writes nothing."""
    event_type = CHARGES.events[status]
    event_id = event_id_of(event_type, {"id": charge_id})
    params = {"id": charge_id, "status": status, "failure_code": failure_code,
              "rail_transaction_id": rail_transaction_id, "polled": polled,
              "intent_status": "succeeded" if status == "succeeded" else "requires_payment_method",
              "event_id": event_id, "event_type": event_type,
              "failure_kind": misconfiguration.failure_kind(failure_code) if status == "failed" else None}
    try:
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(Q["charge_settle"], params).fetchone()
    except psycopg.Error as exc:
        if getattr(exc, "sqlstate", None) == REFUSED:
            raise RuntimeError(exc.diag.message_primary or str(exc)) from None
        raise
    if row is not None and not row["events"]:
        extra = {"event_id": event_id, "type": event_type, "payment_intent": row["payment_intent_id"],
                 "charge_id": charge_id}
        after_commit(conn, lambda: log.warning(
            "event already written: the same transition again, kept once", extra=extra))
    return row


def _schedule_resubmit(ctx, rail: Rail, charge: dict[str, Any]) -> None:
    """A 404 for a request-to-pay never confirmed: ``resubmit:<charge_id>``
    re-sends it (while the prompt lives) or fails it (``not_submitted``).
    Not for a rail that cannot take it twice whose one request may have
    left (``request_may_have_left``): "not found" only says we never learnt
    its identifier, so the charge stays on its ladder, waits for a callback
    to name it, and escalates at the horizon (docs/flows/mpesa.md)."""
    if not resend_safe(rail) and request_may_have_left(charge):
        return
    with ctx.pool.connection() as conn:
        queue.enqueue(conn, "resubmit", f"resubmit:{charge['id']}", {"charge_id": charge["id"]})


def _prompt_clock(conn: psycopg.Connection, settings, charge: dict[str, Any]) -> tuple[float, ...]:
    """The prompt TTL as a clock of the ladder: past it, the prompt expires
    (once); before it, the next poll is not due later than it."""
    ttl = settings.prompt_ttl_seconds
    if charge["prompt_expired_at"] is not None:
        return ()
    if charge["age_seconds"] >= ttl:
        expire_prompt(conn, charge["id"], ttl)
        return ()
    return (ttl,)


def _read_status(rail: Rail, charge: dict[str, Any]) -> RailStatus:
    return rail.status(charge_request(charge))


CHARGES = Pollable(
    kind="poll", noun="charge", table="charges", payload_key="charge_id",
    events={"succeeded": "payment_intent.succeeded", "failed": "payment_intent.payment_failed"},
    unresolved_alert="charge_unresolved",
    load=load_charge,
    read_status=_read_status,
    settle_in_one=_settle_in_one,
    alert_refs=lambda charge: {"charge_id": charge["id"]},
    details=lambda charge: {"payment_intent": charge["payment_intent_id"]},
    resend=_schedule_resubmit,
    clocks=_prompt_clock,
    settle_where="settle",
    kill_points=("before_settle_commit", "after_settle_commit"),
)
"""Charges as a pollable operation (``poll:<charge_id>``; vpay.money.pollable)."""


@dataclass(frozen=True)
class Evidence:
    """Why a charge or refund is settled without a status read (table
    ``settlement_evidence``). ``source`` is ``statement`` (then
    ``statement_id`` and ``line_no`` name the line) or ``operator`` (``charges
    resolve``); ``text`` is what a reviewer reads later, never empty."""

    source: str
    text: str
    statement_id: str | None = None
    line_no: int | None = None


def settle_proven(conn: psycopg.Connection, p: Pollable, item_id: str, outcome: str, evidence: Evidence, *,
                  failure_code: str | None = None, rail_transaction_id: str | None = None) -> Settled:
    """Settle a charge or refund (``p``: ``CHARGES``, ``refunds.REFUNDS``)
    whose outcome something other than a status read proves (a statement
    line, an operator's note): the shared compare-and-swap
    (``vpay.money.pollable.settle``: one transition, one event, a contradiction
    alerted there) plus one ``settlement_evidence`` row, written only when the
    CAS moved the row, all in one transaction. ``outcome`` is ``succeeded``
    or ``failed``. Raises ``ValueError`` for another outcome or empty
    evidence, ``LookupError`` for an unknown id."""
    if outcome not in ("succeeded", "failed"):
        raise ValueError(f"outcome must be succeeded or failed, got {outcome!r}")
    if not isinstance(evidence.text, str) or not evidence.text.strip():
        raise ValueError("evidence is required")
    kind = StatusKind.SUCCEEDED if outcome == "succeeded" else StatusKind.FAILED
    with committed(conn):
        result = pollable.settle(conn, p, item_id, kind, failure_code=failure_code,
                                 rail_transaction_id=rail_transaction_id)
        if result.transitioned:
            conn.execute(Q["insert_settlement_evidence"], {
                "charge_id": item_id if p.noun == "charge" else None,
                "refund_id": item_id if p.noun == "refund" else None,
                "outcome": outcome, "source": evidence.source, "statement_id": evidence.statement_id,
                "line_no": evidence.line_no, "evidence": evidence.text.strip()})
    return result


def settle_with_evidence(conn: psycopg.Connection, charge_id: str, outcome: str, evidence: Evidence, *,
                         failure_code: str | None = None,
                         rail_transaction_id: str | None = None) -> Settled:
    """``settle`` on evidence instead of a status read: ``settle_proven``
    for a charge (its intent follows; one ``payment_intent.*`` event)."""
    return settle_proven(conn, CHARGES, charge_id, outcome, evidence, failure_code=failure_code,
                         rail_transaction_id=rail_transaction_id)
