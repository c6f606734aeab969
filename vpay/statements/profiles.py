"""Statement formats: which of a file's columns holds which field.

Map keys (docs/design/contract.md): ``reference`` (the id we sent the rail:
``charges.rail_reference``; Orange's ``order_id`` and our own ``ch_…`` /
``re_…`` ids are recognised too), ``rail_transaction_id`` (the operator's own
id), ``msisdn``, ``amount`` (decimal, major units), ``currency``, ``status``
(the rail's word), ``time`` (ISO 8601; no offset = UTC), ``type`` (collection
or refund, when the format has it), ``reason`` (why a line failed), ``period_start`` / ``period_end`` (the
period the statement covers, when the export repeats it on every line).

A statement needs ``amount``, ``currency``, ``time``, ``reference`` or
``rail_transaction_id``, and ``status`` unless its profile says what a line
without one means (a wallet statement lists only money that moved). Column
names are configuration, not constants (design/rails.md, "Statements"):
``--map KEY=COLUMN,…`` names them for any other export.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KEYS = ("reference", "rail_transaction_id", "msisdn", "amount", "currency", "status", "time", "type",
        "reason", "period_start", "period_end")
PERIOD_KEYS = frozenset({"period_start", "period_end"})
"""Optional in every profile: columns giving the period the statement
covers (the same on every line; docs/flows/statements.md, "The period")."""
REQUIRED = ("amount", "currency", "time")


class BadMap(ValueError):
    """An unknown profile or a ``--map`` that cannot work (a usage error)."""


@dataclass(frozen=True)
class Profile:
    """``columns``: map key → column name. ``default_status``: the status of
    every line when the format has no status column (``None``: it must have
    one). ``optional``: keys whose column may be absent from a file.
    ``default_currency``: the currency of every line when the format has no
    currency column (M-Pesa's organisation statement: a KES account).
    ``utc_offset_hours``: the offset of times written without one (M-Pesa's
    statement is in Kenya time, UTC+3; default UTC), so the lag window is
    judged on the real instant."""

    name: str
    description: str
    columns: dict[str, str]
    default_status: str | None = None
    optional: frozenset[str] = field(default_factory=frozenset)
    default_currency: str | None = None
    utc_offset_hours: int = 0


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile(
        "default",
        "vpay's plain format: one column per map key, named as the key "
        "(reference, rail_transaction_id, msisdn, amount, currency, status, time, type, reason)",
        {k: k for k in KEYS},
        optional=frozenset({"reference", "rail_transaction_id", "msisdn", "type", "reason"})),
    Profile(
        "pawapay",
        "pawaPay's wallet statement export: Creation Date (UTC), MSISDN, Transaction ID, Amount, "
        "Currency, Country, MNO, Type; it lists money that moved, so every line is SUCCESSFUL",
        {"time": "Creation Date (UTC)", "msisdn": "MSISDN", "reference": "Transaction ID",
         "amount": "Amount", "currency": "Currency", "type": "Type",
         "rail_transaction_id": "Financial Transaction ID"},
        default_status="SUCCESSFUL",
        optional=frozenset({"rail_transaction_id", "msisdn"})),
    Profile(
        "pawapay-deposits",
        "pawaPay's deposits export: the statement's columns plus Financial Transaction ID, "
        "Requested amount, Deposited amount (compared), Status, Reason, Metadata",
        {"time": "Creation Date (UTC)", "msisdn": "MSISDN", "reference": "Transaction ID",
         "rail_transaction_id": "Financial Transaction ID", "amount": "Deposited amount",
         "currency": "Currency", "status": "Status", "reason": "Reason"},
        optional=frozenset({"msisdn", "reason"})),
    Profile(
        "mpesa",
        "M-Pesa's organisation statement (Daraja / M-Pesa org portal export): Receipt No., "
        "Completion Time (Kenya time), Details, Transaction Status, Paid In, Withdrawn, Balance, "
        "Reason Type, A/C No. (the AccountReference we sent: the first 12 hex digits of the "
        "charge's reference); every amount in KES",
        {"rail_transaction_id": "Receipt No.", "time": "Completion Time", "status": "Transaction Status",
         "amount": "Paid In", "reference": "A/C No.", "reason": "Reason Type"},
        optional=frozenset({"reason"}), default_currency="KES", utc_offset_hours=3),
    Profile(
        "sandbox",
        "the sandbox rail's export (vpay/sandbox/statement.py): Date (UTC), Type, Reference ID, "
        "Financial Transaction ID, External ID, MSISDN, Amount, Currency, Status, Reason",
        {"time": "Date (UTC)", "type": "Type", "reference": "Reference ID",
         "rail_transaction_id": "Financial Transaction ID", "msisdn": "MSISDN", "amount": "Amount",
         "currency": "Currency", "status": "Status", "reason": "Reason"}),
)}


def parse_map(text: str) -> Profile:
    """A ``--map`` value, ``KEY=COLUMN,…``, as a profile named ``map``.
    Raises ``BadMap`` for an unknown or repeated key or an empty column."""
    columns: dict[str, str] = {}
    for part in text.split(","):
        key, sep, column = part.partition("=")
        key, column = key.strip(), column.strip()
        if not sep or not column:
            raise BadMap(f"--map wants KEY=COLUMN pairs separated by commas, got {part.strip()!r}")
        if key not in KEYS:
            raise BadMap(f"--map: unknown key {key!r}; keys: {', '.join(KEYS)}")
        if key in columns:
            raise BadMap(f"--map names {key!r} twice")
        columns[key] = column
    missing = [k for k in REQUIRED if k not in columns]
    if "reference" not in columns and "rail_transaction_id" not in columns:
        missing.append("reference or rail_transaction_id")
    if "status" not in columns:
        missing.append("status")
    if missing:
        raise BadMap(f"--map must name {', '.join(missing)}")
    return Profile("map", "an explicit --map", columns)


def choose(profile: str | None, mapping: str | None) -> Profile:
    """The profile for ``--profile`` / ``--map`` (default: ``default``).
    Raises ``BadMap`` for both at once, an unknown name or a bad map."""
    if profile and mapping:
        raise BadMap("give --profile or --map, not both")
    if mapping:
        return parse_map(mapping)
    name = profile or "default"
    if name not in PROFILES:
        raise BadMap(f"unknown profile {name!r}; profiles: {', '.join(PROFILES)}")
    return PROFILES[name]


def resolve(profile: Profile, header: list[str]) -> dict[str, str]:
    """The columns this file uses: map key → column name, for every key the
    profile names and the file has. Raises ``reader.BadFile`` (the file does
    not fit the format) when a needed column is absent."""
    from vpay.statements.reader import BadFile
    present = {k: c for k, c in profile.columns.items() if c in header}
    absent = [c for k, c in profile.columns.items()
              if k not in present and k not in profile.optional and k not in PERIOD_KEYS]
    if "reference" not in present and "rail_transaction_id" not in present:
        absent += [profile.columns[k] for k in ("reference", "rail_transaction_id")
                   if k in profile.columns and profile.columns[k] not in absent]
    if absent:
        raise BadFile(f"missing column(s) {', '.join(repr(c) for c in absent)} for profile "
                      f"{profile.name!r}; the file has: {', '.join(header)}")
    return present
