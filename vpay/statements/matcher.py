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
from psycopg.types.json import Jsonb

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

CHUNK_LINES = 5_000
"""Lines fetched from the spool (and judged lines written back) at a time:
with the spool, what bounds the importer's memory, whatever the file's size."""

TERMINAL = ("succeeded", "failed")


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
    """The whole statement judged. The judged lines are not held here: they
    are the session's temporary table ``statement_judged`` (one row per line:
    ``statement_lines``' columns and the alert it raises), until ``drop``.
    ``missing`` and ``within_lag``: our successes absent from it (dicts with
    ``charge_id`` or ``refund_id``, ``rail_reference``, ``amount``,
    ``currency``, ``created_at``); the period it covers and where that came
    from (``given``, ``declared``, ``lines``); the kinds it covers; ``lines``:
    how many lines it has."""

    lines: int
    period_start: datetime | None
    period_end: datetime | None
    kinds: frozenset[str]
    period_source: str | None = None
    missing: list[dict[str, Any]] = field(default_factory=list)
    within_lag: list[dict[str, Any]] = field(default_factory=list)


def plan(conn: psycopg.Connection, rail: str, lines: Iterable[Line], *, has_type: bool,
         lag_seconds: float = LAG_SECONDS,
         period: tuple[datetime, datetime] | None = None) -> Plan:
    """Judge ``lines`` (read lazily, once) of a ``rail`` statement.
    ``has_type``: the file has a type column (then it covers the kinds its
    lines name; otherwise it is a collections statement). ``period``: the
    operator's (inclusive). Raises ``BadPeriod`` (and ``reader.BadFile``
    from ``lines``); nothing is written but the session's temporary tables.

    Memory stays bounded whatever the line count: the lines are spooled into
    a temporary table as they are read (COPY), what each names is found by
    one set-wise join, the common line (the only one naming a charge settled
    as it says) is judged ``matched`` in SQL, lines naming nothing of ours
    are grouped by connected components in SQL, and the other groups are
    judged here ``CHUNK_LINES`` lines at a time, their judgements copied into
    ``statement_judged``."""
    drop(conn)
    facts = _spool(conn, lines)
    with conn.transaction():
        conn.execute(Q["statement_work_settings"])
        start, end, source = _period_of(conn, facts, period)
        conn.execute(Q["statement_found_create"])
        conn.execute(Q["statement_unknown_create"])
        conn.execute(Q["statement_judged_create"])
        conn.execute(Q["statement_resolve"], {"rail": rail, "prefix": PREFIX_REFERENCES.get(rail, 0)})
        conn.execute(Q["statement_found_analyze"])
        conn.execute(Q["statement_judge_matched"])
        conn.execute(Q["statement_unknown_fill"])
        while conn.execute(Q["statement_unknown_step"]).rowcount:
            pass
        _judge_all(conn, rail)
    kinds = frozenset(facts.kinds) if has_type else frozenset({"charge"})
    result = Plan(facts.count, start, end, kinds, source)
    if start is not None:
        _absent(conn, rail, result, lag_seconds)
    return result


def drop(conn: psycopg.Connection) -> None:
    """Drop the session's working tables (``plan``'s), if any."""
    conn.execute(Q["statement_work_drop"])


PREFIX_REFERENCES = {"orange": 30, "mpesa": 12}
"""Rails whose statement names a charge by the first N hex digits of its
reference: Orange's ``order_id`` (30) and M-Pesa's ``AccountReference`` (12,
Daraja's limit; ``vpay.rails.mpesa.account_reference``)."""


# ---- the spool ------------------------------------------------------------------


class _Facts:
    """What the period needs of the readable lines, gathered as they pass:
    their count, earliest and latest time, the finest unit their times carry
    (``resolution``), the first two periods they declare; and the kinds the
    lines name."""

    def __init__(self) -> None:
        self.count = 0
        self.readable = 0
        self.first: datetime | None = None
        self.last: datetime | None = None
        self.micro = self.seconds = self.minutes = False
        self.declared: dict[tuple, int] = {}
        self.kinds: set[str] = set()

    def add(self, line: Line) -> None:
        self.count += 1
        if line.kind:
            self.kinds.add(line.kind)
        if line.error:
            return
        if line.period_start is not None or line.period_end is not None:
            key = (line.period_start, line.period_end)
            if key not in self.declared and len(self.declared) < 2:
                self.declared[key] = line.line_no
        t = line.time
        if t is None:
            return
        self.readable += 1
        self.first = t if self.first is None or t < self.first else self.first
        self.last = t if self.last is None or t > self.last else self.last
        self.micro = self.micro or t.microsecond != 0
        self.seconds = self.seconds or t.second != 0
        self.minutes = self.minutes or t.minute != 0 or t.hour != 0

    def unit(self) -> timedelta:
        """``resolution`` of the readable lines' times."""
        return (timedelta(microseconds=1) if self.micro else timedelta(seconds=1) if self.seconds
                else timedelta(minutes=1) if self.minutes else timedelta(days=1))


_SPOOL_COLUMNS = ("line_no", "kind", "reference", "rail_transaction_id", "ref_key", "tx_key", "msisdn",
                  "amount_text", "amount", "currency", "status_text", "status", "line_time", "reason", "error")


def _spool(conn: psycopg.Connection, lines: Iterable[Line]) -> _Facts:
    """COPY every line into ``statement_spool`` as it is read; a refusal
    while reading (``BadFile``) rolls the spool back."""
    facts = _Facts()
    with conn.transaction():
        conn.execute(Q["statement_spool_create"])
        with conn.cursor() as cur, cur.copy(
                f"COPY pg_temp.statement_spool ({', '.join(_SPOOL_COLUMNS)}) FROM STDIN") as copy:
            for l in lines:
                facts.add(l)
                copy.write_row((l.line_no, l.kind, l.reference, l.rail_transaction_id, canonical(l.reference),
                                canonical(l.rail_transaction_id), l.msisdn, l.amount_text, l.amount,
                                l.currency, l.status_text, l.status, l.time, l.reason, l.error))
        conn.execute(Q["statement_spool_analyze"])
    return facts


_ROW_COLS = ("id", "charge_id", "rail_reference", "rail_transaction_id", "amount", "currency", "status",
             "failure_code")


def _judge_all(conn: psycopg.Connection, rail: str) -> None:
    """Judge the spooled lines group by group (``statement_spool_groups``),
    ``CHUNK_LINES`` fetched at a time; the judgements are copied into
    ``statement_judged`` chunk by chunk."""
    out: list[Judgement] = []
    group: list[Line] = []
    key = subject = None
    with conn.cursor(name="statement_groups") as cur:
        cur.execute(Q["statement_spool_groups"])
        while rows := cur.fetchmany(CHUNK_LINES):
            for r in rows:
                grp = (r[22], r[23])
                if grp != key:
                    if group:
                        _judge_one(rail, group, subject, out)
                    key, group = grp, []
                    subject = (r[13], dict(zip(_ROW_COLS, r[14:22]))) if r[13] else None
                    if r[22] == 2:
                        subject = "error"
                group.append(Line(r[0], kind=r[1], reference=r[2], rail_transaction_id=r[3], msisdn=r[4],
                                  amount_text=r[5], amount=r[6], currency=r[7], status_text=r[8],
                                  status=r[9], time=r[10], reason=r[11], error=r[12]))
            if len(out) >= CHUNK_LINES:
                _write_judged(conn, out)
                out = []
        if group:
            _judge_one(rail, group, subject, out)
    _write_judged(conn, out)


def _judge_one(rail: str, group: list[Line], subject, out: list[Judgement]) -> None:
    if subject == "error":  # an unreadable line naming nothing of ours
        out.extend(Judgement(l, "error", detail=l.error) for l in group)
    elif subject is None:
        out.extend(_judge_unknown(rail, group))
    else:
        out.extend(_judge_group(group, *subject))


_JUDGED_COLUMNS = ("line_no", "kind", "reference", "rail_transaction_id", "msisdn", "amount_text", "amount",
                   "currency", "status_text", "line_time", "outcome", "charge_id", "refund_id", "detail",
                   "settle_to", "reason", "alert_kind", "alert_charge_id", "alert_refund_id", "alert_details")


def _write_judged(conn: psycopg.Connection, judgements: list[Judgement]) -> None:
    if not judgements:
        return
    with conn.cursor() as cur, cur.copy(
            f"COPY pg_temp.statement_judged ({', '.join(_JUDGED_COLUMNS)}) FROM STDIN") as copy:
        for j in judgements:
            l = j.line
            kind = l.kind or ("refund" if j.refund_id else "charge" if j.charge_id else None)
            alert = (j.alert[0], j.refund_charge_id or j.charge_id, j.refund_id, Jsonb(j.alert[1])) \
                if j.alert else (None, None, None, None)
            copy.write_row((l.line_no, kind, l.reference, l.rail_transaction_id, l.msisdn, l.amount_text,
                            l.amount, l.currency, l.status_text, l.time, j.outcome, j.charge_id, j.refund_id,
                            j.detail, j.settle, l.reason, *alert))


# ---- judging a group ---------------------------------------------------------


def _claim(line: Line) -> tuple:
    """What a terminal line says about the money: a failure moved none."""
    return ("succeeded", line.amount, line.currency) if line.status == "succeeded" else ("failed",)


def _words(line: Line) -> str:
    return " ".join(x for x in (line.status_text, line.amount_text, line.currency) if x)


def _judge_group(lines: list[Line], kind: str, row: dict[str, Any]) -> list[Judgement]:
    """The lines naming our charge (refund) ``row``, in file order."""
    out: list[Judgement] = []
    readable = [l for l in lines if not l.error]
    terminal = [l for l in readable if l.status in TERMINAL]
    claims = {_claim(l) for l in terminal}
    primary = terminal[0] if terminal else readable[0] if readable else None
    for line in lines:
        if line.error:
            j = Judgement(line, "error", detail=line.error)
            _name(j, kind, row)
        elif len(claims) > 1:
            numbers = ", ".join(str(l.line_no) for l in terminal)
            said = " / ".join(dict.fromkeys(_words(l) for l in terminal))
            j = Judgement(line, "contradiction",
                          detail=f"lines {numbers} disagree about our {kind} {row['id']}: {said}; nothing settled")
            _name(j, kind, row)
            if line is readable[0]:
                j.alert = ("rail_contradiction", {
                    "finding": "statement_disagrees", "where": "statement", "ours": row["status"],
                    "rail_says": "statement_disagrees", "lines": [l.line_no for l in terminal],
                    "rail_statuses": sorted({l.status_text or "" for l in terminal}),
                    "rail_amounts": sorted({l.amount_text or "" for l in terminal}),
                    **({"refund_id": row["id"]} if kind == "refund" else {})})
        elif line is primary:
            j = _judge(line, kind, row)
        elif line.status in TERMINAL:
            j = Judgement(line, "error", detail=f"repeats line {primary.line_no} "
                                                 f"(our {kind} {row['id']}): counted once")
            _name(j, kind, row)
        else:
            j = Judgement(line, "still_pending", detail=f"the rail says {line.status_text} here and "
                                                        f"{primary.status_text} on line {primary.line_no}")
            _name(j, kind, row)
        out.append(j)
    return out


def _judge_unknown(rail: str, lines: list[Line]) -> list[Judgement]:
    """Readable lines naming nothing of ours that share identifiers, in file order."""
    terminal = [l for l in lines if l.status in TERMINAL]
    claims = {_claim(l) for l in terminal}
    first = terminal[0] if terminal else lines[0]
    # the canonical identity: what a re-export in another case names too
    key = canonical(first.rail_transaction_id) or canonical(first.reference)
    out: list[Judgement] = []
    for l in lines:
        if len(claims) <= 1 and l is not first and l.status in TERMINAL:
            out.append(Judgement(l, "error", detail=f"repeats line {first.line_no} (names nothing of ours): "
                                                    "counted once"))
            continue
        detail = "names no charge or refund of ours"
        if len(claims) > 1:
            detail += f"; lines {', '.join(str(k.line_no) for k in terminal)} disagree about it"
        j = Judgement(l, "unknown_rail_transaction", detail=detail)
        out.append(j)
        if l is first and any(k.status == "succeeded" for k in terminal):
            success = next(k for k in terminal if k.status == "succeeded")
            j.alert = ("unknown_rail_transaction", {
                "finding": f"unknown:{rail}:{key}", "reference": success.reference,
                "rail_transaction_id": success.rail_transaction_id, "msisdn": success.msisdn,
                "amount": success.amount, "currency": success.currency, "time": success.time.isoformat()})
    return out


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


def _period_of(conn: psycopg.Connection, facts: _Facts, given: tuple[datetime, datetime] | None
               ) -> tuple[datetime | None, datetime | None, str | None]:
    """``(start, end, source)``, both inclusive: ``given`` (the operator's;
    source ``given``), else the period the readable lines declare (period
    columns; ``declared``), else the readable lines' earliest time to the end
    of the latest one's unit (``lines``; ``resolution``). Raises
    ``BadPeriod`` (one line) for lines declaring different periods, a
    period longer than ``MAX_PERIOD``, a declared one holding none of the
    lines, or stray lines (``STRAY_GAP``) that would stretch it. The lines
    are the spool's (``_spool``); ``facts`` what was gathered reading them."""
    source = "given"
    if given is None:
        declared = facts.declared
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
        if facts.readable and not _any_time_within(conn, start, end):
            raise BadPeriod(f"the {source} period {_span(start, end)} holds none of the file's line times "
                            f"({_span(facts.first, facts.last)})")
        return start, end, source
    if not facts.readable:
        return None, None, None
    if facts.last - facts.first > STRAY_GAP:  # else no gap between two lines can be longer
        _refuse_strays(conn, facts.readable)
    start = facts.first
    end = facts.last + facts.unit() - timedelta(microseconds=1)
    if end - start > MAX_PERIOD:
        raise BadPeriod(f"the lines span {_span(start, end)}, longer than {MAX_PERIOD.days} days (MAX_PERIOD): "
                        "split the statement by period, or pass --period-start/--period-end")
    return start, end, "lines"


def _any_time_within(conn: psycopg.Connection, start: datetime, end: datetime) -> bool:
    return conn.execute(Q["statement_spool_any_within"], {"start": start, "end": end}).fetchone()[0]


def _refuse_strays(conn: psycopg.Connection, n: int) -> None:
    """Refuse a period a few stray lines would stretch: the largest gap
    between consecutive readable line times (in SQL, over the spool) is
    longer than ``STRAY_GAP`` with at most ``STRAY_SHARE`` of the lines on
    one side of it."""
    if n < 2:
        return
    gap, below = conn.execute(Q["statement_spool_largest_gap"]).fetchone() or (timedelta(0), 0)
    below = int(below)
    if gap <= STRAY_GAP:
        return
    above = n - below
    allowed = max(1, int(n * STRAY_SHARE))
    if min(below, above) > allowed:
        return
    first_at, count = (1, below) if below <= above else (below + 1, above)
    at, line_no = conn.execute(Q["statement_spool_time_at"], {"k": first_at}).fetchone()
    more = f" and {count - 1} more" if count > 1 else ""
    raise BadPeriod(f"line {line_no}'s time {at.isoformat()}{more} lies {gap.days} days from the "
                    f"other lines: it would stretch the statement's period; fix the line or pass "
                    f"--period-start/--period-end")


def _span(start: datetime | None, end: datetime | None) -> str:
    return f"{start.isoformat() if start else '-'} .. {end.isoformat() if end else '-'}"


def _absent(conn: psycopg.Connection, rail: str, result: Plan, lag_seconds: float) -> None:
    """Our successes inside the period that no line names (``statement_found``)."""
    start, end = result.period_start, result.period_end
    cutoff = end - timedelta(seconds=lag_seconds)
    for kind, query, cols in (("charge", "charge_successes_absent", ("id", "rail_reference",
                                                                      "rail_transaction_id", "amount",
                                                                      "currency", "created_at")),
                              ("refund", "refund_successes_absent", ("id", "charge_id", "rail_reference",
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
                entry = {f"{kind}_id": row["id"], "rail_reference": row["rail_reference"],
                         "amount": row["amount"], "currency": row["currency"],
                         "created_at": row["created_at"]}
                if kind == "refund":
                    entry["charge_id"] = row["charge_id"]
                (result.missing if row["created_at"] <= cutoff else result.within_lag).append(entry)
