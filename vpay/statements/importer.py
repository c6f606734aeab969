"""``statements import``: read, judge, and (with ``--apply``) act.

Dry run (the default) writes nothing. ``--apply``, one import per rail at a
time (``statement_import_lock``; another is refused with ``Busy``):

1. one transaction records the statement (file hash, period, line count),
   every line with its outcome (``would_settle`` lines with the outcome
   they prove), and the alerts; nothing is settled yet;
2. the ``would_settle`` lines are settled in batches of at most
   ``BATCH_SETTLES``, each batch one short transaction that first locks its
   charges (refunds) in id order, skipping any a poll holds (retried in a
   later batch, for at most ``RETRY_SECONDS``), then settles each through
   the money state machine with the line as the evidence
   (``charges.settle_with_evidence``, ``refunds.settle_refund_with_evidence``:
   one transition, one event, one ``settlement_evidence`` row) and marks the
   line ``settled`` (or what the compare-and-swap found instead); a poll
   waits at most one batch, ``BATCH_SETTLES`` settlements long;
3. one transaction stores the report and ``completed_at``.

A kill between two batches leaves each batch applied or not; importing the
same file again (same rail, same SHA-256, ``completed_at`` NULL) resumes at
step 2. A completed file changes nothing and answers the stored report; an
overlapping statement finds the earlier work done (settled charges are
``matched``; each alert is raised once, ``alerts_one_per_statement_finding``).
No log line is written before the transaction it reports committed.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from vpay.money import charges, refunds
from vpay.money.ids import new_id
from vpay.base.logs import committed
from vpay.base.queries import Q
from vpay.statements import report as reports
from vpay.statements.lines import typed
from vpay.statements.matcher import LAG_SECONDS, Plan, drop, plan
from vpay.statements.profiles import Profile, resolve
from vpay.statements.reader import RawStatement, read

log = logging.getLogger("vpay.statements")

BATCH_SETTLES = 50
"""Settlements per batch transaction: the longest a poll of one of them can
wait on an import is one batch (about 4 ms a settlement: ~0.2 s)."""

BATCH_LOCK_TIMEOUT = "2s"
"""``lock_timeout`` inside a batch (a row the batch did not lock first, e.g. a
payment intent): the batch is rolled back and retried rather than waiting."""

RETRY_SECONDS = 60.0
"""How long lines whose charges a poll kept locked are retried before the
import stops and leaves them to a re-run (the file is then not complete)."""


class Busy(RuntimeError):
    """Another ``--apply`` for the same rail is running; nothing was done."""


class PeriodConflict(RuntimeError):
    """The file was imported already, over another period than the one now
    given; nothing was done (a completed import is never re-judged: its
    outcomes may have moved money)."""


def _check_period(found: dict[str, Any], period: tuple[datetime, datetime] | None) -> None:
    """Raise ``PeriodConflict`` when ``period`` is given and is not the
    period the completed import ``found`` recorded."""
    if period is None:
        return
    stored = (found["report"].get("period") or {})
    given = {"start": _iso(period[0]), "end": _iso(period[1])}
    if (stored.get("start"), stored.get("end")) != (given["start"], given["end"]):
        raise PeriodConflict(
            f"this file was imported already (statement {found['id']}) over the period "
            f"{stored.get('start')} to {stored.get('end')}, not {given['start']} to {given['end']}: "
            "nothing done")


def run(conn: psycopg.Connection, raw: RawStatement | bytes, *, rail: str, profile: Profile, file_name: str,
        apply: bool = False, lag_seconds: float = LAG_SECONDS,
        period: tuple[datetime, datetime] | None = None) -> dict[str, Any]:
    """Import one statement (``reader.read_path``'s answer, or its bytes);
    answer the report (see ``report``). Raises ``reader.BadFile`` for a file
    that cannot be a statement or a period that cannot be trusted
    (``matcher.BadPeriod``; nothing written), ``Busy``, and
    ``PeriodConflict`` for a completed file given another period."""
    if isinstance(raw, (bytes, bytearray)):
        raw = read(bytes(raw))
    columns = resolve(profile, raw.header)  # before a line is read: a wrong file is refused at once
    found = _earlier(conn, rail, raw.sha256)
    if found and found["completed"]:
        _check_period(found, period)
        return found["report"]
    try:
        # the lines are spooled to the session's temporary tables as they are read and judged there
        judged = plan(conn, rail, typed(raw, profile, columns), has_type="type" in columns,
                      lag_seconds=lag_seconds, period=period)
        meta = {"rail": rail, "file": file_name, "sha256": raw.sha256, "profile": profile.name,
                "columns": columns, "lines": judged.lines}
        if not apply:
            result = _report(conn, meta, judged, statement=None, applied=False)
            if found:
                result["interrupted"] = found["id"]
            return result
        if not conn.execute(Q["statement_import_lock"], {"rail": rail}).fetchone()[0]:
            raise Busy(f"another statements import --apply for rail {rail} is running: "
                       "nothing done; run this one again when it has finished")
        try:
            found = _earlier(conn, rail, raw.sha256)  # finished or begun while we waited
            if found and found["completed"]:
                _check_period(found, period)
                return found["report"]
            statement_id = found["id"] if found else _record(conn, meta, judged)
            _drop(conn)  # recorded: the batches read statement_lines
            left = _settle_batches(conn, statement_id)
            return _complete(conn, statement_id, left)
        finally:
            if not conn.closed and not conn.broken:
                conn.execute(Q["statement_import_unlock"], {"rail": rail})
    finally:
        _drop(conn)


def _drop(conn: psycopg.Connection) -> None:
    """The working tables go as soon as they are done with (a pooled
    connection would keep them): only on a usable, idle connection."""
    if not conn.closed and not conn.broken and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        drop(conn)


def run_audited(conn: psycopg.Connection, data: Any, *, actor: str | None = None, via: str = "cli",
                **kwargs: Any) -> dict[str, Any]:
    """``run``, and when it applies, one ``operator_actions`` row (action
    ``statements.apply``, target ``statement:<id>``; a refused file is
    recorded too). A dry run writes nothing, so it is not audited. ``actor``
    None: the OS user (the CLI)."""
    from vpay.money.audit import audited
    if not kwargs.get("apply"):
        return run(conn, data, **kwargs)
    with audited(conn, actor=actor, action="statements.apply", target=f"file:{kwargs.get('file_name')}",
                 via=via) as done:
        result = run(conn, data, **kwargs)
        done.result = f"ok: statement {result.get('statement')}"
    return result


# ---- step 1: the record ----------------------------------------------------------


def _record(conn: psycopg.Connection, meta: dict[str, Any], judged: Plan) -> str:
    statement_id = new_id("st")
    preview = _report(conn, meta, judged, statement=statement_id, applied=True)
    findings: list[tuple[str, str | None, str | None, str | None]] = []
    with committed(conn):
        conn.execute(Q["insert_statement"], {
            "id": statement_id, "rail": meta["rail"], "sha256": meta["sha256"], "file_name": meta["file"],
            "profile": meta["profile"], "columns": Jsonb(meta["columns"]),
            "period_start": judged.period_start, "period_end": judged.period_end,
            "period_source": judged.period_source, "line_count": meta["lines"],
            "report": Jsonb(_stored(preview))})
        conn.execute(Q["statement_lines_from_judged"], {"id": statement_id})
        findings += conn.execute(Q["statement_alerts_from_judged"], {"id": statement_id}).fetchall()
        for entry in judged.missing:
            _alert(conn, findings, "missing_from_statement", entry.get("charge_id"), entry.get("refund_id"), {
                "finding": "missing", "statement_id": statement_id, "rail_reference": entry["rail_reference"],
                "amount": entry["amount"], "currency": entry["currency"],
                "created_at": entry["created_at"].isoformat(),
                "period_start": judged.period_start.isoformat(), "period_end": judged.period_end.isoformat()})
    for kind, charge_id, refund_id, finding in findings:  # committed: now they may be said
        log.error("statement finding", extra={"kind": kind, "charge_id": charge_id, "refund_id": refund_id,
                                              "finding": finding, "statement_id": statement_id})
    log.info("statement recorded", extra={"statement_id": statement_id, "rail": meta["rail"],
                                          "lines": meta["lines"], "sha256": meta["sha256"],
                                          "to_settle": preview["summary"].get("would_settle", {}).get("count", 0)})
    return statement_id


def _alert(conn, findings: list, kind: str, charge_id: str | None, refund_id: str | None,
           details: dict[str, Any]) -> None:
    if conn.execute(Q["insert_statement_alert"], {"kind": kind, "charge_id": charge_id, "refund_id": refund_id,
                                                  "details": Jsonb(details)}).fetchone():
        findings.append((kind, charge_id, refund_id, details.get("finding")))


# ---- step 2: the batches -----------------------------------------------------------


def _settle_batches(conn: psycopg.Connection, statement_id: str) -> int:
    """Settle the statement's ``would_settle`` lines, ``BATCH_SETTLES`` per
    transaction. Answers how many are left (their rows stayed locked by
    polls for ``RETRY_SECONDS``)."""
    skipped: list[int] = []
    deadline = time.monotonic() + RETRY_SECONDS
    pause = 0.01
    while True:
        with conn.cursor(row_factory=dict_row) as cur:
            batch = cur.execute(Q["statement_lines_to_settle"], {
                "id": statement_id, "skip": skipped, "limit": BATCH_SETTLES}).fetchall()
        if not batch:
            if not skipped:
                return 0
            if time.monotonic() > deadline:
                return len(skipped)
            time.sleep(pause)  # the polls holding them commit within their own short transaction
            pause = min(pause * 2, 1.0)
            skipped = []
            continue
        try:
            skipped += _settle_batch(conn, statement_id, batch)
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            skipped += [r["line_no"] for r in batch]  # rolled back whole: retried later


def _settle_batch(conn: psycopg.Connection, statement_id: str, batch: list[dict[str, Any]]) -> list[int]:
    """One transaction: lock the batch's rows (id order, SKIP LOCKED), settle
    each locked one, mark its line. Answers the lines skipped."""
    skipped: list[int] = []
    settled = 0
    with committed(conn):
        conn.execute(f"SET LOCAL lock_timeout = '{BATCH_LOCK_TIMEOUT}'")
        charges = sorted({r["charge_id"] for r in batch if r["charge_id"] and not r["refund_id"]})
        refund_ids = sorted({r["refund_id"] for r in batch if r["refund_id"]})
        locked = {r[0] for r in conn.execute(Q["lock_charges_for_batch"], {"ids": charges})}
        locked |= {r[0] for r in conn.execute(Q["lock_refunds_for_batch"], {"ids": refund_ids})}
        for r in batch:
            subject = r["refund_id"] or r["charge_id"]
            if subject not in locked:
                skipped.append(r["line_no"])
                continue
            outcome, detail = _settle(conn, statement_id, r)
            settled += outcome == "settled"
            conn.execute(Q["set_line_outcome"], {"id": statement_id, "line_no": r["line_no"],
                                                 "outcome": outcome, "detail": detail})
    if settled:
        log.info("statement batch settled", extra={"statement_id": statement_id, "settled": settled,
                                                   "skipped": len(skipped)})
    return skipped


def _settle(conn: psycopg.Connection, statement_id: str, r: dict[str, Any]) -> tuple[str, str | None]:
    evidence = charges.Evidence(
        "statement", f"statement {statement_id} line {r['line_no']}: {r['status_text']} "
                     f"{r['amount_text'] or '-'} {r['currency'] or ''} reference {r['reference'] or '-'} "
                     f"rail transaction {r['rail_transaction_id'] or '-'} at {r['line_time'].isoformat()}",
        statement_id=statement_id, line_no=r["line_no"])
    to = r["settle_to"]
    code = (r["reason"] or r["status_text"]) if to == "failed" else None
    if r["refund_id"]:
        result = refunds.settle_refund_with_evidence(conn, r["refund_id"], to, evidence, failure_code=code,
                                                     rail_transaction_id=r["rail_transaction_id"])
    else:
        result = charges.settle_with_evidence(conn, r["charge_id"], to, evidence, failure_code=code,
                                            rail_transaction_id=r["rail_transaction_id"])
    if result.transitioned:
        return "settled", f"settled {to}"
    if result.status == to:  # a status read settled it first, the same way
        return "matched", f"{result.status} (settled meanwhile)"
    if result.contradiction:  # settled the other way meanwhile: settle() raised the alert
        return "contradiction", f"the rail says {r['status_text']}; ours: {result.status}"
    return "still_pending", f"not settled: ours is {result.status}"


# ---- step 3: the report --------------------------------------------------------------


def _complete(conn: psycopg.Connection, statement_id: str, left: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        st = cur.execute(Q["load_statement"], {"id": statement_id}).fetchone()
    stored = st["report"] or {}
    summary = _summary(conn, statement_id, stored.get("absent", []), stored.get("within_lag", {}))
    stored = {**stored, "summary": summary}
    if left:
        conn.execute("UPDATE statements SET report = %s WHERE id = %s", (Jsonb(stored), statement_id))
        log.warning("statement import interrupted: charges stayed locked", extra={
            "statement_id": statement_id, "left": left})
    else:
        conn.execute(Q["complete_statement"], {"id": statement_id, "report": Jsonb(stored)})
        log.info("statement imported", extra={"statement_id": statement_id, "rail": st["rail"],
                                              "lines": st["line_count"], "sha256": st["file_sha256"],
                                              "outcomes": {k: v["count"] for k, v in summary.items()}})
    result = show(conn, statement_id)
    if left:
        result["unfinished"] = left
    return result


def _summary(conn: psycopg.Connection, statement_id: str, absent: list[dict[str, Any]],
             within_lag: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Counts and amounts per outcome, in ``report.OUTCOMES`` order: the
    lines' from the database, plus the absent successes the report keeps."""
    counts: dict[str, dict[str, Any]] = {}
    for outcome, currency, n, amount in conn.execute(Q["statement_summary"], {"id": statement_id}):
        entry = counts.setdefault(outcome, {"count": 0, "amounts": {}})
        entry["count"] += n
        if currency and amount is not None:
            entry["amounts"][currency] = entry["amounts"].get(currency, 0) + int(amount)
    for outcome, rows in (("missing_from_statement", absent),):
        for r in rows:
            entry = counts.setdefault(outcome, {"count": 0, "amounts": {}})
            entry["count"] += 1
            entry["amounts"][r["currency"]] = entry["amounts"].get(r["currency"], 0) + r["amount"]
    if within_lag:
        counts["within_lag"] = within_lag
    return {o: {"count": counts[o]["count"], "amounts": dict(sorted(counts[o]["amounts"].items()))}
            for o in reports.OUTCOMES if o in counts}


def _exception_row(r: dict[str, Any]) -> dict[str, Any]:
    """A judged line (``statement_judged``/``statement_lines``) as a report row."""
    return {"line_no": r["line_no"], "outcome": r["outcome"], "kind": r["kind"], "reference": r["reference"],
            "rail_transaction_id": r["rail_transaction_id"], "msisdn": r["msisdn"], "amount": r["amount"],
            "amount_text": r["amount_text"], "currency": r["currency"], "status": r["status_text"],
            "time": _iso(r["line_time"]), "charge_id": r["charge_id"], "refund_id": r["refund_id"],
            "detail": r["detail"]}


def _absent_row(entry: dict[str, Any], outcome: str) -> dict[str, Any]:
    kind = "refund" if entry.get("refund_id") else "charge"
    return {"line_no": None, "outcome": outcome, "kind": kind, "reference": entry["rail_reference"],
            "rail_transaction_id": None, "msisdn": None, "amount": entry["amount"], "amount_text": None,
            "currency": entry["currency"], "status": "succeeded (ours)",
            "time": entry["created_at"].isoformat(), "charge_id": entry.get("charge_id"),
            "refund_id": entry.get("refund_id"),
            "detail": "a success of ours inside the period, absent from the statement"
                      if outcome == "missing_from_statement" else
                      "absent, but within the statement's lag of its end: the next statement should list it"}


def _report(conn: psycopg.Connection, meta: dict[str, Any], judged: Plan, *, statement: str | None,
            applied: bool) -> dict[str, Any]:
    """The report of a judged statement, from ``statement_judged``: the
    counts in SQL, only the exceptions become rows."""
    counts: dict[str, dict[str, Any]] = {}

    def count(outcome: str, n: int, amount: int | None, currency: str | None) -> None:
        entry = counts.setdefault(outcome, {"count": 0, "amounts": {}})
        entry["count"] += n
        if amount is not None and currency:
            entry["amounts"][currency] = entry["amounts"].get(currency, 0) + int(amount)
    for outcome, currency, n, amount in conn.execute(Q["statement_judged_summary"]):
        count(outcome, n, amount, currency)
    with conn.cursor(row_factory=dict_row) as cur:
        exceptions = [_exception_row(r) for r in cur.execute(Q["statement_judged_exceptions"])]
    for outcome, entries in (("missing_from_statement", judged.missing), ("within_lag", judged.within_lag)):
        for e in entries:
            count(outcome, 1, e["amount"], e["currency"])
            if outcome in reports.EXCEPTIONS:
                exceptions.append(_absent_row(e, outcome))
    summary = {o: {"count": counts[o]["count"], "amounts": dict(sorted(counts[o]["amounts"].items()))}
               for o in reports.OUTCOMES if o in counts}
    return {"statement": statement, **meta, "applied": applied, "already_imported": False,
            "period": {"start": _iso(judged.period_start), "end": _iso(judged.period_end),
                       "source": judged.period_source},
            "kinds": sorted(judged.kinds), "summary": summary, "exceptions": exceptions}


def _stored(result: dict[str, Any]) -> dict[str, Any]:
    """What the statement row keeps: the kinds, the rows no line holds, and
    the within-lag count (the summary is added when the batches are done)."""
    return {"kinds": result["kinds"], "period_source": result["period"]["source"],
            "absent": [r for r in result["exceptions"] if r["line_no"] is None],
            "within_lag": result["summary"].get("within_lag", {})}


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def _earlier(conn: psycopg.Connection, rail: str, sha256: str) -> dict[str, Any] | None:
    """The statement already recorded for this file: ``{"id", "completed",
    "report"}`` (the stored report, ``already_imported``), or ``None``."""
    row = conn.execute(Q["statement_by_hash"], {"rail": rail, "sha256": sha256}).fetchone()
    if row is None:
        return None
    found = show(conn, row[0])
    found["already_imported"] = True
    return {"id": row[0], "completed": row[2] is not None, "report": found}


def show(conn: psycopg.Connection, statement_id: str) -> dict[str, Any] | None:
    """A recorded statement's report (as ``run`` answered it), from its row
    and its exception lines; ``None`` when unknown."""
    with conn.cursor(row_factory=dict_row) as cur:
        st = cur.execute(Q["load_statement"], {"id": statement_id}).fetchone()
        if st is None:
            return None
        lines = cur.execute(Q["lines_of_statement"], {"id": statement_id, "exceptions_only": True}).fetchall()
    rows = [_exception_row(l) for l in lines]
    stored = st["report"] or {}
    return {"statement": st["id"], "rail": st["rail"], "file": st["file_name"], "sha256": st["file_sha256"],
            "profile": st["profile"], "columns": st["columns"], "lines": st["line_count"],
            "imported_at": _iso(st["imported_at"]), "applied": True, "already_imported": False,
            "completed": _iso(st.get("completed_at")),
            "period": {"start": _iso(st["period_start"]), "end": _iso(st["period_end"]),
                       "source": st.get("period_source")},
            "kinds": stored.get("kinds", []), "summary": stored.get("summary", {}),
            "exceptions": rows + stored.get("absent", [])}


def list_statements(conn: psycopg.Connection, limit: int = 100) -> list[dict[str, Any]]:
    """The latest recorded statements, newest first: id, rail, file, profile,
    period, line count, counts per outcome, imported_at."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(Q["list_statements"], {"limit": limit}).fetchall()
    return [{"statement": r["id"], "rail": r["rail"], "file": r["file_name"], "profile": r["profile"],
             "period": {"start": _iso(r["period_start"]), "end": _iso(r["period_end"])},
             "lines": r["line_count"], "imported_at": _iso(r["imported_at"]),
             "outcomes": {k: v["count"] for k, v in (r["report"] or {}).get("summary", {}).items()}}
            for r in rows]
