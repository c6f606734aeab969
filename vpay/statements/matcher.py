"""Judge statement lines against our charges and refunds (reads only).

The rules (docs/flows/statements.md; issue "Statement reconciliation"):

* a line naming a charge (refund) of ours that agrees with its settled state
  → ``matched``;
* a terminal line naming a ``pending`` or ``unresolved`` one → ``would_settle``
  (the importer settles it through the money state machine with ``--apply``,
  the line stored as the evidence: one transition, one event);
* a terminal line contradicting a settled one, or a success whose amount or
  currency (minor units, by the currency's exponent) is not ours → one
  ``contradiction`` alert; nothing moves;
* a line naming nothing of ours → ``unknown_rail_transaction`` (an alert for
  a success: money received that we cannot attribute);
* a line the rail still calls pending → ``still_pending``; an unreadable one
  → ``error``; neither moves anything;
* a success of ours created inside the statement's period and absent from it
  → ``missing_from_statement`` (an alert), except within ``lag_seconds`` of
  the period's end: a statement may lag the latest transactions by up to 60
  minutes (design/rails.md, "Statements"), so those are reported as
  ``within_lag`` and left to the next statement.

Lines are compared with a snapshot read once; the importer's settlement is
still a compare-and-swap, so a poll that settled a charge meanwhile wins and
the line is judged again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from vpay.money.currency import minor_to_major_string
from vpay.base.queries import Q
from vpay.statements.lines import Line

LAG_SECONDS = 3600.0
"""How far a statement may lag the latest transactions (design/rails.md)."""

TERMINAL = ("succeeded", "failed")


@dataclass
class Judgement:
    """What one line means. ``settle``: the outcome to settle the charge or
    refund with (``would_settle`` only); ``alert``: ``(kind, details)`` to
    raise with ``--apply``."""

    line: Line
    outcome: str
    charge_id: str | None = None
    refund_id: str | None = None
    refund_charge_id: str | None = None
    detail: str | None = None
    settle: str | None = None
    alert: tuple[str, dict[str, Any]] | None = None


@dataclass
class Plan:
    """The whole statement judged: one ``Judgement`` per line; ``missing`` and
    ``within_lag``: our successes absent from it (dicts with ``charge_id`` or
    ``refund_id``, ``rail_reference``, ``amount``, ``currency``,
    ``created_at``); the period its lines cover; the kinds it covers."""

    judgements: list[Judgement]
    period_start: datetime | None
    period_end: datetime | None
    kinds: frozenset[str]
    missing: list[dict[str, Any]] = field(default_factory=list)
    within_lag: list[dict[str, Any]] = field(default_factory=list)


def plan(conn: psycopg.Connection, rail: str, lines: list[Line], *, has_type: bool,
         lag_seconds: float = LAG_SECONDS) -> Plan:
    """Judge ``lines`` of a ``rail`` statement. ``has_type``: the file has a
    type column (then it covers the kinds its lines name; otherwise it is a
    collections statement)."""
    refs = sorted({l.reference for l in lines if l.reference} | {l.reference.lower() for l in lines
                                                                  if l.reference})
    txids = sorted({l.rail_transaction_id for l in lines if l.rail_transaction_id})
    with conn.cursor(row_factory=dict_row) as cur:
        charges = cur.execute(Q["charges_for_statement"], {"rail": rail, "refs": refs,
                                                           "txids": txids}).fetchall()
        refunds = cur.execute(Q["refunds_for_statement"], {"rail": rail, "refs": refs,
                                                           "txids": txids}).fetchall()
    index = {"charge": _index(charges, order_ids=rail == "orange"), "refund": _index(refunds)}
    named: dict[str, int] = {}
    judgements = [_judge(rail, line, index, named) for line in lines]

    times = [l.time for l in lines if l.time is not None]
    start, end = (min(times), max(times)) if times else (None, None)
    kinds = (frozenset(l.kind for l in lines if l.kind) if has_type else frozenset({"charge"}))
    result = Plan(judgements, start, end, kinds)
    if start is not None:
        _absent(conn, rail, result, named, lag_seconds)
    return result


def _index(rows: list[dict[str, Any]], order_ids: bool = False) -> dict[str, dict[str, dict[str, Any]]]:
    by_ref: dict[str, dict[str, Any]] = {}
    by_txid: dict[str, dict[str, Any]] = {}
    for row in rows:
        by_ref[row["rail_reference"].lower()] = row
        by_ref[row["id"]] = row
        if order_ids:
            by_ref[row["rail_reference"].replace("-", "").lower()[:30]] = row
        if row["rail_transaction_id"]:
            by_txid[row["rail_transaction_id"]] = row
    return {"ref": by_ref, "txid": by_txid}


def _find(line: Line, index) -> tuple[str, dict[str, Any]] | None:
    kinds = (line.kind,) if line.kind else ("charge", "refund")
    for kind in kinds:
        table = index[kind]
        row = None
        if line.reference:
            row = table["ref"].get(line.reference) or table["ref"].get(line.reference.lower())
        if row is None and line.rail_transaction_id:  # a settled one, by the id the rail gave us
            row = table["txid"].get(line.rail_transaction_id)
        if row is not None:
            return kind, row
    return None


def _judge(rail: str, line: Line, index, named: dict[str, int]) -> Judgement:
    if line.error:
        found = _find(line, index) if (line.reference or line.rail_transaction_id) else None
        j = Judgement(line, "error", detail=line.error)
        if found:
            _name(j, *found)
            named.setdefault(found[1]["id"], line.line_no)
        return j
    found = _find(line, index)
    if found is None:
        if line.kind is None or line.reference is None:
            other = None
        else:
            other = _find(Line(line.line_no, reference=line.reference), index)
        if other is not None:
            return Judgement(line, "error", detail=f"type says {line.kind}, but "
                                                   f"{line.reference} is our {other[0]} {other[1]['id']}")
        j = Judgement(line, "unknown_rail_transaction", detail="names no charge or refund of ours")
        if line.status == "succeeded":
            key = line.rail_transaction_id or line.reference
            j.alert = ("unknown_rail_transaction", {
                "finding": f"unknown:{rail}:{key}", "reference": line.reference,
                "rail_transaction_id": line.rail_transaction_id, "msisdn": line.msisdn,
                "amount": line.amount, "currency": line.currency, "time": line.time.isoformat()})
        return j
    kind, row = found
    j = Judgement(line, "matched")
    _name(j, kind, row)
    if row["id"] in named:
        j.outcome, j.detail = "error", f"{row['id']} is named on line {named[row['id']]} already"
        return j
    named[row["id"]] = line.line_no
    ours = row["status"]
    rail_says = line.status
    if rail_says == "pending":
        j.outcome, j.detail = "still_pending", f"the rail says {line.status_text}; ours: {ours}"
        return j
    if not _same_money(line, row):
        j.outcome = "contradiction"
        j.detail = (f"the rail says {line.status_text} {line.amount_text} {line.currency}; "
                    f"ours: {ours} {minor_to_major_string(row['amount'], row['currency'])} {row['currency']}")
        j.alert = ("rail_contradiction", _contradiction(j, row, "amount_mismatch",
                                                       f"{rail_says}_other_amount"))
        return j
    if ours in TERMINAL:
        if ours == rail_says:
            j.detail = f"{ours}"
            return j
        j.outcome, j.detail = "contradiction", f"the rail says {line.status_text}; ours: {ours}"
        j.alert = ("rail_contradiction", _contradiction(j, row, f"contradiction:{rail_says}", rail_says))
        return j
    j.outcome, j.settle = "would_settle", rail_says
    j.detail = f"{ours} → {rail_says}"
    return j


def _name(j: Judgement, kind: str, row: dict[str, Any]) -> None:
    if kind == "charge":
        j.charge_id = row["id"]
    else:
        j.refund_id, j.refund_charge_id = row["id"], row["charge_id"]


def _same_money(line: Line, row: dict[str, Any]) -> bool:
    """A success must carry exactly our amount and currency. A failure moved
    no money: an absent or zero amount says nothing, any other must agree."""
    if line.currency != row["currency"]:
        return line.status == "failed" and not line.amount
    if line.status == "failed" and not line.amount:
        return True
    return line.amount == row["amount"]


def _contradiction(j: Judgement, row: dict[str, Any], finding: str, rail_says: str) -> dict[str, Any]:
    line = j.line
    return {"finding": finding, "where": "statement", "ours": row["status"],
            "our_failure_code": row["failure_code"], "our_amount": row["amount"],
            "our_currency": row["currency"], "rail_says": rail_says, "rail_status": line.status_text,
            "rail_reason": line.reason, "rail_amount": line.amount_text, "rail_currency": line.currency,
            "rail_transaction_id": line.rail_transaction_id, "line_no": line.line_no,
            **({"refund_id": j.refund_id} if j.refund_id else {})}


def resolution(times: list[datetime]) -> timedelta:
    """The finest unit a statement's times carry: a day when every time is
    midnight, a minute when no time has seconds, a second when none has a
    fraction, else a microsecond. The period runs to the end of its last
    line's unit: a statement written to the second covers that whole second."""
    if all(t.microsecond == 0 for t in times):
        if all(t.second == 0 for t in times):
            if all(t.minute == 0 and t.hour == 0 for t in times):
                return timedelta(days=1)
            return timedelta(minutes=1)
        return timedelta(seconds=1)
    return timedelta(microseconds=1)


def _absent(conn: psycopg.Connection, rail: str, result: Plan, named: dict[str, int],
            lag_seconds: float) -> None:
    times = [j.line.time for j in result.judgements if j.line.time is not None]
    end = result.period_end + resolution(times) - timedelta(microseconds=1)
    cutoff = end - timedelta(seconds=lag_seconds)
    with conn.cursor(row_factory=dict_row) as cur:
        for kind, query in (("charge", "charge_successes_in_period"), ("refund", "refund_successes_in_period")):
            if kind not in result.kinds:
                continue
            rows = cur.execute(Q[query], {"rail": rail, "start": result.period_start, "end": end}).fetchall()
            for row in rows:
                if row["id"] in named:
                    continue
                entry = {f"{kind}_id": row["id"], "rail_reference": row["rail_reference"],
                         "amount": row["amount"], "currency": row["currency"],
                         "created_at": row["created_at"]}
                if kind == "refund":
                    entry["charge_id"] = row["charge_id"]
                (result.missing if row["created_at"] <= cutoff else result.within_lag).append(entry)
