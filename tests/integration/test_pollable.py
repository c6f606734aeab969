"""The pollable abstraction is one body shared by every polled operation
(vpay/money/pollable.py, vpay/handlers/polling.py; docs/architecture.md, "Adding a
pollable operation").

Charges and refunds are registrations of the one poll body; and a third
operation, a toy payout with its own state table and a fake rail adapter
that implements the port plus one status method, is polled to its end by the
real worker loop against real Postgres with nothing else written for it:
the ladder, the settle compare-and-swap with its one event, the verification
read, the contradiction rule, the amount check, the re-send on a 404 and the
24-hour escalation all come from the shared code.
"""

from __future__ import annotations

import re
import uuid

import pytest

from vpay import handlers
from vpay.money import pollable
from vpay.engine import queue
from vpay.handlers import polling
from vpay.worker.loop import Worker, WorkerConfig
from vpay.rails.port import CallbackIds, ChargeRequest, RailStatus, RefundRequest, StatusKind, Submit
from vpay.worker.signals import ShutdownSignals


# ---- a third pollable operation: a toy payout -------------------------------

TOY_SCHEMA = """
CREATE TABLE toy_payouts (
    id                  text        PRIMARY KEY,
    rail                text        NOT NULL,
    rail_reference      text        NOT NULL,
    amount              bigint      NOT NULL,
    currency            text        NOT NULL,
    status              text        NOT NULL DEFAULT 'pending'
                                    CHECK (status IN ('pending', 'succeeded', 'failed', 'unresolved')),
    failure_code        text,
    rail_transaction_id text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    submitted_at        timestamptz,
    settled_at          timestamptz,
    unresolved_at       timestamptz,
    last_polled_at      timestamptz
);
CREATE TABLE toy_payout_events (payout_id text NOT NULL, type text NOT NULL);
"""
KIND_CHECK = ("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
              "WHERE conrelid = 'alerts'::regclass AND conname = 'alerts_kind_check'")


class FakePayoutRail:
    """A rail adapter that implements the port, plus the one method a payout
    needs (``payout_status``). Its answers are set by the test; it records
    what it was asked."""

    code = "toyrail"

    def __init__(self):
        self.answers: dict[str, RailStatus] = {}
        self.reads: list[str] = []
        self.resent: list[str] = []

    def payout_status(self, payout: dict) -> RailStatus:
        self.reads.append(payout["id"])
        return self.answers.get(payout["id"], RailStatus(StatusKind.NO_ANSWER, detail="no answer"))

    def request_to_pay(self, charge: ChargeRequest) -> Submit:
        raise AssertionError("a payout is never a request-to-pay")

    def status(self, charge: ChargeRequest) -> RailStatus:
        raise AssertionError("a payout is never read as a charge")

    def parse_callback(self, query, body: bytes) -> CallbackIds:
        raise AssertionError("no callbacks here")

    def refund(self, refund: RefundRequest) -> Submit:
        raise AssertionError("a payout is never a refund")

    def refund_status(self, refund: RefundRequest) -> RailStatus:
        raise AssertionError("a payout is never read as a refund")


def _load_payout(conn, payout_id):
    from psycopg.rows import dict_row
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT p.*, EXTRACT(EPOCH FROM now() - p.created_at)::float8 AS age_seconds "
                           "FROM toy_payouts p WHERE p.id = %s", (payout_id,)).fetchone()


def _payout_event(conn, payout, event_type):
    conn.execute("INSERT INTO toy_payout_events (payout_id, type) VALUES (%s, %s)", (payout["id"], event_type))


def _resend(ctx, rail, payout):
    rail.resent.append(payout["id"])
    return None


TOY = pollable.Pollable(
    kind="payout_poll", noun="payout", table="toy_payouts", payload_key="payout_id",
    events={"succeeded": "payout.succeeded", "failed": "payout.failed"},
    unresolved_alert="payout_unresolved",
    load=_load_payout,
    read_status=lambda rail, payout: rail.payout_status(payout),
    apply=_payout_event,
    alert_refs=lambda payout: {"charge_id": None, "refund_id": None},
    details=lambda payout: {"payout_id": payout["id"]},
    resend=_resend,
)


@pytest.fixture
def toy(db, pool):
    """The toy's state table and alert kind (what its migration would add),
    its registration, a fake rail and a real worker loop to run its jobs."""
    db.execute("DROP TABLE IF EXISTS toy_payouts, toy_payout_events")
    db.execute(TOY_SCHEMA)
    # The kinds the migrations allow, read rather than restated (other
    # migrations add kinds), and put back exactly as found.
    kind_check = db.execute(KIND_CHECK).fetchone()[0]
    kinds = ", ".join(f"'{k}'" for k in re.findall(r"'([a-z_]+)'", kind_check))
    db.execute("ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check")
    db.execute(f"ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check CHECK (kind IN ({kinds}, "
               "'payout_unresolved'))")
    polling.register_pollable(TOY)
    rail = FakePayoutRail()
    ctx = handlers.Context(pool=pool, worker_id="w1", rail_factory=lambda code: rail)
    worker = Worker(pool, ctx, WorkerConfig(worker_id="w1", concurrency=1), ShutdownSignals())
    try:
        yield rail, worker
    finally:
        handlers.REGISTRY.pop(TOY.kind, None)
        db.execute("DELETE FROM alerts WHERE kind = 'payout_unresolved'")
        db.execute("ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check")
        db.execute(f"ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check {kind_check}")
        db.execute("DROP TABLE toy_payouts, toy_payout_events")


def _create(db, payout_id, amount=700, age="0 seconds"):
    db.execute("INSERT INTO toy_payouts (id, rail, rail_reference, amount, currency, created_at) "
               "VALUES (%s, 'toyrail', %s, %s, 'EUR', now() - %s::interval)",
               (payout_id, str(uuid.uuid4()), amount, age))
    queue.enqueue(db, TOY.kind, TOY.job_key(payout_id), {"payout_id": payout_id})


def _run_due(db, worker):
    """Claim the one due job and run it through the real loop's handling and
    fenced outcome write."""
    job = queue.claim(db, "w1")
    assert job is not None, "a due job"
    worker._run(job)
    return job


def _job_row(db, payout_id):
    return db.execute("SELECT EXTRACT(EPOCH FROM run_at - now())::float8, last_error FROM jobs "
                      "WHERE dedupe_key = %s", (TOY.job_key(payout_id),)).fetchone()


def _payout(db, payout_id):
    return db.execute("SELECT status, failure_code, rail_transaction_id, submitted_at IS NOT NULL, "
                      "last_polled_at IS NOT NULL, unresolved_at IS NOT NULL FROM toy_payouts WHERE id = %s",
                      (payout_id,)).fetchone()


def _events(db, payout_id):
    return [r[0] for r in db.execute("SELECT type FROM toy_payout_events WHERE payout_id = %s", (payout_id,))]


def _alerts(db):
    return db.execute("SELECT kind, details->>'payout_id', details->>'rail_says', details->>'where' "
                      "FROM alerts ORDER BY id").fetchall()


def test_a_toy_payout_is_polled_settled_verified_and_escalated_by_the_shared_code(db, toy):
    rail, worker = toy

    # pending: stamped, submitted (the rail knows it), next rung of the ladder
    _create(db, "po_1")
    rail.answers["po_1"] = RailStatus(StatusKind.PENDING)
    _run_due(db, worker)
    assert _payout(db, "po_1") == ("pending", None, None, True, True, False)
    delay, note = _job_row(db, "po_1")
    assert pollable.poll_delay(1) - 5 < delay <= pollable.poll_delay(1) and note == "rail: pending"

    # a success for another amount settles nothing: one contradiction alert
    db.execute("UPDATE jobs SET run_at = now()")
    rail.answers["po_1"] = RailStatus(StatusKind.SUCCEEDED, amount=699, currency="EUR")
    _run_due(db, worker)
    assert _payout(db, "po_1")[0] == "pending" and _events(db, "po_1") == []
    assert _alerts(db) == [("rail_contradiction", "po_1", "succeeded_other_amount", "amount_mismatch")]

    # the right success: one transition, one event written by the toy's apply, job done
    db.execute("UPDATE jobs SET run_at = now()")
    rail.answers["po_1"] = RailStatus(StatusKind.SUCCEEDED, amount=700, currency="EUR",
                                      financial_transaction_id="ft-1")
    _run_due(db, worker)
    assert _payout(db, "po_1")[:3] == ("succeeded", None, "ft-1")
    assert _events(db, "po_1") == ["payout.succeeded"]
    assert _job_row(db, "po_1") is None

    # asked again later, the rail says the opposite: a verification read, an alert, nothing changed
    queue.enqueue(db, TOY.kind, TOY.job_key("po_1"), {"payout_id": "po_1"})
    rail.answers["po_1"] = RailStatus(StatusKind.FAILED, reason="REVERSED")
    _run_due(db, worker)
    assert _payout(db, "po_1")[:3] == ("succeeded", None, "ft-1")
    assert _events(db, "po_1") == ["payout.succeeded"]
    assert _alerts(db)[-1] == ("rail_contradiction", "po_1", "failed", "payout_poll")
    assert _job_row(db, "po_1") is None

    # a settle racing the one above matches no row: the shared CAS
    assert pollable.settle(db, TOY, "po_1", StatusKind.SUCCEEDED).transitioned is False
    assert _events(db, "po_1") == ["payout.succeeded"]

    # a 404 for a payout never confirmed: the toy's resend is asked, the ladder goes on
    _create(db, "po_2")
    rail.answers["po_2"] = RailStatus(StatusKind.NOT_FOUND, reason="RESOURCE_NOT_FOUND")
    _run_due(db, worker)
    assert rail.resent == ["po_2"] and _payout(db, "po_2")[0] == "pending"
    assert _job_row(db, "po_2")[1] == "rail: not_found RESOURCE_NOT_FOUND"

    # past the 24-hour horizon with a silent rail: unresolved, one alert, hourly for ever
    _create(db, "po_3", age="25 hours")
    _run_due(db, worker)
    assert _payout(db, "po_3")[0] == "unresolved" and _payout(db, "po_3")[5] is True
    assert ("payout_unresolved", "po_3", None, None) in _alerts(db)
    delay, note = _job_row(db, "po_3")
    assert pollable.UNRESOLVED_EVERY - 5 < delay <= pollable.UNRESOLVED_EVERY
    db.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s", (TOY.job_key("po_3"),))
    _run_due(db, worker)
    assert [a for a in _alerts(db) if a[0] == "payout_unresolved"] == [("payout_unresolved", "po_3", None, None)]

    # and an unresolved payout still settles when the rail answers
    db.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s", (TOY.job_key("po_3"),))
    rail.answers["po_3"] = RailStatus(StatusKind.FAILED, reason="PAYEE_NOT_FOUND")
    _run_due(db, worker)
    assert _payout(db, "po_3")[:2] == ("failed", "PAYEE_NOT_FOUND")
    assert _events(db, "po_3") == ["payout.failed"]

    # a payload naming no payout is dead-lettered with the toy's own words
    queue.enqueue(db, TOY.kind, TOY.job_key("po_missing"), {"payout_id": "po_missing"})
    _run_due(db, worker)
    assert db.execute("SELECT run_at = 'infinity', last_error FROM jobs WHERE dedupe_key = %s",
                      (TOY.job_key("po_missing"),)).fetchone() == (True, "payout_poll names no payout: 'po_missing'")
