"""Crash safety of the M-Pesa and pawaPay rails under a real kill -9, at the
kill points of creation (``after_charge_commit``, ``after_rail_accepted``)
and of the settle (``before_settle_commit``, ``after_settle_commit``): the
same proof as tests/acceptance/test_crash_safety.py gives MoMo (its helpers
reused), against the two sandboxes.

Where the rails differ: pawaPay is idempotent on our depositId, so a kill
after it accepted is found by the status read and never sent twice. Daraja's
STK Push has no key of ours (``resend_safe`` False) and its
CheckoutRequestID lives only in the lost answer: a kill after it accepted
leaves a prompt we cannot read, and it is never pushed again
(docs/flows/mpesa.md, "A lost answer"). Daraja's callback names the
CheckoutRequestID: stored as an identifier (through a real `vpay-server
api`), the STK Push Query settles the charge; with no callback the charge
stays pending and escalates at the 24-hour horizon, still one push."""

from __future__ import annotations

import pytest
import requests

from api_support import free_port
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
    with _double(request.param) as double:
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


def _double(code):
    return MpesaSandbox() if code == "mpesa" else PawaPaySandbox()


def _create_killed_at(spawn, db, env, merchant, code, point):
    """`vpay-server payments create` killed -9 at ``point``: the charge row."""
    amount, currency, payer = RAILS[code]
    create = spawn("vpay-server", "--log-level", "INFO", "payments", "create", "--merchant", merchant,
                   "--amount", amount, "--currency", currency, "--rail", code, "--payer", payer,
                   env={**env, "VPAY_TEST_PAUSE_AT": point})
    create.wait_for_log("test pause", point=point)
    _kill(create)
    charge = _charge(db)
    assert charge["status"] == "pending" and charge["submitted_at"] is None
    return charge


def _rail_data(db, charge_id):
    return db.execute("SELECT rail_data FROM charges WHERE id = %s", (charge_id,)).fetchone()[0]


def _answers(api, port):
    if api.popen.poll() is not None:
        raise AssertionError(f"vpay-server api exited {api.popen.returncode}:\n{api.text()[-4000:]}")
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def _settled(db, charge_id):
    charge = _charge(db, charge_id)
    assert charge["status"] in TERMINAL_EVENT and charge["submitted_at"] is not None
    assert _events(db, charge["intent"]) == ["payment_intent.processing", TERMINAL_EVENT[charge["status"]]]
    return charge


@pytest.mark.parametrize("code,point", [("mpesa", "after_charge_commit"), ("pawapay", "after_charge_commit"),
                                        ("pawapay", "after_rail_accepted")])
def test_kill_in_the_create_path_is_recovered(code, point, db, db_url, merchant, spawn):
    with _double(code) as double:
        env = _env(db_url, code, double)
        charge = _create_killed_at(spawn, db, env, merchant, code, point)
        assert charge["submitted_at"] is None
        assert _sends(code, double, charge["ref"]) == (0 if point == "after_charge_commit" else 1)

        worker = _rescuer(spawn, env)
        with TimeMachine(db_url):
            wait_until(lambda: _charge(db, charge["id"])["status"] != "pending"
                       and _job(db, f"poll:{charge['id']}") is None, timeout=60, what="the charge to settle")
        assert _settled(db, charge["id"])["status"] == "succeeded"
        assert _sends(code, double, charge["ref"]) == 1
        _stop_cleanly(worker)
        _assert_nothing_stranded(db)


def test_mpesa_kill_after_accepted_pushes_once_and_settles_through_the_callbacks_identifier(db, db_url, merchant,
                                                                                          spawn):
    with MpesaSandbox() as double:
        port = free_port()
        env = base_env(db_url, **double.env(f"http://127.0.0.1:{port}/provider/mpesa/callback"))
        api = spawn("vpay-server", "api", "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "2",
                    env=env)
        charge = _create_killed_at(spawn, db, env, merchant, "mpesa", "after_rail_accepted")
        assert double.count("/processrequest", reference=charge["ref"]) == 1
        assert _rail_data(db, charge["id"]).keys() == {"request_sent_at"}      # pushed; its id never heard

        worker = _rescuer(spawn, env)
        with TimeMachine(db_url):
            wait_until(lambda: (_job(db, f"poll:{charge['id']}") or {}).get("attempts", 0) >= 3,
                       timeout=60, what="three polls that cannot read the prompt")
            assert _charge(db, charge["id"])["status"] == "pending" and _job(db, f"resubmit:{charge['id']}") is None
            wait_until(lambda: _answers(api, port), timeout=30, what="the API to answer /healthz")
            assert double.notify(charge["ref"]) == 202                           # Daraja's callback
            wait_until(lambda: _charge(db, charge["id"])["status"] != "pending"
                       and _job(db, f"poll:{charge['id']}") is None, timeout=60, what="the charge to settle")
        assert _settled(db, charge["id"])["status"] == "succeeded"
        assert _rail_data(db, charge["id"])["checkout_request_id"] == double.push(charge["ref"])["checkout"]
        assert double.count("/processrequest", reference=charge["ref"]) == 1   # the payer was asked once
        assert double.count("/query", reference=charge["ref"]) >= 1            # settled by the STK Push Query
        assert api.find("callback hint", status_key_adopted=True)
        _stop_cleanly(worker)
        _assert_nothing_stranded(db)


def test_mpesa_kill_after_accepted_without_a_callback_pushes_once_and_escalates_at_the_horizon(db, db_url, merchant,
                                                                                             spawn):
    with MpesaSandbox() as double:
        env = _env(db_url, "mpesa", double)
        charge = _create_killed_at(spawn, db, env, merchant, "mpesa", "after_rail_accepted")
        worker = _rescuer(spawn, env)
        with TimeMachine(db_url):
            wait_until(lambda: (_job(db, f"poll:{charge['id']}") or {}).get("attempts", 0) >= 3,
                       timeout=60, what="three polls that cannot read the prompt")
            assert _charge(db, charge["id"])["status"] == "pending"
            # The clock moved past the prompt TTL and the 24-hour horizon (created_at, as the lifecycle tests do).
            db.execute("UPDATE charges SET created_at = created_at - interval '25 hours' WHERE id = %s",
                       (charge["id"],))
            wait_until(lambda: _charge(db, charge["id"])["status"] == "unresolved", timeout=60,
                       what="the escalation at the horizon")
        assert db.execute("SELECT kind FROM alerts WHERE charge_id = %s", (charge["id"],)).fetchall() \
            == [("charge_unresolved",)]
        # No settlement event: only the birth and the prompt's expiry (past the TTL); the intent stays processing.
        assert _events(db, charge["intent"]) == ["payment_intent.processing", "payment_intent.processing"]
        assert db.execute("SELECT status FROM payment_intents WHERE id = %s", (charge["intent"],)).fetchone() \
            == ("processing",)
        assert double.count("/processrequest", reference=charge["ref"]) == 1   # never a second prompt
        assert _job(db, f"poll:{charge['id']}") is not None                    # still read, hourly
        assert _job(db, f"resubmit:{charge['id']}") is None
        _stop_cleanly(worker)


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
