"""Conformance of the M-Pesa (vpay/sandbox/mpesa.py) and pawaPay
(vpay/sandbox/pawapay.py) sandboxes: real HTTP on 127.0.0.1, driven by
vpay's own adapters for every scripted payer, refusing what the real rails
refuse, and (where a published client installs beside vpay: ``mpesakit``)
driven by that client too, so the double's shapes are not only ours. No
database, no process."""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest
import requests

from vpay.rails.mpesa import MpesaDaraja
from vpay.rails.pawapay import PawaPay
from vpay.rails.port import ChargeRequest, RefundRequest, StatusKind, SubmitKind
from vpay.sandbox.mpesa import MpesaSandbox
from vpay.sandbox.pawapay import PawaPaySandbox

CALLBACK = "http://127.0.0.1:9/provider/mpesa/callback"


@pytest.fixture(scope="module")
def daraja():
    with MpesaSandbox() as double:
        yield double


@pytest.fixture
def mpesa(daraja):
    daraja.reset()
    return MpesaDaraja.from_env(daraja.env(CALLBACK), sleep=lambda s: None)


@pytest.fixture(scope="module")
def pawa():
    with PawaPaySandbox() as double:
        yield double


@pytest.fixture
def pawapay(pawa):
    pawa.reset()
    return PawaPay.from_env(pawa.env(), sleep=lambda s: None)


def kes_charge(payer="254708374149", amount=100_00):
    return ChargeRequest(charge_id="ch_x", rail_reference=str(uuid.uuid4()), amount=amount, currency="KES",
                         payer=payer)


def pushed(mpesa, charge):
    answer = mpesa.request_to_pay(charge)
    assert answer.kind is SubmitKind.ACCEPTED, answer
    return dataclasses.replace(charge, rail_data=dict(answer.rail_data))


@pytest.mark.parametrize("outcome,kind,reason", [
    ("approve", StatusKind.SUCCEEDED, None), ("decline", StatusKind.FAILED, "MPESA_1032"),
    ("expire", StatusKind.FAILED, "MPESA_1037"), ("timeout", StatusKind.FAILED, "MPESA_1019"),
    ("insufficient", StatusKind.FAILED, "MPESA_1"), ("wrong_pin", StatusKind.FAILED, "MPESA_2001"),
])
def test_mpesa_scripted_payers_end_as_scripted_after_the_in_flight_answers(daraja, mpesa, outcome, kind, reason):
    daraja.script_payer("254708374149", outcome, in_flight=2)
    charge = pushed(mpesa, kes_charge())
    assert [mpesa.status(charge).kind for _ in range(2)] == [StatusKind.PENDING] * 2
    answer = mpesa.status(charge)
    assert (answer.kind, answer.reason) == (kind, reason)
    push = daraja.push(charge.rail_reference)
    assert push["amount"] == 100 and push["account_reference"] == charge.rail_reference.replace("-", "")[:12]


def test_mpesa_never_answering_payer_stays_in_flight(daraja, mpesa):
    daraja.script_payer("254708374149", "never")
    charge = pushed(mpesa, kes_charge())
    assert {mpesa.status(charge).reason for _ in range(3)} == {"500.001.1001"}


def test_mpesa_token_revoked_early_is_replaced_within_the_call(daraja, mpesa):
    charge = pushed(mpesa, kes_charge())
    daraja.expire_tokens()
    assert mpesa.status(charge).kind is StatusKind.SUCCEEDED
    assert [e["status_code"] for e in daraja.requests_log() if e["path"].endswith("/query")] == [401, 200]


def test_mpesa_lost_answer_is_read_only_by_the_callbacks_checkout_request_id(daraja, mpesa):
    daraja.lose_next_answers(500)
    charge = kes_charge()
    answer = mpesa.request_to_pay(charge)
    assert (answer.kind, answer.unsent, answer.rail_data) == (SubmitKind.NO_ANSWER, False, {})
    assert mpesa.status(charge).kind is StatusKind.NOT_FOUND                 # no id: nothing to ask
    push = daraja.push(charge.rail_reference)                                # but the payer has the prompt
    body = json.dumps({"Body": {"stkCallback": {"MerchantRequestID": push["merchant"],
                                                "CheckoutRequestID": push["checkout"], "ResultCode": 0}}})
    ids = mpesa.parse_callback({"ref": charge.rail_reference}, body.encode())
    known = dataclasses.replace(charge, rail_data=dict(ids.status_keys))
    assert mpesa.status(known).kind is StatusKind.SUCCEEDED


def test_mpesa_refuses_what_daraja_refuses(daraja, mpesa):
    wrong = MpesaDaraja.from_env(daraja.env(CALLBACK, VPAY_MPESA_PASSKEY="wrong"), sleep=lambda s: None)
    assert wrong.request_to_pay(kes_charge()).kind is SubmitKind.MISCONFIGURED
    bad_key = MpesaDaraja.from_env(daraja.env(CALLBACK, VPAY_MPESA_CONSUMER_SECRET="x"), sleep=lambda s: None)
    assert bad_key.request_to_pay(kes_charge()).kind is SubmitKind.MISCONFIGURED
    unknown = dataclasses.replace(kes_charge(), rail_data={"checkout_request_id": "ws_CO_nope"})
    assert mpesa.status(unknown).kind is StatusKind.NOT_FOUND
    charge = pushed(mpesa, kes_charge())
    daraja.fail_next(500, 429)
    assert mpesa.request_to_pay(kes_charge()).kind is SubmitKind.NO_ANSWER   # system busy: not a decline
    assert mpesa.status(charge).kind is StatusKind.NO_ANSWER                 # spike arrest: no answer
    assert mpesa.status(charge).kind is StatusKind.SUCCEEDED


def test_mpesakit_drives_the_mpesa_sandbox(daraja):
    mpesakit = pytest.importorskip("mpesakit")
    from mpesakit.auth import TokenManager
    from mpesakit.http_client import MpesaHttpClient
    from mpesakit.mpesa_express import StkPush, StkPushQueryRequest, StkPushSimulateRequest
    daraja.reset()
    http = MpesaHttpClient(env="sandbox")
    http.base_url = daraja.url
    tokens = TokenManager(consumer_key=daraja.consumer_key, consumer_secret=daraja.consumer_secret, http_client=http)
    stk = StkPush(http_client=http, token_manager=tokens)
    ref = str(uuid.uuid4())
    pushed_ = stk.push(StkPushSimulateRequest(
        BusinessShortCode=int(daraja.shortcode), Passkey=daraja.passkey, TransactionType="CustomerPayBillOnline",
        Amount=10, PartyA="254708374149", PartyB=daraja.shortcode, PhoneNumber="254708374149",
        CallBackURL=f"https://shop.example/cb?ref={ref}", AccountReference="acc1", TransactionDesc="test"))
    assert pushed_.ResponseCode in ("0", 0) and pushed_.CheckoutRequestID
    queried = stk.query(StkPushQueryRequest(BusinessShortCode=int(daraja.shortcode), Passkey=daraja.passkey,
                                            CheckoutRequestID=pushed_.CheckoutRequestID))
    assert str(queried.ResultCode) == "0"
    del mpesakit


@pytest.mark.parametrize("outcome,kind,reason", [
    ("approve", StatusKind.SUCCEEDED, None), ("decline", StatusKind.FAILED, "INSUFFICIENT_BALANCE"),
    ("expire", StatusKind.FAILED, "PAYMENT_NOT_APPROVED"), ("never", StatusKind.PENDING, "SUBMITTED"),
])
def test_pawapay_scripted_payers(pawa, pawapay, outcome, kind, reason):
    pawa.script_payer("260763456789", outcome, in_flight=1)
    charge = ChargeRequest("ch_p", str(uuid.uuid4()), 1500, "ZMW", "260763456789")
    assert pawapay.request_to_pay(charge).kind is SubmitKind.ACCEPTED
    assert pawapay.status(charge).reason == "ACCEPTED"
    answer = pawapay.status(charge)
    assert (answer.kind, answer.reason) == (kind, reason)
    if kind is StatusKind.SUCCEEDED:
        assert (answer.amount, answer.currency) == (1500, "ZMW") and answer.financial_transaction_id


def test_pawapay_duplicate_deposit_is_already_have_it_and_not_found_lags(pawa, pawapay):
    pawa.script_payer("260763456789", "approve", lag_reads=1)
    charge = ChargeRequest("ch_p", str(uuid.uuid4()), 1500, "ZMW", "260763456789")
    assert pawapay.request_to_pay(charge).kind is SubmitKind.ACCEPTED
    again = pawapay.request_to_pay(charge)
    assert again.kind is SubmitKind.ACCEPTED and again.reason == "DUPLICATE_IGNORED"
    assert pawapay.status(charge).kind is StatusKind.NOT_FOUND
    assert pawapay.status(charge).kind is StatusKind.SUCCEEDED
    refund = RefundRequest("re_p", str(uuid.uuid4()), charge.rail_reference, 500, "ZMW", charge.payer)
    assert pawapay.refund(refund).kind is SubmitKind.ACCEPTED
    assert pawapay.refund_status(refund).kind is StatusKind.PENDING
    assert pawapay.refund_status(refund).kind is StatusKind.SUCCEEDED


def test_pawapay_refuses_what_pawapay_refuses(pawa, pawapay):
    wrong = PawaPay.from_env(pawa.env(VPAY_PAWAPAY_API_TOKEN="nope"), sleep=lambda s: None)
    charge = ChargeRequest("ch_p", str(uuid.uuid4()), 1500, "ZMW", "260763456789")
    assert wrong.request_to_pay(charge).kind is SubmitKind.MISCONFIGURED
    other = PawaPay.from_env(pawa.env(VPAY_PAWAPAY_PROVIDERS="260=NOT_A_PROVIDER:ZMW"), sleep=lambda s: None)
    assert other.request_to_pay(charge).kind is SubmitKind.MISCONFIGURED
    resp = requests.post(f"{pawa.url}/v2/deposits", json={"depositId": "x"}, timeout=5,
                         headers={"Authorization": f"Bearer {pawa.api_token}"})
    assert resp.status_code == 400 and resp.json()["failureReason"]["failureCode"] == "INVALID_PARAMETER"
