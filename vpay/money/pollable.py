"""What every operation the worker polls to its end shares, written once.

A charge and a refund are the same idea: a row the rail may or may not have
taken, which only an authenticated status read can settle. The rules (design
page, "The poll ladder", "Timers assert nothing", "What the worker does not
do"; docs/flows/refunds.md) are:

* The ladder (``poll_delay``): 10, 20, 30, 45, 60, 90 s, then 120 s, then
  15 min; the first poll is due ``FIRST_POLL_SECONDS`` after creation.
* The 24-hour escalation (``escalate``): a row still ``pending`` at the
  horizon becomes ``unresolved`` with one alert, and is polled every
  ``UNRESOLVED_EVERY`` seconds from then on, for ever.
* The settle compare-and-swap (``settle``): only a live row (``pending`` or
  ``unresolved``) ends, with exactly one event, in one transaction.
* The contradiction rule (``note_contradiction``): a rail that reports the
  opposite of a settled row, or a success for another amount or currency,
  gets one open ``rail_contradiction`` alert and changes nothing.
* The verification read: a settled row polled again is read once and only
  compared (``vpay.handlers.polling``).

What differs between operations is described by one ``Pollable`` value: its
state table, job kind, payload key, event names, alert kind, which port
method reads its status, and what else a settle writes (the charge's intent;
the refund's event on its charge's intent). ``vpay.money.CHARGES`` and
``vpay.money.refunds.REFUNDS`` are the two in use; the generic poll handler body is
``vpay.handlers.polling.poll_once``. Adding a pollable operation: a port
method to read its status, a state table with the columns named in
``sql/queries/pollable.sql``, a ``Pollable`` and one ``register_pollable``
line (docs/architecture.md, "Adding a pollable operation").

Amounts are integers in minor units; ages, horizons and delays are seconds,
measured by the database's clock.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from vpay.base.logs import after_commit, committed
from vpay.engine.outcome import Outcome
from vpay.base.queries import Q
from vpay.rails.port import Rail, RailStatus, StatusKind

log = logging.getLogger("vpay.pollable")

LADDER = (10.0, 20.0, 30.0, 45.0, 60.0, 90.0)
FIRST_POLL_SECONDS = LADDER[0]  # the poll job is born due at the ladder's first rung
UNRESOLVED_EVERY = 3600.0  # after escalation: once an hour, for ever

LIVE = ("pending", "unresolved")
SETTLED = ("succeeded", "failed")
RAIL_KNOWS = frozenset({StatusKind.PENDING, StatusKind.SUCCEEDED, StatusKind.FAILED})


def poll_delay(attempt: int) -> float:
    """Seconds until the next status read after poll number ``attempt``
    (0-based): 0–5 → 10, 20, 30, 45, 60, 90 s; 6–19 → 120 s; 20+ → 900 s
    (15 min) out to the 24-hour horizon. Monotonic non-decreasing. Raises
    ``ValueError`` for a negative ``attempt``."""
    if attempt < 0:
        raise ValueError("attempt must be >= 0")
    if attempt < len(LADDER):
        return LADDER[attempt]
    if attempt < 20:
        return 120.0
    return 900.0


Row = dict[str, Any]


def _no_clocks(conn: psycopg.Connection, settings: Any, row: Row) -> tuple[float, ...]:
    return ()


@dataclass(frozen=True)
class Pollable:
    """One operation the worker polls to its end (a charge, a refund).

    * ``kind``: the job kind; its job key is ``<kind>:<id>`` and its payload
      names the row under ``payload_key``.
    * ``noun``: ``charge``, ``refund``: for messages and log fields
      (``<noun>_id``).
    * ``table``: the state table (columns: ``sql/queries/pollable.sql``).
    * ``events``: the event type a settle writes, by final status
      (``succeeded``, ``failed``).
    * ``unresolved_alert``: the alert kind written once at the horizon.
    * ``load(conn, id)``: the row plus ``age_seconds`` (database clock) and
      whatever ``read_status`` needs; ``None`` when unknown.
    * ``read_status(rail, row)``: the authenticated status read, one rail
      port method (``Rail.status``, ``Rail.refund_status``).
    * ``apply(conn, row, event_type)``: the rest of a settle, inside its
      transaction (``row`` is the settled row): write ``event_type`` with
      its deliveries (``vpay.money.charges.emit_event``), and anything the
      settle moves besides the row. Or, instead of ``apply``:
    * ``settle_in_one(conn, id, status, failure_code, rail_transaction_id,
      polled)``: the whole settle as ONE statement (the CAS, what moves with
      it, the event and its deliveries; issue 30: a charge's, the settle on
      every payment's path): answers the settled row, or ``None`` when the
      CAS matched nothing. ``polled``: a status read said so, and the row's
      read is stamped in the same statement (``record_poll``). Exactly one of
      ``apply`` and ``settle_in_one`` is given (``ValueError`` otherwise).
    * ``alert_refs(row)``: the alert's ``charge_id`` and ``refund_id``.
    * ``details(row)``: keys put first in every alert's ``details``.
    * ``resend(ctx, rail, row)``: the rail answered NOT_FOUND for a row whose
      submission was never confirmed, so the request never arrived: send it
      again (or schedule that). An ``Outcome`` ends the poll; ``None`` keeps
      the ladder.
    * ``clocks(conn, settings, row)``: other clocks than the horizon the
      ladder must not sleep past (the charge's prompt TTL); may act on a
      clock already past (expire the prompt). Default: none.
    * ``settle_where``: the ``where`` of a contradiction a settle finds.
    * ``kill_points``: the ``testhooks`` names paused at before and after the
      settle commits (docs/flows/crash-safety.md).
    """

    kind: str
    noun: str
    table: str
    payload_key: str
    events: Mapping[str, str]
    unresolved_alert: str
    load: Callable[[psycopg.Connection, str], Row | None]
    read_status: Callable[[Rail, Row], RailStatus]
    alert_refs: Callable[[Row], Mapping[str, str | None]]
    resend: Callable[[Any, Rail, Row], Outcome | None]
    apply: Callable[[psycopg.Connection, Row, str], None] | None = None
    settle_in_one: Callable[..., Row | None] | None = None
    details: Callable[[Row], Mapping[str, Any]] = lambda row: {}
    clocks: Callable[[psycopg.Connection, Any, Row], tuple[float, ...]] = _no_clocks
    settle_where: str = "settle"
    kill_points: tuple[str, str] = ("", "")

    def __post_init__(self) -> None:
        if (self.apply is None) == (self.settle_in_one is None):
            raise ValueError(f"a Pollable ({self.kind}) settles by apply or by settle_in_one: exactly one")

    def job_key(self, item_id: str) -> str:
        """The poll job's dedupe key: ``<kind>:<id>``."""
        return f"{self.kind}:{item_id}"

    def ids(self, row: Row) -> dict[str, str]:
        """The row's ids for log lines (``charge_id``, ``refund_id``)."""
        refs = {k: v for k, v in self.alert_refs(row).items() if v is not None}
        return refs | {f"{self.noun}_id": row["id"]}


@dataclass(frozen=True)
class Settled:
    """``settle``'s answer. ``transitioned`` is False when the CAS matched no
    row; ``status`` is the row's status afterwards; ``contradiction`` is
    True when the row was already terminal the other way."""

    transitioned: bool
    status: str
    contradiction: bool = False


@functools.lru_cache(maxsize=None)
def _query(name: str, table: str) -> sql.Composed:
    """Named query ``name`` (``sql/queries/pollable.sql``) for ``table``."""
    return sql.SQL(Q[name]).format(table=sql.Identifier(table))


def mark_submitted(conn: psycopg.Connection, p: Pollable, item_id: str) -> bool:
    """The rail accepted the request: set ``submitted_at`` once. Answers
    whether this call set it."""
    return conn.execute(_query("pollable_mark_submitted", p.table), {"id": item_id}).fetchone() is not None


def record_poll(conn: psycopg.Connection, p: Pollable, item_id: str, rail_knows: bool) -> None:
    """Stamp ``last_polled_at``; when the rail knew the reference, also
    ``submitted_at`` (recovers the kill point between the rail's 202 and our
    write of ``submitted_at``)."""
    conn.execute(_query("pollable_record_poll", p.table), {"id": item_id, "rail_knows": rail_knows})


def final_status(kind: StatusKind) -> str:
    """``succeeded`` or ``failed`` for a terminal answer; ``ValueError``
    for any other."""
    if kind is StatusKind.SUCCEEDED:
        return "succeeded"
    if kind is StatusKind.FAILED:
        return "failed"
    raise ValueError(f"settle needs a terminal outcome, got {kind}")


def settle(conn: psycopg.Connection, p: Pollable, item_id: str, kind: StatusKind, *,
           failure_code: str | None = None, rail_transaction_id: str | None = None,
           polled: bool = False) -> Settled:
    """Move a live row to its terminal state, in one transaction, with its
    one event (``p.events``): ``SUCCEEDED`` → ``succeeded``; ``FAILED`` →
    ``failed`` (``failure_code`` kept, default ``unknown``). By
    ``p.settle_in_one`` (one statement) when the operation has it, else the
    CAS and ``p.apply`` in a transaction. ``polled``: a status read answered
    this (the poll handler), so the read is stamped too (``record_poll``,
    the rail knew the reference), in the same statement where it can be.

    A compare-and-swap on the status: a row already terminal is not changed
    (``transitioned`` False); if it ended the other way the rail has
    contradicted us, and a ``rail_contradiction`` alert is written
    (``contradiction`` True; design page, "What the worker does not do":
    contradictions are alerted, never acted on). Raises ``ValueError`` for a
    non-terminal ``kind`` and ``LookupError`` for an unknown id.
    """
    status = final_status(kind)
    code = (failure_code or "unknown") if status == "failed" else None
    if p.settle_in_one is not None:
        row = p.settle_in_one(conn, item_id, status, code, rail_transaction_id, polled)
        if row is None:
            if polled:
                record_poll(conn, p, item_id, True)
            return _not_settled(conn, p, item_id, status, code)
    else:
        with committed(conn), conn.cursor(row_factory=dict_row) as cur:
            if polled:
                record_poll(conn, p, item_id, True)
            row = cur.execute(_query("pollable_settle", p.table), {
                "id": item_id, "status": status, "failure_code": code,
                "rail_transaction_id": rail_transaction_id}).fetchone()
            if row is None:
                return _not_settled(conn, p, item_id, status, code)
            p.apply(conn, row, p.events[status])
    extra = p.ids(row) | {"status": status, "failure_code": code}
    after_commit(conn, lambda: log.info(f"{p.noun} settled", extra=extra))
    return Settled(True, status)


def _not_settled(conn: psycopg.Connection, p: Pollable, item_id: str, status: str,
                 code: str | None) -> Settled:
    """The settle's CAS matched nothing: what is there instead (a no-op, a
    contradiction alerted, or ``LookupError`` for an unknown id)."""
    with conn.cursor(row_factory=dict_row) as cur:
        current = cur.execute(_query("pollable_current", p.table), {"id": item_id}).fetchone()
    if current is None:
        raise LookupError(f"no {p.noun} {item_id}")
    if current["status"] in SETTLED and current["status"] != status:
        note_contradiction(conn, p, current, status, code, where=p.settle_where)
        return Settled(False, current["status"], contradiction=True)
    return Settled(False, current["status"])


def note_contradiction(conn: psycopg.Connection, p: Pollable, row: Row, rail_says: str,
                       rail_reason: str | None, *, where: str) -> bool:
    """Alert that the rail reports something other than ``row`` (its
    ``status`` and ``failure_code`` are ``ours``); change nothing else
    (runbook: worker-queue, "a rail contradicting a settled charge"). One
    open alert per row and answer (sql/0007_one_open_contradiction.sql):
    answers whether this call wrote it."""
    details = {**p.details(row), "ours": row["status"], "our_failure_code": row.get("failure_code"),
               "rail_says": rail_says, "rail_reason": rail_reason, "where": where}
    written = _alert(conn, "rail_contradiction", p.alert_refs(row), details)
    if written:
        extra = p.ids(row) | details
        after_commit(conn, lambda: log.error(f"rail contradicts a settled {p.noun}", extra=extra))
    return written


def escalate(conn: psycopg.Connection, p: Pollable, item_id: str | None,
             horizon_seconds: float) -> list[str]:
    """At the horizon (``horizon_seconds`` after ``created_at``, 24 h by
    default) a row still ``pending`` becomes ``unresolved`` and one
    ``p.unresolved_alert`` alert is written with it (logged at error, once).
    No event: the merchant hears when it settles. ``item_id`` names one row
    (the poll handler) or is ``None`` for every overdue row (the hourly
    sweep). Answers the ids escalated by this call."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(_query("pollable_escalate", p.table),
                           {"id": item_id, "horizon": horizon_seconds}).fetchall()
        for row in rows:
            _alert(conn, p.unresolved_alert, p.alert_refs(row), {
                **p.details(row), "rail": row["rail"], "rail_reference": row["rail_reference"],
                "amount": row["amount"], "currency": row["currency"],
                "created_at": row["created_at"].isoformat()})
    for row in rows:
        extra = p.ids(row) | {"rail": row["rail"], "rail_reference": row["rail_reference"],
                              "horizon_seconds": horizon_seconds}
        after_commit(conn, lambda extra=extra: log.error(
            f"{p.noun} unresolved at the horizon: reconcile against the rail's statement", extra=extra))
    return [row["id"] for row in rows]


def _alert(conn: psycopg.Connection, kind: str, refs: Mapping[str, str | None],
           details: dict[str, Any]) -> bool:
    return conn.execute(Q["insert_alert"], {
        "kind": kind, "charge_id": refs.get("charge_id"), "refund_id": refs.get("refund_id"),
        "details": Jsonb(details)}).fetchone() is not None
