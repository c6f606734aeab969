"""Webhook secrets at rest: seal the plaintext rows, re-seal every row under
the newest key (``vpay-server secrets rotate``), and check at boot that the
configured keys open what is stored (vpay.base.secretbox; docs/security.md).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from vpay.base.queries import Q
from vpay.base.secretbox import SecretBox, WrongKey, is_sealed

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


KEY_CHECK_SAMPLE = 20
"""How many of the newest sealed secrets the boot check tries to open."""


def check_keys(conn: psycopg.Connection, box: SecretBox) -> list[str]:
    """Try ``box`` on the ``KEY_CHECK_SAMPLE`` newest sealed secrets. Raise
    ``WrongKey`` (one line, exit 78) when none of them opens: a process
    started with the wrong keys refuses to boot instead of failing every
    delivery. When some open and some do not (one row sealed under a key
    since dropped), answer the ids of those that do not: the caller warns,
    and the money engine is not stopped by one endpoint's secret (only that
    endpoint's deliveries fail). Answers ``[]`` when every one opens or
    nothing is stored."""
    rows = conn.execute(Q["secrets_sample"], {"n": KEY_CHECK_SAMPLE}).fetchall()
    unopened: list[str] = []
    first_error: WrongKey | None = None
    for endpoint_id, sealed in rows:
        try:
            box.open(sealed)
        except WrongKey as exc:
            unopened.append(endpoint_id)
            first_error = first_error or exc
    if rows and len(unopened) == len(rows):
        raise first_error
    return unopened
