"""The operator's audit trail (table ``operator_actions``): every action a
person takes, from the console or the CLI, with who, what, on what, the
note, how it ended and when (issue 23, "Every action audited").

The action functions call ``audited`` around their work, so the CLI and the
console, which call the same functions, write the same rows. A refusal is
recorded too (``result`` starts ``refused:``): an auditor asks what was
tried, not only what worked. The row is written after the action's own
transaction: a refusal rolled that back, and a success is already committed.
"""

from __future__ import annotations

import contextlib
import getpass
import socket
from typing import Any, Iterator

import psycopg
from psycopg.rows import dict_row

from vpay.base.queries import Q

PAGE = 50
"""Rows a page of the trail answers."""


def os_actor() -> str:
    """``user@host`` of the process: the CLI's actor."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def record(conn: psycopg.Connection, *, actor: str, action: str, target: str | None,
           note: str | None, result: str, via: str = "cli") -> int:
    """Write one ``operator_actions`` row; answers its id. ``via`` is ``cli``
    or ``console``. Never inside the caller's transaction by intent: call it
    on an autocommit connection after the action."""
    row = conn.execute(Q["audit_insert"], {
        "actor": actor, "action": action, "target": (target or None) and target[:500],
        "note": note, "result": result[:500], "via": via}).fetchone()
    return row[0]


class Outcome:
    """What ``audited`` yields: set ``result`` (default ``ok``) to say more."""

    def __init__(self) -> None:
        self.result = "ok"


@contextlib.contextmanager
def audited(conn: psycopg.Connection, *, actor: str | None, action: str, target: str | None,
            note: str | None = None, via: str = "cli") -> Iterator[Outcome]:
    """Run the body, then record it: ``ok`` (or what the body put in
    ``outcome.result``), or ``refused: <message>`` when it raised a
    ``ValueError`` / ``LookupError`` (the refusals of the action functions),
    then re-raise. Anything else (a bug, the database gone) is not recorded:
    nothing happened that a person did. ``actor`` None means the OS user."""
    outcome = Outcome()
    try:
        yield outcome
    except (ValueError, LookupError) as exc:
        _safe_record(conn, actor, action, target, note, f"refused: {exc}", via)
        raise
    _safe_record(conn, actor, action, target, note, outcome.result, via)


def _safe_record(conn, actor, action, target, note, result, via) -> None:
    record(conn, actor=actor or os_actor(), action=action, target=target, note=note, result=result,
           via=via)


def list_actions(conn: psycopg.Connection, *, actor: str | None = None, target: str | None = None,
                 action: str | None = None, before: int | None = None,
                 limit: int = PAGE) -> list[dict[str, Any]]:
    """The trail, newest first, ``limit`` rows with ``id < before`` (keyset
    pagination): ``[{id, actor, action, target, note, result, via,
    created_at}]``. ``target`` matches exactly or as a prefix up to ``:``."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["audit_list"], {"actor": actor, "target": target, "action": action,
                                              "before": before, "limit": limit}).fetchall()
