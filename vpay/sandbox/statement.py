"""The sandbox MoMo rail's transaction statement: its own ledger as a CSV, in
the format vpay's ``sandbox`` statement profile reads (and an operator can
read too), so statement reconciliation is tested against a rail's own record.

Columns, one line per transaction (collections, then refunds, each oldest
first)::

    Date (UTC)                ISO 8601, seconds, "Z": when the rail took the request
    Type                      REQUEST_TO_PAY | REFUND
    Reference ID              the X-Reference-Id (vpay's charges.rail_reference / refunds.rail_reference)
    Financial Transaction ID  the rail's own id (SUCCESSFUL lines only)
    External ID               externalId as sent (vpay's ch_… / re_…)
    MSISDN                    the payer (the payee of a refund)
    Amount                    major units, as the request had it
    Currency                  ISO 4217
    Status                    SUCCESSFUL | FAILED | PENDING
    Reason                    the FAILED reason

Like a real export, a statement is a snapshot: ONGOING and PAYER_DELAYED
(which the sandbox answers as FAILED with that reason, and vpay reads as
still pending) are listed as PENDING. UTF-8, comma-separated, CRLF line ends
(RFC 4180).
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from typing import Any, Iterable

COLUMNS = ("Date (UTC)", "Type", "Reference ID", "Financial Transaction ID", "External ID", "MSISDN",
           "Amount", "Currency", "Status", "Reason")
_NOT_FINAL = ("ONGOING", "PAYER_DELAYED")

def rows(rail, *, since: float | None = None, until: float | None = None,
         shift_seconds: float = 0.0) -> list[dict[str, str]]:
    """The statement of a ``vpay.sandbox.mtn.SandboxRail`` (its
    ``transactions()`` and ``refunds()``) as dicts keyed by ``COLUMNS``.
    ``since`` / ``until``: epoch seconds bounding the transactions' times.
    ``shift_seconds``: added to every time (a test dates a statement in the
    past without waiting)."""
    out = []
    for kind, ledger in (("REQUEST_TO_PAY", rail.transactions()), ("REFUND", rail.refunds())):
        for txn in ledger:
            at = txn["createdAt"]
            if (since is not None and at < since) or (until is not None and at > until):
                continue
            out.append(_row(kind, txn, at + shift_seconds))
    return out

def _row(kind: str, txn: dict[str, Any], at: float) -> dict[str, str]:
    status, reason = txn["status"], txn.get("reason") or ""
    if status == "FAILED" and reason in _NOT_FINAL:
        status, reason = "PENDING", ""
    party = txn.get("payer") or txn.get("payee") or {}
    when = datetime.fromtimestamp(at, timezone.utc).replace(microsecond=0)
    return {"Date (UTC)": when.isoformat().replace("+00:00", "Z"), "Type": kind,
            "Reference ID": txn["reference"], "Financial Transaction ID": txn.get("financialTransactionId") or "",
            "External ID": txn.get("externalId") or "", "MSISDN": party.get("partyId", ""),
            "Amount": txn["amount"], "Currency": txn["currency"], "Status": status,
            "Reason": reason if status == "FAILED" else ""}

def to_csv(lines: Iterable[dict[str, str]]) -> bytes:
    """Statement rows (``rows()``, possibly edited by a test) as CSV bytes."""
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(lines)
    return buf.getvalue().encode("utf-8")

def export(rail, **options: Any) -> bytes:
    """``to_csv(rows(rail, **options))``: the rail's statement file."""
    return to_csv(rows(rail, **options))
