"""Unit tests for MoMo refunds in the MTN adapter (vpay/rails/mtn.py):
``refund`` and ``refund_status`` over the Disbursement product.

HTTP is faked with ``responses``; time is injected, nothing sleeps, no
database.
"""

from __future__ import annotations

import base64
import json
import logging

import pytest
import requests
import responses

from vpay.rails.mtn import MtnMomo
from vpay.rails.port import ChargeRequest, RefundRequest, StatusKind, SubmitKind

BASE = "https://momo.test"
COLLECTION_TOKEN_URL = f"{BASE}/collection/token/"
TOKEN_URL = f"{BASE}/disbursement/token/"
REFUND_URL = f"{BASE}/disbursement/v1_0/refund"
REFERENCE = "0b7d7c2e-4f1a-4c3b-9a2d-1e2f3a4b5c6d"
CHARGE_REFERENCE = "3f2c1b7e-9a4d-4c2e-8f1a-5b6d7e8f9a0b"
STATUS_URL = f"{REFUND_URL}/{REFERENCE}"
RTP_STATUS_URL = f"{BASE}/collection/v1_0/requesttopay/{CHARGE_REFERENCE}"

SUBSCRIPTION_KEY = "subkey-SECRET-1111"
API_USER = "apiuser-SECRET-2222"
API_KEY = "apikey-SECRET-3333"
D_SUBSCRIPTION_KEY = "disb-subkey-SECRET-6666"
D_API_USER = "disb-user-SECRET-7777"
D_API_KEY = "disb-key-SECRET-8888"
ACCESS_TOKEN = "token-SECRET-4444"
SECOND_TOKEN = "token-SECRET-5555"
COLLECTION_TOKEN = "token-SECRET-9999"
SECRETS = (SUBSCRIPTION_KEY, API_USER, API_KEY, D_SUBSCRIPTION_KEY, D_API_USER, D_API_KEY,
           ACCESS_TOKEN, SECOND_TOKEN, COLLECTION_TOKEN,
           base64.b64encode(f"{D_API_USER}:{D_API_KEY}".encode()).decode())

REFUND = RefundRequest(refund_id="re_123", rail_reference=REFERENCE,
                       charge_rail_reference=CHARGE_REFERENCE, amount=1050, currency="EUR",
                       payer="46733123454")
CHARGE = ChargeRequest(charge_id="ch_123", rail_reference=CHARGE_REFERENCE, amount=1050,
                       currency="EUR", payer="46733123454")


@pytest.fixture
def rsps():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def adapter(sleeps):
    return MtnMomo(BASE, SUBSCRIPTION_KEY, API_USER, API_KEY, target_environment="mtnuganda",
                   callback_url="https://hooks.example/provider/mtn/callback",
                   clock=lambda: 1000.0, sleep=sleeps.append,
                   disbursement_subscription_key=D_SUBSCRIPTION_KEY,
                   disbursement_api_user=D_API_USER, disbursement_api_key=D_API_KEY)


def add_token(rsps, token=ACCESS_TOKEN, url=TOKEN_URL):
    rsps.add(responses.POST, url, status=200,
             json={"access_token": token, "token_type": "access_token", "expires_in": 3600})


def calls_to(rsps, url, method=None):
    return [c for c in rsps.calls
            if c.request.url == url and (method is None or c.request.method == method)]


# --- refund ----------------------------------------------------------------------


def test_refund_sends_the_disbursement_request(rsps, adapter):
    add_token(rsps)
    rsps.add(responses.POST, REFUND_URL, status=202)
    submit = adapter.refund(REFUND)
    assert submit.kind is SubmitKind.ACCEPTED and submit.http_status == 202
    [call] = calls_to(rsps, REFUND_URL)
    headers = call.request.headers
    assert headers["X-Reference-Id"] == REFERENCE
    assert headers["X-Target-Environment"] == "mtnuganda"
    assert headers["Ocp-Apim-Subscription-Key"] == D_SUBSCRIPTION_KEY
    assert headers["Authorization"] == f"Bearer {ACCESS_TOKEN}"
    assert "X-Callback-Url" not in headers
    assert json.loads(call.request.body) == {
        "amount": "10.50", "currency": "EUR", "externalId": "re_123",
        "payerMessage": "Refund re_123", "payeeNote": "re_123",
        "referenceIdToRefund": CHARGE_REFERENCE}
    [token_call] = calls_to(rsps, TOKEN_URL)
    assert token_call.request.headers["Ocp-Apim-Subscription-Key"] == D_SUBSCRIPTION_KEY
    basic = base64.b64encode(f"{D_API_USER}:{D_API_KEY}".encode()).decode()
    assert token_call.request.headers["Authorization"] == f"Basic {basic}"


def test_refund_409_is_accepted(rsps, adapter):
    add_token(rsps)
    rsps.add(responses.POST, REFUND_URL, status=409, json={"code": "RESOURCE_ALREADY_EXIST"})
    submit = adapter.refund(REFUND)
    assert submit.kind is SubmitKind.ACCEPTED
    assert submit.reason == "RESOURCE_ALREADY_EXIST"


@pytest.mark.parametrize("http,code,kind", [
    (400, "BAD_REQUEST", SubmitKind.REJECTED),
    (400, None, SubmitKind.REJECTED),
    (500, "NOT_ALLOWED", SubmitKind.MISCONFIGURED),      # issue 12: our configuration, not a rejection
    (500, "INVALID_CURRENCY", SubmitKind.MISCONFIGURED),
    (403, None, SubmitKind.MISCONFIGURED),
    (500, "INTERNAL_PROCESSING_ERROR", SubmitKind.NO_ANSWER),
    (404, "RESOURCE_NOT_FOUND", SubmitKind.NO_ANSWER),
    (429, None, SubmitKind.NO_ANSWER),
])
def test_refund_error_mapping(rsps, adapter, http, code, kind):
    add_token(rsps)
    rsps.add(responses.POST, REFUND_URL, status=http, json={"code": code} if code else {})
    submit = adapter.refund(REFUND)
    assert submit.kind is kind
    assert submit.http_status == http


def test_refund_503_is_retried_then_no_answer(rsps, adapter, sleeps):
    add_token(rsps)
    rsps.add(responses.POST, REFUND_URL, status=503, json={"code": "SERVICE_UNAVAILABLE"})
    submit = adapter.refund(REFUND)
    assert submit.kind is SubmitKind.NO_ANSWER
    calls = calls_to(rsps, REFUND_URL)
    assert len(calls) == 3
    assert {c.request.headers["X-Reference-Id"] for c in calls} == {REFERENCE}
    assert sleeps == [0.2, 0.5]


@pytest.mark.parametrize("exc,reason", [(requests.exceptions.ReadTimeout("slow"), "TIMEOUT"),
                                        (requests.exceptions.ConnectionError("refused"),
                                         "CONNECTION_ERROR")])
def test_refund_transport_failure_is_no_answer(rsps, adapter, exc, reason):
    add_token(rsps)
    rsps.add(responses.POST, REFUND_URL, body=exc)
    submit = adapter.refund(REFUND)
    assert submit.kind is SubmitKind.NO_ANSWER and submit.reason == reason


def test_refund_token_endpoint_down_is_no_answer(rsps, adapter):
    rsps.add(responses.POST, TOKEN_URL, status=500, json={"code": "INTERNAL_PROCESSING_ERROR"})
    assert adapter.refund(REFUND).kind is SubmitKind.NO_ANSWER
    assert calls_to(rsps, REFUND_URL) == []


def test_refund_rejects_a_bad_amount_before_sending(rsps, adapter):
    add_token(rsps)
    with pytest.raises(ValueError):
        adapter.refund(RefundRequest("re_1", REFERENCE, CHARGE_REFERENCE, -1, "EUR", "4673"))
    assert len(rsps.calls) == 0


# --- refund_status ---------------------------------------------------------------


def test_refund_status_pending(rsps, adapter):
    add_token(rsps)
    rsps.add(responses.GET, STATUS_URL, json={"status": "PENDING", "externalId": "re_123"})
    result = adapter.refund_status(REFUND)
    assert result.kind is StatusKind.PENDING and not result.terminal
    [call] = calls_to(rsps, STATUS_URL)
    assert call.request.headers["Ocp-Apim-Subscription-Key"] == D_SUBSCRIPTION_KEY


def test_refund_status_successful_keeps_financial_transaction_id(rsps, adapter):
    add_token(rsps)
    rsps.add(responses.GET, STATUS_URL, json={"status": "SUCCESSFUL", "financialTransactionId": "777",
                                              "payee": {"partyIdType": "MSISDN", "partyId": "4673"}})
    result = adapter.refund_status(REFUND)
    assert result.kind is StatusKind.SUCCEEDED
    assert result.financial_transaction_id == "777"


@pytest.mark.parametrize("reason", ["NOT_ENOUGH_FUNDS", {"code": "NOT_ENOUGH_FUNDS", "message": "x"}])
def test_refund_status_failed_with_reason_in_both_shapes(rsps, adapter, reason):
    add_token(rsps)
    rsps.add(responses.GET, STATUS_URL, json={"status": "FAILED", "reason": reason})
    result = adapter.refund_status(REFUND)
    assert result.kind is StatusKind.FAILED and result.reason == "NOT_ENOUGH_FUNDS"


def test_refund_status_404_is_not_found(rsps, adapter):
    add_token(rsps)
    rsps.add(responses.GET, STATUS_URL, status=404, json={"code": "RESOURCE_NOT_FOUND"})
    result = adapter.refund_status(REFUND)
    assert result.kind is StatusKind.NOT_FOUND and result.reason == "RESOURCE_NOT_FOUND"


@pytest.mark.parametrize("response", [
    {"status": 500, "json": {"code": "INTERNAL_PROCESSING_ERROR"}},
    {"status": 503, "json": {"code": "SERVICE_UNAVAILABLE"}},
    {"status": 200, "body": "not json"},
    {"status": 200, "json": {"status": "WEIRD"}},
    {"status": 200, "json": ["SUCCESSFUL"]},
    {"body": requests.exceptions.ReadTimeout("slow")},
    {"body": requests.exceptions.ConnectionError("refused")},
])
def test_refund_status_errors_are_never_a_decline(rsps, adapter, response):
    add_token(rsps)
    rsps.add(responses.GET, STATUS_URL, **response)
    result = adapter.refund_status(REFUND)
    assert result.kind is StatusKind.NO_ANSWER
    assert not result.terminal


def test_refund_401_renews_only_the_disbursement_token(rsps, adapter):
    add_token(rsps, COLLECTION_TOKEN, COLLECTION_TOKEN_URL)
    rsps.add(responses.GET, RTP_STATUS_URL, json={"status": "PENDING"})
    assert adapter.status(CHARGE).kind is StatusKind.PENDING
    add_token(rsps, ACCESS_TOKEN)
    add_token(rsps, SECOND_TOKEN)
    rsps.add(responses.GET, STATUS_URL, status=401, json={"code": "UNAUTHORIZED"})
    rsps.add(responses.GET, STATUS_URL, json={"status": "PENDING"})
    # the 401 is answered by one new token and one retry, in the same call
    assert adapter.refund_status(REFUND).kind is StatusKind.PENDING
    assert calls_to(rsps, STATUS_URL)[1].request.headers["Authorization"] == f"Bearer {SECOND_TOKEN}"
    assert len(calls_to(rsps, TOKEN_URL)) == 2
    # the collection token survived: the next collection read fetches no token
    assert adapter.status(CHARGE).kind is StatusKind.PENDING
    assert len(calls_to(rsps, COLLECTION_TOKEN_URL)) == 1
    assert calls_to(rsps, RTP_STATUS_URL)[1].request.headers["Authorization"] == f"Bearer {COLLECTION_TOKEN}"


def test_each_product_caches_its_own_token(rsps, adapter):
    add_token(rsps, COLLECTION_TOKEN, COLLECTION_TOKEN_URL)
    add_token(rsps, ACCESS_TOKEN)
    rsps.add(responses.GET, RTP_STATUS_URL, json={"status": "PENDING"})
    rsps.add(responses.GET, STATUS_URL, json={"status": "PENDING"})
    for _ in range(2):
        adapter.status(CHARGE)
        adapter.refund_status(REFUND)
    assert len(calls_to(rsps, COLLECTION_TOKEN_URL)) == 1
    assert len(calls_to(rsps, TOKEN_URL)) == 1
    assert {c.request.headers["Authorization"] for c in calls_to(rsps, STATUS_URL)} == {f"Bearer {ACCESS_TOKEN}"}


# --- configuration -----------------------------------------------------------------

ENV = {"VPAY_MTN_BASE_URL": BASE, "VPAY_MTN_SUBSCRIPTION_KEY": SUBSCRIPTION_KEY,
       "VPAY_MTN_API_USER": API_USER, "VPAY_MTN_API_KEY": API_KEY}


def _refund_once(env, rsps):
    adapter = MtnMomo.from_env(env, sleep=lambda s: None)
    add_token(rsps)
    rsps.add(responses.POST, REFUND_URL, status=202)
    assert adapter.refund(REFUND).kind is SubmitKind.ACCEPTED
    return calls_to(rsps, TOKEN_URL)[-1].request.headers


def test_from_env_disbursement_credentials_fall_back_to_collection(rsps):
    headers = _refund_once(ENV, rsps)
    assert headers["Ocp-Apim-Subscription-Key"] == SUBSCRIPTION_KEY
    assert headers["Authorization"] == "Basic " + base64.b64encode(f"{API_USER}:{API_KEY}".encode()).decode()


def test_from_env_reads_disbursement_credentials(rsps):
    env = dict(ENV, VPAY_MTN_DISBURSEMENT_SUBSCRIPTION_KEY=D_SUBSCRIPTION_KEY,
               VPAY_MTN_DISBURSEMENT_API_USER=D_API_USER, VPAY_MTN_DISBURSEMENT_API_KEY=D_API_KEY)
    headers = _refund_once(env, rsps)
    assert headers["Ocp-Apim-Subscription-Key"] == D_SUBSCRIPTION_KEY
    assert headers["Authorization"] == "Basic " + base64.b64encode(f"{D_API_USER}:{D_API_KEY}".encode()).decode()


def test_from_env_only_some_disbursement_credentials(rsps):
    headers = _refund_once(dict(ENV, VPAY_MTN_DISBURSEMENT_SUBSCRIPTION_KEY=D_SUBSCRIPTION_KEY), rsps)
    assert headers["Ocp-Apim-Subscription-Key"] == D_SUBSCRIPTION_KEY
    assert headers["Authorization"] == "Basic " + base64.b64encode(f"{API_USER}:{API_KEY}".encode()).decode()


def test_no_credential_in_refund_logs_or_answers(rsps, adapter, caplog):
    caplog.set_level(logging.DEBUG)
    add_token(rsps)
    rsps.add(responses.POST, REFUND_URL, status=401, json={"code": "UNAUTHORIZED"})
    rsps.add(responses.GET, STATUS_URL, body=requests.exceptions.ConnectTimeout("t"))
    answers = [adapter.refund(REFUND)]
    rsps.replace(responses.POST, TOKEN_URL, status=401, json={"code": "UNAUTHORIZED"})
    answers.append(adapter.refund_status(REFUND))
    assert any(r.name == "vpay.rails.mtn" for r in caplog.records)
    for record in caplog.records:
        text = record.getMessage() + repr(record.args) + (record.exc_text or "")
        for secret in SECRETS:
            assert secret not in text, f"{record.name} logged a credential"
    for answer in answers:
        assert not any(secret in repr(answer) for secret in SECRETS)
    assert not any(secret in repr(adapter) for secret in SECRETS)
