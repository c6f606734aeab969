"""A stateful property test of the money state machine and the poll handlers
(hypothesis ``RuleBasedStateMachine``), against the real Postgres of the
test fixtures and the real handlers, queue and callback logic in-process.

The rail is a scripted double of the port (``ScriptedRail``): every answer a
real adapter can give (pending, success, failure, 404, 5xx, timeout, another
amount, an unreadable amount, a refusal of our configuration), in any order,
duplicated or late, and requests it took without our hearing. Between them
hypothesis interleaves callbacks, crashes at every kill point (the handler
committed but the jobs write never happened; the lease reaped and re-claimed
while the first run still finishes), the sweep, and the clock moved past the
prompt TTL and the 24-hour horizon (by rewriting ``created_at``, as the
lifecycle tests do).

Invariants, after every step:

* at most one terminal transition per charge and per refund, and events
  equal transitions exactly (one ``processing`` at birth, one ``expired``
  when the prompt expired, one settlement event iff terminal);
* no status moves backwards, and a terminal status never changes;
* every non-terminal charge (refund) has live work: its ``poll:`` /
  ``refund_poll:`` job exists and is not dead-lettered;
* refunds that have not failed never add up to more than their charge;
* a charge (refund) succeeded only if the rail said so for its amount,
  readably (unreadable is never agreement); failed with a payer's code only
  if the rail declined readably; failed as ``rail_configuration_refused``
  only if the rail blamed our configuration when no payer was or will be
  asked (its FAILED said so, or it refused a request while holding none of
  ours: a re-send refused after an unheard send must not end the payment).
"""

from __future__ import annotations

import collections
import uuid

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, initialize, invariant, multiple, rule,
                                 run_state_machine_as_test)
from psycopg import sql
from psycopg.rows import dict_row

from conftest import TABLES
from vpay.money import charges, payments, refunds
from vpay.engine import queue
from vpay.api.callbacks import apply_hint
from vpay.handlers import registry
from vpay.money.merchants import create_merchant
from vpay.engine.outcome import DeadLetter, Done, RetryAfter
from vpay.engine.queue import Job
from vpay.rails.port import RailStatus, StatusKind, Submit, SubmitKind
from vpay.base.settings import Settings

pytestmark = pytest.mark.slow

MERCHANT, PAYER = "m_sm", "256770000077"
TTL, HORIZON = 900, 24 * 3600

SUBMITS = ("accepted", "taken_unheard", "no_answer", "rejected", "misconfigured", "crash_before_send",
           "crash_after_rail_took_it")
ANSWERS = ("pending", "success", "success_other_amount", "success_unreadable", "failure",
           "failure_unreadable", "failure_configuration", "not_found", "http_503", "timeout", "misconfigured")
CRASHES = ("none",) * 5 + ("before_handler", "after_commit", "reaped_and_reclaimed")
MAYBE_ANSWER = st.one_of(st.none(), st.sampled_from(ANSWERS))
LIVE, TERMINAL = ("pending", "unresolved"), ("succeeded", "failed")
FORWARD = {"pending": {"pending", "unresolved", "succeeded", "failed"},
           "unresolved": {"unresolved", "succeeded", "failed"},
           "succeeded": {"succeeded"}, "failed": {"failed"}}


class ScriptedRail:
    """The rail port with scripted answers per reference. Without a script:
    a request is taken (202); a status read is PENDING for a reference the
    rail took and 404 for one it did not. Records what it ever said that may
    settle something (``said``)."""

    code = "mtn"

    def __init__(self) -> None:
        self.submits: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.answers: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.taken: set[str] = set()
        self.said: dict[str, set[str]] = collections.defaultdict(set)

    def _submit(self, reference: str) -> Submit:
        script = self.submits[reference].popleft() if self.submits[reference] else "accepted"
        if script in ("accepted", "taken_unheard"):
            self.taken.add(reference)
        if script == "accepted":
            return Submit(SubmitKind.ACCEPTED, http_status=202)
        if script == "rejected":
            self.said[reference].add("failed")
            return Submit(SubmitKind.REJECTED, reason="PAYER_NOT_FOUND", http_status=400)
        if script == "misconfigured":
            self.said[reference].add("configuration_refused_request")
            return Submit(SubmitKind.MISCONFIGURED, reason="LOGIN_FAILED", http_status=401)
        return Submit(SubmitKind.NO_ANSWER, reason="HTTP_500", http_status=500)

    def _status(self, reference: str, amount: int, currency: str) -> RailStatus:
        default = "pending" if reference in self.taken else "not_found"
        answer = self.answers[reference].popleft() if self.answers[reference] else default
        if answer == "pending":
            return RailStatus(StatusKind.PENDING, http_status=200)
        if answer == "success":
            self.said[reference].add("succeeded")
            return RailStatus(StatusKind.SUCCEEDED, financial_transaction_id="ft-1", http_status=200,
                              amount=amount, currency=currency)
        if answer == "success_other_amount":
            return RailStatus(StatusKind.SUCCEEDED, http_status=200, amount=amount + 1, currency=currency)
        if answer == "success_unreadable":
            return RailStatus(StatusKind.SUCCEEDED, http_status=200, currency=currency, unreadable=("amount",))
        if answer == "failure":
            self.said[reference].add("failed")
            return RailStatus(StatusKind.FAILED, reason="APPROVAL_REJECTED", http_status=200,
                              amount=amount, currency=currency)
        if answer == "failure_unreadable":
            return RailStatus(StatusKind.FAILED, http_status=200, unreadable=("reason",))
        if answer == "failure_configuration":
            self.said[reference].add("configuration_failed")
            return RailStatus(StatusKind.FAILED, reason="INVALID_CURRENCY", http_status=200, configuration=True)
        if answer == "not_found":
            self.said[reference].add("not_found")
            return RailStatus(StatusKind.NOT_FOUND, reason="RESOURCE_NOT_FOUND", http_status=404)
        if answer == "misconfigured":
            return RailStatus(StatusKind.MISCONFIGURED, reason="NOT_ALLOWED_TARGET_ENVIRONMENT", http_status=500)
        return RailStatus(StatusKind.NO_ANSWER, reason="TIMEOUT" if answer == "timeout" else None,
                          http_status=503 if answer == "http_503" else None, detail=answer)

    # the port
    def request_to_pay(self, charge):
        return self._submit(charge.rail_reference)

    def status(self, charge):
        return self._status(charge.rail_reference, charge.amount, charge.currency)

    def refund(self, refund):
        return self._submit(refund.rail_reference)

    def refund_status(self, refund):
        return self._status(refund.rail_reference, refund.amount, refund.currency)

    def parse_callback(self, query, body):  # the route's job, not exercised here
        raise NotImplementedError


class MoneyMachine(RuleBasedStateMachine):
    """Drives payments, refunds and the worker's handlers in random order."""

    pool = None  # set by the test function (the session pool of this xdist worker)

    made_charges = Bundle("charges")
    refunds_ = Bundle("refunds")

    def __init__(self) -> None:
        super().__init__()
        with self.pool.connection() as conn:
            conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                sql.SQL(", ").join(sql.Identifier(t) for t in TABLES)))
            create_merchant(conn, MERCHANT, "State machine")
            registry.ensure_scheduled(conn)
        self.rail = ScriptedRail()
        self.ctx = registry.Context(pool=self.pool, worker_id="sm-1",
                                    settings=Settings(prompt_ttl_seconds=TTL, escalate_after_seconds=HORIZON),
                                    rail_factory=lambda code: self.rail)
        self.seen: dict[str, str] = {}  # charge or refund id -> last status seen
        self.workers = 0

    # ---- helpers ----------------------------------------------------------

    def _rows(self, query, *args):
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(query, args).fetchall()

    def _claim(self, key: str) -> Job | None:
        """Lease the job ``key`` whatever its ``run_at`` (time "moved" to it),
        as a new worker would; ``None`` when it is absent, leased or dead."""
        self.workers += 1
        worker = f"sm-{self.workers}"
        rows = self._rows(
            "UPDATE jobs SET attempts = attempts + 1, locked_by = %s, locked_at = now(), "
            "lease_expires_at = now() + interval '300 seconds', lease_token = gen_random_uuid() "
            "WHERE dedupe_key = %s AND locked_at IS NULL AND run_at <> 'infinity' "
            "RETURNING id, kind, dedupe_key, payload, attempts, failures, lease_token, run_at, created_at",
            worker, key)
        return Job(worker=worker, **rows[0]) if rows else None

    def _apply(self, job: Job, outcome) -> bool:
        """The loop's write that ends the lease (``vpay.worker.loop``), fenced."""
        with self.pool.connection() as conn:
            if isinstance(outcome, Done):
                return queue.finish(conn, job)
            if isinstance(outcome, RetryAfter):
                return queue.reschedule(conn, job, outcome.seconds, outcome.note)
            assert isinstance(outcome, DeadLetter), outcome
            return queue.park(conn, job, outcome.reason)

    def _reap_all(self) -> None:
        with self.pool.connection() as conn:
            conn.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
                         "WHERE locked_at IS NOT NULL")
            queue.reap_expired_leases(conn)

    def _run(self, key: str, crash: str) -> None:
        job = self._claim(key)
        if job is None:
            return
        if crash == "before_handler":      # killed before it did anything: the lease strands
            return
        if crash == "reaped_and_reclaimed":
            # the lease ran out mid-run: another worker re-claims and runs it too
            self._reap_all()
            again = self._claim(key)
            first = registry.handle(job, self.ctx)
            assert not self._apply(job, first), "a reaped lease wrote its outcome"
            if again is not None:
                self._apply(again, registry.handle(again, self.ctx))
            return
        outcome = registry.handle(job, self.ctx)
        if crash == "after_commit":         # committed, then killed before the jobs write
            return
        assert self._apply(job, outcome), "a live lease lost its outcome"

    def _reference(self, table: str, item_id: str) -> str:
        return self._rows(f"SELECT rail_reference FROM {table} WHERE id = %s", item_id)[0]["rail_reference"]

    # ---- rules: payments --------------------------------------------------

    @initialize(target=made_charges, amount=st.integers(1, 5000), first=st.sampled_from(SUBMITS))
    def first_payment(self, amount, first):
        return self.create_payment(amount, first)

    @rule(target=made_charges, amount=st.integers(1, 5000), first=st.sampled_from(SUBMITS))
    def create_payment(self, amount, first):
        with self.pool.connection() as conn:
            created = charges.create_payment(conn, merchant_id=MERCHANT, amount=amount, currency="EUR",
                                           rail="mtn", payer=PAYER, prompt_ttl_seconds=TTL)
        charge = created.charge
        self.seen[charge["id"]] = "pending"
        if first == "crash_after_rail_took_it":     # the rail has it; we never heard (killed)
            self.rail.taken.add(charge["rail_reference"])
        elif first != "crash_before_send":
            self.rail.submits[charge["rail_reference"]].append(first)
            with self.pool.connection() as conn:
                payments.submit(conn, self.rail, charge)
        return charge["id"]

    @rule(charge=made_charges, answer=st.sampled_from(ANSWERS), times=st.integers(1, 3))
    def rail_will_answer(self, charge, answer, times):
        self.rail.answers[self._reference("charges", charge)].extend([answer] * times)

    @rule(charge=made_charges, answer=MAYBE_ANSWER, crash=st.sampled_from(CRASHES))
    def poll(self, charge, answer, crash):
        """The rail's next answer (``None``: whatever it had queued, or its
        default), then the poll job runs (if it is there and not leased)."""
        if answer is not None:
            self.rail.answers[self._reference("charges", charge)].append(answer)
        self._run(f"poll:{charge}", crash)

    @rule(charge=made_charges, resend=st.sampled_from(("accepted", "taken_unheard", "no_answer", "misconfigured",
                                                  "rejected")),
          answer=MAYBE_ANSWER, crash=st.sampled_from(CRASHES))
    def resubmit(self, charge, resend, answer, crash):
        """How the rail will take a re-send (and answer a status read past
        the TTL), then the resubmit job runs if there is one."""
        reference = self._reference("charges", charge)
        self.rail.submits[reference].append(resend)
        if answer is not None:
            self.rail.answers[reference].append(answer)
        self._run(f"resubmit:{charge}", crash)

    @rule(charge=made_charges)
    def callback(self, charge):
        with self.pool.connection() as conn:
            apply_hint(conn, "mtn", self._reference("charges", charge))

    @rule(charge=made_charges, past=st.sampled_from((TTL + 1, HORIZON + 1)))
    def clock_moves(self, charge, past):
        """The charge (and its refunds) are now ``past`` seconds old."""
        with self.pool.connection() as conn:
            for table, column in (("charges", "id"), ("refunds", "charge_id")):
                conn.execute(sql.SQL("UPDATE {} SET created_at = least(created_at, now() - make_interval(secs => %s)) "
                                     "WHERE {} = %s").format(sql.Identifier(table), sql.Identifier(column)),
                             (past, charge))

    @rule(charge=made_charges, what=st.sampled_from(("reap", "sweep")))
    def housekeeping(self, charge, what):
        """A dead worker's leases run out and are reaped, or the hourly sweep
        runs (it reaps and escalates overdue charges)."""
        if what == "reap":
            self._reap_all()
        else:
            self._run("sweep:expired", "none")

    # ---- rules: refunds ---------------------------------------------------

    @rule(target=refunds_, charge=made_charges, amount=st.one_of(st.none(), st.integers(1, 5000)),
          first=st.sampled_from(SUBMITS))
    def create_refund(self, charge, amount, first):
        with self.pool.connection() as conn:
            try:
                refund = refunds.create_refund(conn, charge_id=charge, amount=amount)
            except refunds.InvalidRefund:
                return multiple()
            self.seen[refund["id"]] = "pending"
            if first == "crash_after_rail_took_it":
                self.rail.taken.add(refund["rail_reference"])
            elif first != "crash_before_send":
                self.rail.submits[refund["rail_reference"]].append(first)
                refunds.submit(conn, self.rail, refunds.load_refund(conn, refund["id"]))
        return refund["id"]

    @rule(refund=refunds_, answer=MAYBE_ANSWER, crash=st.sampled_from(CRASHES))
    def refund_poll(self, refund, answer, crash):
        if answer is not None:
            self.rail.answers[self._reference("refunds", refund)].append(answer)
        self._run(f"refund_poll:{refund}", crash)

    # ---- invariants -------------------------------------------------------

    def _check_forward(self, item_id: str, status: str) -> None:
        before = self.seen.get(item_id, "pending")
        assert status in FORWARD[before], f"{item_id} moved backwards: {before} -> {status}"
        self.seen[item_id] = status

    @invariant()
    def charges_move_forward_with_one_event_per_transition_and_live_work(self):
        rows = self._rows("""
            SELECT c.id, c.status, c.failure_code, c.rail_reference, c.prompt_expired_at IS NOT NULL AS expired,
                   count(*) FILTER (WHERE e.type = 'payment_intent.processing'
                                      AND NOT coalesce((e.data->>'expired')::boolean, false)) AS born,
                   count(*) FILTER (WHERE e.type = 'payment_intent.processing'
                                      AND coalesce((e.data->>'expired')::boolean, false)) AS expirations,
                   count(*) FILTER (WHERE e.type = 'payment_intent.succeeded') AS succeeded,
                   count(*) FILTER (WHERE e.type = 'payment_intent.payment_failed') AS failed,
                   EXISTS (SELECT 1 FROM jobs j WHERE j.dedupe_key = 'poll:' || c.id
                                                  AND j.run_at <> 'infinity') AS live_poll
              FROM charges c LEFT JOIN events e ON e.payment_intent_id = c.payment_intent_id
             GROUP BY c.id""")
        for c in rows:
            self._check_forward(c["id"], c["status"])
            assert c["born"] == 1, c
            assert c["expirations"] == (1 if c["expired"] else 0), c
            assert (c["succeeded"], c["failed"]) == (int(c["status"] == "succeeded"), int(c["status"] == "failed")), c
            if c["status"] in LIVE:
                assert c["live_poll"], f"live charge without live work: {c}"
            said = self.rail.said[c["rail_reference"]]
            if c["status"] == "succeeded":
                assert "succeeded" in said, f"succeeded without a readable success for its amount: {c}"
            if c["failure_code"] == "rail_configuration_refused":
                # ended only when no payer was or will be asked: the rail's FAILED blamed our
                # configuration, or it refused a request while holding none of ours
                assert "configuration_failed" in said or (
                    "configuration_refused_request" in said and c["rail_reference"] not in self.rail.taken), c
            elif c["failure_code"] == "not_submitted":
                assert "not_found" in said, c
            elif c["status"] == "failed":
                assert "failed" in said, f"failed without a readable decline: {c}"

    @invariant()
    def refunds_never_exceed_their_charge_and_move_forward_with_one_event_each(self):
        rows = self._rows("""
            SELECT r.id, r.status, r.failure_code, r.rail_reference, r.charge_id,
                   (SELECT count(*) FROM events e WHERE e.type = 'refund.succeeded'
                                                    AND e.data->'refund'->>'id' = r.id) AS succeeded,
                   (SELECT count(*) FROM events e WHERE e.type = 'refund.failed'
                                                    AND e.data->'refund'->>'id' = r.id) AS failed,
                   EXISTS (SELECT 1 FROM jobs j WHERE j.dedupe_key = 'refund_poll:' || r.id
                                                  AND j.run_at <> 'infinity') AS live_poll
              FROM refunds r""")
        for r in rows:
            self._check_forward(r["id"], r["status"])
            assert (r["succeeded"], r["failed"]) == (int(r["status"] == "succeeded"), int(r["status"] == "failed")), r
            if r["status"] in LIVE:
                assert r["live_poll"], f"live refund without live work: {r}"
            said = self.rail.said[r["rail_reference"]]
            if r["status"] == "succeeded":
                assert "succeeded" in said, r
            if r["failure_code"] == "rail_configuration_refused":
                assert "configuration_failed" in said or (
                    "configuration_refused_request" in said and r["rail_reference"] not in self.rail.taken), r
            elif r["status"] == "failed":
                assert "failed" in said, r
        over = self._rows("""
            SELECT c.id, c.amount, sum(r.amount) AS refunded FROM charges c JOIN refunds r ON r.charge_id = c.id
             WHERE r.status <> 'failed' GROUP BY c.id, c.amount HAVING sum(r.amount) > c.amount""")
        assert over == [], f"refunds exceed their charge: {over}"
        unpaid = self._rows("SELECT r.id FROM refunds r JOIN charges c ON c.id = r.charge_id "
                            "WHERE c.status <> 'succeeded'")
        assert unpaid == [], f"a refund of a charge that is not succeeded: {unpaid}"


def test_money_state_machine_over_random_interleavings(db, pool):
    MoneyMachine.pool = pool
    run_state_machine_as_test(MoneyMachine, settings=settings(
        max_examples=30, stateful_step_count=25, deadline=None, derandomize=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                               HealthCheck.function_scoped_fixture]))
