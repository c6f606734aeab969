"""Statement rows → typed lines, each read on its own: a field that cannot be
read is an error for that line (never agreement, never a guess, never an
exception), and the other lines go on.

Amounts: decimal strings in major units (``1500``, ``10.50``, ``-10.50``),
turned into integer minor units by the currency's ISO 4217 exponent
(``vpay.money.currency``), never through a float; more decimals than the exponent,
thousands separators, a decimal comma, or more than ``money.MAX_AMOUNT``
minor units are errors. A negative amount is read as its size on a refund
line (money out) and is an error on a collection. Times: ISO 8601; no offset
means UTC; an offset beyond ``MAX_OFFSET`` or a time outside
``[EARLIEST_TIME, now + FUTURE_SLACK]`` is an error (a statement lists what
happened, never what will). A NUL byte in any field is an error (Postgres
text cannot hold one; it is stored as ``\\x00``).

Identifiers are compared by ``canonical``: the same transaction written in
another case is the same transaction where the identifier's spec says case
does not matter (UUIDs, RFC 4122 §3; hex order ids).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterator

from vpay.money.currency import exponent
from vpay.money.charges import MAX_AMOUNT
from vpay.statements.profiles import Profile
from vpay.statements.reader import RawStatement

SUCCEEDED = frozenset({"SUCCESSFUL", "SUCCESS", "SUCCEEDED", "COMPLETED"})
FAILED = frozenset({"FAILED", "FAILURE", "REJECTED", "DECLINED", "EXPIRED", "CANCELLED", "CANCELED"})
PENDING = frozenset({"PENDING", "INITIATED", "ONGOING", "PAYER_DELAYED", "SUBMITTED", "ACCEPTED",
                     "ENQUEUED", "PROCESSING"})
"""The rails' status words (MoMo, Orange, pawaPay), case-insensitive."""

COLLECTIONS = frozenset({"DEPOSIT", "COLLECTION", "REQUEST_TO_PAY", "REQUESTTOPAY", "PAYMENT",
                         "DEBIT", "MERCHANT_PAYMENT"})
REFUNDS = frozenset({"REFUND"})
"""``type`` words: a collection is matched against charges, a refund against refunds."""

EARLIEST_TIME = datetime(2000, 1, 1, tzinfo=timezone.utc)
"""No mobile-money statement line is older (MTN MoMo launched in 2007)."""
FUTURE_SLACK = timedelta(days=1)
"""A line may be this far past our clock (a rail's clock, a time zone
mislabelled by a day's edge); beyond it the time is unreadable."""
MAX_OFFSET = timedelta(hours=14)
"""Real UTC offsets run from -12:00 to +14:00 (IANA tz database)."""
MAX_FIELD_CHARS = 1000
"""A field longer than this is an error for its line (no rail writes one)."""

_AMOUNT = re.compile(r"(-?)([0-9]{1,20})(?:\.([0-9]{1,20}))?")
_CURRENCY = re.compile(r"[A-Z]{3}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX = re.compile(r"[0-9a-fA-F]{30,32}")


def canonical(identifier: str | None) -> str | None:
    """The form two spellings of one identifier share: UUIDs (RFC 4122 §3:
    case-insensitive on input) and 30-32-digit hex ids (Orange's order id,
    a UUID without dashes) lower-cased; anything else (our ``ch_``/``re_``
    ids are base62, rail transaction ids are the rail's) as written."""
    if identifier is None:
        return None
    size = len(identifier)  # a UUID is 36 characters, a hex id 30-32: most ids are neither
    if (size == 36 and _UUID.fullmatch(identifier)) or (30 <= size <= 32 and _HEX.fullmatch(identifier)):
        return identifier.lower()
    return identifier


@dataclass(slots=True)
class Line:
    """One statement line. ``kind``: ``charge`` / ``refund`` / ``None`` (no
    type column: either). ``status``: ``succeeded`` / ``failed`` /
    ``pending``. ``amount``: minor units. ``error``: why the line cannot be
    judged (its other fields may be ``None``). ``period_start`` /
    ``period_end``: the period the line says its statement covers (a
    profile's period columns), when the file has them."""

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
    period_start: datetime | None = None
    period_end: datetime | None = None

    def fail(self, message: str) -> None:
        self.error = self.error or message


def parse_amount(text: str, currency: str) -> int | None:
    """``text`` (major units) as an int of minor units, or ``None`` when it
    is not a plain decimal, has more decimals than ``currency`` allows, or is
    larger than ``money.MAX_AMOUNT`` minor units. Exact integer arithmetic
    on the digits (a ``Decimal`` product would round past 28 digits)."""
    match = _AMOUNT.fullmatch(text)
    if match is None:
        return None
    sign, whole, frac = match.groups()
    exp = exponent(currency)
    frac = frac or ""
    if frac[exp:].strip("0"):  # 10.500 EUR is 10.50; 10.505 is not an amount in EUR
        return None
    minor = int(whole) * 10 ** exp + int(frac[:exp].ljust(exp, "0") or "0")
    if minor > MAX_AMOUNT:
        return None
    return -minor if sign else minor


def parse_time(text: str, now: datetime | None = None, utc_offset_hours: int = 0) -> datetime | None:
    """ISO 8601 (``2026-11-30T14:05:00Z``, ``2026-11-30 14:05:00``) as an
    aware UTC datetime; no offset = ``utc_offset_hours`` (the profile's local
    time: M-Pesa's statement is in Kenya time; default UTC), so the lag window
    is judged on the real instant. ``None`` when unreadable: not ISO
    8601, an offset beyond ``MAX_OFFSET``, before ``EARLIEST_TIME``, or more
    than ``FUTURE_SLACK`` after ``now`` (default: the current time)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone(timedelta(hours=utc_offset_hours)))
    offset = value.utcoffset()
    if offset is None or abs(offset) > MAX_OFFSET:
        return None
    try:
        value = value.astimezone(timezone.utc)
    except OverflowError:  # 9999-12-31T23:59:59-10:00 is past datetime.max in UTC
        return None
    now = now or datetime.now(timezone.utc)
    if value < EARLIEST_TIME or value > now + FUTURE_SLACK:
        return None
    return value


def _time_error(text: str, now: datetime) -> str:
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        return f"unreadable time {text!r}"
    if value.tzinfo is not None and abs(value.utcoffset()) > MAX_OFFSET:
        return f"time {text!r} has an offset beyond ±14:00"
    return f"time {text!r} is outside {EARLIEST_TIME.date()} .. {(now + FUTURE_SLACK).date()}"


def clean(value: str) -> str:
    """``value`` as it can be stored: a NUL byte (which Postgres text
    cannot hold) written as ``\\x00``."""
    return value.replace("\x00", "\\x00") if "\x00" in value else value


def typed(raw: RawStatement, profile: Profile, columns: dict[str, str],
          now: datetime | None = None) -> Iterator[Line]:
    """Read every row of ``raw`` with ``columns`` (map key → column name; see
    ``profiles.resolve``), one ``Line`` per row, lazily. Never raises for a
    line's content: what cannot be read is that line's ``error`` (a refused
    file, ``reader.BadFile``, is raised by ``raw.rows``)."""
    index = {key: raw.header.index(col) for key, col in columns.items()}
    now = now or datetime.now(timezone.utc)
    for line_no, fields in raw.rows:
        yield _line(line_no, fields, index, profile, now)


def _line(line_no: int, fields: list[str], index: dict[str, int], profile: Profile, now: datetime) -> Line:
    bad: list[str] = []

    if max(map(len, fields)) <= MAX_FIELD_CHARS and "\x00" not in "".join(fields):
        def get(key: str) -> str | None:  # the common line: every field fits and holds no NUL
            at = index.get(key)
            return (fields[at].strip() or None) if at is not None else None
    else:
        def get(key: str) -> str | None:
            value = fields[index[key]].strip() if key in index else ""
            if "\x00" in value:
                bad.append(f"{key} holds a NUL byte")
                value = clean(value)
            if len(value) > MAX_FIELD_CHARS:
                bad.append(f"{key} is longer than {MAX_FIELD_CHARS} characters")
                value = value[:MAX_FIELD_CHARS] + "…"
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
    currency_text = get("currency") or profile.default_currency
    currency = (currency_text or "").upper()
    if _CURRENCY.fullmatch(currency):
        line.currency = currency
    else:
        line.fail(f"unreadable currency {currency_text!r}")
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
    line.time = parse_time(time_text, now, profile.utc_offset_hours) if time_text else None
    if line.time is None:
        line.fail(_time_error(time_text, now) if time_text else "no time")
    for key in ("period_start", "period_end"):
        text = get(key)
        if text is None:
            continue
        value = parse_time(text, now, profile.utc_offset_hours)
        if value is None:
            line.fail(f"{key.replace('_', ' ')}: {_time_error(text, now)}")
        elif key == "period_end" and len(text) == 10:  # a date alone: the period covers that whole day
            value += timedelta(days=1, microseconds=-1)
        setattr(line, key, value)
    if bad:  # a NUL byte or an endless field names the first, above any other reason
        line.error = "; ".join(bad)
    return line
