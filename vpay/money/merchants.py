"""Merchant accounts: the owners of payment intents and webhook endpoints,
and their API secret keys (the merchant API's ``Authorization: Bearer``)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
from typing import Any

import psycopg
from psycopg.rows import dict_row

from vpay.money.charges import MERCHANT
from vpay.base.queries import Q


def create_merchant(conn: psycopg.Connection, merchant_id: str, name: str = "") -> bool:
    """Create merchant ``merchant_id`` unless it exists; answers whether it
    was created. Raises ``ValueError`` for an id that is not 1-64 letters,
    digits, ``_``, ``-`` or ``.``."""
    if not MERCHANT.fullmatch(merchant_id or ""):
        raise ValueError("merchant id must be 1-64 letters, digits, '_', '-' or '.'")
    row = conn.execute("INSERT INTO merchants (id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING "
                       "RETURNING id", (merchant_id, name)).fetchone()
    return row is not None


# --- API keys ----------------------------------------------------------------
# A key reads ``sk_<16 base62>_<32 base62>``: the first part names its row in
# ``merchant_api_keys`` (``key_<16 base62>``), the whole string is secret. Only
# sha256 of the whole string is stored: with ~190 random bits a plain hash is
# enough, and it is compared in constant time (``hmac.compare_digest``).

_KEY_SHAPE = re.compile(r"^sk_([A-Za-z0-9]{16})_([A-Za-z0-9]{32})$")
_BASE62 = string.digits + string.ascii_letters
_NO_KEY = hashlib.sha256(b"no such key").digest()


def _base62(length: int) -> str:
    return "".join(secrets.choice(_BASE62) for _ in range(length))


def _digest(api_key: str) -> bytes:
    return hashlib.sha256(api_key.encode("ascii")).digest()


def create_api_key(conn: psycopg.Connection, merchant_id: str) -> tuple[str, str]:
    """Issue a new secret key for an existing merchant. Answers ``(key_id,
    api_key)``; ``api_key`` is shown to the operator once and never stored.
    Raises ``LookupError`` when the merchant does not exist."""
    part = _base62(16)
    api_key = f"sk_{part}_{_base62(32)}"
    try:
        conn.execute(Q["insert_api_key"], {"id": f"key_{part}", "merchant_id": merchant_id,
                                           "secret_sha256": _digest(api_key)})
    except psycopg.errors.ForeignKeyViolation:
        raise LookupError(f"no merchant {merchant_id!r}") from None
    return f"key_{part}", api_key


def authenticate(conn: psycopg.Connection, api_key: str | None) -> str | None:
    """The merchant id a presented secret key belongs to, or ``None`` (unknown,
    revoked, malformed or missing key). Reads only. The hash comparison is
    constant-time, and a key of the right shape costs one lookup whether or
    not its id exists."""
    m = _KEY_SHAPE.match(api_key) if isinstance(api_key, str) else None
    if m is None:
        return None
    row = conn.execute(Q["find_api_key"], {"id": f"key_{m.group(1)}"}).fetchone()
    stored = bytes(row[1]) if row else _NO_KEY
    ok = hmac.compare_digest(_digest(api_key), stored)
    return row[0] if (row and ok) else None


def revoke_api_key(conn: psycopg.Connection, key_id: str) -> str | None:
    """Revoke a key by its id (``key_…``); answers its merchant, or ``None``
    when no live key has that id."""
    row = conn.execute(Q["revoke_api_key"], {"id": key_id}).fetchone()
    return row[1] if row else None


def merchant_exists(conn: psycopg.Connection, merchant_id: str) -> bool:
    """Whether ``merchant_id`` names a merchant."""
    return bool(conn.execute(Q["merchant_exists"], {"id": merchant_id}).fetchone()[0])


def list_merchants(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every merchant with its keys' ids and dates (never a secret), as
    JSON-ready dicts: ``[{id, name, created_at, keys: [{id, created_at,
    revoked_at}]}]``."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(Q["list_merchants"]).fetchall()
    return [{"id": r["id"], "name": r["name"], "created_at": r["created_at"].isoformat(),
             "keys": r["keys"]} for r in rows]
