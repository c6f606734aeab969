"""Rail adapters behind one port (``vpay.rails.port``), one file per rail."""

from __future__ import annotations

from .port import Rail, RailError

KNOWN_RAILS = ("mtn",)
"""Rails a charge may name today. Orange Money is planned (its adapter does not
exist yet), so a charge naming it is refused as an unknown rail."""


def build_rail(code: str) -> Rail:
    """The adapter for ``code``, configured from the environment (contract:
    ``VPAY_MTN_*``). Raises ``RailError`` for an unknown or unconfigured rail."""
    if code == "mtn":
        from .mtn import MtnMomo
        return MtnMomo.from_env()
    raise RailError(f"unknown rail {code!r}; known: {', '.join(KNOWN_RAILS)}")
