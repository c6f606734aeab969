"""An operator ends a charge with evidence (``charges resolve``).

Design page, "What can go wrong": "Do not force an old charge terminal. Age
is not evidence; reconcile against the rail's statement." So a charge may be
resolved by hand only when the machine has handed it to a person: it is
``unresolved`` (escalated at the 24-hour horizon), or ``pending`` with an open
alert (a contradiction or another finding someone must look at). The
operator's evidence (a statement line, a rail ticket, the payer's SMS
receipt) is required and stored (``settlement_evidence``), and the charge
moves exactly as a rail answer would move it: ``charges.settle_with_evidence``,
one transition, one event. The charge's age plays no part in the rule.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg.rows import dict_row

from vpay.money import charges
from vpay.base.logs import committed
from vpay.base.queries import Q

EVIDENCE_MAX_CHARS = 2000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class Refused(ValueError):
    """The charge may not be resolved; nothing was written. ``code`` is
    ``not_found``, ``not_live`` (already settled), ``no_open_alert`` (pending
    and nobody was asked to look) or ``bad_evidence``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def resolve_charge(conn: psycopg.Connection, charge_id: str, outcome: str, evidence: str) -> dict[str, Any]:
    """Settle ``charge_id`` as ``outcome`` (``succeeded`` / ``failed``) on the
    operator's ``evidence`` (1-2000 characters of text). The charge row is
    locked while the rule is checked, so the check and the transition are one
    transaction. Answers ``{"charge", "evidence"}``. Raises ``Refused``."""
    text = evidence.strip() if isinstance(evidence, str) else ""
    if not text or len(text) > EVIDENCE_MAX_CHARS or _CONTROL.search(text):
        raise Refused("bad_evidence", f"--evidence must be 1-{EVIDENCE_MAX_CHARS} characters of text "
                                      "(what proves the outcome: a statement line, a rail ticket, a receipt)")
    if outcome not in ("succeeded", "failed"):
        raise ValueError(f"outcome must be succeeded or failed, got {outcome!r}")
    with committed(conn), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["lock_charge_for_resolve"], {"id": charge_id}).fetchone()
        if row is None:
            raise Refused("not_found", f"no charge {charge_id!r}")
        if row["status"] in ("succeeded", "failed"):
            raise Refused("not_live", f"charge {charge_id} is already {row['status']}: a settled charge is "
                                      "never resolved by hand (a contradiction is an alert to reconcile)")
        if row["status"] == "pending" and not row["has_open_alert"]:
            raise Refused("no_open_alert", f"charge {charge_id} is pending and no alert asks for a person: "
                                           "the poll ladder is still deciding it (age is not evidence)")
        result = charges.settle_with_evidence(
            conn, charge_id, outcome, charges.Evidence("operator", text),
            failure_code="resolved_by_operator" if outcome == "failed" else None)
        if not result.transitioned:  # the row is locked and live: the CAS cannot miss
            raise RuntimeError(f"charge {charge_id} did not move: {result}")
        ev = cur.execute(Q["evidence_of_charge"], {"id": charge_id}).fetchone()
    charge = charges.load_charge(conn, charge_id)
    return {"charge": charges.charge_view(charge),
            "evidence": {"id": ev["id"], "outcome": ev["outcome"], "source": ev["source"],
                         "evidence": ev["evidence"], "created": ev["created_at"].isoformat()}}


def list_charges(conn: psycopg.Connection, status: str, older_than_seconds: float = 0.0,
                 limit: int = 1000) -> list[dict[str, Any]]:
    """Charges in ``status`` created at least ``older_than_seconds`` ago (by
    the database's clock), oldest first, with their age (seconds), open
    alerts, and their poll job's ``next_poll`` and ``last_error`` (what the
    rail last answered; ``None`` without a poll job)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(Q["list_charges_by_status"], {"status": status, "older_than": older_than_seconds,
                                                         "limit": limit}).fetchall()
    times = ("created_at", "unresolved_at", "last_polled_at", "next_poll")
    return [{**{k: v for k, v in r.items() if k not in times},
             **{k: r[k].isoformat() if r[k] else None for k in times}} for r in rows]
