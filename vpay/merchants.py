"""Merchant accounts: the owners of payment intents and webhook endpoints."""

from __future__ import annotations

import psycopg

from .money import MERCHANT


def create_merchant(conn: psycopg.Connection, merchant_id: str, name: str = "") -> bool:
    """Create merchant ``merchant_id`` unless it exists; answers whether it
    was created. Raises ``ValueError`` for an id that is not 1-64 letters,
    digits, ``_``, ``-`` or ``.``."""
    if not MERCHANT.match(merchant_id or ""):
        raise ValueError("merchant id must be 1-64 letters, digits, '_', '-' or '.'")
    row = conn.execute("INSERT INTO merchants (id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING "
                       "RETURNING id", (merchant_id, name)).fetchone()
    return row is not None
