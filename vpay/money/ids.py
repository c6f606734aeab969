"""Identifiers: ``pi_…``, ``ch_…``, ``evt_…``, ``we_…`` and rail references."""

from __future__ import annotations

import secrets
import uuid

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def new_id(prefix: str, length: int = 24) -> str:
    """A random id like ``ch_3kQ9…`` (base62, ~142 bits for 24 characters)."""
    return prefix + "_" + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def new_rail_reference() -> str:
    """A fresh UUIDv4: MoMo's ``X-Reference-Id`` becomes the rail's resource id."""
    return str(uuid.uuid4())
