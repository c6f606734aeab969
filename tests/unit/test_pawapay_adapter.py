"""Unit tests for the pawaPay adapter (vpay/rails/pawapay.py): every
documented answer of the v2 deposits and refunds endpoints, faked with
``responses`` (docs/flows/pawapay.md has the shapes and their sources)."""

from __future__ import annotations

import json
import logging

import pytest
import responses

from vpay.rails import build_rail
from vpay.rails.pawapay import PawaPay, parse_providers
from vpay.rails.port import ChargeRequest, MalformedCallback, RailError, RefundRequest, StatusKind, SubmitKind, creation_problem

BASE = "https://pawapay.test"
DEP = "f4401bd2-1568-4140-bf2d-eb77d2b2b639"
REF = "a1b2c3d4-1568-4140-bf2d-eb77d2b2b639"
TOKEN = "api-token-SECRET-1111"
ENV = {"VPAY_PAWAPAY_BASE_URL": BASE, "VPAY_PAWAPAY_API_TOKEN": TOKEN,
       "VPAY_PAWAPAY_PROVIDERS": "260=MTN_MOMO_ZMB:ZMW, 250=MTN_MOMO_RWA:RWF"}
CHARGE = ChargeRequest(charge_id="ch_1", rail_reference=DEP, amount=1500, currency="ZMW", payer="260763456789")
REFUND = RefundRequest("re_1", REF, DEP, 500, "ZMW", "260763456789")


@pytest.fixture
def rail():
    return PawaPay.from_env(ENV, sleep=lambda s: None)


def found(status, **extra):
    return {"status": "FOUND", "data": {"depositId": DEP, "status": status, "amount": "15.00", "currency": "ZMW",
                                        "country": "ZMB", **extra}}


@responses.activate
def test_deposit_sends_the_v2_body_with_the_configured_provider(rail):
    responses.add(responses.POST, f"{BASE}/v2/deposits",
                  json={"depositId": DEP, "status": "ACCEPTED", "created": "2020-10-19T11:17:01Z"})
    assert rail.request_to_pay(CHARGE).kind is SubmitKind.ACCEPTED
    call = responses.calls[0].request
    assert json.loads(call.body) == {"depositId": DEP, "amount": "15.00", "currency": "ZMW",
                                     "payer": {"type": "MMO", "accountDetails": {"phoneNumber": "260763456789",
                                                                                 "provider": "MTN_MOMO_ZMB"}}}
    assert call.headers["Authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize("status,body,kind", [
    (200, {"depositId": DEP, "status": "DUPLICATE_IGNORED"}, SubmitKind.ACCEPTED),
    (200, {"depositId": DEP, "status": "REJECTED",
           "failureReason": {"failureCode": "INVALID_PHONE_NUMBER", "failureMessage": "x"}}, SubmitKind.REJECTED),
    (200, {"depositId": DEP, "status": "REJECTED",
           "failureReason": {"failureCode": "AMOUNT_OUT_OF_BOUNDS"}}, SubmitKind.REJECTED),
    (200, {"depositId": DEP, "status": "REJECTED",
           "failureReason": {"failureCode": "DEPOSITS_NOT_ALLOWED"}}, SubmitKind.MISCONFIGURED),
    (200, {"depositId": DEP, "status": "REJECTED",
           "failureReason": {"failureCode": "INVALID_CURRENCY"}}, SubmitKind.MISCONFIGURED),
    (200, {"depositId": DEP, "status": "REJECTED",
           "failureReason": {"failureCode": "PROVIDER_TEMPORARILY_UNAVAILABLE"}}, SubmitKind.NO_ANSWER),
    (401, {"failureReason": {"failureCode": "NO_AUTHENTICATION"}}, SubmitKind.MISCONFIGURED),
    (403, {"failureReason": {"failureCode": "AUTHENTICATION_ERROR"}}, SubmitKind.MISCONFIGURED),
    (400, {"failureReason": {"failureCode": "INVALID_INPUT"}}, SubmitKind.MISCONFIGURED),
    (500, {}, SubmitKind.NO_ANSWER),
    (200, {"depositId": DEP, "status": "WHATEVER"}, SubmitKind.NO_ANSWER),
])
@responses.activate
def test_deposit_answers(rail, status, body, kind):
    responses.add(responses.POST, f"{BASE}/v2/deposits", status=status, json=body)
    assert rail.request_to_pay(CHARGE).kind is kind


@pytest.mark.parametrize("body,kind,reason,configuration", [
    (found("ACCEPTED"), StatusKind.PENDING, "ACCEPTED", False),
    (found("SUBMITTED"), StatusKind.PENDING, "SUBMITTED", False),
    (found("PROCESSING"), StatusKind.PENDING, "PROCESSING", False),
    (found("IN_RECONCILIATION"), StatusKind.PENDING, "IN_RECONCILIATION", False),
    (found("COMPLETED", providerTransactionId="ABC123"), StatusKind.SUCCEEDED, None, False),
    (found("FAILED", failureReason={"failureCode": "PAYMENT_NOT_APPROVED"}), StatusKind.FAILED,
     "PAYMENT_NOT_APPROVED", False),
    (found("FAILED", failureReason={"failureCode": "INSUFFICIENT_BALANCE"}), StatusKind.FAILED,
     "INSUFFICIENT_BALANCE", False),
    (found("FAILED", failureReason={"failureCode": "PAYER_NOT_FOUND"}), StatusKind.FAILED, "PAYER_NOT_FOUND", False),
    (found("FAILED", failureReason={"failureCode": "WALLET_LIMIT_REACHED"}), StatusKind.FAILED,
     "WALLET_LIMIT_REACHED", True),
    ({"status": "NOT_FOUND"}, StatusKind.NOT_FOUND, "NOT_FOUND", False),
    ({"status": "FOUND", "data": {"depositId": "someone-else", "status": "COMPLETED"}}, StatusKind.NO_ANSWER, None,
     False),
    (found("DONE?"), StatusKind.NO_ANSWER, None, False),
])
@responses.activate
def test_deposit_status_answers(rail, body, kind, reason, configuration):
    responses.add(responses.GET, f"{BASE}/v2/deposits/{DEP}", json=body)
    answer = rail.status(CHARGE)
    assert (answer.kind, answer.reason, answer.configuration) == (kind, reason, configuration)


@responses.activate
def test_a_completed_deposit_reports_its_amount_and_provider_id(rail):
    responses.add(responses.GET, f"{BASE}/v2/deposits/{DEP}", json=found("COMPLETED", providerTransactionId="ABC1"))
    answer = rail.status(CHARGE)
    assert (answer.amount, answer.currency, answer.financial_transaction_id) == (1500, "ZMW", "ABC1")
    assert answer.disagreement(1500, "ZMW") is None and answer.disagreement(1600, "ZMW") == "other_amount"


@responses.activate
def test_an_unreadable_amount_never_settles(rail):
    responses.add(responses.GET, f"{BASE}/v2/deposits/{DEP}", json=found("COMPLETED") | {
        "data": {**found("COMPLETED")["data"], "amount": 15}})
    assert rail.status(CHARGE).disagreement(1500, "ZMW") == "unreadable"


@pytest.mark.parametrize("status,kind", [(500, StatusKind.NO_ANSWER), (401, StatusKind.MISCONFIGURED),
                                         (403, StatusKind.MISCONFIGURED), (404, StatusKind.NOT_FOUND)])
@responses.activate
def test_status_http_errors(rail, status, kind):
    responses.add(responses.GET, f"{BASE}/v2/deposits/{DEP}", status=status, json={})
    assert rail.status(CHARGE).kind is kind


@responses.activate
def test_refunds_go_through_v2_refunds(rail):
    responses.add(responses.POST, f"{BASE}/v2/refunds", json={"refundId": REF, "status": "ACCEPTED"})
    responses.add(responses.GET, f"{BASE}/v2/refunds/{REF}", json={
        "status": "FOUND", "data": {"refundId": REF, "depositId": DEP, "status": "COMPLETED", "amount": "5.00",
                                    "currency": "ZMW"}})
    assert rail.refund(REFUND).kind is SubmitKind.ACCEPTED
    assert json.loads(responses.calls[0].request.body) == {"refundId": REF, "depositId": DEP, "amount": "5.00",
                                                           "currency": "ZMW"}
    answer = rail.refund_status(REFUND)
    assert answer.kind is StatusKind.SUCCEEDED and answer.amount == 500


def test_unsupported_pairings_are_refused_at_creation_and_never_sent(rail):
    assert creation_problem(rail, 100, "ZMW", "+260763456789") is None
    assert creation_problem(rail, 100, "KES", "260763456789")[0] == "currency"
    assert creation_problem(rail, 100, "KES", "254708374149")[0] == "payer"
    with responses.RequestsMock() as rsps:
        assert rail.request_to_pay(ChargeRequest("ch", DEP, 100, "KES", "254708374149")).kind is SubmitKind.REJECTED
        assert len(rsps.calls) == 0


def test_provider_configuration_is_checked():
    assert parse_providers("260=MTN_MOMO_ZMB:ZMW") == {"260": ("MTN_MOMO_ZMB", "ZMW")}
    for bad in ("", "260=MTN_MOMO_ZMB", "x=MTN:ZMW", "260=A:ZMW,260=B:ZMW"):
        with pytest.raises(RailError):
            parse_providers(bad)
    with pytest.raises(RailError, match="VPAY_PAWAPAY_API_TOKEN"):
        PawaPay.from_env({k: v for k, v in ENV.items() if k != "VPAY_PAWAPAY_API_TOKEN"})


def test_callback_reads_the_deposit_id_only(rail):
    ids = rail.parse_callback({}, json.dumps({"depositId": DEP.upper(), "status": "COMPLETED",
                                              "providerTransactionId": "T1"}).encode())
    assert ids.rail_reference == DEP and ids.hints == {"providerTransactionId": "T1"}
    with pytest.raises(MalformedCallback):
        rail.parse_callback({}, b'{"status": "COMPLETED"}')


@responses.activate
def test_the_token_never_reaches_a_log(rail, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    responses.add(responses.POST, f"{BASE}/v2/deposits", status=403, json={"x": TOKEN})
    rail.request_to_pay(CHARGE)
    assert TOKEN not in caplog.text and TOKEN not in repr(rail)
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    assert build_rail("pawapay").code == "pawapay"
