"""Maker-checker for money (issue 23): resolving an unresolved charge from
the console is a *proposal* with evidence; a second operator (never the
proposer) approves it, and only then does the settle run, through
``vpay.money.resolve.resolve_charge`` (the path ``charges resolve`` takes:
one transition, one event, the evidence stored). A proposal can be withdrawn
by its proposer or rejected by anyone else, with a note. One open proposal
per charge (``resolution_proposals_one_open``).

Every call is audited (``vpay.money.audit``) by its caller's actor.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from vpay.base.queries import Q
from vpay.money import resolve
from vpay.money.operator import check_note


class Refused(ValueError):
    """The proposal or decision is refused; nothing was written."""


def propose(conn: psycopg.Connection, charge_id: str, outcome: str, evidence: str,
            actor: str) -> dict[str, Any]:
    """Open a proposal to settle ``charge_id`` as ``outcome`` on
    ``evidence``. The charge must be one ``resolve_charge`` would accept
    (checked now, and again at approval). Raises ``Refused``."""
    if outcome not in ("succeeded", "failed"):
        raise Refused(f"outcome must be succeeded or failed, got {outcome!r}")
    text = (evidence or "").strip()
    if not text or len(text) > resolve.EVIDENCE_MAX_CHARS or resolve._CONTROL.search(text):
        raise Refused(f"evidence is 1-{resolve.EVIDENCE_MAX_CHARS} characters of text")
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(Q["lock_charge_for_resolve"], {"id": charge_id}).fetchone()
            if row is None:
                raise Refused(f"no charge {charge_id!r}")
            if row["status"] in ("succeeded", "failed"):
                raise Refused(f"charge {charge_id} is already {row['status']}")
            if row["status"] == "pending" and not row["has_open_alert"]:
                raise Refused(f"charge {charge_id} is pending and no alert asks for a person")
            return cur.execute(Q["proposal_insert"], {"charge_id": charge_id, "outcome": outcome,
                                                      "evidence": text, "actor": actor}).fetchone()
    except psycopg.errors.UniqueViolation:
        raise Refused(f"charge {charge_id} has an open proposal already") from None


def _lock_open(conn: psycopg.Connection, proposal_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["proposal_lock"], {"id": proposal_id}).fetchone()
    if row is None:
        raise Refused(f"no proposal {proposal_id}")
    if row["state"] != "open":
        raise Refused(f"proposal {proposal_id} is {row['state']}")
    return row


def _decide(conn, proposal_id: int, state: str, actor: str, note: str | None) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["proposal_decide"], {"id": proposal_id, "state": state, "actor": actor,
                                                  "note": note}).fetchone()


def approve(conn: psycopg.Connection, proposal_id: int, actor: str,
            note: str | None = None) -> dict[str, Any]:
    """Approve and settle, in one transaction: the proposal is locked, the
    approver must not be the proposer, then ``resolve_charge`` settles the
    charge (refused if it no longer may be: the proposal stays open and
    nothing changed). Answers ``{"proposal", "charge", "evidence"}``."""
    with conn.transaction():
        row = _lock_open(conn, proposal_id)
        if row["proposed_by"] == actor:
            raise Refused("the proposer cannot approve their own proposal (maker-checker)")
        try:
            result = resolve.resolve_charge(
                conn, row["charge_id"], row["outcome"],
                f"{row['evidence']} (proposed by {row['proposed_by']}, approved by {actor})")
        except resolve.Refused as exc:
            raise Refused(str(exc)) from None
        decided = _decide(conn, proposal_id, "approved", actor, note)
    return {"proposal": decided, **result}


def reject(conn: psycopg.Connection, proposal_id: int, actor: str, note: str) -> dict[str, Any]:
    """Reject an open proposal (anyone but its proposer: they withdraw), with a note."""
    note = check_note(note)
    with conn.transaction():
        row = _lock_open(conn, proposal_id)
        if row["proposed_by"] == actor:
            raise Refused("the proposer withdraws their proposal; another operator rejects it")
        return _decide(conn, proposal_id, "rejected", actor, note)


def withdraw(conn: psycopg.Connection, proposal_id: int, actor: str, note: str) -> dict[str, Any]:
    """Withdraw an open proposal (its proposer only), with a note."""
    note = check_note(note)
    with conn.transaction():
        row = _lock_open(conn, proposal_id)
        if row["proposed_by"] != actor:
            raise Refused("only the proposer withdraws a proposal; another operator rejects it")
        return _decide(conn, proposal_id, "withdrawn", actor, note)


def of_charges(conn: psycopg.Connection, charge_ids: list[str]) -> list[dict[str, Any]]:
    """Every proposal of these charges, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["proposals_of_charges"], {"ids": charge_ids}).fetchall()
