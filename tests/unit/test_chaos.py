"""The chaos run (issue 12, bench/chaos.py) on a small seed, and its checks.

* ``test_small_chaos_run_has_no_violations``: 30 payments through the real
  API, two real ``vpay-worker`` processes, the run's own embedded Postgres,
  the faulting rail process and three verifying receivers, under one fault of
  every kind (SIGKILL and SIGSTOP of workers, Postgres restart, terminated
  backends, rail 5xx / timeouts / trickle / 429, duplicate and late
  callbacks, receivers answering 500 or hanging). Exit 0, zero violations,
  every payment created, every fault applied; then two violations planted in
  that run's real snapshot are caught.
* ``test_checks_catch_planted_violations``: each check fails on a snapshot
  with one planted violation (a charge succeeded that the rail's ledger
  failed, an event never delivered, a second terminal transition, ...) and
  passes on the clean one.
* ``test_same_seed_same_schedule``: the plan is the seed's, not the clock's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import chaos_checks  # noqa: E402


# --------------------------------------------------------------------------- planted violations


def clean_snapshot() -> dict:
    """Two payments as a quiet run leaves them: ch_1 succeeded (and half
    refunded), ch_2 failed; the rail agrees; every event delivered to both
    endpoints of merchant m."""
    ref1, ref2, rref = "r-1", "r-2", "rr-1"
    snap = {
        "charges": [
            {"id": "ch_1", "payment_intent_id": "pi_1", "rail_reference": ref1, "amount": 1500,
             "currency": "EUR", "status": "succeeded", "failure_code": None, "rail_transaction_id": "4242",
             "prompt_expired": False},
            {"id": "ch_2", "payment_intent_id": "pi_2", "rail_reference": ref2, "amount": 900,
             "currency": "EUR", "status": "failed", "failure_code": "APPROVAL_REJECTED",
             "prompt_expired": False},
        ],
        "intents": [{"id": "pi_1", "merchant_id": "m", "status": "succeeded"},
                    {"id": "pi_2", "merchant_id": "m", "status": "requires_payment_method"}],
        "events": [
            {"id": "evt_1", "type": "payment_intent.processing", "payment_intent_id": "pi_1",
             "charge_id": "ch_1", "refund_id": None, "expired": False},
            {"id": "evt_2", "type": "payment_intent.succeeded", "payment_intent_id": "pi_1",
             "charge_id": "ch_1", "refund_id": None, "expired": None},
            {"id": "evt_3", "type": "payment_intent.processing", "payment_intent_id": "pi_2",
             "charge_id": "ch_2", "refund_id": None, "expired": False},
            {"id": "evt_4", "type": "payment_intent.payment_failed", "payment_intent_id": "pi_2",
             "charge_id": "ch_2", "refund_id": None, "expired": None},
            {"id": "evt_5", "type": "refund.succeeded", "payment_intent_id": "pi_1",
             "charge_id": "ch_1", "refund_id": "re_1", "expired": None},
        ],
        "refunds": [{"id": "re_1", "charge_id": "ch_1", "rail_reference": rref, "amount": 750,
                     "status": "succeeded", "failure_code": None}],
        "jobs": [{"kind": "scan", "dedupe_key": "scan:live", "dead": False, "leased": False,
                  "last_error": None}],
        "alerts": [],
        "audit": [
            {"tbl": "payment_intents", "row_id": "pi_1", "old_status": None, "new_status": "processing",
             "what": "insert"},
            {"tbl": "charges", "row_id": "ch_1", "old_status": None, "new_status": "pending", "what": "insert"},
            {"tbl": "payment_intents", "row_id": "pi_2", "old_status": None, "new_status": "processing",
             "what": "insert"},
            {"tbl": "charges", "row_id": "ch_2", "old_status": None, "new_status": "pending", "what": "insert"},
            {"tbl": "charges", "row_id": "ch_1", "old_status": "pending", "new_status": "succeeded",
             "what": "status"},
            {"tbl": "payment_intents", "row_id": "pi_1", "old_status": "processing",
             "new_status": "succeeded", "what": "status"},
            {"tbl": "charges", "row_id": "ch_2", "old_status": "pending", "new_status": "failed",
             "what": "status"},
            {"tbl": "payment_intents", "row_id": "pi_2", "old_status": "processing",
             "new_status": "requires_payment_method", "what": "status"},
            {"tbl": "refunds", "row_id": "re_1", "old_status": None, "new_status": "pending", "what": "insert"},
            {"tbl": "refunds", "row_id": "re_1", "old_status": "pending", "new_status": "succeeded",
             "what": "status"},
        ],
        "endpoints": [{"id": "we_a", "merchant_id": "m"}, {"id": "we_b", "merchant_id": "m"}],
        "rail": {"transactions": {ref1: {"status": "SUCCESSFUL", "reason": None, "amount": "15.00",
                                         "transaction_id": "4242"},
                                  ref2: {"status": "FAILED", "reason": "APPROVAL_REJECTED", "amount": "9.00"}},
                 "refunds": {rref: {"status": "SUCCESSFUL", "reason": None, "amount": "7.50"}}},
        "delivered": {"we_a": ["evt_1", "evt_2", "evt_3", "evt_4", "evt_5"],
                      "we_b": ["evt_1", "evt_2", "evt_3", "evt_4", "evt_5"]},
        "bad_signatures": [],
        "quiescent": True,
        "unquiet": {},
    }
    return snap


def _charge(snap, cid):
    return next(c for c in snap["charges"] if c["id"] == cid)


def _plant_rail_failed_our_success(snap):
    snap["rail"]["transactions"]["r-1"] = {"status": "FAILED", "reason": "APPROVAL_REJECTED", "amount": "15.00"}


def _plant_never_delivered(snap):
    snap["delivered"]["we_b"].remove("evt_4")


def _plant_second_terminal(snap):
    snap["audit"] += [
        {"tbl": "charges", "row_id": "ch_2", "old_status": "failed", "new_status": "succeeded", "what": "status"}]


def _plant_missing_event(snap):
    snap["events"] = [e for e in snap["events"] if e["id"] != "evt_2"]
    for ids in snap["delivered"].values():
        ids.remove("evt_2")


def _plant_duplicate_event(snap):
    snap["events"].append({"id": "evt_9", "type": "payment_intent.payment_failed", "payment_intent_id": "pi_2",
                           "charge_id": "ch_2", "refund_id": None, "expired": None})
    for ids in snap["delivered"].values():
        ids.append("evt_9")


def _plant_pending_without_work(snap):
    c = _charge(snap, "ch_2")
    c.update(status="pending", failure_code=None)
    snap["intents"][1]["status"] = "processing"
    snap["rail"]["transactions"]["r-2"] = {"status": "PENDING", "reason": None, "amount": "9.00"}
    snap["audit"] = [a for a in snap["audit"] if a["row_id"] not in ("ch_2", "pi_2") or a["what"] == "insert"]
    snap["events"] = [e for e in snap["events"] if e["id"] != "evt_4"]
    for ids in snap["delivered"].values():
        ids.remove("evt_4")


def _plant_dead_poll(snap):
    _plant_pending_without_work(snap)
    snap["jobs"].append({"kind": "poll", "dedupe_key": "poll:ch_2", "dead": True, "leased": False,
                         "last_error": "planted"})


def _plant_over_refund(snap):
    snap["refunds"].append({"id": "re_2", "charge_id": "ch_1", "rail_reference": "rr-2", "amount": 800,
                            "status": "pending", "failure_code": None})
    snap["jobs"].append({"kind": "refund_poll", "dedupe_key": "refund_poll:re_2", "dead": False,
                         "leased": False, "last_error": None})


def _plant_rail_success_we_pending_no_alert(snap):
    _plant_pending_without_work(snap)
    snap["jobs"].append({"kind": "poll", "dedupe_key": "poll:ch_2", "dead": False, "leased": False,
                         "last_error": None})
    snap["rail"]["transactions"]["r-2"] = {"status": "SUCCESSFUL", "reason": None, "amount": "9.00"}


def _plant_backwards(snap):
    snap["audit"].append({"tbl": "payment_intents", "row_id": "pi_1", "old_status": "succeeded",
                          "new_status": "processing", "what": "status"})


def _plant_bad_signature(snap):
    snap["bad_signatures"].append({"endpoint_id": "we_a", "error": "WebhookVerificationError"})


def _plant_wrong_amount(snap):
    snap["rail"]["transactions"]["r-1"]["amount"] = "14.99"


def _plant_failed_while_rail_pending(snap):
    snap["rail"]["transactions"]["r-2"] = {"status": "PENDING", "reason": None, "amount": "9.00"}


def _plant_fabricated_decline(snap):
    del snap["rail"]["transactions"]["r-2"]  # the rail never had it, yet we say the payer declined


def _plant_other_transaction_id(snap):
    _charge(snap, "ch_1")["rail_transaction_id"] = "9999"


def _plant_intent_astray(snap):
    snap["intents"][0]["status"] = "requires_payment_method"


PLANTED = {
    "rail failed a charge we succeeded": (_plant_rail_failed_our_success, "ledger"),
    "an event never delivered": (_plant_never_delivered, "delivered"),
    "a second terminal transition": (_plant_second_terminal, "terminal_once"),
    "a transition without its event": (_plant_missing_event, "events_match"),
    "an event without its transition": (_plant_duplicate_event, "events_match"),
    "a pending charge without a poll job": (_plant_pending_without_work, "live_work"),
    "a dead-lettered poll": (_plant_dead_poll, "dead_letter"),
    "refunds above the charge": (_plant_over_refund, "refunds_bounded"),
    "a rail success pending without an alert": (_plant_rail_success_we_pending_no_alert, "ledger"),
    "a status moving backwards": (_plant_backwards, "no_backwards"),
    "a bad signature": (_plant_bad_signature, "signed"),
    "the rail collected another amount": (_plant_wrong_amount, "ledger"),
    "failed while the rail holds it pending": (_plant_failed_while_rail_pending, "ledger"),
    "an intent that does not follow its charge": (_plant_intent_astray, "intent_follows"),
    "a decline the rail never recorded": (_plant_fabricated_decline, "ledger"),
    "another rail transaction id": (_plant_other_transaction_id, "ledger"),
}


def test_clean_snapshot_passes():
    assert chaos_checks.run_all(clean_snapshot()) == []


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_checks_catch_planted_violations(name):
    plant, check = PLANTED[name]
    snap = clean_snapshot()
    plant(snap)
    found = chaos_checks.run_all(snap)
    assert check in {v["check"] for v in found}, found


def test_an_unquiet_run_is_a_violation():
    snap = clean_snapshot()
    snap.update(quiescent=False, unquiet={"live_jobs": 3})
    assert [v["check"] for v in chaos_checks.run_all(snap)] == ["quiescent"]


def test_a_mixed_rail_plan_keeps_momos_plan_and_shapes_each_rails_payments():
    """``--rails``: a MoMo-only plan is the plan (and digest) it always was;
    a mixed one spreads payments over the three rails with the same expected
    outcomes, M-Pesa amounts in whole shillings, no refunds off MoMo."""
    from chaos_schedule import make_plan
    momo = make_plan(5, 60, 10, 5.0)
    assert momo.digest() == make_plan(5, 60, 10, 5.0, rails=("mtn",)).digest()
    mixed = make_plan(5, 60, 10, 5.0, rails=("mtn", "mpesa", "pawapay"))
    assert {p.rail for p in mixed.payments} == {"mtn", "mpesa", "pawapay"}
    assert [p.expect for p in mixed.payments] == [p.expect for p in momo.payments]
    assert mixed.faults == momo.faults
    for p in mixed.payments:
        if p.rail == "mpesa":
            assert p.amount % 100 == 0 and p.payer.startswith("2547") and not p.refunds
        if p.rail == "pawapay":
            assert p.payer.startswith("2607") and not p.refunds
    with pytest.raises(ValueError):
        make_plan(5, 6, 1, 5.0, rails=("airtel",))
