"""The durable job queue: every database operation on ``jobs`` in one place.

Design page, "The job queue" and "Leases and crash recovery". Rules kept here:

* ``claim`` takes one due, unleased row with ``FOR UPDATE SKIP LOCKED`` and
  leases it: ``attempts + 1``, ``locked_by``, ``locked_at`` and a fresh
  ``lease_token`` (the fencing token).
* ``finish`` / ``reschedule`` / ``retry_failed`` / ``park`` / ``unclaim``
  end a lease and match ``(id, locked_by, lease_token)``. One that matches nothing changes
  nothing and answers ``False``: the caller counts it as **lost** (its lease
  was reaped and maybe re-claimed while it ran).
* ``reap_expired_leases`` is one conditional UPDATE that re-checks each
  lease's own expiry, and its holder's row in ``workers``
  (``vpay.engine.workers``), inside the statement.

All functions take a psycopg connection in autocommit mode (or inside a
caller's transaction, for ``enqueue``). Times are seconds; every "now" is
Postgres's ``now()``.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb
from psycopg.types.numeric import Int8

from vpay.engine import lanes as _lanes
from vpay.base.queries import Q

MAX_FAILURES = 5
"""Consecutive claims without an Outcome (a raised exception, or a lease that
expired because the process died) after which a job is dead-lettered."""


@dataclass(frozen=True)
class Job:
    """A claimed job. ``attempts`` counts claims including this one;
    ``failures`` the consecutive claims before this one that ended without
    an outcome; ``lease_token`` fences every write that ends this lease;
    ``lane`` is the job's lane (``vpay.engine.lanes``)."""

    id: int
    kind: str
    dedupe_key: str
    payload: dict[str, Any]
    attempts: int
    failures: int
    lease_token: uuid.UUID
    worker: str
    run_at: datetime
    created_at: datetime
    lane: str = _lanes.DEFAULT_LANE
    """The lane the job was claimed from (``jobs.lane``); the default only
    serves a ``Job`` built by hand (tests)."""
    late_by: float = 0.0
    """Seconds from ``run_at`` to the claim, on the database's clock
    (negative never: only due jobs are claimed). Zero for a hand-built job."""
    fair_key: str | None = None
    """Whom the job works for (``jobs.fair_key``: the merchant), ``None``
    for housekeeping; with the kind, the party the time share counts by
    (``vpay.engine.timeshare.party_of``)."""


@dataclass(frozen=True)
class Scope:
    """What one claim of a loop may take: its own ``lanes`` first, then the
    ``lent`` lanes it may borrow from, skipping the ``"lane/kind/merchant"``
    keys in ``skip`` (``vpay.engine.timeshare.TimeShare.plan``)."""

    lanes: tuple[str, ...]
    lent: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()


def enqueue(conn: psycopg.Connection, kind: str, dedupe_key: str,
            payload: dict[str, Any] | None = None, delay: float = 0.0, *,
            rail: str | None = None, lane: str | None = None) -> bool:
    """Insert a job due in ``delay`` seconds unless one with ``dedupe_key``
    exists (``ON CONFLICT DO NOTHING``). Answers whether it inserted.

    The job's lane is ``lanes.lane_for(kind, rail)``. For a routed kind
    (registered with a resolver by the layer that owns it, e.g. ``poll``,
    ``resubmit``, ``refund_poll``: ``vpay.money.lanes``) without ``rail``,
    the resolver reads the route from the payload on ``conn``, so inside the
    caller's transaction a row created there is seen. ``lane`` places the
    job explicitly (tests; it must be one of ``lanes.LANES``). Raises
    ``lanes.LaneError`` when the lane cannot be known (a routed kind whose
    subject does not exist): nothing is inserted."""
    payload = payload or {}
    if lane is None:
        if kind in _lanes.RAIL_KINDS and rail is None:
            rail = _lanes.resolve_route(kind, conn, payload)
        lane = _lanes.lane_for(kind, rail)
    elif lane not in _lanes.LANES:
        raise _lanes.LaneError(f"unknown lane {lane!r}; lanes are {','.join(_lanes.LANES)}")
    row = conn.execute(Q["enqueue"], {"kind": kind, "lane": lane, "dedupe_key": dedupe_key,
                                      "payload": Jsonb(payload), "delay": float(delay)}).fetchone()
    return row is not None


def claim(conn: psycopg.Connection, worker: str, lease: float = 300.0,
          lanes: Iterable[str] | None = None) -> Job | None:
    """Lease the oldest due job of ``lanes`` (default: every lane) for
    ``worker`` for ``lease`` seconds (the row's ``lease_expires_at``), or
    ``None`` when nothing is due there. A job within its merchant's share
    comes before any over-share one (``vpay.engine.fairness``). One lane uses
    ``claim_lane`` (ordered scans of ``jobs_claimable_lane`` and
    ``jobs_over_share``); several use ``claim_lanes``; both with no job to
    finish (``id`` 0: ``_NOTHING_TO_FINISH``)."""
    return claim_or_next_due(conn, worker, lease, lanes)[0]


LENT_LANES_MAX = 8
"""The most lanes one claim may borrow from: the claim statements read the
lent lanes as this many fixed slots (sql/queries/queue.sql, ``claim_lane``,
for why). Above the lanes there are (six); a claim given more raises."""


def _lane_params(lanes: Iterable[str] | None, lent: Iterable[str] = (),
                 skip: Iterable[str] = ()) -> tuple[str, dict[str, Any]]:
    """``("claim_lane", {"lane": x, ...})`` for one lane, ``("claim_lanes",
    {"lanes": [...], ...})`` for several: which claim statement serves them,
    with the lanes it may borrow from (``lent``, at most ``LENT_LANES_MAX``:
    ``ValueError`` above) and the ``"lane/kind/merchant"`` keys it skips
    (``skip``)."""
    lanes = tuple(_lanes.LANES if lanes is None else lanes)
    lent = list(lent)
    if len(lent) > LENT_LANES_MAX:
        raise ValueError(f"a claim may borrow from at most {LENT_LANES_MAX} lanes, got {len(lent)}")
    more = {"lent": lent or _NO_TEXT, "skip": list(skip) or _NO_TEXT}
    if len(lanes) == 1:
        return "claim_lane", {"lane": lanes[0], **more}
    return "claim_lanes", {"lanes": list(lanes), **more}


# The claim statements' parameters keep one set of types whatever their
# values: psycopg prepares a statement once per set of parameter types (an
# int is sent as int2, int4 or int8 by its size, None and an empty list
# untyped), and each prepared variant is planned again on every pooled
# connection: about 1 ms per plan of a claim statement, a tenth of a cold
# worker's Postgres CPU in bench/charges.py (docs/performance.md, "A fifth
# run"). So ids go as int8, "no job to finish" is id 0 and the nil UUID (no
# job has id 0, no lease that token), and an empty lane or party list is
# one empty string (no lane and no "lane/kind/merchant" key is ''; a lent
# slot of '' reads nothing, like a NULL one).
_NO_TEXT = [""]

_NOTHING_TO_FINISH = {"id": Int8(0), "token": uuid.UUID(int=0)}
"""The fenced finish of a claim statement with no job: its DELETE matches
nothing (no job has id 0) and ``finished`` is false."""


CLAIM_COLUMNS = ("finished", "id", "kind", "lane", "dedupe_key", "payload", "attempts",
                 "failures", "lease_token", "run_at", "created_at", "late_by", "fair_key", "next_due_in")
"""The one row of ``claim_lane`` / ``claim_lanes``, in order (read by position:
tests/integration/test_queue.py holds both statements to it)."""


def _claim_cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    """The connection's own cursor for the claim statements, made on first
    use and kept on the connection. A busy loop runs one claim per job, and a
    new cursor per statement (with a dict per row) cost about a third of the
    loop's CPU per job (issue #15). A pooled connection serves one thread at a
    time, so its cursor does too. A cursor closed by hand is replaced; a
    broken connection is thrown away by its pool, its cursor with it."""
    cur = getattr(conn, "_vpay_claim_cursor", None)
    if cur is None or cur.closed:
        cur = conn.cursor(row_factory=tuple_row)  # whatever the connection's default
        conn._vpay_claim_cursor = cur
    return cur


def _claim(conn: psycopg.Connection, name: str, params: dict[str, Any],
           worker: str) -> tuple[bool, Job | None, float | None]:
    """Run claim statement ``name``: ``(finished, job or None, next_due_in
    or None)`` (``CLAIM_COLUMNS``)."""
    (finished, id_, kind, lane, dedupe_key, payload, attempts, failures, token, run_at,
     created_at, late_by, fair_key, next_due) = _claim_cursor(conn).execute(Q[name], params).fetchone()
    if id_ is None:
        return bool(finished), None, next_due
    return bool(finished), Job(id_, kind, dedupe_key, payload, attempts, failures, token, worker,
                               run_at, created_at, lane, late_by, fair_key), None


def new_lease_token() -> uuid.UUID:
    """A fresh lease token for a claim (random, version 4). From the random
    module, not ``os.urandom`` (``uuid.uuid4``): a token fences writes, it is
    no secret and never leaves the database, and ``os.urandom`` lets go of
    the GIL around its system call, an extra thread switch per job for a
    busy loop (issue #15). 122 random bits: no two claims share one."""
    return uuid.UUID(int=random.getrandbits(128), version=4)


def claim_or_next_due(conn: psycopg.Connection, worker: str, lease: float = 300.0,
                      lanes: Iterable[str] | None = None, *,
                      token: uuid.UUID | None = None, lent: Iterable[str] = (),
                      skip: Iterable[str] = ()) -> tuple[Job | None, float | None]:
    """``claim``, and when nothing is due, the seconds until the next job of
    ``lanes`` is (``None`` when none is scheduled; zero or less when a due
    job was skipped because another claim held its lock). One statement
    (the claim statement with nothing to finish): ``(job, None)`` or
    ``(None, next_due_in)``. ``token``: the new lease's token (default a
    fresh ``new_lease_token()``); a caller that may lose the answer (the connection dies
    after the commit) passes its own, to hand that claim back by it
    (``release``). ``lent``: other lanes to claim from when ``lanes`` have
    nothing due (their oldest due job; they do not count in
    ``next_due_in``). ``skip``: ``"lane/kind/merchant"`` keys whose jobs
    are neither claimed nor counted in ``next_due_in`` (parties at their
    share: ``vpay.engine.timeshare``)."""
    name, params = _lane_params(lanes, lent, skip)
    params.update(_NOTHING_TO_FINISH, worker=worker, lease=float(lease),
                  new_token=token or new_lease_token())
    return _claim(conn, name, params, worker)[1:]


def finish_and_claim(conn: psycopg.Connection, job: Job, lease: float = 300.0,
                     lanes: Iterable[str] | None = None, *,
                     token: uuid.UUID | None = None, lent: Iterable[str] = (),
                     skip: Iterable[str] = ()) -> tuple[bool, Job | None, float | None]:
    """``finish(job)`` and ``claim_or_next_due`` for the same worker in one
    statement (the claim statement with ``job``'s fenced finish: one round
    trip per job in a busy loop). Answers ``(finished, next job or None,
    next_due_in or None)``; ``finished`` is ``False`` when the lease was no
    longer ours (lost), and the claim happens all the same. ``token``,
    ``lent``, ``skip``: as for ``claim_or_next_due``."""
    name, params = _lane_params(lanes, lent, skip)
    params.update(id=Int8(job.id), worker=job.worker, token=job.lease_token, lease=float(lease),
                  new_token=token or new_lease_token())
    return _claim(conn, name, params, job.worker)


def write_was_made(conn: psycopg.Connection, job: Job, finished: bool) -> bool:
    """After a lease-ending write on ``job`` whose answer was lost and whose
    retry then matched nothing: whether the row shows the lost attempt made
    it. ``finished``: the write was a finish (the row is then gone);
    otherwise (reschedule, park, retry_failed) the row's ``ended_token`` is
    this lease's token, whoever holds the row now (a claim leaves
    ``ended_token`` alone; a reaper, a hand-back or an operator's release
    never writes it, and tokens are never reused).

    Inexact in two rare paths, neither touching money (handlers are
    compare-and-swaps): a finish answers made when the row is gone because
    our lease was reaped and another worker finished the job (the job is
    done either way); a reschedule, retry_failed or park answers not made
    when it landed but the job came due and another worker ended it again
    (finished it, or ended its own lease) before this read: a false ``lost``,
    never a hidden one."""
    row = conn.execute(Q["job_lease"], {"id": job.id}).fetchone()
    if finished:
        return row is None
    return row is not None and row[0] == job.lease_token


def _fenced(job: Job) -> dict[str, Any]:
    return {"id": job.id, "worker": job.worker, "token": job.lease_token}


def unclaim(conn: psycopg.Connection, job: Job) -> bool:
    """Hand back ``job``, just claimed and not run (its party was at its
    share: ``vpay.engine.timeshare``): unleased, due as it was, its claim's
    attempt given back. Fenced on the lease; ``False`` when it was no longer
    ours (reaped meanwhile: nothing changes)."""
    return conn.execute(Q["unclaim"], _fenced(job)).fetchone() is not None


def finish(conn: psycopg.Connection, job: Job) -> bool:
    """Delete the job; ``False`` (lost) when the lease is no longer ours."""
    return conn.execute(Q["finish"], _fenced(job)).fetchone() is not None


def reschedule(conn: psycopg.Connection, job: Job, delay: float, note: str | None = None,
               spent: bool = True) -> bool:
    """Release the lease with ``run_at = now() + delay``; ends a failure
    streak. ``spent=False``: the job was deferred without doing its work, and
    ``attempts`` goes back to what it was before this claim."""
    params = _fenced(job) | {"delay": float(delay), "note": note, "spent": bool(spent)}
    return conn.execute(Q["reschedule"], params).fetchone() is not None


def retry_failed(conn: psycopg.Connection, job: Job, delay: float, error: str) -> bool:
    """Release the lease after a handler raised: ``failures + 1``, the error
    text in ``last_error``, due again in ``delay`` seconds."""
    params = _fenced(job) | {"delay": float(delay), "error": error[:2000]}
    return conn.execute(Q["retry_failed"], params).fetchone() is not None


def park(conn: psycopg.Connection, job: Job, reason: str) -> bool:
    """Dead-letter the job (``run_at = 'infinity'``, ``reason`` in
    ``last_error``) and write a ``job_dead_lettered`` alert, in one statement."""
    return conn.execute(Q["park"], _fenced(job) | {"reason": reason[:2000]}).fetchone() is not None


def renew(conn: psycopg.Connection, worker: str, tokens: Iterable[uuid.UUID], lease: float) -> int:
    """Extend ``worker``'s leases under ``tokens`` to ``now() + lease``
    seconds (the heartbeat of a live worker). Answers how many were renewed;
    a lease already reaped or released is not revived."""
    tokens = list(tokens)
    if not tokens:
        return 0
    return len(conn.execute(Q["renew"], {"worker": worker, "tokens": tokens,
                                         "lease": float(lease)}).fetchall())


def release(conn: psycopg.Connection, worker: str, tokens: Iterable[uuid.UUID]) -> int:
    """Hand back the leases ``worker`` still holds under ``tokens`` (the
    timed-out drain). The jobs keep their ``run_at`` and are claimable at
    once. Answers how many were released."""
    tokens = list(tokens)
    if not tokens:
        return 0
    return len(conn.execute(Q["release"], {"worker": worker, "tokens": tokens}).fetchall())


def reap_expired_leases(conn: psycopg.Connection, max_failures: int = MAX_FAILURES, *,
                        by_heartbeat: bool = False,
                        reaper: str | None = None) -> list[dict[str, Any]]:
    """Free every lease past its own ``lease_expires_at`` (set at claim from
    the claiming worker's lease, so a reaper never judges another worker's
    lease by its own), and every lease whose holder is gone by its row in
    ``workers`` (``vpay.engine.workers``): stopped, or restarted under the
    same id; and, with ``by_heartbeat``, dead by its heartbeat (older than the
    holder's own ``VPAY_WORKER_DEAD_AFTER_SECONDS``), never ``reaper``'s own
    leases that way (the worker calling is alive). A holder with no row is
    judged by the expiry alone. A job whose leases keep ending so is
    dead-lettered after ``max_failures`` with an alert. Answers ``[{id, kind,
    lane, dedupe_key, parked, why}]`` of the rows reaped; ``why`` is
    ``expired``, ``dead``, ``stopped`` or ``restarted``."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["reap_expired_leases"], {
            "max_failures": max_failures, "by_heartbeat": bool(by_heartbeat),
            "reaper": reaper}).fetchall()


def depth(conn: psycopg.Connection) -> dict[str, int]:
    """``{due, leased, dead}``: the gauge's queue counts."""
    with conn.cursor(row_factory=dict_row) as cur:
        return dict(cur.execute(Q["depth"]).fetchone())


def depth_by_lane(conn: psycopg.Connection) -> dict[str, dict[str, int]]:
    """``{lane: {due, leased, dead}}`` for every lane in ``lanes.LANES``
    (zeros where a lane has no rows)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = {r.pop("lane"): r for r in cur.execute(Q["depth_by_lane"]).fetchall()}
    return {lane: rows.get(lane, {"due": 0, "leased": 0, "dead": 0}) for lane in _lanes.LANES}
