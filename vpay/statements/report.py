"""The import's answer: counts and amounts per outcome, the exceptions, as a
table, as JSON, and as a CSV an accountant can open (UTF-8 with a BOM, so
Excel reads it as UTF-8).

A row is one judged line or one absent success of ours: ``line_no`` (None
for an absent success), ``outcome``, ``kind``, ``reference``,
``rail_transaction_id``, ``msisdn``, ``amount`` (minor units or None),
``amount_text`` (as the file had it), ``currency``, ``status``, ``time``
(ISO 8601), ``charge_id``, ``refund_id``, ``detail``.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from vpay.money.currency import minor_to_major_string

OUTCOMES = ("matched", "settled", "would_settle", "contradiction", "unknown_rail_transaction",
            "missing_from_statement", "within_lag", "still_pending", "error")
EXCEPTIONS = ("contradiction", "unknown_rail_transaction", "missing_from_statement", "error")
"""Outcomes a person must look at; the exceptions CSV lists these rows."""

CSV_COLUMNS = ("line", "outcome", "type", "reference", "rail_transaction_id", "msisdn", "amount",
               "currency", "status", "time", "charge_id", "refund_id", "detail")


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{outcome: {"count": n, "amounts": {currency: minor units}}}`` for the
    outcomes present, in ``OUTCOMES`` order."""
    out: dict[str, dict[str, Any]] = {}
    for outcome in OUTCOMES:
        mine = [r for r in rows if r["outcome"] == outcome]
        if not mine:
            continue
        amounts: dict[str, int] = {}
        for r in mine:
            if r.get("amount") is not None and r.get("currency"):
                amounts[r["currency"]] = amounts.get(r["currency"], 0) + r["amount"]
        out[outcome] = {"count": len(mine), "amounts": dict(sorted(amounts.items()))}
    return out


def exceptions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows a person must look at, file order first, then absent successes."""
    return [r for r in rows if r["outcome"] in EXCEPTIONS]


def _money(amount: int | None, currency: str | None) -> str:
    if amount is None or not currency:
        return ""
    return f"{minor_to_major_string(amount, currency)}"


def _when(value, format_time) -> str:
    """A period bound as the tables print times (whole seconds, UTC), or ``-``."""
    return format_time(value) if value else "-"


def render(report: dict[str, Any]) -> str:
    """The summary table and the exceptions, for a terminal: every text the
    statement (or the rail, or a merchant) wrote is escaped
    (``cli.output.safe_text``), so no field can drive the terminal."""
    from vpay.cli.output import format_time, safe_text
    period = report.get("period") or {}
    head = report.get("statement") or "(not recorded)"
    mode = ("already imported: nothing done" if report.get("already_imported")
            else f"interrupted: {report['unfinished']} lines still to settle (a poll held them); "
                 "run the same import again to finish" if report.get("unfinished")
            else "applied" if report.get("applied") else "dry run: nothing written; --apply to settle")
    if report.get("interrupted"):
        mode += f"; {report['interrupted']} was interrupted: --apply finishes it"
    out = [f"statement {head}  rail {report['rail']}  lines {report['lines']}  "
           f"period {_when(period.get('start'), format_time)} .. {_when(period.get('end'), format_time)}"
           f"{' (' + period['source'] + ')' if period.get('source') else ''}  [{mode}]", ""]
    out.append(f"{'outcome':<26} {'count':>7}  amounts")
    for outcome, entry in report["summary"].items():
        amounts = ", ".join(f"{c} {_money(a, c)}" for c, a in entry["amounts"].items())
        out.append(f"{outcome:<26} {entry['count']:>7}  {amounts}")
    rows = report.get("exceptions") or []
    out += ["", f"exceptions: {len(rows)}"]
    for r in rows[:200]:
        where = f"line {r['line_no']}" if r.get("line_no") else "ours"
        amount = f"{_money(r.get('amount'), r.get('currency')) or r.get('amount_text') or ''} " \
                 f"{r.get('currency') or ''}".strip()
        subject = r.get("refund_id") or r.get("charge_id") or r.get("reference") or r.get("rail_transaction_id")
        out.append(f"  {where:<10} {r['outcome']:<25} {safe_text(subject):<40} {safe_text(amount):<16} "
                   f"{safe_text(r.get('detail'))}".rstrip())
    if len(rows) > 200:
        out.append(f"  … {len(rows) - 200} more (--json or --exceptions-csv)")
    return "\n".join(out)


_NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?")


def _cell(value: Any) -> Any:
    """A cell a spreadsheet shows as text. The file is for an accountant's
    spreadsheet (hence the BOM), and its text comes from the rail's
    statement: a field starting ``=``, ``+``, ``-``, ``@``, tab or CR would
    be run as a formula (OWASP, "CSV Injection"), so it gets a leading
    ``'``. A plain number (``-12.50``) is left as it is."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r") \
            and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def exceptions_csv(report: dict[str, Any]) -> bytes:
    """The exceptions as CSV bytes (UTF-8 with BOM; amounts in major units;
    text that would read as a spreadsheet formula is quoted, ``_cell``)."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for r in report.get("exceptions") or []:
        amount = _money(r.get("amount"), r.get("currency")) or (r.get("amount_text") or "")
        writer.writerow([_cell(v) for v in (
            r.get("line_no") or "", r["outcome"], r.get("kind") or "", r.get("reference") or "",
            r.get("rail_transaction_id") or "", r.get("msisdn") or "", amount,
            r.get("currency") or "", r.get("status") or "", r.get("time") or "",
            r.get("charge_id") or "", r.get("refund_id") or "", r.get("detail") or "")])
    return buf.getvalue().encode("utf-8-sig")
