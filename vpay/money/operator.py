"""What an operator does to the queue and the alerts, and retention: the
database side of ``vpay-server jobs``, ``alerts`` and ``prune`` (and of the
hourly sweep's pruning). SQL: ``sql/queries/operator.sql``.

Rules kept here (docs/runbooks/worker-queue.md; design page, "What can go
wrong"):

* ``retry`` re-queues only dead letters (``run_at = 'infinity'``), due now,
  failure streak reset; ``release`` frees only a stranded lease: past its own
  ``lease_expires_at``, or whose holder is gone by its row in ``workers``
  (dead by its heartbeat, stopped, restarted: ``vpay.engine.workers``); a
  live worker renews its leases and beats its row. Either is
  all or nothing: an id that does not qualify refuses the whole call
  (``Refused``) and changes nothing.
* ``ack`` stores the operator's note with the acknowledgement.
* ``prune`` deletes only what is finished and older than the retention, and
  nothing a live (pending or unresolved) charge or refund needs.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import psycopg
from psycopg.rows import dict_row

from vpay.base.queries import Q
from vpay.money.audit import audited

log = logging.getLogger("vpay.operator")

LIST_LIMIT = 1000
"""Rows a list answers at most (newest state first is not promised: oldest first)."""
MAX_NOTE = 2000


class Refused(ValueError):
    """The data refuses the request (exit 1): ``problems`` is one line per
    id that does not qualify; nothing was changed."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def list_jobs(conn: psycopg.Connection, *, dead: bool = False, stranded: bool = False,
              kind: str | None = None, lane: str | None = None, ids: Sequence[int] | None = None,
              limit: int = LIST_LIMIT) -> list[dict[str, Any]]:
    """Jobs, oldest ``run_at`` first: ``[{id, kind, lane, dedupe_key, state,
    run_at, attempts, failures, locked_by, locked_at, lease_expires_at,
    holder_state, heartbeat_age, dead_since, last_error, payload,
    created_at}]``. ``state`` is ``dead``, ``stranded`` (lease past its own
    expiry, or its holder gone: ``vpay.engine.workers``), ``leased``, ``due``
    or ``scheduled``; ``run_at`` is None for a dead letter. For a leased job,
    ``holder_state`` is ``live``, ``dead``, ``stopped`` or ``restarted`` and
    ``heartbeat_age`` the seconds since its holder's last heartbeat (both
    None when the holder has no row in ``workers``)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["op_jobs_list"], {
            "dead": dead, "stranded": stranded, "kind": kind, "lane": lane,
            "ids": list(ids) if ids is not None else None, "limit": limit}).fetchall()


def _check(found: list[dict[str, Any]], ids: Sequence[int], wanted: str, why: str) -> None:
    by_id = {r["id"]: r for r in found}
    problems = []
    for job_id in ids:
        row = by_id.get(job_id)
        if row is None:
            problems.append(f"no job {job_id}")
        elif row["state"] != wanted:
            problems.append(f"job {job_id} ({row['dedupe_key']}) is {row['state']}, {why}")
    if problems:
        raise Refused(problems)


def retry(conn: psycopg.Connection, ids: Sequence[int], note: str,
          actor: str, via: str = "cli") -> list[dict[str, Any]]:
    """Re-queue dead letters ``ids`` (due now, ``failures = 0``; a ``deliver``
    job also restarts its webhook schedule, ``attempts = 0``) and acknowledge
    their open ``job_dead_lettered`` alerts with ``note``. Raises ``Refused``
    (nothing changed) when an id is unknown or not dead-lettered. Logs one
    audit line per job. Answers ``[{id, kind, dedupe_key, attempts,
    last_error, alerts_acknowledged}]``. Audited (``operator_actions``,
    action ``jobs.retry``, one row per call) as ``actor`` ``via`` cli or console."""
    ids = sorted(set(ids))
    with audited(conn, actor=actor, action="jobs.retry", target=_target("job", ids), note=note,
                 via=via) as done:
        rows = _retry(conn, ids, note)
        done.result = f"ok: {len(rows)} retried"
    for row in rows:
        log.warning("operator retried a dead letter", extra={
            "audit": True, "actor": actor, "job_id": row["id"], "kind": row["kind"],
            "dedupe_key": row["dedupe_key"], "last_error": row["last_error"], "note": note})
    return rows


def _target(noun: str, ids: Sequence[Any]) -> str:
    """An audit row's target: ``job:12`` for one, ``job:12,13,…`` (cut) for many."""
    text = f"{noun}:" + ",".join(str(i) for i in ids)
    return text if len(text) <= 200 else text[:199] + "…"


def _retry(conn: psycopg.Connection, ids: list[int], note: str) -> list[dict[str, Any]]:
    with conn.transaction():
        _check(_locked(conn, ids), ids, "dead", "not a dead letter")
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(Q["op_jobs_retry"], {"ids": ids, "note": note}).fetchall()
        if len(rows) != len(ids):  # changed between the check and the update: refuse all
            raise Refused([f"job {i} changed meanwhile" for i in set(ids) - {r["id"] for r in rows}])
    return rows


def release(conn: psycopg.Connection, ids: Sequence[int], actor: str,
            via: str = "cli") -> list[dict[str, Any]]:
    """Free stranded leases ``ids`` (past their own ``lease_expires_at``, or
    whose holder is gone), as the reaper would, due now. Raises ``Refused``
    (nothing changed) when an id is unknown or its lease is live or absent. Logs one audit line per job.
    Answers ``[{id, kind, dedupe_key, failures, last_error}]``. Audited
    (action ``jobs.release``)."""
    ids = sorted(set(ids))
    with audited(conn, actor=actor, action="jobs.release", target=_target("job", ids), via=via) as done:
        rows = _release(conn, ids)
        done.result = f"ok: {len(rows)} released"
    for row in rows:
        log.warning("operator released a stranded lease", extra={
            "audit": True, "actor": actor, "job_id": row["id"], "kind": row["kind"],
            "dedupe_key": row["dedupe_key"], "last_error": row["last_error"]})
    return rows


def _release(conn: psycopg.Connection, ids: list[int]) -> list[dict[str, Any]]:
    with conn.transaction():
        _check(_locked(conn, ids), ids, "stranded",
               "not a stranded lease (only a lease past its lease_expires_at, or whose holder is "
               "dead, stopped or restarted, may be released)")
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(Q["op_jobs_release"], {"ids": ids}).fetchall()
        if len(rows) != len(ids):
            raise Refused([f"job {i} changed meanwhile" for i in set(ids) - {r["id"] for r in rows}])
    return rows


def _locked(conn: psycopg.Connection, ids: Sequence[int]) -> list[dict[str, Any]]:
    # The rows are locked for the transaction: the check and the update agree.
    conn.execute("SELECT id FROM jobs WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (list(ids),))
    return list_jobs(conn, ids=ids, limit=len(ids) or 1)


def list_alerts(conn: psycopg.Connection, *, open_only: bool = False, kind: str | None = None,
                charge: str | None = None, ids: Sequence[int] | None = None,
                limit: int = LIST_LIMIT) -> list[dict[str, Any]]:
    """Alerts, oldest first: ``[{id, kind, charge_id, refund_id, details,
    created_at, acknowledged_at, note}]``."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["op_alerts_list"], {
            "open": open_only, "kind": kind, "charge": charge,
            "ids": list(ids) if ids is not None else None, "limit": limit}).fetchall()


def check_note(note: str) -> str:
    """``note`` stripped; ``ValueError`` when empty or longer than ``MAX_NOTE``."""
    note = (note or "").strip()
    if not note or len(note) > MAX_NOTE or any(ord(c) < 32 and c not in "\t\n" for c in note):
        raise ValueError(f"a note is 1 to {MAX_NOTE} printable characters")
    return note


def ack(conn: psycopg.Connection, ids: Sequence[int], note: str, actor: str,
        via: str = "cli") -> list[dict[str, Any]]:
    """Acknowledge open alerts ``ids`` with ``note`` (stored on the alert).
    Raises ``Refused`` (nothing changed) when an id is unknown or already
    acknowledged. Answers the alerts as acknowledged. Audited (action
    ``alerts.ack``)."""
    ids = sorted(set(ids))
    with audited(conn, actor=actor, action="alerts.ack", target=_target("alert", ids), note=note,
                 via=via) as done:
        rows = _ack(conn, ids, note)
        done.result = f"ok: {len(rows)} acknowledged"
    for row in rows:
        log.info("operator acknowledged an alert", extra={
            "audit": True, "actor": actor, "alert_id": row["id"], "kind": row["kind"],
            "charge_id": row["charge_id"], "note": note})
    return rows


def _ack(conn: psycopg.Connection, ids: list[int], note: str) -> list[dict[str, Any]]:
    with conn.transaction():
        conn.execute("SELECT id FROM alerts WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (ids,))
        found = {r["id"]: r for r in list_alerts(conn, ids=ids, limit=len(ids) or 1)}
        problems = [f"no alert {i}" if i not in found else
                    f"alert {i} was acknowledged at {found[i]['acknowledged_at'].isoformat()}"
                    for i in ids if i not in found or found[i]["acknowledged_at"] is not None]
        if problems:
            raise Refused(problems)
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(Q["op_alerts_ack"], {"ids": ids, "note": note}).fetchall()
    return rows


def prune(conn: psycopg.Connection, days: float, *, apply: bool = True) -> dict[str, int]:
    """Delete what finished more than ``days`` days ago (see ``op_prune``):
    delivered events, finished webhook deliveries, acknowledged alerts and
    dead letters, never what a live charge or refund needs. ``apply=False``
    counts without deleting. Answers ``{webhook_deliveries, events, alerts,
    dead_letters}``. Raises ``ValueError`` unless ``days`` > 0."""
    if not days > 0:
        raise ValueError(f"days must be > 0, got {days!r}")
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        return dict(cur.execute(Q["op_prune"], {"days": float(days), "apply": apply}).fetchone())


def payment_view(conn: psycopg.Connection, some_id: str) -> dict[str, Any] | None:
    """``money.show`` for an operator: ``{payment_intent, charge, charges,
    events}`` where every charge also has ``poll`` (its ``poll:<charge_id>``
    job: ``{dedupe_key, lane, state, next_read_at, attempts, failures,
    last_error}``, None once the poll has ended) and ``open_alerts``.
    ``charge`` is the latest charge (the key ``payments create`` prints),
    ``charges`` all of them, oldest first. None when ``some_id`` is unknown."""
    from vpay.money.charges import show
    found = show(conn, some_id)
    if found is None:
        return None
    charges = found["charges"]
    ids = [c["id"] for c in charges]
    with conn.cursor(row_factory=dict_row) as cur:
        polls = {r.pop("charge_id"): r for r in cur.execute(
            Q["op_charge_polls"], {"keys": [f"poll:{i}" for i in ids]}).fetchall()}
        alerts = cur.execute(Q["op_open_alerts_of_charges"], {"ids": ids}).fetchall()
    for charge in charges:
        # a settled charge's poll has ended, whatever row is left (no next read, no "rail: pending")
        poll = polls.get(charge["id"]) if charge.get("status") in ("pending", "unresolved") else None
        if poll is not None and poll["next_read_at"] is not None:
            poll["next_read_at"] = poll["next_read_at"].isoformat()
        charge["poll"] = poll
        charge["open_alerts"] = [{**a, "created_at": a["created_at"].isoformat()}
                                 for a in alerts if a["charge_id"] == charge["id"]]
    return {"payment_intent": found["payment_intent"], "charge": charges[-1] if charges else None,
            "charges": charges, "events": found["events"]}
