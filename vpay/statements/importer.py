"""``statements import``: read, judge, and (with ``--apply``) act, in ONE
transaction, so a crash or a refusal half-way leaves nothing behind.

Dry run (the default) writes nothing. ``--apply`` records the statement (file
hash, period, line count) and every line with its outcome, settles each
``would_settle`` line through the money state machine with the line as the
evidence (``charges.settle_with_evidence``, ``refunds.settle_refund_with_evidence``:
one transition, one event, one ``settlement_evidence`` row), and raises the
alerts. Idempotent: a file already imported (same rail, same SHA-256) changes
nothing and answers the stored report; an overlapping statement finds the
earlier work done (settled charges are ``matched``; each alert is raised once,
``alerts_one_per_statement_finding``).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from vpay.money import charges, refunds
from vpay.money.ids import new_id
from vpay.base.queries import Q
from vpay.statements import report as reports
from vpay.statements.lines import typed
from vpay.statements.matcher import LAG_SECONDS, Judgement, Plan, plan
from vpay.statements.profiles import Profile, resolve
from vpay.statements.reader import read

log = logging.getLogger("vpay.statements")


def run(conn: psycopg.Connection, data: bytes, *, rail: str, profile: Profile, file_name: str,
        apply: bool = False, lag_seconds: float = LAG_SECONDS) -> dict[str, Any]:
    """Import one statement's bytes; answer the report (see ``report``).
    Raises ``reader.BadFile`` for a file that cannot be a statement (nothing
    written)."""
    raw = read(data)
    columns = resolve(profile, raw.header)
    lines = typed(raw, profile, columns)
    meta = {"rail": rail, "file": file_name, "sha256": raw.sha256, "profile": profile.name,
            "columns": columns, "lines": len(lines)}
    earlier = _earlier(conn, rail, raw.sha256)
    if earlier:
        return earlier
    judged = plan(conn, rail, lines, has_type="type" in columns, lag_seconds=lag_seconds)
    if not apply:
        return _report(meta, judged, statement=None, applied=False)
    try:
        with conn.transaction():
            return _apply(conn, meta, judged)
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name != "statements_rail_file_sha256_key":
            raise
        return _earlier(conn, rail, raw.sha256)  # imported by someone else meanwhile


def run_audited(conn: psycopg.Connection, data: bytes, *, actor: str | None = None, via: str = "cli",
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


def _apply(conn: psycopg.Connection, meta: dict[str, Any], judged: Plan) -> dict[str, Any]:
    statement_id = new_id("st")
    conn.execute(Q["insert_statement"], {
        "id": statement_id, "rail": meta["rail"], "sha256": meta["sha256"], "file_name": meta["file"],
        "profile": meta["profile"], "columns": Jsonb(meta["columns"]), "period_start": judged.period_start,
        "period_end": judged.period_end, "line_count": meta["lines"], "report": Jsonb({})})
    for j in judged.judgements:
        if j.settle:
            _settle(conn, statement_id, j)
        if j.alert:
            kind, details = j.alert
            _alert(conn, kind, j.refund_charge_id or j.charge_id, j.refund_id,
                   {**details, "statement_id": statement_id})
    for entry in judged.missing:
        _alert(conn, "missing_from_statement", entry.get("charge_id"), entry.get("refund_id"), {
            "finding": "missing", "statement_id": statement_id, "rail_reference": entry["rail_reference"],
            "amount": entry["amount"], "currency": entry["currency"],
            "created_at": entry["created_at"].isoformat(),
            "period_start": judged.period_start.isoformat(), "period_end": judged.period_end.isoformat()})
    _copy_lines(conn, statement_id, judged.judgements)
    result = _report(meta, judged, statement=statement_id, applied=True)
    conn.execute(Q["set_statement_report"], {"id": statement_id, "report": Jsonb(_stored(result))})
    log.info("statement imported", extra={"statement_id": statement_id, "rail": meta["rail"],
                                          "lines": meta["lines"], "sha256": meta["sha256"],
                                          "outcomes": {k: v["count"] for k, v in result["summary"].items()}})
    return result


def _settle(conn: psycopg.Connection, statement_id: str, j: Judgement) -> None:
    line = j.line
    evidence = charges.Evidence(
        "statement", f"statement {statement_id} line {line.line_no}: {line.status_text} "
                     f"{line.amount_text or '-'} {line.currency or ''} reference {line.reference or '-'} "
                     f"rail transaction {line.rail_transaction_id or '-'} at {line.time.isoformat()}",
        statement_id=statement_id, line_no=line.line_no)
    code = (line.reason or line.status_text) if j.settle == "failed" else None
    if j.refund_id:
        result = refunds.settle_refund_with_evidence(conn, j.refund_id, j.settle, evidence, failure_code=code,
                                                     rail_transaction_id=line.rail_transaction_id)
    else:
        result = charges.settle_with_evidence(conn, j.charge_id, j.settle, evidence, failure_code=code,
                                            rail_transaction_id=line.rail_transaction_id)
    if result.transitioned:
        j.outcome = "settled"
    elif result.status == j.settle:  # a status read settled it first, the same way
        j.outcome, j.detail = "matched", f"{result.status} (settled meanwhile)"
    elif result.contradiction:  # settled the other way meanwhile: settle() raised the alert
        j.outcome, j.detail = "contradiction", f"the rail says {line.status_text}; ours: {result.status}"
    else:
        j.outcome, j.detail = "still_pending", f"not settled: ours is {result.status}"


def _alert(conn, kind: str, charge_id: str | None, refund_id: str | None, details: dict[str, Any]) -> None:
    if conn.execute(Q["insert_statement_alert"], {"kind": kind, "charge_id": charge_id, "refund_id": refund_id,
                                                  "details": Jsonb(details)}).fetchone():
        log.error("statement finding", extra={"kind": kind, "charge_id": charge_id, "refund_id": refund_id,
                                              "finding": details.get("finding")})


_LINE_COLUMNS = ("statement_id", "line_no", "kind", "reference", "rail_transaction_id", "msisdn",
                 "amount_text", "amount", "currency", "status_text", "line_time", "outcome", "charge_id",
                 "refund_id", "detail")


def _copy_lines(conn: psycopg.Connection, statement_id: str, judgements: list[Judgement]) -> None:
    with conn.cursor() as cur, cur.copy(f"COPY statement_lines ({', '.join(_LINE_COLUMNS)}) FROM STDIN") as copy:
        for j in judgements:
            l = j.line
            copy.write_row((statement_id, l.line_no, l.kind or _kind(j), l.reference, l.rail_transaction_id,
                            l.msisdn, l.amount_text, l.amount, l.currency, l.status_text, l.time, j.outcome,
                            j.charge_id, j.refund_id, j.detail))


def _kind(j: Judgement) -> str | None:
    return "refund" if j.refund_id else "charge" if j.charge_id else None


def _row(j: Judgement) -> dict[str, Any]:
    l = j.line
    return {"line_no": l.line_no, "outcome": j.outcome, "kind": l.kind or _kind(j), "reference": l.reference,
            "rail_transaction_id": l.rail_transaction_id, "msisdn": l.msisdn, "amount": l.amount,
            "amount_text": l.amount_text, "currency": l.currency, "status": l.status_text,
            "time": l.time.isoformat() if l.time else None, "charge_id": j.charge_id,
            "refund_id": j.refund_id, "detail": j.detail}


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


def _report(meta: dict[str, Any], judged: Plan, *, statement: str | None, applied: bool) -> dict[str, Any]:
    rows = ([_row(j) for j in judged.judgements]
            + [_absent_row(e, "missing_from_statement") for e in judged.missing]
            + [_absent_row(e, "within_lag") for e in judged.within_lag])
    return {"statement": statement, **meta, "applied": applied, "already_imported": False,
            "period": {"start": _iso(judged.period_start), "end": _iso(judged.period_end)},
            "kinds": sorted(judged.kinds), "summary": reports.summarize(rows),
            "exceptions": reports.exceptions(rows)}


def _stored(result: dict[str, Any]) -> dict[str, Any]:
    """What the statement row keeps: the summary and the rows no line holds."""
    return {"summary": result["summary"], "kinds": result["kinds"],
            "absent": [r for r in result["exceptions"] if r["line_no"] is None]}


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def _earlier(conn: psycopg.Connection, rail: str, sha256: str) -> dict[str, Any] | None:
    row = conn.execute(Q["statement_by_hash"], {"rail": rail, "sha256": sha256}).fetchone()
    if row is None:
        return None
    found = show(conn, row[0])
    found["already_imported"] = True
    return found


def show(conn: psycopg.Connection, statement_id: str) -> dict[str, Any] | None:
    """A recorded statement's report (as ``run`` answered it), from its row
    and its exception lines; ``None`` when unknown."""
    with conn.cursor(row_factory=dict_row) as cur:
        st = cur.execute(Q["load_statement"], {"id": statement_id}).fetchone()
        if st is None:
            return None
        lines = cur.execute(Q["lines_of_statement"], {"id": statement_id, "exceptions_only": True}).fetchall()
    rows = [{"line_no": l["line_no"], "outcome": l["outcome"], "kind": l["kind"], "reference": l["reference"],
             "rail_transaction_id": l["rail_transaction_id"], "msisdn": l["msisdn"], "amount": l["amount"],
             "amount_text": l["amount_text"], "currency": l["currency"], "status": l["status_text"],
             "time": _iso(l["line_time"]), "charge_id": l["charge_id"], "refund_id": l["refund_id"],
             "detail": l["detail"]} for l in lines]
    stored = st["report"] or {}
    return {"statement": st["id"], "rail": st["rail"], "file": st["file_name"], "sha256": st["file_sha256"],
            "profile": st["profile"], "columns": st["columns"], "lines": st["line_count"],
            "imported_at": _iso(st["imported_at"]), "applied": True, "already_imported": False,
            "period": {"start": _iso(st["period_start"]), "end": _iso(st["period_end"])},
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
