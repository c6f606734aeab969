"""Rail adapters behind one port (``vpay.rails.port``), one file per rail."""

from __future__ import annotations

from .port import Rail, RailError

KNOWN_RAILS = ("mtn", "orange")
"""Rails a charge may name: MTN MoMo (``vpay.rails.mtn``) and Orange Money Web
Payment (``vpay.rails.orange``). A known rail may still be unconfigured in a
given process: ``build_rail`` then raises ``RailError``."""


def build_rail(code: str) -> Rail:
    """The adapter for ``code``, configured from the environment (contract:
    ``VPAY_MTN_*``, ``VPAY_ORANGE_*``). Raises ``RailError`` for an unknown or
    unconfigured rail (the message names missing variables, never values)."""
    if code == "mtn":
        from .mtn import MtnMomo
        return MtnMomo.from_env()
    if code == "orange":
        from .orange import OrangeMoney
        return OrangeMoney.from_env()
    raise RailError(f"unknown rail {code!r}; known: {', '.join(KNOWN_RAILS)}")
