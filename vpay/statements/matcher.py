"""Judge statement lines against our charges and refunds (reads only).

The rules (docs/flows/statements.md):

* lines are first grouped by the charge or refund they name, by any of its
  identifiers (the reference we sent, Orange's order id, our ``ch_``/``re_``
  id, the rail's transaction id; ``lines.canonical`` for case), and lines
  naming nothing of ours by the identifiers they share; a group is judged
  as one transaction:
* readable lines of a group that disagree about its end (a success and a
  failure, two amounts) → every one of them ``contradiction``, ONE alert
  (``finding: statement_disagrees``); nothing moves;
* otherwise the group's first terminal line is judged (below) and a later
  one saying the same is an ``error`` ("repeats line N: counted once"), a
  pending one ``still_pending``;
* a line naming a charge (refund) of ours that agrees with its settled state
  → ``matched``;
* a terminal line naming a ``pending`` or ``unresolved`` one → ``would_settle``
  (the importer settles it through the money state machine with ``--apply``,
  the line stored as the evidence: one transition, one event);
* a terminal line contradicting a settled one, or a success whose amount or
  currency (minor units, by the currency's exponent) is not ours → one
  ``contradiction`` alert; nothing moves;
* a line naming nothing of ours → ``unknown_rail_transaction`` (an alert for
  a success: money received that we cannot attribute; its key is the
  canonical identifier, so a re-export in another case adds nothing);
* a line the rail still calls pending → ``still_pending``; an unreadable one
  → ``error``; neither moves anything;
* a success of ours created inside the statement's period and absent from it
  → ``missing_from_statement`` (an alert), except within ``lag_seconds`` of
  the period's end: a statement may lag the latest transactions by up to 60
  minutes (design/rails.md, "Statements"), so those are reported as
  ``within_lag`` and left to the next statement.

The period (``period``): the one the operator gives, else the one the file
declares (period columns), else the readable lines' earliest to latest time;
refused (``BadPeriod``) when longer than ``MAX_PERIOD`` or when a few lines
lie more than ``STRAY_GAP`` away from all the others.

Lines are compared with a snapshot read once; the importer's settlement is
still a compare-and-swap, so a poll that settled a charge meanwhile wins and
the line is judged again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable

import psycopg

from vpay.money.currency import minor_to_major_string
from vpay.base.queries import Q
from vpay.statements.lines import Line, canonical
from vpay.statements.reader import BadFile

LAG_SECONDS = 3600.0
"""How far a statement may lag the latest transactions (design/rails.md)."""

MAX_PERIOD = timedelta(days=93)
"""The longest period one statement may cover (a quarter): a longer one,
declared or read from the lines, is refused rather than judged, since every
success of ours inside it that the file lacks would be alerted."""

STRAY_GAP = timedelta(days=7)
"""A gap this long between line times, with at most ``STRAY_SHARE`` of the
lines on one side of it, means those lines are strays (a mistyped year):
the period they would stretch is refused with their line named."""
STRAY_SHARE = 0.01

LOOKUP_CHUNK = 20_000
"""Lines whose charges and refunds are looked up in one query."""

TERMINAL = ("succeeded", "failed")

_CHARGE_COLS = ("id", "rail_reference", "rail_transaction_id", "amount", "currency", "status",
                "failure_code", "created_at")
_REFUND_COLS = ("id", "charge_id", "rail_reference", "rail_transaction_id", "amount", "currency", "status",
                "failure_code", "created_at")


class BadPeriod(BadFile):
    """The statement's period cannot be trusted; one line for the operator
    (exit 1, nothing written)."""


@dataclass(slots=True)
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
    """The whole statement judged: one ``Judgement`` per line, in file
    order; ``missing`` and ``within_lag``: our successes absent from it
    (dicts with ``charge_id`` or ``refund_id``, ``rail_reference``,
    ``amount``, ``currency``, ``created_at``); the period it covers and
    where that came from (``given``, ``declared``, ``lines``); the kinds it
    covers."""

    judgements: list[Judgement]
    period_start: datetime | None
    period_end: datetime | None
    kinds: frozenset[str]
    period_source: str | None = None
    missing: list[dict[str, Any]] = field(default_factory=list)
    within_lag: list[dict[str, Any]] = field(default_factory=list)


def plan(conn: psycopg.Connection, rail: str, lines: list[Line], *, has_type: bool,
         lag_seconds: float = LAG_SECONDS,
         period: tuple[datetime, datetime] | None = None) -> Plan:
    """Judge ``lines`` of a ``rail`` statement. ``has_type``: the file has a
    type column (then it covers the kinds its lines name; otherwise it is a
    collections statement). ``period``: the operator's (inclusive). Raises
    ``BadPeriod``."""
    start, end, source = statement_period(lines, period)
    found = _resolve(conn, rail, lines)
    judgements: list[Judgement | None] = [None] * len(lines)
    named: set[str] = set()
    groups: dict[Any, list[int]] = {}
    unknown = _Unknowns()
    for i, line in enumerate(lines):
        hit = found[i]
        if hit is not None:
            named.add(hit[1]["id"])
            groups.setdefault((hit[0], hit[1]["id"]), []).append(i)
        elif line.error:
            judgements[i] = Judgement(line, "error", detail=line.error)
        else:
            unknown.add(i, line)
    for key, members in groups.items():
        _judge_group(rail, lines, members, found, judgements)
    for members in unknown.groups():
        _judge_unknown(rail, lines, members, judgements)
    kinds = (frozenset(l.kind for l in lines if l.kind) if has_type else frozenset({"charge"}))
    result = Plan(judgements, start, end, kinds, source)  # type: ignore[arg-type]
    if start is not None:
        _absent(conn, rail, result, named, lag_seconds)
    return result


# ---- finding what a line names ---------------------------------------------


def _resolve(conn: psycopg.Connection, rail: str, lines: list[Line]) -> list[tuple[str, dict] | None]:
    """For each line, ``(kind, row)`` of the charge or refund of ours it
    names, or ``None``; looked up ``LOOKUP_CHUNK`` lines at a time."""
    out: list[tuple[str, dict] | None] = []
    for at in range(0, len(lines), LOOKUP_CHUNK):
        chunk = lines[at:at + LOOKUP_CHUNK]
        refs = sorted({r for l in chunk if l.reference for r in (l.reference, canonical(l.reference))})
        txids = sorted({t for l in chunk if l.rail_transaction_id
                        for t in (l.rail_transaction_id, canonical(l.rail_transaction_id))})
        charges = [dict(zip(_CHARGE_COLS, r)) for r in conn.execute(
            Q["charges_for_statement"], {"rail": rail, "refs": refs, "txids": txids})]
        refunds = [dict(zip(_REFUND_COLS, r)) for r in conn.execute(
            Q["refunds_for_statement"], {"rail": rail, "refs": refs, "txids": txids})]
        index = {"charge": _index(charges, prefix=PREFIX_REFERENCES.get(rail)), "refund": _index(refunds)}
        out.extend(_find(l, index) for l in chunk)
    return out


PREFIX_REFERENCES = {"orange": 30, "mpesa": 12}
"""Rails whose statement names a charge by the first N hex digits of its
reference: Orange's ``order_id`` (30) and M-Pesa's ``AccountReference`` (12,
Daraja's limit; ``vpay.rails.mpesa.account_reference``)."""


def _index(rows: list[dict[str, Any]], prefix: int | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    by_ref: dict[str, dict[str, Any]] = {}
    by_txid: dict[str, dict[str, Any]] = {}
    for row in rows:
        by_ref[canonical(row["rail_reference"])] = row
        by_ref[row["id"]] = row
        if prefix:
            by_ref[row["rail_reference"].replace("-", "").lower()[:prefix]] = row
        if row["rail_transaction_id"]:
            by_txid[canonical(row["rail_transaction_id"])] = row
    return {"ref": by_ref, "txid": by_txid}


def _find(line: Line, index) -> tuple[str, dict[str, Any]] | None:
    """The charge or refund a line names, by its reference (ours, or our id)
    first, else by the rail's transaction id. A line whose type names the
    other kind is found anyway (and judged an error by the group)."""
    kinds = (line.kind, "refund" if line.kind == "charge" else "charge") if line.kind else ("charge", "refund")
    for kind in kinds:
        table = index[kind]
        row = None
        if line.reference:
            row = table["ref"].get(canonical(line.reference))
        if row is None and line.rail_transaction_id:  # a settled one, by the id the rail gave us
            row = table["txid"].get(canonical(line.rail_transaction_id))
        if row is not None:
            return kind, row
    return None


class _Unknowns:
    """Lines naming nothing of ours, grouped by the identifiers they share
    (a line giving a reference and a transaction id joins the lines giving
    either): a small union-find over canonical identifiers."""

    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}
        self.members: dict[int, Any] = {}

    def _root(self, key):
        while self.parent.setdefault(key, key) != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def add(self, i: int, line: Line) -> None:
        keys = [("ref", canonical(line.reference)) if line.reference else None,
                ("tx", canonical(line.rail_transaction_id)) if line.rail_transaction_id else None]
        keys = [k for k in keys if k]
        roots = [self._root(k) for k in keys]
        for r in roots[1:]:
            self.parent[r] = roots[0]
        self.members[i] = keys[0]

    def groups(self) -> Iterable[list[int]]:
        out: dict[Any, list[int]] = {}
        for i, key in self.members.items():
            out.setdefault(self._root(key), []).append(i)
        return out.values()


# ---- judging a group ---------------------------------------------------------


def _claim(line: Line) -> tuple:
    """What a terminal line says about the money: a failure moved none."""
    return ("succeeded", line.amount, line.currency) if line.status == "succeeded" else ("failed",)


def _words(line: Line) -> str:
    return " ".join(x for x in (line.status_text, line.amount_text, line.currency) if x)


def _judge_group(rail: str, lines: list[Line], members: list[int], found, judgements) -> None:
    kind, row = found[members[0]][0], found[members[0]][1]
    for i in members:
        if lines[i].error:
            j = judgements[i] = Judgement(lines[i], "error", detail=lines[i].error)
            _name(j, kind, row)
    readable = [i for i in members if not lines[i].error]
    if not readable:
        return
    terminal = [i for i in readable if lines[i].status in TERMINAL]
    claims = {_claim(lines[i]) for i in terminal}
    if len(claims) > 1:
        numbers = ", ".join(str(lines[i].line_no) for i in terminal)
        said = " / ".join(dict.fromkeys(_words(lines[i]) for i in terminal))
        detail = f"lines {numbers} disagree about our {kind} {row['id']}: {said}; nothing settled"
        for n, i in enumerate(readable):
            j = judgements[i] = Judgement(lines[i], "contradiction", detail=detail)
            _name(j, kind, row)
            if n == 0:
                j.alert = ("rail_contradiction", {
                    "finding": "statement_disagrees", "where": "statement", "ours": row["status"],
                    "rail_says": "statement_disagrees", "lines": [lines[k].line_no for k in terminal],
                    "rail_statuses": sorted({lines[k].status_text or "" for k in terminal}),
                    "rail_amounts": sorted({lines[k].amount_text or "" for k in terminal}),
                    **({"refund_id": row["id"]} if kind == "refund" else {})})
        return
    primary = terminal[0] if terminal else readable[0]
    for i in readable:
        line = lines[i]
        if i == primary:
            judgements[i] = _judge(line, kind, row)
        elif line.status in TERMINAL:
            judgements[i] = Judgement(line, "error", detail=f"repeats line {lines[primary].line_no} "
                                                            f"(our {kind} {row['id']}): counted once")
            _name(judgements[i], kind, row)
        else:
            judgements[i] = Judgement(line, "still_pending",
                                      detail=f"the rail says {line.status_text} here and "
                                             f"{lines[primary].status_text} on line {lines[primary].line_no}")
            _name(judgements[i], kind, row)


def _judge_unknown(rail: str, lines: list[Line], members: list[int], judgements) -> None:
    terminal = [i for i in members if lines[i].status in TERMINAL]
    claims = {_claim(lines[i]) for i in terminal}
    first = terminal[0] if terminal else members[0]
    line = lines[first]
    # the canonical identity: what a re-export in another case names too
    key = canonical(line.rail_transaction_id) or canonical(line.reference)
    for i in members:
        l = lines[i]
        if len(claims) <= 1 and i != first and l.status in TERMINAL:
            judgements[i] = Judgement(l, "error", detail=f"repeats line {line.line_no} (names nothing of ours): "
                                                         "counted once")
            continue
        detail = "names no charge or refund of ours"
        if len(claims) > 1:
            detail += f"; lines {', '.join(str(lines[k].line_no) for k in terminal)} disagree about it"
        judgements[i] = Judgement(l, "unknown_rail_transaction", detail=detail)
    if any(lines[i].status == "succeeded" for i in terminal):
        success = next(lines[i] for i in terminal if lines[i].status == "succeeded")
        judgements[first].alert = ("unknown_rail_transaction", {
            "finding": f"unknown:{rail}:{key}", "reference": success.reference,
            "rail_transaction_id": success.rail_transaction_id, "msisdn": success.msisdn,
            "amount": success.amount, "currency": success.currency, "time": success.time.isoformat()})


def _judge(line: Line, kind: str, row: dict[str, Any]) -> Judgement:
    j = Judgement(line, "matched")
    _name(j, kind, row)
    if line.kind is not None and line.kind != kind:
        j.outcome, j.detail = "error", f"type says {line.kind}, but it names our {kind} {row['id']}"
        return j
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
            j.detail = ours
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


# ---- the period ----------------------------------------------------------------


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


def statement_period(lines: list[Line], given: tuple[datetime, datetime] | None = None
                     ) -> tuple[datetime | None, datetime | None, str | None]:
    """``(start, end, source)``, both inclusive: ``given`` (the operator's;
    source ``given``), else the period the readable lines declare (period
    columns; ``declared``), else the readable lines' earliest time to the end
    of the latest one's unit (``lines``; ``resolution``). Raises
    ``BadPeriod`` (one line) for lines declaring different periods, a
    period longer than ``MAX_PERIOD``, a declared one holding none of the
    lines, or stray lines (``STRAY_GAP``) that would stretch it."""
    readable = [l for l in lines if not l.error]
    times = sorted((l.time, l.line_no) for l in readable if l.time is not None)
    source = "given"
    if given is None:
        declared = {(l.period_start, l.period_end): l.line_no for l in readable
                    if l.period_start is not None or l.period_end is not None}
        if len(declared) > 1:
            (a, la), (b, lb) = list(declared.items())[:2]
            raise BadPeriod(f"lines {la} and {lb} declare different periods "
                            f"({_span(*a)} and {_span(*b)})")
        if declared:
            given, source = next(iter(declared)), "declared"
            if None in given:
                raise BadPeriod(f"line {declared[given]} declares half a period ({_span(*given)}): "
                                "it needs both a start and an end")
    if given is not None:
        start, end = given
        if end < start:
            raise BadPeriod(f"the {source} period ends before it starts ({_span(start, end)})")
        if end - start > MAX_PERIOD:
            raise BadPeriod(f"the {source} period {_span(start, end)} is longer than {MAX_PERIOD.days} days "
                            "(MAX_PERIOD): split the statement by period")
        if times and not any(start <= t <= end for t, _ in times):
            raise BadPeriod(f"the {source} period {_span(start, end)} holds none of the file's line times "
                            f"({_span(times[0][0], times[-1][0])})")
        return start, end, source
    if not times:
        return None, None, None
    _refuse_strays(times)
    start = times[0][0]
    end = times[-1][0] + resolution([t for t, _ in times]) - timedelta(microseconds=1)
    if end - start > MAX_PERIOD:
        raise BadPeriod(f"the lines span {_span(start, end)}, longer than {MAX_PERIOD.days} days (MAX_PERIOD): "
                        "split the statement by period, or pass --period-start/--period-end")
    return start, end, "lines"


def _refuse_strays(times: list[tuple[datetime, int]]) -> None:
    if len(times) < 2:
        return
    gap, at = max((times[k + 1][0] - times[k][0], k) for k in range(len(times) - 1))
    if gap <= STRAY_GAP:
        return
    below, above = at + 1, len(times) - at - 1
    allowed = max(1, int(len(times) * STRAY_SHARE))
    if min(below, above) > allowed:
        return
    strays = times[:below] if below <= above else times[below:]
    first = strays[0]
    more = f" and {len(strays) - 1} more" if len(strays) > 1 else ""
    raise BadPeriod(f"line {first[1]}'s time {first[0].isoformat()}{more} lies {gap.days} days from the "
                    f"other lines: it would stretch the statement's period; fix the line or pass "
                    f"--period-start/--period-end")


def _span(start: datetime | None, end: datetime | None) -> str:
    return f"{start.isoformat() if start else '-'} .. {end.isoformat() if end else '-'}"


def _absent(conn: psycopg.Connection, rail: str, result: Plan, named: set[str], lag_seconds: float) -> None:
    start, end = result.period_start, result.period_end
    cutoff = end - timedelta(seconds=lag_seconds)
    for kind, query, cols in (("charge", "charge_successes_in_period", ("id", "rail_reference",
                                                                         "rail_transaction_id", "amount",
                                                                         "currency", "created_at")),
                              ("refund", "refund_successes_in_period", ("id", "charge_id", "rail_reference",
                                                                         "rail_transaction_id", "amount",
                                                                         "currency", "created_at"))):
        if kind not in result.kinds:
            continue
        # a server-side cursor: a month of successes is streamed, not held
        with conn.transaction(), conn.cursor(name=f"absent_{kind}") as cur:
            cur.itersize = 5000
            cur.execute(Q[query], {"rail": rail, "start": start, "end": end})
            for values in cur:
                row = dict(zip(cols, values))
                if row["id"] in named:
                    continue
                entry = {f"{kind}_id": row["id"], "rail_reference": row["rail_reference"],
                         "amount": row["amount"], "currency": row["currency"],
                         "created_at": row["created_at"]}
                if kind == "refund":
                    entry["charge_id"] = row["charge_id"]
                (result.missing if row["created_at"] <= cutoff else result.within_lag).append(entry)
