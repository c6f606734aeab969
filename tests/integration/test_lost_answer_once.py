"""A request-to-pay whose answer was lost, on a rail that cannot take it twice
(``Rail.resend_safe`` False: M-Pesa's STK Push), against real Postgres and
the real submit, poll and resubmit handlers, run by the worker loop's own
handling (docs/flows/mpesa.md, "A lost answer").

The rail is a double of the port (``OnceRail``) that counts its sends and
answers status reads by the identifier it was given: none is NOT_FOUND
without asking, as M-Pesa's adapter does. The rules proven:

* a send that may have left is never sent again (not by the create path's
  resubmit, not by the poll's NOT_FOUND, not by a resubmit job already
  queued), and its "not found" past the prompt TTL fails nothing: the charge
  waits and escalates at the 24-hour horizon (unresolved + alert);
* a send that surely never left (``Submit.unsent``) is sent again;
* a rail that says nothing keeps the old rule (resend on a lost answer);
* a callback's identifier is stored only for a charge whose send may have
  left and that has none, never one another charge holds; the status read
  made with it settles the charge, and a wrong one settles nothing;
* an answer that did arrive is not lost to the database going away before
  it is written (the chaos run's find, seed 11: a fast Postgres restart
  between Daraja's answer and our write left the charge without its
  ``CheckoutRequestID``): the write is retried on a fresh connection
  (``payments.ANSWER_WRITE_SECONDS``), by the create path (against vpay's
  Daraja double, the backends really terminated) and by the resubmit job,
  and given up only past its bound.
"""

from __future__ import annotations

import logging

import psycopg
import pytest

from vpay import handlers  # noqa: F401  (registers the job kinds)
from vpay.base import db as vdb
from vpay.engine import queue
from vpay.money import charges, payments
from vpay.base.settings import Settings
from vpay.handlers import registry
from vpay.rails.port import RailStatus, StatusKind, Submit, SubmitKind
from vpay.worker.loop import Worker, WorkerConfig
from vpay.worker.signals import ShutdownSignals

PAYER = "254708374149"
ID_KEY = "checkout_request_id"


class OnceRail:
    """The port, as a rail without an idempotency key (``resend_safe``
    False unless told). ``answers`` is the queue of ``request_to_pay``
    answers (then ACCEPTED with a fresh identifier); ``known`` maps the
    identifiers the rail assigned to what its status read answers."""

    code = "mpesa"

    def __init__(self, resend_safe: bool = False):
        self.resend_safe = resend_safe
        self.answers: list[Submit] = []
        self.sends: list[str] = []
        self.known: dict[str, StatusKind] = {}

    def request_to_pay(self, charge):
        self.sends.append(charge.charge_id)
        ident = f"ws_CO_{len(self.sends)}"
        self.known[ident] = StatusKind.PENDING   # the prompt is with the payer, answer heard or not
        if self.answers:
            return self.answers.pop(0)
        return Submit(SubmitKind.ACCEPTED, rail_data={ID_KEY: ident})

    def status(self, charge):
        ident = charge.rail_data.get(ID_KEY)
        if ident is None:
            return RailStatus(StatusKind.NOT_FOUND, reason="NO_CHECKOUT_REQUEST_ID")
        return RailStatus(self.known.get(ident, StatusKind.NOT_FOUND))

    def parse_callback(self, query, body):  # pragma: no cover - the route is not used here
        raise NotImplementedError


@pytest.fixture
def setup(pool, db, merchant):
    rail = OnceRail()
    ctx = registry.Context(pool=pool, worker_id="w1", settings=Settings(), rail_factory=lambda code: rail)
    worker = Worker(pool, ctx, WorkerConfig(worker_id="w1", concurrency=1), ShutdownSignals())
    return rail, worker


def _create(pool, rail, merchant):
    created = payments.create_and_submit(pool, lambda code: rail, merchant_id=merchant, amount=150_00,
                                         currency="KES", rail="mpesa", payer=PAYER)
    return created["charge"]["id"]


def _run(db, worker, key):
    """Make ``key`` due, claim it and run it through the loop's handling."""
    db.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s", (key,))
    job = queue.claim(db, "w1")
    assert job is not None and job.dedupe_key == key, job
    worker._run(job)


def _charge(db, charge_id):
    return charges.load_charge(db, charge_id)


def _jobs(db):
    return sorted(r[0] for r in db.execute("SELECT dedupe_key FROM jobs WHERE kind IN ('poll', 'resubmit')"))


def _age(db, charge_id, interval):
    db.execute("UPDATE charges SET created_at = now() - %s::interval WHERE id = %s", (interval, charge_id))


def test_a_lost_answer_is_never_sent_again_and_escalates_at_the_horizon(setup, pool, db, merchant):
    rail, worker = setup
    rail.answers = [Submit(SubmitKind.NO_ANSWER, reason="TIMEOUT")]     # sent, then the answer was lost
    charge_id = _create(pool, rail, merchant)
    charge = _charge(db, charge_id)
    assert charge["status"] == "pending" and charge["submitted_at"] is None
    assert charges.request_may_have_left(charge)
    assert _jobs(db) == [f"poll:{charge_id}"]                              # no resubmit scheduled

    _run(db, worker, f"poll:{charge_id}")                                  # NOT_FOUND: no identifier known
    assert _jobs(db) == [f"poll:{charge_id}"] and _charge(db, charge_id)["status"] == "pending"

    # A resubmit job queued anyway (an older worker, an operator) sends nothing.
    queue.enqueue(db, "resubmit", f"resubmit:{charge_id}", {"charge_id": charge_id})
    _run(db, worker, f"resubmit:{charge_id}")
    _age(db, charge_id, "20 minutes")                                      # past the prompt TTL
    queue.enqueue(db, "resubmit", f"resubmit:{charge_id}", {"charge_id": charge_id})
    _run(db, worker, f"resubmit:{charge_id}")
    assert _charge(db, charge_id)["status"] == "pending"                   # "not found" fails nothing
    assert payments.submit(db, rail, _charge(db, charge_id)).reason == payments.ANSWER_LOST
    assert rail.sends == [charge_id]

    _age(db, charge_id, "25 hours")
    _run(db, worker, f"poll:{charge_id}")
    escalated = _charge(db, charge_id)
    assert escalated["status"] == "unresolved" and escalated["intent_status"] == "processing"
    assert db.execute("SELECT kind FROM alerts WHERE charge_id = %s", (charge_id,)).fetchall() \
        == [("charge_unresolved",)]
    assert _jobs(db) == [f"poll:{charge_id}"] and rail.sends == [charge_id]


def test_a_send_that_never_left_is_sent_again(setup, pool, db, merchant):
    rail, worker = setup
    rail.answers = [Submit(SubmitKind.NO_ANSWER, reason="TOKEN_HTTP_500", unsent=True)]
    charge_id = _create(pool, rail, merchant)
    assert not charges.request_may_have_left(_charge(db, charge_id))
    assert _jobs(db) == [f"poll:{charge_id}", f"resubmit:{charge_id}"]
    _run(db, worker, f"resubmit:{charge_id}")
    charge = _charge(db, charge_id)
    assert charge["submitted_at"] is not None and charge["rail_data"][ID_KEY] == "ws_CO_2"
    assert rail.sends == [charge_id, charge_id]


def test_a_rail_with_an_idempotency_key_keeps_resending_a_lost_answer(setup, pool, db, merchant):
    rail, worker = setup
    rail.resend_safe = True                                                 # MoMo, Orange, pawaPay
    rail.answers = [Submit(SubmitKind.NO_ANSWER, reason="TIMEOUT")]
    charge_id = _create(pool, rail, merchant)
    assert _jobs(db) == [f"poll:{charge_id}", f"resubmit:{charge_id}"]
    assert "request_sent_at" not in _charge(db, charge_id)["rail_data"]
    _run(db, worker, f"resubmit:{charge_id}")
    assert rail.sends == [charge_id, charge_id] and _charge(db, charge_id)["submitted_at"] is not None


def test_a_callbacks_identifier_is_adopted_only_for_a_lost_answer_and_settles_by_the_read(setup, pool, db,
                                                                                         merchant):
    rail, worker = setup
    answered = _create(pool, rail, merchant)                               # ws_CO_1, heard
    rail.answers = [Submit(SubmitKind.NO_ANSWER, reason="TIMEOUT")]
    lost = _create(pool, rail, merchant)                                   # ws_CO_2, never heard
    rail.answers = [Submit(SubmitKind.NO_ANSWER, reason="TIMEOUT")]
    other_lost = _create(pool, rail, merchant)                             # ws_CO_3, never heard
    ref = {c: _charge(db, c)["rail_reference"] for c in (answered, lost, other_lost)}

    def adopt(charge_id, ident):
        return charges.adopt_status_keys(db, "mpesa", ref[charge_id], {ID_KEY: ident})

    assert adopt(answered, "ws_CO_9") is None                              # it has its own: kept
    assert adopt(lost, "ws_CO_1") is None                                  # another charge's: refused
    assert charges.adopt_status_keys(db, "orange", ref[lost], {ID_KEY: "ws_CO_2"}) is None   # not its rail
    assert adopt(lost, "ws_CO_2") == lost
    assert adopt(lost, "ws_CO_3") is None                                  # the first one stays
    assert adopt(other_lost, "ws_CO_2") is None                            # now held by `lost`
    assert _charge(db, answered)["rail_data"][ID_KEY] == "ws_CO_1"

    rail.known["ws_CO_2"] = StatusKind.SUCCEEDED                           # the payer approved the one prompt
    _run(db, worker, f"poll:{lost}")
    settled = _charge(db, lost)
    assert (settled["status"], settled["intent_status"]) == ("succeeded", "succeeded")
    assert settled["submitted_at"] is not None and rail.sends.count(lost) == 1
    assert adopt(lost, "ws_CO_8") is None                                  # ended: nothing to adopt


def test_a_forged_identifier_settles_nothing(setup, pool, db, merchant):
    rail, worker = setup
    rail.answers = [Submit(SubmitKind.NO_ANSWER, reason="TIMEOUT")]
    charge_id = _create(pool, rail, merchant)
    reference = _charge(db, charge_id)["rail_reference"]
    assert charges.adopt_status_keys(db, "mpesa", reference, {ID_KEY: "ws_CO_forged"}) == charge_id
    _run(db, worker, f"poll:{charge_id}")                                  # the rail: not found
    charge = _charge(db, charge_id)
    assert charge["status"] == "pending" and charge["submitted_at"] is None
    assert _jobs(db) == [f"poll:{charge_id}"] and rail.sends == [charge_id]   # and no second prompt
    with pytest.raises(ValueError):
        charges.adopt_status_keys(db, "mpesa", reference, {})


def test_a_never_sent_charge_adopts_nothing(setup, pool, db, merchant):
    rail, worker = setup
    created = charges.create_payment(db, merchant_id=merchant, amount=150_00, currency="KES", rail="mpesa",
                                     payer=PAYER)                        # killed before the send
    charge_id = created.charge["id"]
    assert charges.adopt_status_keys(db, "mpesa", created.charge["rail_reference"], {ID_KEY: "ws_CO_1"}) is None
    _run(db, worker, f"poll:{charge_id}")                                  # NOT_FOUND: never sent
    assert _jobs(db) == [f"poll:{charge_id}", f"resubmit:{charge_id}"]
    _run(db, worker, f"resubmit:{charge_id}")                              # the first and only push
    assert rail.sends == [charge_id] and _charge(db, charge_id)["submitted_at"] is not None


def test_the_marker_never_reaches_the_adapter(setup, pool, db, merchant):
    rail, _ = setup
    rail.answers = [Submit(SubmitKind.NO_ANSWER, reason="TIMEOUT")]
    charge_id = _create(pool, rail, merchant)
    assert charges.charge_request(_charge(db, charge_id)).rail_data == {}


# ------------------------------------------------ the answer outlives a restart

RESTARTED = "vpay-restarted"  # application_name of the pools whose sessions the "restart" ends


def _restart(db) -> int:
    """End every session of the ``RESTARTED`` pools on this test's database,
    as a fast Postgres restart ends them all (``pg_terminate_backend``, the
    chaos run's ``pg_terminate``). Answers how many were ended."""
    rows = db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = current_database() AND application_name = %s", (RESTARTED,)).fetchall()
    return sum(1 for (ended,) in rows if ended)


@pytest.fixture
def restarted_pool(db_url):
    own = vdb.make_pool(db_url, name=RESTARTED, max_size=4)
    yield own
    own.close()


def test_an_accepted_push_keeps_its_checkout_request_id_through_a_restart_before_its_write(
        db, merchant, restarted_pool):
    """The chaos run's find (seed 11, payment 22 under load): Daraja accepted
    the push and the database's sessions ended before the answer was written.
    Before: the create raised, the charge kept the one-send mark without the
    ``CheckoutRequestID``, and so waited for a callback or the 24-hour horizon
    while the payer had paid. Now the answer is written on a fresh connection
    and the first poll settles the charge; one push only."""
    from vpay.rails.mpesa import MpesaDaraja
    from vpay.sandbox.mpesa import MpesaSandbox
    with MpesaSandbox() as daraja:
        daraja.script_payer(PAYER, "approve")
        mpesa = MpesaDaraja.from_env(daraja.env("http://127.0.0.1:9/provider/mpesa/callback"),
                                     sleep=lambda s: None)
        push, ended = mpesa.request_to_pay, []

        def push_then_restart(request):
            answer = push(request)             # Daraja has the push: the prompt is with the payer
            ended.append(_restart(db))         # ... and our sessions end before we write its answer
            return answer
        mpesa.request_to_pay = push_then_restart

        created = payments.create_and_submit(restarted_pool, lambda code: mpesa, merchant_id=merchant,
                                             amount=150_00, currency="KES", rail="mpesa", payer=PAYER)
        charge_id = created["charge"]["id"]
        assert ended == [1]                                                  # the submit's session ended
        charge = _charge(db, charge_id)
        assert [p["reference"] for p in daraja.pushes()] == [charge["rail_reference"]]
        assert charge["rail_data"][ID_KEY] == daraja.pushes()[0]["checkout"]
        assert charge["submitted_at"] is not None and created["payment_intent"]["status"] == "processing"

        ctx = registry.Context(pool=restarted_pool, worker_id="w1", settings=Settings(),
                               rail_factory=lambda code: mpesa)
        worker = Worker(restarted_pool, ctx, WorkerConfig(worker_id="w1", concurrency=1), ShutdownSignals())
        _run(db, worker, f"poll:{charge_id}")                                 # STK Push Query by its id
        settled = _charge(db, charge_id)
        assert (settled["status"], settled["intent_status"]) == ("succeeded", "succeeded")
        assert len(daraja.pushes()) == 1


def test_the_resubmit_job_keeps_an_accepted_answer_through_a_restart_before_its_write(
        db, merchant, restarted_pool):
    """The same on the worker's side: the push the create path left to the
    worker (every API slot busy) is accepted, and the sessions end before its
    answer is written. Before: the handler raised, and its retry found the
    one-send mark and sent nothing (the identifier lost for good)."""
    rail = OnceRail()
    push, ended = rail.request_to_pay, []

    def push_then_restart(request):
        answer = push(request)
        ended.append(_restart(db))
        return answer
    rail.request_to_pay = push_then_restart
    created = charges.create_payment(db, merchant_id=merchant, amount=150_00, currency="KES", rail="mpesa",
                                     payer=PAYER)
    charge_id = created.charge["id"]
    queue.enqueue(db, "resubmit", f"resubmit:{charge_id}", {"charge_id": charge_id})
    ctx = registry.Context(pool=restarted_pool, worker_id="w1", settings=Settings(),
                           rail_factory=lambda code: rail)
    worker = Worker(restarted_pool, ctx, WorkerConfig(worker_id="w1", concurrency=1), ShutdownSignals())
    _run(db, worker, f"resubmit:{charge_id}")
    assert ended == [1] and rail.sends == [charge_id]
    charge = _charge(db, charge_id)
    assert charge["rail_data"][ID_KEY] == "ws_CO_1" and charge["submitted_at"] is not None
    assert _jobs(db) == [f"poll:{charge_id}"]                                # the resubmit is done


def _away_until(monkeypatch, clock: list[float], back_at: float, tries: list[float]) -> None:
    """The database is away for the answer's writes until ``clock[0]``
    reaches ``back_at`` (each write raises as a dropped session does); every
    try's time is kept in ``tries``."""
    for name in ("record_submission", "mark_submitted"):
        real = getattr(charges, name)

        def write(conn, *args, _real=real, _name=name, **kwargs):
            if _name == "record_submission":
                tries.append(clock[0])
            if clock[0] < back_at:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return _real(conn, *args, **kwargs)
        monkeypatch.setattr(charges, name, write)


@pytest.mark.parametrize("back", ["at_the_bound", "past_the_bound"])
def test_an_accepted_answers_write_is_retried_up_to_its_bound(db, pool, merchant, monkeypatch, caplog, back):
    bound = payments.ANSWER_WRITE_SECONDS
    created = charges.create_payment(db, merchant_id=merchant, amount=150_00, currency="KES", rail="mpesa",
                                     payer=PAYER)
    charge = _charge(db, created.charge["id"])
    clock, tries = [1000.0], []

    def sleep(seconds):
        assert seconds > 0
        clock[0] += seconds
    # The last try is made at the bound (its wait is cut to what is left):
    # back then, the answer lands; back a millisecond later, it is given up.
    _away_until(monkeypatch, clock, 1000.0 + bound - 1e-6 if back == "at_the_bound" else 1000.0 + bound + 1e-3,
                tries)
    answer = Submit(SubmitKind.ACCEPTED, rail_data={ID_KEY: "ws_CO_1"})
    with caplog.at_level(logging.WARNING, logger="vpay.payments"):
        if back == "at_the_bound":
            payments.record_accepted(db, charge, answer, pool, clock=lambda: clock[0], sleep=sleep)
        else:
            with pytest.raises(psycopg.OperationalError):
                payments.record_accepted(db, charge, answer, pool, clock=lambda: clock[0], sleep=sleep)
    assert tries[0] == 1000.0 and tries[-1] == pytest.approx(1000.0 + bound)
    assert all(t <= 1000.0 + bound + 1e-9 for t in tries) and len(tries) > 2
    written = _charge(db, charge["id"])
    if back == "at_the_bound":
        assert written["rail_data"][ID_KEY] == "ws_CO_1" and written["submitted_at"] is not None
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    else:
        assert ID_KEY not in written["rail_data"] and written["submitted_at"] is None
        given_up = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(given_up) == 1 and given_up[0].charge_id == charge["id"]
        assert _jobs(db) == [f"poll:{charge['id']}"]                          # still polled


def test_without_a_pool_the_writes_error_is_raised_at_once(db, merchant, monkeypatch):
    created = charges.create_payment(db, merchant_id=merchant, amount=150_00, currency="KES", rail="mpesa",
                                     payer=PAYER)
    tries: list[float] = []
    _away_until(monkeypatch, [0.0], 1.0, tries)
    with pytest.raises(psycopg.OperationalError):
        payments.record_accepted(db, _charge(db, created.charge["id"]),
                                 Submit(SubmitKind.ACCEPTED, rail_data={ID_KEY: "ws_CO_1"}), None,
                                 sleep=lambda s: pytest.fail("no retry without a pool"))
    assert tries == [0.0]
