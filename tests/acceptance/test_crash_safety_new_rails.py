"""Crash safety of the M-Pesa and pawaPay rails under a real kill -9, at the
kill points of creation (``after_charge_commit``, ``after_rail_accepted``)
and of the settle (``before_settle_commit``, ``after_settle_commit``): the
same proof as tests/acceptance/test_crash_safety.py gives MoMo (its helpers
reused), against the two sandboxes.

Where the rails differ: pawaPay is idempotent on our depositId, so a kill
after it accepted is found by the status read and never sent twice. Daraja's
STK Push has no key of ours and its CheckoutRequestID lives only in the lost
answer: a kill after it accepted leaves a prompt we cannot read, and the
resubmit sends a second one (docs/flows/mpesa.md, "A lost answer"); the
charge ends by the prompt we can read, once."""

from __future__ import annotations

import pytest

from support import TimeMachine, base_env, wait_until
from test_crash_safety import _assert_nothing_stranded, _charge, _events, _job, _kill, _rescuer, _stop_cleanly
from vpay.money import payments
from vpay.rails.mpesa import MpesaDaraja
from vpay.rails.pawapay import PawaPay
from vpay.sandbox.mpesa import MpesaSandbox
from vpay.sandbox.pawapay import PawaPaySandbox

pytestmark = pytest.mark.slow

RAILS = {"mpesa": ("15000", "KES", "254708374149"), "pawapay": ("1500", "ZMW", "260763456789")}
TERMINAL_EVENT = {"succeeded": "payment_intent.succeeded", "failed": "payment_intent.payment_failed"}


@pytest.fixture(params=["mpesa", "pawapay"])
def rail(request):
    double = MpesaSandbox() if request.param == "mpesa" else PawaPaySandbox()
    with double:
        yield request.param, double


def _env(db_url, code, double):
    extra = double.env("http://127.0.0.1:9/provider/mpesa/callback") if code == "mpesa" else double.env()
    return base_env(db_url, **extra)


def _sends(code, double, ref):
    if code == "mpesa":
        return double.count("/processrequest", reference=ref)
    return double.count("POST", "/v2/deposits", ref)


def _script(code, double, outcome):
    payer = RAILS[code][2]
    double.script_payer(payer, {"approve": "approve", "decline": "decline"}[outcome])


def _settled(db, charge_id):
    charge = _charge(db, charge_id)
    assert charge["status"] in TERMINAL_EVENT and charge["submitted_at"] is not None
    assert _events(db, charge["intent"]) == ["payment_intent.processing", TERMINAL_EVENT[charge["status"]]]
    return charge


@pytest.mark.parametrize("point", ["after_charge_commit", "after_rail_accepted"])
def test_kill_in_the_create_path_is_recovered(point, rail, db, db_url, merchant, spawn):
    code, double = rail
    env = _env(db_url, code, double)
    amount, currency, payer = RAILS[code]
    create = spawn("vpay-server", "--log-level", "INFO", "payments", "create", "--merchant", merchant,
                   "--amount", amount,
                   "--currency", currency, "--rail", code, "--payer", payer,
                   env={**env, "VPAY_TEST_PAUSE_AT": point})
    create.wait_for_log("test pause", point=point)
    _kill(create)
    charge = _charge(db)
    assert charge["status"] == "pending" and charge["submitted_at"] is None
    assert _sends(code, double, charge["ref"]) == (0 if point == "after_charge_commit" else 1)

    worker = _rescuer(spawn, env)
    with TimeMachine(db_url):
        wait_until(lambda: _charge(db, charge["id"])["status"] != "pending"
                   and _job(db, f"poll:{charge['id']}") is None, timeout=60, what="the charge to settle")
    assert _settled(db, charge["id"])["status"] == "succeeded"
    expected = 2 if (code == "mpesa" and point == "after_rail_accepted") else 1
    assert _sends(code, double, charge["ref"]) == expected
    _stop_cleanly(worker)
    _assert_nothing_stranded(db)


@pytest.mark.parametrize("point,outcome", [("before_settle_commit", "approve"), ("before_settle_commit", "decline"),
                                           ("after_settle_commit", "approve")])
def test_kill_in_the_settle_is_recovered_after_the_lease_is_reaped(point, outcome, rail, db, db_url, pool,
                                                                   merchant, spawn):
    code, double = rail
    env = _env(db_url, code, double)
    _script(code, double, outcome)
    amount, currency, payer = RAILS[code]
    adapter = (MpesaDaraja if code == "mpesa" else PawaPay).from_env(env)
    created = payments.create_and_submit(pool, lambda c: adapter, merchant_id=merchant, amount=int(amount),
                                         currency=currency, rail=code, payer=payer)
    charge_id = created["charge"]["id"]
    doomed = spawn("vpay-worker", "--idle-sleep", "0.1", "--worker-id", "doomed", "--lease-seconds", "5",
                   env={**env, "VPAY_TEST_PAUSE_AT": point})
    with TimeMachine(db_url):
        doomed.wait_for_log("test pause", point=point)
    _kill(doomed)
    charge = _charge(db, charge_id)
    events = _events(db, charge["intent"])
    if point == "before_settle_commit":
        assert charge["status"] == "pending" and events == ["payment_intent.processing"]
    else:
        assert events == ["payment_intent.processing", TERMINAL_EVENT[charge["status"]]]

    rescuer = _rescuer(spawn, env)
    with TimeMachine(db_url):
        wait_until(lambda: _job(db, f"poll:{charge_id}") is None, timeout=60, what="the poll to be re-run")
    assert _settled(db, charge_id)["status"] == ("succeeded" if outcome == "approve" else "failed")
    assert _sends(code, double, charge["ref"]) == 1
    _stop_cleanly(rescuer)
    _assert_nothing_stranded(db)
