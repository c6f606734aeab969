"""Operators, their passwords and their sessions (contract: "Console").

* Passwords: argon2id (argon2-cffi's ``PasswordHasher``, its defaults: the
  RFC 9106 low-memory profile); a hash made with older parameters is
  re-hashed at the next sign-in.
* Sessions: a 256-bit random id in the cookie; only its SHA-256 is stored
  (``operator_sessions.id_sha256``), so the table cannot be used to sign in.
  A session ends when idle for ``VPAY_CONSOLE_SESSION_IDLE_SECONDS`` (default
  900), at ``VPAY_CONSOLE_SESSION_MAX_SECONDS`` (default 43200) whatever
  happens, at sign-out, or when its operator is disabled. A new id is made at
  every sign-in (no fixation: an id set before sign-in is never promoted).
* Throttle: at most ``THROTTLE_FAILURES`` failed sign-ins per account and
  ``THROTTLE_ADDRESS_FAILURES`` per address in ``THROTTLE_WINDOW_SECONDS``;
  past either, sign-in is refused without checking the password.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from typing import Any, Mapping

import psycopg
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from psycopg.rows import dict_row

from vpay.base.queries import Q
from vpay.base.settings import env_seconds

ROLES = ("viewer", "operator", "admin")
"""viewer reads; operator also acts on jobs, alerts, charges, statements;
admin also manages operators and webhook endpoints."""

THROTTLE_WINDOW_SECONDS = 900.0
THROTTLE_FAILURES = 5
THROTTLE_ADDRESS_FAILURES = 20

_hasher = PasswordHasher()
# Verifying an unknown account still costs a hash, so timing does not tell
# which emails exist.
_DUMMY_HASH = _hasher.hash("not a password: timing only")


class Refused(ValueError):
    """An operator request the data refuses (duplicate email, unknown
    operator, bad role or password); nothing was written."""


@dataclass(frozen=True)
class SessionLimits:
    """Idle timeout and absolute lifetime of a session, in seconds."""

    idle: float = 900.0
    maximum: float = 43200.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "SessionLimits":
        """From ``VPAY_CONSOLE_SESSION_IDLE_SECONDS`` / ``_MAX_SECONDS``;
        raises ``ConfigError`` (78) for a bad value."""
        env = os.environ if env is None else env
        return cls(idle=env_seconds("VPAY_CONSOLE_SESSION_IDLE_SECONDS", 900.0, maximum=86400.0,
                                    minimum=0.0, env=env),
                   maximum=env_seconds("VPAY_CONSOLE_SESSION_MAX_SECONDS", 43200.0,
                                       maximum=30 * 86400.0, minimum=0.0, env=env))


def check_role(role: str) -> str:
    if role not in ROLES:
        raise Refused(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def check_password(password: str) -> str:
    if not isinstance(password, str) or not 12 <= len(password) <= 1024:
        raise Refused("a password is 12 to 1024 characters")
    return password


def new_password() -> str:
    """A one-time password: 20 URL-safe characters (~120 bits)."""
    return secrets.token_urlsafe(15)


def create_operator(conn: psycopg.Connection, email: str, role: str, password: str) -> dict[str, Any]:
    """Insert an operator; answers ``{id, email, role, created_at,
    disabled_at}``. Raises ``Refused`` for a bad role or password, a
    malformed or taken email."""
    check_role(role)
    check_password(password)
    email = (email or "").strip()
    if "@" not in email or len(email) > 254 or any(c.isspace() for c in email):
        raise Refused(f"{email!r} is not an email address")
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(Q["operator_insert"], {"email": email, "role": role,
                                                       "hash": _hasher.hash(password)}).fetchone()
    except psycopg.errors.UniqueViolation:
        raise Refused(f"an operator {email!r} exists already") from None


def list_operators(conn: psycopg.Connection, limit: int = 1000) -> list[dict[str, Any]]:
    """Operators by id: ``[{id, email, role, created_at, disabled_at}]``."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["operator_list"], {"limit": limit}).fetchall()


def disable_operator(conn: psycopg.Connection, email: str) -> dict[str, Any]:
    """Disable an operator and end their sessions. Raises ``Refused`` when unknown."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["operator_disable"], {"email": email}).fetchone()
    if row is None:
        raise Refused(f"no operator {email!r}")
    return row


def _sha(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def throttled(conn: psycopg.Connection, email: str, address: str) -> bool:
    """Whether sign-in is refused for now for this account or address."""
    row = conn.execute(Q["login_failures_recent"], {"email": email, "address": address,
                                                    "window": THROTTLE_WINDOW_SECONDS}).fetchone()
    return row[0] >= THROTTLE_FAILURES or row[1] >= THROTTLE_ADDRESS_FAILURES


def sign_in(conn: psycopg.Connection, email: str, password: str, address: str) -> tuple[str, dict] | None:
    """Check the password and open a session: answers ``(session_id,
    operator)`` (the id goes in the cookie, only its hash is stored), or
    None (wrong email or password, disabled, or throttled: one answer for
    all, recorded as a failure). A throttled attempt checks nothing."""
    email = (email or "").strip()[:254]
    if throttled(conn, email, address):
        conn.execute(Q["login_failure_insert"], {"email": email, "address": address})
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        op = cur.execute(Q["operator_by_email"], {"email": email}).fetchone()
    try:
        _hasher.verify(op["password_hash"] if op else _DUMMY_HASH, password or "")
        ok = op is not None and op["disabled_at"] is None
    except (VerificationError, InvalidHashError):
        ok = False
    if not ok:
        conn.execute(Q["login_failure_insert"], {"email": email, "address": address})
        return None
    if _hasher.check_needs_rehash(op["password_hash"]):
        conn.execute(Q["operator_set_hash"], {"id": op["id"], "hash": _hasher.hash(password)})
    conn.execute(Q["login_failures_clear"], {"email": email})
    session_id = secrets.token_urlsafe(32)
    conn.execute(Q["session_insert"], {"sha": _sha(session_id), "operator_id": op["id"],
                                       "csrf": secrets.token_urlsafe(32), "address": address})
    return session_id, {"id": op["id"], "email": op["email"], "role": op["role"]}


def load_session(conn: psycopg.Connection, session_id: str | None,
                 limits: SessionLimits) -> dict[str, Any] | None:
    """The live session for the cookie's ``session_id`` (its idle clock
    restarted): ``{operator_id, email, role, csrf_token, created_at}``, or
    None when absent, expired, or its operator disabled."""
    if not session_id or len(session_id) > 128:
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["session_load"], {"sha": _sha(session_id), "idle": limits.idle,
                                               "max": limits.maximum}).fetchone()


def sign_out(conn: psycopg.Connection, session_id: str) -> None:
    """End the session (its row deleted)."""
    conn.execute(Q["session_delete"], {"sha": _sha(session_id)})


def prune_sessions(conn: psycopg.Connection, limits: SessionLimits) -> int:
    """Delete expired sessions; answers how many."""
    return conn.execute(Q["session_prune"], {"idle": limits.idle, "max": limits.maximum}).rowcount
