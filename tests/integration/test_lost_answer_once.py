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
  made with it settles the charge, and a wrong one settles nothing.
"""

from __future__ import annotations

import pytest

from vpay import handlers  # noqa: F401  (registers the job kinds)
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
