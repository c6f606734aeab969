"""Currencies: which ones vpay accepts, and ISO 4217 minor-unit exponents.

Amounts everywhere are integers in the minor unit. A rail that wants a
decimal string in major units (MoMo's request-to-pay ``amount``) converts
with ``minor_to_major_string``.
"""

from __future__ import annotations

import re

# ISO 4217 exponents that differ from the usual 2; anything unlisted is 2.
_EXPONENTS: dict[str, int] = {
    "BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0,
    "KRW": 0, "PYG": 0, "RWF": 0, "UGX": 0, "VND": 0, "VUV": 0, "XAF": 0,
    "XOF": 0, "XPF": 0,
    "BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
}

CURRENCIES: frozenset[str] = frozenset({
    # the mobile-money markets MTN MoMo and Orange Money serve
    "XAF", "XOF", "UGX", "RWF", "GNF", "GHS", "ZMW", "ZAR", "NGN", "KES", "SZL", "LRD",
    "SLE", "CDF", "MGA", "BWP", "MAD", "EGP", "TND", "BIF", "KMF", "MWK", "SDG",
    # MoMo's sandbox currency, and the dollar
    "EUR", "USD",
})
"""ISO 4217 codes a payment may be made in; any other is refused as unknown."""


def exponent(currency: str) -> int:
    """The ISO 4217 minor-unit exponent of ``currency`` (2 when unlisted)."""
    return _EXPONENTS.get(currency.upper(), 2)


def minor_to_major_string(amount: int, currency: str) -> str:
    """Render an amount in minor units as a decimal string in major units,
    with the currency's ISO 4217 number of decimals (MoMo's request-to-pay
    takes ``amount`` as a string; design/rails.md, "MTN MoMo").

    >>> minor_to_major_string(1050, "EUR")
    '10.50'
    >>> minor_to_major_string(5000, "UGX")
    '5000'

    Raises ``TypeError`` if ``amount`` is not an int (a bool is refused too)
    and ``ValueError`` if it is negative.
    """
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError(f"amount must be an int in minor units, got {type(amount).__name__}")
    if amount < 0:
        raise ValueError("amount must not be negative")
    exp = exponent(currency)
    if exp == 0:
        return str(amount)
    major, minor = divmod(amount, 10**exp)
    return f"{major}.{minor:0{exp}d}"


_MAJOR_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def major_string_to_minor(value, currency: str) -> int | None:
    """A rail's decimal amount in major units (``"10.50"``, ``"5000"``) as an
    int in minor units, or ``None`` when it cannot be read as one.

    The shape is MoMo's (design/rails.md, "MTN MoMo": ``amount`` is a
    string): a JSON string of ASCII digits with at most one ``.`` and digits
    after it, nothing else. Unreadable, so ``None``: any non-string (a JSON
    number, ``null``, a bool), ``""``, a sign (``"-15"``, ``"+15"``),
    exponent notation (``"1e3"``), a thousands separator (``"1,500"``),
    spaces, ``"NaN"``/``"Infinity"``, words, and a value that is not a whole
    number of minor units by the currency's ISO 4217 exponent (``"15.001"``
    for EUR). Extra decimals that are zeros (``"15.000"`` for EUR) are exact,
    so they are read. Never a float: Decimal arithmetic throughout.
    """
    from decimal import Decimal
    if not isinstance(value, str) or not _MAJOR_DECIMAL.fullmatch(value):
        return None
    scaled = Decimal(value) * (10 ** exponent(currency))
    if scaled != scaled.to_integral_value():
        return None
    return int(scaled)
