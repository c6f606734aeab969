"""Unit tests for the M-Pesa Daraja adapter (vpay/rails/mpesa.py): every
documented answer of the token, STK Push and STK Push Query endpoints, faked
with ``responses`` (docs/flows/mpesa.md has the shapes and their sources).
Nothing sleeps; no database."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import logging
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import responses

from vpay.rails import build_rail
from vpay.rails.mpesa import MpesaDaraja, account_reference, password, timestamp
from vpay.rails.port import ChargeRequest, MalformedCallback, RailError, RefundRequest, StatusKind, SubmitKind, creation_problem

BASE = "https://daraja.test"
TOKEN_URL = f"{BASE}/oauth/v1/generate"
PUSH_URL = f"{BASE}/mpesa/stkpush/v1/processrequest"
QUERY_URL = f"{BASE}/mpesa/stkpushquery/v1/query"
REFERENCE = "3f2c1b7e-9a4d-4c2e-8f1a-5b6d7e8f9a0b"
CHECKOUT = "ws_CO_DMZ_123212312_2342347678234"
KEY, SECRET, PASSKEY = "key-SECRET-1111", "secret-SECRET-2222", "passkey-SECRET-3333"
TOKEN, TOKEN2 = "token-SECRET-4444", "token-SECRET-5555"
SECRETS = (KEY, SECRET, PASSKEY, TOKEN, TOKEN2)
CALLBACK = "https://pay.example/provider/mpesa/callback"
NOW = dt.datetime(2026, 12, 4, 21, 30, 5, tzinfo=dt.timezone.utc)   # 00:30:05 next day in Nairobi

CHARGE = ChargeRequest(charge_id="ch_1", rail_reference=REFERENCE, amount=150_00, currency="KES",
                       payer="254708374149", description="Order 42 for a long desc")
SUBMITTED = dataclasses.replace(CHARGE, rail_data={"checkout_request_id": CHECKOUT})
PUSH_OK = {"MerchantRequestID": "16813-1590513-1", "CheckoutRequestID": CHECKOUT, "ResponseCode": "0",
           "ResponseDescription": "Success. Request accepted for processing",
           "CustomerMessage": "Success. Request accepted for processing"}
ENV = {"VPAY_MPESA_BASE_URL": BASE, "VPAY_MPESA_CONSUMER_KEY": KEY, "VPAY_MPESA_CONSUMER_SECRET": SECRET,
       "VPAY_MPESA_SHORTCODE": "174379", "VPAY_MPESA_PASSKEY": PASSKEY, "VPAY_MPESA_CALLBACK_URL": CALLBACK}


def query_answer(result_code, desc="x"):
    return {"ResponseCode": "0", "ResponseDescription": "The service request has been accepted successsfully",
            "MerchantRequestID": "16813-1590513-1", "CheckoutRequestID": CHECKOUT,
            "ResultCode": result_code, "ResultDesc": desc}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def rail(clock):
    return MpesaDaraja.from_env(ENV, clock=clock, sleep=lambda s: None, now=lambda: NOW)


def token(rsps, value=TOKEN, expires="3599"):
    rsps.add(responses.GET, TOKEN_URL, json={"access_token": value, "expires_in": expires})


def test_password_and_timestamp_follow_daraja_in_kenya_time():
    assert timestamp(NOW) == "20261205003005"
    assert base64.b64decode(password("174379", "pk", "20261205003005")) == b"174379pk20261205003005"
    assert account_reference(REFERENCE) == "3f2c1b7e9a4d"


@responses.activate
def test_stk_push_sends_daraja_body_and_keeps_the_checkout_request_id(rail):
    token(responses)
    responses.add(responses.POST, PUSH_URL, json=PUSH_OK)
    answer = rail.request_to_pay(CHARGE)
    assert answer.kind is SubmitKind.ACCEPTED
    assert answer.rail_data == {"checkout_request_id": CHECKOUT, "merchant_request_id": "16813-1590513-1"}
    sent = json.loads(responses.calls[1].request.body)
    assert sent["Amount"] == 150 and sent["PartyA"] == sent["PhoneNumber"] == "254708374149"
    assert sent["BusinessShortCode"] == sent["PartyB"] == "174379"
    assert sent["Timestamp"] == "20261205003005"
    assert sent["Password"] == password("174379", PASSKEY, "20261205003005")
    assert sent["TransactionType"] == "CustomerPayBillOnline"
    assert sent["AccountReference"] == "3f2c1b7e9a4d" and len(sent["TransactionDesc"]) <= 13
    assert parse_qs(urlsplit(sent["CallBackURL"]).query) == {"ref": [REFERENCE]}
    assert responses.calls[0].request.headers["Authorization"] == \
        "Basic " + base64.b64encode(f"{KEY}:{SECRET}".encode()).decode()
    assert responses.calls[1].request.headers["Authorization"] == f"Bearer {TOKEN}"


def test_creation_refuses_what_mpesa_cannot_carry(rail):
    assert creation_problem(rail, 150_00, "kes", "+254708374149") is None
    assert creation_problem(rail, 150_50, "KES", "254708374149")[0] == "amount"
    assert "whole shillings" in creation_problem(rail, 150_50, "KES", "254708374149")[1]
    assert creation_problem(rail, 100, "UGX", "254708374149")[0] == "currency"
    assert creation_problem(rail, 100, "KES", "256700000001")[0] == "payer"


@responses.activate
def test_a_non_whole_amount_is_never_sent(rail):
    answer = rail.request_to_pay(dataclasses.replace(CHARGE, amount=150_50))
    assert answer.kind is SubmitKind.REJECTED and answer.reason == "UNSUPPORTED_AMOUNT"
    assert len(responses.calls) == 0


@pytest.mark.parametrize("status,body,kind", [
    (400, {"requestId": "1", "errorCode": "400.002.02", "errorMessage": "Bad Request - Invalid PhoneNumber"},
     SubmitKind.REJECTED),
    (400, {"requestId": "1", "errorCode": "400.002.02", "errorMessage": "Bad Request - Invalid BusinessShortCode"},
     SubmitKind.MISCONFIGURED),
    (400, {"requestId": "1", "errorCode": "400.002.02", "errorMessage": "Bad Request - Invalid CallBackURL"},
     SubmitKind.MISCONFIGURED),
    (403, {"requestId": "1", "errorCode": "403.001.01", "errorMessage": "forbidden"}, SubmitKind.MISCONFIGURED),
    (500, {"requestId": "1", "errorCode": "500.001.1001",
           "errorMessage": "Unable to lock subscriber, a transaction is already in process for the current subscriber"},
     SubmitKind.NO_ANSWER),
    (500, {"requestId": "1", "errorCode": "500.003.02", "errorMessage": "System is busy"}, SubmitKind.NO_ANSWER),
    (200, {"ResponseCode": "0"}, SubmitKind.NO_ANSWER),
])
@responses.activate
def test_push_answers(rail, status, body, kind):
    token(responses)
    responses.add(responses.POST, PUSH_URL, status=status, json=body)
    assert rail.request_to_pay(CHARGE).kind is kind


@responses.activate
def test_push_is_not_retried_once_sent(rail):
    token(responses)
    responses.add(responses.POST, PUSH_URL, status=503, json={"errorCode": "503.001.01"})
    assert rail.request_to_pay(CHARGE).kind is SubmitKind.NO_ANSWER
    assert sum(1 for c in responses.calls if c.request.url == PUSH_URL) == 1


@responses.activate
def test_token_refused_is_misconfigured_never_a_decline(rail):
    responses.add(responses.GET, TOKEN_URL, status=400,
                  json={"errorCode": "400.008.01", "errorMessage": "Invalid Authentication passed"})
    assert rail.request_to_pay(CHARGE).kind is SubmitKind.MISCONFIGURED
    assert rail.status(SUBMITTED).kind is StatusKind.MISCONFIGURED


@responses.activate
def test_a_token_expired_early_is_fetched_again_within_the_call(rail):
    token(responses, TOKEN)
    token(responses, TOKEN2)
    responses.add(responses.POST, QUERY_URL, status=401,
                  json={"requestId": "1", "errorCode": "404.001.03", "errorMessage": "Invalid Access Token"})
    responses.add(responses.POST, QUERY_URL, json=query_answer("0"))
    assert rail.status(SUBMITTED).kind is StatusKind.SUCCEEDED
    bearers = [c.request.headers["Authorization"] for c in responses.calls if c.request.url == QUERY_URL]
    assert bearers == [f"Bearer {TOKEN}", f"Bearer {TOKEN2}"]


@pytest.mark.parametrize("code,kind,reason", [
    ("0", StatusKind.SUCCEEDED, None), (0, StatusKind.SUCCEEDED, None),
    ("1032", StatusKind.FAILED, "MPESA_1032"), ("1037", StatusKind.FAILED, "MPESA_1037"),
    ("1", StatusKind.FAILED, "MPESA_1"), ("2001", StatusKind.FAILED, "MPESA_2001"),
    ("1019", StatusKind.FAILED, "MPESA_1019"),
    ("4711", StatusKind.NO_ANSWER, None), (None, StatusKind.NO_ANSWER, None),
])
@responses.activate
def test_query_result_codes(rail, code, kind, reason):
    token(responses)
    responses.add(responses.POST, QUERY_URL, json=query_answer(code))
    answer = rail.status(SUBMITTED)
    assert answer.kind is kind and answer.reason == reason
    sent = json.loads(responses.calls[1].request.body)
    assert sent == {"BusinessShortCode": "174379", "Password": password("174379", PASSKEY, "20261205003005"),
                    "Timestamp": "20261205003005", "CheckoutRequestID": CHECKOUT}


@responses.activate
def test_in_flight_500_001_1001_is_pending_never_a_failure(rail):
    token(responses)
    responses.add(responses.POST, QUERY_URL, status=500, json={
        "requestId": "ws_CO_1", "errorCode": "500.001.1001", "errorMessage": "The transaction is being processed"})
    answer = rail.status(SUBMITTED)
    assert answer.kind is StatusKind.PENDING and answer.reason == "500.001.1001"
    assert not answer.terminal


@pytest.mark.parametrize("status,body,kind", [
    (500, {"requestId": "1", "errorCode": "500.003.02", "errorMessage": "System is busy"}, StatusKind.NO_ANSWER),
    (500, {"requestId": "1", "errorCode": "500.003.03", "errorMessage": "Quota Violation"}, StatusKind.NO_ANSWER),
    (429, {"fault": {"faultstring": "Spike arrest violation"}}, StatusKind.NO_ANSWER),
    (400, {"requestId": "1", "errorCode": "400.002.02", "errorMessage": "Bad Request - Invalid CheckoutRequestID"},
     StatusKind.NOT_FOUND),
    (403, {"errorCode": "403.001.01"}, StatusKind.MISCONFIGURED),
    (200, b"<html>", StatusKind.NO_ANSWER),
    (200, {**query_answer("0"), "CheckoutRequestID": "ws_CO_other"}, StatusKind.NO_ANSWER),
])
@responses.activate
def test_query_error_answers(rail, status, body, kind):
    token(responses)
    if isinstance(body, bytes):
        responses.add(responses.POST, QUERY_URL, status=status, body=body)
    else:
        responses.add(responses.POST, QUERY_URL, status=status, json=body)
    assert rail.status(SUBMITTED).kind is kind


@responses.activate
def test_no_checkout_request_id_is_not_found_without_asking(rail):
    answer = rail.status(CHARGE)
    assert answer.kind is StatusKind.NOT_FOUND and answer.reason == "NO_CHECKOUT_REQUEST_ID"
    assert len(responses.calls) == 0


def test_refunds_are_refused_without_a_request(rail):
    refund = RefundRequest("re_1", REFERENCE, REFERENCE, 100, "KES", "254708374149")
    assert rail.refund(refund).kind is SubmitKind.REJECTED
    assert rail.refund_status(refund).kind is StatusKind.NOT_FOUND


def test_callback_gives_identifiers_only(rail):
    body = json.dumps({"Body": {"stkCallback": {"MerchantRequestID": "m1", "CheckoutRequestID": CHECKOUT,
                                                "ResultCode": 0, "ResultDesc": "ok"}}}).encode()
    ids = rail.parse_callback({"ref": REFERENCE.upper()}, body)
    assert ids.rail_reference == REFERENCE and ids.hints == {"MerchantRequestID": "m1", "CheckoutRequestID": CHECKOUT}
    assert ids.status_keys == {"checkout_request_id": CHECKOUT}     # an identifier, never the ResultCode
    assert rail.parse_callback({"ref": REFERENCE}, b"").status_keys == {}
    with pytest.raises(MalformedCallback):
        rail.parse_callback({}, body)
    with pytest.raises(MalformedCallback):
        rail.parse_callback({"ref": REFERENCE}, b"[1]")


def test_configuration_is_named_never_shown(monkeypatch):
    with pytest.raises(RailError) as err:
        MpesaDaraja.from_env({k: v for k, v in ENV.items() if k != "VPAY_MPESA_PASSKEY"})
    assert "VPAY_MPESA_PASSKEY" in str(err.value)
    monkeypatch.setattr("os.environ", {})
    rail = MpesaDaraja.from_env(ENV)
    assert all(s not in repr(rail) for s in SECRETS)


@responses.activate
def test_credentials_never_reach_a_log(rail, caplog):
    caplog.set_level(logging.DEBUG)
    responses.add(responses.GET, TOKEN_URL, status=401, json={"errorMessage": TOKEN})
    rail.request_to_pay(CHARGE)
    token(responses)
    responses.add(responses.POST, QUERY_URL, status=500, json={"errorCode": "500.003.02"})
    rail.status(SUBMITTED)
    assert all(s not in caplog.text for s in SECRETS)


def test_build_rail_knows_mpesa(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    assert build_rail("mpesa").code == "mpesa"


@responses.activate
def test_a_failed_token_fetch_is_remembered_briefly(rail, clock):
    responses.add(responses.GET, TOKEN_URL, status=500, json={})
    assert rail.status(SUBMITTED).kind is StatusKind.NO_ANSWER
    fetches = len(responses.calls)
    assert rail.status(SUBMITTED).kind is StatusKind.NO_ANSWER
    assert len(responses.calls) == fetches          # within 15 s: not asked again
    clock.now += 16
    responses.replace(responses.GET, TOKEN_URL, json={"access_token": TOKEN, "expires_in": "3599"})
    responses.add(responses.POST, QUERY_URL, json=query_answer("0"))
    assert rail.status(SUBMITTED).kind is StatusKind.SUCCEEDED


def test_mpesa_is_not_resend_safe_and_the_other_rails_are():
    from vpay.rails.mtn import MtnMomo
    from vpay.rails.orange import OrangeMoney
    from vpay.rails.pawapay import PawaPay
    from vpay.rails.port import resend_safe
    assert resend_safe(MpesaDaraja) is False
    assert all(resend_safe(cls) for cls in (MtnMomo, OrangeMoney, PawaPay))
    assert resend_safe(object()) is True       # a double that does not say keeps the old rule


@responses.activate
def test_a_push_that_may_have_left_is_never_called_unsent(rail):
    token(responses)
    responses.add(responses.POST, PUSH_URL, status=503, json={"errorCode": "503.001.01"})
    assert rail.request_to_pay(CHARGE).unsent is False
    responses.replace(responses.POST, PUSH_URL, body=requests.ReadTimeout("read timed out"))
    answer = rail.request_to_pay(CHARGE)
    assert (answer.kind, answer.unsent) == (SubmitKind.NO_ANSWER, False)   # a timeout after sending


@responses.activate
def test_a_push_that_never_left_is_unsent(rail, clock):
    responses.add(responses.GET, TOKEN_URL, status=500, json={})           # no token: no push
    answer = rail.request_to_pay(CHARGE)
    assert (answer.kind, answer.unsent) == (SubmitKind.NO_ANSWER, True)
    assert rail.request_to_pay(CHARGE).unsent is True                        # the remembered failure too
    assert not any(c.request.url == PUSH_URL for c in responses.calls)
    clock.now += 16
    token(responses)
    responses.replace(responses.GET, TOKEN_URL, json={"access_token": TOKEN, "expires_in": "3599"})
    responses.add(responses.POST, PUSH_URL, body=requests.ConnectTimeout("connect timed out"))
    answer = rail.request_to_pay(CHARGE)
    assert (answer.kind, answer.unsent) == (SubmitKind.NO_ANSWER, True)    # the connection was never made


@responses.activate
def test_a_refused_connection_is_unsent_and_a_reset_is_not(rail):
    from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError
    token(responses)
    refused = requests.ConnectionError(MaxRetryError(None, "/", reason=NewConnectionError(None, "refused")))
    responses.add(responses.POST, PUSH_URL, body=refused)
    assert rail.request_to_pay(CHARGE).unsent is True
    reset = requests.ConnectionError(ProtocolError("Connection aborted.", ConnectionResetError()))
    responses.replace(responses.POST, PUSH_URL, body=reset)
    answer = rail.request_to_pay(CHARGE)
    assert (answer.kind, answer.unsent) == (SubmitKind.NO_ANSWER, False)   # it may have been read first
