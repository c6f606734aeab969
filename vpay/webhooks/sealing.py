"""Webhook secrets at rest: seal the plaintext rows, re-seal every row under
the newest key (``vpay-server secrets rotate``), and check at boot that the
configured keys open what is stored (vpay.base.secretbox; docs/security.md).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from vpay.base.queries import Q
from vpay.base.secretbox import SecretBox, is_sealed

log = logging.getLogger("vpay.webhooks.sealing")

PAGE = 200
"""Endpoints re-sealed per transaction: a crash loses at most one page of
work, and a re-run skips every row already under the newest key."""


def _reseal(box: SecretBox, stored: str | None) -> str | None:
    if stored is None or box.current(stored):
        return stored
    return box.reseal(stored)


def rotate(conn: psycopg.Connection, box: SecretBox, *, actor: str, page: int = PAGE) -> dict[str, Any]:
    """Seal every endpoint's secrets (current and previous) under ``box``'s
    newest key, one page of ``page`` endpoints per transaction, in id order.
    Resumable: a row already under the newest key is not written, so a run
    cut short is finished by running it again. A row whose secret was
    rotated meanwhile is skipped (the compare-and-swap matched nothing; its
    new secret is sealed under the newest key already). Raises ``WrongKey``
    (before writing that row) when a stored value opens with no key. Answers
    ``{"endpoints", "resealed", "sealed_from_plaintext", "current",
    "changed_meanwhile"}`` and logs one audit line (no secret, no key)."""
    counts = {"endpoints": 0, "resealed": 0, "sealed_from_plaintext": 0, "current": 0,
              "changed_meanwhile": 0}
    after = ""
    while True:
        with conn.transaction():
            rows = conn.execute(Q["secrets_page"], {"after": after, "limit": page}).fetchall()
            for endpoint_id, secret, previous in rows:
                counts["endpoints"] += 1
                new_secret, new_previous = _reseal(box, secret), _reseal(box, previous)
                if (new_secret, new_previous) == (secret, previous):
                    counts["current"] += 1
                    continue
                written = conn.execute(Q["secrets_reseal"], {
                    "id": endpoint_id, "secret": new_secret, "previous": new_previous,
                    "old_secret": secret, "old_previous": previous}).rowcount
                if not written:
                    counts["changed_meanwhile"] += 1
                elif not is_sealed(secret) or (previous is not None and not is_sealed(previous)):
                    counts["sealed_from_plaintext"] += 1
                else:
                    counts["resealed"] += 1
        if len(rows) < page:
            break
        after = rows[-1][0]
    log.warning("operator re-sealed the webhook secrets under the newest key",
                extra={"audit": True, "actor": actor, "keys": len(box.keys), **counts})
    return counts


def plaintext_count(conn: psycopg.Connection) -> int:
    """Endpoints with a secret still stored in plaintext."""
    return conn.execute(Q["secrets_plaintext_count"], {}).fetchone()[0]


def check_keys(conn: psycopg.Connection, box: SecretBox) -> None:
    """Raise ``WrongKey`` (one line, exit 78) when the newest stored sealed
    secret opens with none of ``box``'s keys: a process started with the
    wrong keys refuses to boot instead of failing every delivery."""
    row = conn.execute(Q["secrets_sample"], {}).fetchone()
    if row is not None:
        box.open(row[0])
