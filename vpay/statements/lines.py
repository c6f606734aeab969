"""Statement rows → typed lines, each read on its own: a field that cannot be
read is an error for that line (never agreement, never a guess), and the
other lines go on. Two lines naming the same transaction refuse the file.

Amounts: decimal strings in major units (``1500``, ``10.50``, ``-10.50``),
turned into integer minor units by the currency's ISO 4217 exponent
(``vpay.money.currency``), never through a float; more decimals than the exponent,
thousands separators or a decimal comma are errors. A negative amount is
read as its size on a refund line (money out) and is an error on a
collection. Times: ISO 8601; no offset means UTC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal

from vpay.money.currency import exponent
from vpay.statements.profiles import Profile
from vpay.statements.reader import BadFile, RawStatement

SUCCEEDED = frozenset({"SUCCESSFUL", "SUCCESS", "SUCCEEDED", "COMPLETED"})
FAILED = frozenset({"FAILED", "FAILURE", "REJECTED", "DECLINED", "EXPIRED", "CANCELLED", "CANCELED"})
PENDING = frozenset({"PENDING", "INITIATED", "ONGOING", "PAYER_DELAYED", "SUBMITTED", "ACCEPTED",
                     "ENQUEUED", "PROCESSING"})
"""The rails' status words (MoMo, Orange, pawaPay), case-insensitive."""

COLLECTIONS = frozenset({"DEPOSIT", "COLLECTION", "REQUEST_TO_PAY", "REQUESTTOPAY", "PAYMENT",
                         "DEBIT", "MERCHANT_PAYMENT"})
REFUNDS = frozenset({"REFUND"})
"""``type`` words: a collection is matched against charges, a refund against refunds."""

_AMOUNT = re.compile(r"-?[0-9]+(\.[0-9]+)?")
_CURRENCY = re.compile(r"[A-Z]{3}")


@dataclass
class Line:
    """One statement line. ``kind``: ``charge`` / ``refund`` / ``None`` (no
    type column: either). ``status``: ``succeeded`` / ``failed`` /
    ``pending``. ``amount``: minor units. ``error``: why the line cannot be
    judged (its other fields may be ``None``)."""

    line_no: int
    kind: str | None = None
    reference: str | None = None
    rail_transaction_id: str | None = None
    msisdn: str | None = None
    amount_text: str | None = None
    amount: int | None = None
    currency: str | None = None
    status_text: str | None = None
    status: str | None = None
    time: datetime | None = None
    reason: str | None = None
    error: str | None = None

    def fail(self, message: str) -> None:
        self.error = self.error or message


def parse_amount(text: str, currency: str) -> int | None:
    """``text`` (major units) as an int of minor units, or ``None`` when it
    is not a plain decimal or has more decimals than ``currency`` allows."""
    if not _AMOUNT.fullmatch(text):
        return None
    scaled = Decimal(text) * (10 ** exponent(currency))
    if scaled != scaled.to_integral_value():
        return None
    return int(scaled)


def parse_time(text: str) -> datetime | None:
    """ISO 8601 (``2026-11-30T14:05:00Z``, ``2026-11-30 14:05:00``) as an
    aware datetime; no offset = UTC. ``None`` when unreadable."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def typed(raw: RawStatement, profile: Profile, columns: dict[str, str]) -> list[Line]:
    """Read every row with ``columns`` (map key → column name; see
    ``profiles.resolve``). Raises ``BadFile`` when two lines name the same
    transaction (same type and reference, or same rail transaction id)."""
    index = {key: raw.header.index(col) for key, col in columns.items()}
    out = [_line(line_no, fields, index, profile) for line_no, fields in raw.rows]
    _refuse_duplicates(out)
    return out


def _line(line_no: int, fields: list[str], index: dict[str, int], profile: Profile) -> Line:
    def get(key: str) -> str | None:
        value = fields[index[key]].strip() if key in index else ""
        return value or None

    line = Line(line_no, reference=get("reference"), rail_transaction_id=get("rail_transaction_id"),
                msisdn=get("msisdn"), amount_text=get("amount"), reason=get("reason"))
    if line.reference is None and line.rail_transaction_id is None:
        line.fail("no reference and no rail transaction id")
    kind_word = (get("type") or "").upper()
    if kind_word in COLLECTIONS:
        line.kind = "charge"
    elif kind_word in REFUNDS:
        line.kind = "refund"
    elif kind_word:
        line.fail(f"type {kind_word!r} is neither a collection nor a refund")
    line.status_text = get("status") or profile.default_status
    word = (line.status_text or "").upper()
    line.status = ("succeeded" if word in SUCCEEDED else "failed" if word in FAILED
                   else "pending" if word in PENDING else None)
    if line.status is None:
        line.fail(f"unknown status {line.status_text!r}" if line.status_text else "no status")
    currency = (get("currency") or "").upper()
    if _CURRENCY.fullmatch(currency):
        line.currency = currency
    else:
        line.fail(f"unreadable currency {get('currency')!r}")
    if line.amount_text is None:
        if line.status != "failed":  # a failed line may say nothing of money that never moved
            line.fail("no amount")
    elif line.currency:
        minor = parse_amount(line.amount_text, line.currency)
        if minor is None:
            line.fail(f"unreadable amount {line.amount_text!r} for {line.currency}")
        elif minor < 0 and line.kind != "refund":
            line.fail(f"negative amount {line.amount_text!r} on a collection")
        else:
            line.amount = abs(minor)
    time_text = get("time")
    line.time = parse_time(time_text) if time_text else None
    if line.time is None:
        line.fail(f"unreadable time {time_text!r}" if time_text else "no time")
    return line


def _refuse_duplicates(lines: list[Line]) -> None:
    seen: dict[tuple, int] = {}
    for line in lines:
        keys = []
        if line.reference:
            keys.append(("reference", line.kind, line.reference.lower()))
        if line.rail_transaction_id:
            keys.append(("rail transaction id", line.rail_transaction_id))
        for key in keys:
            if key in seen:
                value = key[-1]
                raise BadFile(f"lines {seen[key]} and {line.line_no} name the same transaction "
                              f"({key[0]} {value}): a duplicate line")
            seen[key] = line.line_no
