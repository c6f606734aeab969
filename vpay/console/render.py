"""How values are shown on the console's pages (Jinja2 filters): amounts in
major units, MSISDNs masked, times in UTC, ages in words. Escaping is
Jinja2's autoescape; nothing here marks text safe."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any


def msisdn(value: str | None) -> str:
    """``23767…4567``: the country code and operator prefix and the last four digits."""
    if not value:
        return "-"
    return value if len(value) <= 8 else f"{value[:5]}…{value[-4:]}"


def money(amount: int | None, currency: str | None) -> str:
    """Minor units as a decimal with the currency: ``1050, EUR`` → ``10.50 EUR``."""
    if amount is None or not currency:
        return "-"
    from vpay.money.currency import minor_to_major_string
    try:
        return f"{minor_to_major_string(amount, currency)} {currency}"
    except Exception:  # noqa: BLE001 - an unknown currency still shows its minor units
        return f"{amount} {currency} (minor units)"


def when(value: datetime | None) -> str:
    """UTC, to the second."""
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(seconds: float | None) -> str:
    """``3 s``, ``4 min``, ``5.2 h``, ``3.1 d``."""
    if seconds is None:
        return "-"
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def as_json(value: Any) -> str:
    """Compact JSON for a details column (escaped by the template like any text)."""
    return json.dumps(value, default=str, sort_keys=True)


COUNT_CAP = 10_000
"""Where the overview's counts stop (sql/queries/console.sql counts to one more)."""


def capped(n: int | None) -> str:
    """A count read up to ``COUNT_CAP + 1``: ``"over 10,000"`` past the cap."""
    if n is None:
        return "-"
    return f"over {COUNT_CAP:,}" if n > COUNT_CAP else f"{n:,}"


FILTERS = {"capped": capped, "msisdn": msisdn, "money": money, "when": when, "age": age, "as_json": as_json}
