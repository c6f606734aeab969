"""Rail adapters behind one port (``vpay.rails.port``), one file per rail."""

from __future__ import annotations

from vpay.rails.port import KNOWN_RAILS, Rail, RailError  # noqa: F401  (KNOWN_RAILS re-exported)


def build_rail(code: str, **overrides) -> Rail:
    """The adapter for ``code``, configured from the environment (contract:
    ``VPAY_MTN_*``, ``VPAY_ORANGE_*``, ``VPAY_MPESA_*``, ``VPAY_PAWAPAY_*``); ``overrides`` are constructor
    arguments that win over it (the API passes a shorter ``total_timeout``).
    Raises ``RailError`` for an unknown or unconfigured rail (the message
    names missing variables, never values). Each setting may come from the
    environment or a systemd credential of the same name
    (``vpay.base.credentials``)."""
    from vpay.base.credentials import WithCredentials
    if code == "mtn":
        from vpay.rails.mtn import MtnMomo
        return MtnMomo.from_env(WithCredentials(), **overrides)
    if code == "orange":
        from vpay.rails.orange import OrangeMoney
        return OrangeMoney.from_env(WithCredentials(), **overrides)
    if code == "mpesa":
        from vpay.rails.mpesa import MpesaDaraja
        return MpesaDaraja.from_env(WithCredentials(), **overrides)
    if code == "pawapay":
        from vpay.rails.pawapay import PawaPay
        return PawaPay.from_env(WithCredentials(), **overrides)
    raise RailError(f"unknown rail {code!r}; known: {', '.join(KNOWN_RAILS)}")


def configured_rails(environ=None) -> list[str]:
    """The rails whose ``VPAY_<RAIL>_*`` settings are present, each built
    once to check them. A rail with none of its settings is simply not
    configured here; one with some of them must build, or this raises
    ``RailError`` naming the problem (missing or malformed settings): a
    half-configured rail is refused at boot rather than failing every job."""
    from vpay.base.credentials import WithCredentials
    env = WithCredentials() if environ is None else environ
    present = []
    for code in KNOWN_RAILS:
        prefix = f"VPAY_{code.upper()}_"
        if not any(k.startswith(prefix) and v.strip() for k, v in env.items()):
            continue
        build_rail(code)  # raises RailError on a missing or malformed setting
        present.append(code)
    return present
