"""Unit tests for the MTN MoMo Collection adapter (vpay/rails/mtn.py).

HTTP is faked with ``responses``; time is injected (``clock``, ``sleep``), so
nothing here sleeps for real except the one test that measures the bound, and
nothing needs a database.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import responses

from vpay.rails.mtn import MtnMomo, callback_url_with_reference, minor_to_major_string
from vpay.rails.port import CallbackIds, ChargeRequest, MalformedCallback, RailError, StatusKind, SubmitKind

BASE = "https://momo.test"
TOKEN_URL = f"{BASE}/collection/token/"
RTP_URL = f"{BASE}/collection/v1_0/requesttopay"
REFERENCE = "3f2c1b7e-9a4d-4c2e-8f1a-5b6d7e8f9a0b"
STATUS_URL = f"{RTP_URL}/{REFERENCE}"
CALLBACK = "https://hooks.example/provider/mtn/callback?tenant=a"

SUBSCRIPTION_KEY = "subkey-SECRET-1111"
API_USER = "apiuser-SECRET-2222"
API_KEY = "apikey-SECRET-3333"
ACCESS_TOKEN = "token-SECRET-4444"
SECOND_TOKEN = "token-SECRET-5555"
SECRETS = (SUBSCRIPTION_KEY, API_USER, API_KEY, ACCESS_TOKEN, SECOND_TOKEN,
           base64.b64encode(f"{API_USER}:{API_KEY}".encode()).decode())

CHARGE = ChargeRequest(
    charge_id="ch_123",
    rail_reference=REFERENCE,
    amount=1050,
    currency="EUR",
    payer="46733123454",
    description="Order 42",
)


class FakeClock:
    """Monotonic seconds that only move when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rsps():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def adapter(clock, sleeps):
    return MtnMomo(
        base_url=BASE + "/",
        subscription_key=SUBSCRIPTION_KEY,
        api_user=API_USER,
        api_key=API_KEY,
        target_environment="mtnuganda",
        callback_url=CALLBACK,
        clock=clock,
        sleep=sleeps.append,
    )


def add_token(rsps, token=ACCESS_TOKEN, expires_in=3600):
    rsps.add(responses.POST, TOKEN_URL, status=200,
             json={"access_token": token, "token_type": "access_token", "expires_in": expires_in})


def add_status(rsps, status=200, **kwargs):
    rsps.add(responses.GET, STATUS_URL, status=status, **kwargs)


def calls_to(rsps, url, method=None):
    return [c for c in rsps.calls
            if c.request.url == url and (method is None or c.request.method == method)]


# --- status --------------------------------------------------------------------


def test_status_pending(rsps, adapter):
    add_token(rsps)
    add_status(rsps, json={"status": "PENDING", "externalId": "ch_123"})
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.PENDING
    assert not result.terminal
    assert result.http_status == 200


def test_status_successful_keeps_financial_transaction_id(rsps, adapter):
    add_token(rsps)
    add_status(rsps, json={"status": "SUCCESSFUL", "financialTransactionId": "987654321",
                           "amount": "10.50", "currency": "EUR"})
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.SUCCEEDED
    assert result.terminal
    assert result.financial_transaction_id == "987654321"


@pytest.mark.parametrize("code", ["APPROVAL_REJECTED", "EXPIRED", "NOT_ENOUGH_FUNDS",
                                  "PAYER_NOT_FOUND", "COULD_NOT_PERFORM_TRANSACTION",
                                  "INTERNAL_PROCESSING_ERROR"])
@pytest.mark.parametrize("shape", ["string", "object"])
def test_status_failed_with_reason_in_both_shapes(rsps, adapter, code, shape):
    reason = code if shape == "string" else {"code": code, "message": "some text"}
    add_token(rsps)
    add_status(rsps, json={"status": "FAILED", "reason": reason})
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.FAILED
    assert result.reason == code
    assert result.terminal


@pytest.mark.parametrize("code", ["ONGOING", "PAYER_DELAYED"])
@pytest.mark.parametrize("shape", ["string", "object"])
def test_status_failed_but_not_final_is_pending(rsps, adapter, code, shape):
    reason = code if shape == "string" else {"code": code, "message": "wait"}
    add_token(rsps)
    add_status(rsps, json={"status": "FAILED", "reason": reason})
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.PENDING
    assert result.reason == code
    assert not result.terminal


def test_status_404_is_not_found(rsps, adapter):
    add_token(rsps)
    add_status(rsps, status=404, json={"code": "RESOURCE_NOT_FOUND", "message": "nope"})
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.NOT_FOUND
    assert result.http_status == 404


def test_status_401_fetches_a_new_token_and_retries_once_in_the_same_call(rsps, adapter):
    # design/rails.md: a 401 (token revoked early) fetches a new token once before anything else
    rsps.add(responses.POST, TOKEN_URL, json={"access_token": ACCESS_TOKEN, "expires_in": 3600})
    rsps.add(responses.POST, TOKEN_URL, json={"access_token": SECOND_TOKEN, "expires_in": 3600})
    add_status(rsps, status=401, json={"code": "UNAUTHORIZED", "message": "expired"})
    add_status(rsps, json={"status": "PENDING"})

    first = adapter.status(CHARGE)
    assert first.kind is StatusKind.PENDING
    assert len(calls_to(rsps, TOKEN_URL)) == 2
    status_calls = calls_to(rsps, STATUS_URL)
    assert len(status_calls) == 2
    assert status_calls[0].request.headers["Authorization"] == f"Bearer {ACCESS_TOKEN}"
    assert status_calls[1].request.headers["Authorization"] == f"Bearer {SECOND_TOKEN}"

    # the new token is cached: the next call fetches none
    assert adapter.status(CHARGE).kind is StatusKind.PENDING
    assert len(calls_to(rsps, TOKEN_URL)) == 2


def test_status_401_twice_is_misconfigured_after_one_retry(rsps, adapter):
    rsps.add(responses.POST, TOKEN_URL, json={"access_token": ACCESS_TOKEN, "expires_in": 3600})
    rsps.add(responses.POST, TOKEN_URL, json={"access_token": SECOND_TOKEN, "expires_in": 3600})
    add_status(rsps, status=401, json={"code": "UNAUTHORIZED", "message": "expired"})
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.MISCONFIGURED  # the fresh token refused too: our credentials
    assert result.http_status == 401
    assert len(calls_to(rsps, TOKEN_URL)) == 2
    assert len(calls_to(rsps, STATUS_URL)) == 2


def test_status_500_is_no_answer_and_not_retried(rsps, adapter, sleeps):
    add_token(rsps)
    add_status(rsps, status=500, json={"code": "INTERNAL_PROCESSING_ERROR", "message": "x"})
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.NO_ANSWER
    assert result.reason == "INTERNAL_PROCESSING_ERROR"
    assert result.detail
    assert len(calls_to(rsps, STATUS_URL)) == 1
    assert sleeps == []


@pytest.mark.parametrize("http", [502, 503, 504])
def test_status_gateway_errors_are_retried_a_bounded_number_of_times(rsps, adapter, sleeps, http):
    add_token(rsps)
    add_status(rsps, status=http, json={"code": "SERVICE_UNAVAILABLE", "message": "busy"})
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.NO_ANSWER
    assert result.http_status == http
    assert len(calls_to(rsps, STATUS_URL)) == 3
    assert sleeps == [0.2, 0.5]


def test_status_503_then_answer_uses_the_answer(rsps, adapter, sleeps):
    add_token(rsps)
    add_status(rsps, status=503, json={"code": "SERVICE_UNAVAILABLE"})
    add_status(rsps, json={"status": "SUCCESSFUL", "financialTransactionId": "1"})
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.SUCCEEDED
    assert len(calls_to(rsps, STATUS_URL)) == 2
    assert sleeps == [0.2]


@pytest.mark.parametrize("error", [requests.exceptions.ConnectTimeout,
                                   requests.exceptions.ReadTimeout,
                                   requests.exceptions.ConnectionError])
def test_status_transport_errors_are_no_answer_after_bounded_retries(rsps, adapter, error):
    add_token(rsps)
    add_status(rsps, body=error("boom"))
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.NO_ANSWER
    assert result.http_status is None
    assert result.reason in {"TIMEOUT", "CONNECTION_ERROR"}
    assert result.detail and "boom" not in result.detail
    assert len(calls_to(rsps, STATUS_URL)) == 3


def test_status_retries_take_seconds_not_minutes_with_real_sleep(rsps):
    real = MtnMomo(BASE, SUBSCRIPTION_KEY, API_USER, API_KEY)
    add_token(rsps)
    add_status(rsps, status=503)
    started = time.monotonic()
    result = real.status(CHARGE)
    elapsed = time.monotonic() - started
    assert result.kind is StatusKind.NO_ANSWER
    assert len(calls_to(rsps, STATUS_URL)) == 3
    assert 0.6 <= elapsed < 5.0


@pytest.mark.parametrize("kwargs", [
    {"body": b"<html>gateway</html>"},
    {"body": b""},
    {"json": {"amount": "10.50"}},
    {"json": {"status": "DONE"}},
    {"json": {"status": None}},
    {"json": ["SUCCESSFUL"]},
], ids=["html", "empty", "no-status", "unknown-status", "null-status", "list"])
def test_status_malformed_200_is_no_answer(rsps, adapter, kwargs):
    add_token(rsps)
    add_status(rsps, **kwargs)
    result = adapter.status(CHARGE)
    assert result.kind is StatusKind.NO_ANSWER
    assert result.http_status == 200
    assert result.detail


def test_status_sends_auth_and_target_headers(rsps, adapter):
    add_token(rsps)
    add_status(rsps, json={"status": "PENDING"})
    adapter.status(CHARGE)
    headers = calls_to(rsps, STATUS_URL)[0].request.headers
    assert headers["Authorization"] == f"Bearer {ACCESS_TOKEN}"
    assert headers["X-Target-Environment"] == "mtnuganda"
    assert headers["Ocp-Apim-Subscription-Key"] == SUBSCRIPTION_KEY


# --- token -------------------------------------------------------------------


def test_token_request_uses_basic_auth_and_subscription_key(rsps, adapter):
    add_token(rsps)
    add_status(rsps, json={"status": "PENDING"})
    adapter.status(CHARGE)
    (token_call,) = calls_to(rsps, TOKEN_URL, "POST")
    expected = base64.b64encode(f"{API_USER}:{API_KEY}".encode()).decode()
    assert token_call.request.headers["Authorization"] == f"Basic {expected}"
    assert token_call.request.headers["Ocp-Apim-Subscription-Key"] == SUBSCRIPTION_KEY


def test_token_is_cached_then_refetched_after_expiry(rsps, adapter, clock):
    add_token(rsps, expires_in=3600)
    add_status(rsps, json={"status": "PENDING"})

    for _ in range(3):
        adapter.status(CHARGE)
    assert len(calls_to(rsps, TOKEN_URL)) == 1

    clock.now += 3600 - 61           # still inside expires_in minus the margin
    adapter.status(CHARGE)
    assert len(calls_to(rsps, TOKEN_URL)) == 1

    clock.now += 2                   # inside the safety margin: refetch
    adapter.status(CHARGE)
    assert len(calls_to(rsps, TOKEN_URL)) == 2
    assert len(calls_to(rsps, STATUS_URL)) == 5


def test_token_without_expires_in_is_not_cached(rsps, adapter):
    rsps.add(responses.POST, TOKEN_URL, json={"access_token": ACCESS_TOKEN})
    add_status(rsps, json={"status": "PENDING"})
    adapter.status(CHARGE)
    adapter.status(CHARGE)
    assert len(calls_to(rsps, TOKEN_URL)) == 2


def test_concurrent_threads_share_one_token_fetch(rsps, adapter):
    def slow_token(request):
        time.sleep(0.05)             # widen the race window
        return 200, {}, json.dumps({"access_token": ACCESS_TOKEN, "expires_in": 3600})

    rsps.add_callback(responses.POST, TOKEN_URL, callback=slow_token)
    add_status(rsps, json={"status": "PENDING"})
    results = []
    threads = [threading.Thread(target=lambda: results.append(adapter.status(CHARGE)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.kind for r in results] == [StatusKind.PENDING] * 8
    assert len(calls_to(rsps, TOKEN_URL)) == 1


# A token-endpoint 401 is no longer "no answer" (issue 12): fresh credentials
# refused is our configuration; see test_misconfiguration_* below.
@pytest.mark.parametrize("token_reply", [
    {"status": 500, "body": b"oops"},
    {"status": 200, "json": {"token_type": "access_token"}},
    {"status": 200, "body": b"not json"},
], ids=["500", "no-access-token", "non-json"])
def test_token_failure_is_no_answer_for_both_operations(rsps, adapter, token_reply):
    rsps.add(responses.POST, TOKEN_URL, **token_reply)
    status = adapter.status(CHARGE)
    submit = adapter.request_to_pay(CHARGE)
    assert status.kind is StatusKind.NO_ANSWER
    assert status.detail
    assert submit.kind is SubmitKind.NO_ANSWER
    assert submit.reason
    assert calls_to(rsps, STATUS_URL) == [] and calls_to(rsps, RTP_URL) == []


# --- request-to-pay ----------------------------------------------------------


def test_request_to_pay_202_is_accepted_with_headers_and_body(rsps, adapter):
    add_token(rsps)
    rsps.add(responses.POST, RTP_URL, status=202)
    submit = adapter.request_to_pay(CHARGE)
    assert submit.kind is SubmitKind.ACCEPTED
    assert submit.http_status == 202

    (call,) = calls_to(rsps, RTP_URL)
    headers = call.request.headers
    assert headers["X-Reference-Id"] == REFERENCE
    assert headers["X-Target-Environment"] == "mtnuganda"
    assert headers["Ocp-Apim-Subscription-Key"] == SUBSCRIPTION_KEY
    assert headers["Authorization"] == f"Bearer {ACCESS_TOKEN}"
    callback = urlsplit(headers["X-Callback-Url"])
    assert (callback.scheme, callback.netloc, callback.path) == (
        "https", "hooks.example", "/provider/mtn/callback")
    assert parse_qs(callback.query) == {"tenant": ["a"], "ref": [REFERENCE]}

    assert json.loads(call.request.body) == {
        "amount": "10.50",
        "currency": "EUR",
        "externalId": "ch_123",
        "payer": {"partyIdType": "MSISDN", "partyId": "46733123454"},
        "payerMessage": "Order 42",
        "payeeNote": "ch_123",
    }


def test_request_to_pay_without_callback_url_sends_no_callback_header(rsps):
    plain = MtnMomo(BASE, SUBSCRIPTION_KEY, API_USER, API_KEY, sleep=lambda s: None)
    add_token(rsps)
    rsps.add(responses.POST, RTP_URL, status=202)
    assert plain.request_to_pay(CHARGE).kind is SubmitKind.ACCEPTED
    headers = calls_to(rsps, RTP_URL)[0].request.headers
    assert "X-Callback-Url" not in headers
    assert headers["X-Target-Environment"] == "sandbox"


def test_request_to_pay_truncates_messages_to_160(rsps, adapter):
    add_token(rsps)
    rsps.add(responses.POST, RTP_URL, status=202)
    adapter.request_to_pay(ChargeRequest("ch_" + "x" * 300, REFERENCE, 5000, "UGX",
                                         "256770000000", "d" * 500))
    body = json.loads(calls_to(rsps, RTP_URL)[0].request.body)
    assert body["amount"] == "5000"
    assert len(body["payerMessage"]) == 160
    assert len(body["payeeNote"]) == 160
    assert len(body["externalId"]) == 303        # externalId is ours: never cut


def test_request_to_pay_409_is_accepted(rsps, adapter):
    add_token(rsps)
    rsps.add(responses.POST, RTP_URL, status=409,
             json={"code": "RESOURCE_ALREADY_EXIST", "message": "Duplicated reference id"})
    submit = adapter.request_to_pay(CHARGE)
    assert submit.kind is SubmitKind.ACCEPTED
    assert submit.reason == "RESOURCE_ALREADY_EXIST"
    assert submit.http_status == 409


# Issue 12: INVALID_CURRENCY, NOT_ALLOWED, NOT_ALLOWED_TARGET_ENVIRONMENT and
# INVALID_CALLBACK_URL_HOST blame our configuration: MISCONFIGURED, tested in
# test_misconfiguration_codes_are_never_a_rejection below.
@pytest.mark.parametrize("http", [400, 500])
@pytest.mark.parametrize("code", ["PAYEE_NOT_ALLOWED_TO_RECEIVE", "PAYER_NOT_FOUND"])
def test_request_to_pay_definitive_codes_are_rejected(rsps, adapter, http, code):
    add_token(rsps)
    rsps.add(responses.POST, RTP_URL, status=http, json={"code": code, "message": "no"})
    submit = adapter.request_to_pay(CHARGE)
    assert submit.kind is SubmitKind.REJECTED
    assert submit.reason == code
    assert submit.http_status == http
    assert len(calls_to(rsps, RTP_URL)) == 1


def test_request_to_pay_500_internal_error_is_no_answer(rsps, adapter):
    add_token(rsps)
    rsps.add(responses.POST, RTP_URL, status=500,
             json={"code": "INTERNAL_PROCESSING_ERROR", "message": "x"})
    submit = adapter.request_to_pay(CHARGE)
    assert submit.kind is SubmitKind.NO_ANSWER
    assert submit.reason == "INTERNAL_PROCESSING_ERROR"
    assert len(calls_to(rsps, RTP_URL)) == 1


def test_request_to_pay_503_is_retried_then_no_answer(rsps, adapter, sleeps):
    add_token(rsps)
    rsps.add(responses.POST, RTP_URL, status=503,
             json={"code": "SERVICE_UNAVAILABLE", "message": "busy"})
    submit = adapter.request_to_pay(CHARGE)
    assert submit.kind is SubmitKind.NO_ANSWER
    assert submit.reason == "SERVICE_UNAVAILABLE"
    assert submit.http_status == 503
    calls = calls_to(rsps, RTP_URL)
    assert len(calls) == 3
    # every retry carries the same reference, which is what makes it safe
    assert {c.request.headers["X-Reference-Id"] for c in calls} == {REFERENCE}
    assert sleeps == [0.2, 0.5]


def test_request_to_pay_timeout_is_no_answer(rsps, adapter):
    add_token(rsps)
    rsps.add(responses.POST, RTP_URL, body=requests.exceptions.ReadTimeout("slow"))
    submit = adapter.request_to_pay(CHARGE)
    assert submit.kind is SubmitKind.NO_ANSWER
    assert submit.reason == "TIMEOUT"
    assert len(calls_to(rsps, RTP_URL)) == 3


def test_request_to_pay_401_fetches_a_new_token_and_retries_once(rsps, adapter):
    rsps.add(responses.POST, TOKEN_URL, json={"access_token": ACCESS_TOKEN, "expires_in": 3600})
    rsps.add(responses.POST, TOKEN_URL, json={"access_token": SECOND_TOKEN, "expires_in": 3600})
    rsps.add(responses.POST, RTP_URL, status=401, json={"code": "UNAUTHORIZED"})
    rsps.add(responses.POST, RTP_URL, status=202)
    assert adapter.request_to_pay(CHARGE).kind is SubmitKind.ACCEPTED
    assert len(calls_to(rsps, TOKEN_URL)) == 2
    assert len(calls_to(rsps, RTP_URL)) == 2
    assert calls_to(rsps, RTP_URL)[1].request.headers["Authorization"] == f"Bearer {SECOND_TOKEN}"


def test_request_to_pay_rejects_a_bad_amount_before_sending(rsps, adapter):
    add_token(rsps)
    with pytest.raises(ValueError):
        adapter.request_to_pay(ChargeRequest("ch_1", REFERENCE, -1, "EUR", "4673"))
    assert len(rsps.calls) == 0


# --- amounts -------------------------------------------------------------------


@pytest.mark.parametrize("amount,currency,expected", [
    (1050, "EUR", "10.50"),
    (5, "EUR", "0.05"),
    (0, "EUR", "0.00"),
    (100000, "GHS", "1000.00"),
    (1999, "zmw", "19.99"),
    (5000, "UGX", "5000"),
    (250, "XAF", "250"),
    (100, "XOF", "100"),
    (1000, "RWF", "1000"),
    (7, "GNF", "7"),
    (3, "KMF", "3"),
    (1234, "BHD", "1.234"),
    (5, "KWD", "0.005"),
])
def test_minor_to_major_string(amount, currency, expected):
    assert minor_to_major_string(amount, currency) == expected


@pytest.mark.parametrize("amount,error", [(-1, ValueError), (10.5, TypeError),
                                          ("100", TypeError), (True, TypeError)])
def test_minor_to_major_string_refuses_bad_amounts(amount, error):
    with pytest.raises(error):
        minor_to_major_string(amount, "EUR")


# --- callback URL ----------------------------------------------------------------


def test_callback_url_with_reference_replaces_a_foreign_ref():
    url = callback_url_with_reference("https://h.example/cb?ref=evil&x=1&x=2", REFERENCE)
    assert parse_qs(urlsplit(url).query) == {"x": ["1", "2"], "ref": [REFERENCE]}
    assert callback_url_with_reference("https://h.example/cb", REFERENCE) == (
        f"https://h.example/cb?ref={REFERENCE}")


# --- parse_callback ----------------------------------------------------------------


def test_parse_callback_good(adapter):
    body = json.dumps({"externalId": "ch_123", "financialTransactionId": "555",
                       "amount": "10.50", "status": "PENDING"}).encode()
    ids = adapter.parse_callback({"ref": REFERENCE}, body)
    assert ids == CallbackIds(rail_reference=REFERENCE,
                              hints={"externalId": "ch_123", "financialTransactionId": "555"})


def test_parse_callback_successful_body_yields_only_identifiers(adapter):
    body = json.dumps({"status": "SUCCESSFUL", "reason": "x", "amount": "10.50",
                       "externalId": "ch_123", "financialTransactionId": 42}).encode()
    ids = adapter.parse_callback({"ref": REFERENCE.upper()}, body)
    assert ids.rail_reference == REFERENCE
    assert dict(ids.hints) == {"externalId": "ch_123"}    # non-string id dropped
    assert "SUCCESSFUL" not in repr(ids)


def test_parse_callback_empty_body(adapter):
    assert adapter.parse_callback({"ref": REFERENCE}, b"") == CallbackIds(REFERENCE, {})
    assert adapter.parse_callback({"ref": REFERENCE}, b"  \n").hints == {}


def test_parse_callback_truncates_hints(adapter):
    ids = adapter.parse_callback({"ref": REFERENCE}, json.dumps({"externalId": "e" * 1000}).encode())
    assert 0 < len(ids.hints["externalId"]) <= 128


@pytest.mark.parametrize("query", [{}, {"ref": ""}, {"other": REFERENCE}, {"ref": ["x"]}])
def test_parse_callback_missing_ref(adapter, query):
    with pytest.raises(MalformedCallback):
        adapter.parse_callback(query, b"{}")


@pytest.mark.parametrize("ref", ["ch_123", "123", "3f2c1b7e9a4d4c2e8f1a5b6d7e8f9a0b",
                                 "{3f2c1b7e-9a4d-4c2e-8f1a-5b6d7e8f9a0b}",
                                 "3f2c1b7e-9a4d-4c2e-8f1a-5b6d7e8f9a0g"])
def test_parse_callback_non_uuid_ref(adapter, ref):
    with pytest.raises(MalformedCallback):
        adapter.parse_callback({"ref": ref}, b"{}")


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b'["a"]', b'"SUCCESSFUL"'])
def test_parse_callback_bad_body(adapter, body):
    with pytest.raises(MalformedCallback):
        adapter.parse_callback({"ref": REFERENCE}, body)


# --- configuration ----------------------------------------------------------------

FULL_ENV = {
    "VPAY_MTN_BASE_URL": BASE,
    "VPAY_MTN_SUBSCRIPTION_KEY": SUBSCRIPTION_KEY,
    "VPAY_MTN_API_USER": API_USER,
    "VPAY_MTN_API_KEY": API_KEY,
}


@pytest.mark.parametrize("name", sorted(FULL_ENV))
@pytest.mark.parametrize("how", ["absent", "empty"])
def test_from_env_missing_variable_is_named(name, how):
    env = dict(FULL_ENV)
    if how == "absent":
        del env[name]
    else:
        env[name] = ""
    with pytest.raises(RailError) as caught:
        MtnMomo.from_env(env)
    message = str(caught.value)
    assert name in message
    assert not any(secret in message for secret in SECRETS)


@pytest.mark.parametrize("name", ["VPAY_MTN_BASE_URL", "VPAY_MTN_CALLBACK_URL"])
@pytest.mark.parametrize("value, says", [
    ("https://momo.example/ collection", "whitespace"), (" https://momo.example", "whitespace"),
    ("https://momo.example\n", "whitespace"), ("https://momo.ex\x00ample", "control"),
    ("ftp://momo.example", "http:// or https://"), ("momo.example", "http:// or https://"),
    ("https://", "no host"), ("https://momo.example:99999", "not a URL"),
])
def test_from_env_refuses_a_url_with_whitespace_or_another_scheme_naming_the_variable(name, value, says):
    with pytest.raises(RailError) as caught:
        MtnMomo.from_env({**FULL_ENV, name: value})
    assert name in str(caught.value) and says in str(caught.value)
    assert value.strip() not in str(caught.value)


def test_from_env_names_every_missing_variable():
    with pytest.raises(RailError) as caught:
        MtnMomo.from_env({})
    assert all(name in str(caught.value) for name in FULL_ENV)


def test_from_env_defaults_and_options(rsps):
    adapter = MtnMomo.from_env(FULL_ENV)
    assert adapter.code == "mtn"
    assert adapter.target_environment == "sandbox"
    assert adapter.callback_url is None
    assert adapter.timeout == (3.05, 10.0)

    env = dict(FULL_ENV, VPAY_MTN_TARGET_ENVIRONMENT="mtnghana", VPAY_MTN_CALLBACK_URL=CALLBACK)
    adapter = MtnMomo.from_env(env, sleep=lambda s: None)
    assert adapter.target_environment == "mtnghana"
    add_token(rsps)
    rsps.add(responses.POST, RTP_URL, status=202)
    adapter.request_to_pay(CHARGE)
    headers = calls_to(rsps, RTP_URL)[0].request.headers
    assert headers["X-Target-Environment"] == "mtnghana"
    assert REFERENCE in headers["X-Callback-Url"]


def test_constructor_refuses_empty_credentials_without_leaking():
    with pytest.raises(RailError, match="api_key"):
        MtnMomo(BASE, SUBSCRIPTION_KEY, API_USER, "")
    with pytest.raises(RailError, match="base_url"):
        MtnMomo("ftp://x", SUBSCRIPTION_KEY, API_USER, API_KEY)


def test_repr_hides_credentials(adapter):
    assert not any(secret in repr(adapter) for secret in SECRETS)


# --- no credential in logs -----------------------------------------------------------


def test_no_credential_in_any_log_record(rsps, adapter, caplog):
    caplog.set_level(logging.DEBUG)          # root: catches urllib3/requests too
    rsps.add(responses.POST, TOKEN_URL, json={"access_token": ACCESS_TOKEN, "expires_in": 3600})
    rsps.add(responses.POST, TOKEN_URL, status=401, json={"code": "UNAUTHORIZED"})
    add_status(rsps, status=401, json={"code": "UNAUTHORIZED"})
    rsps.add(responses.POST, RTP_URL, body=requests.exceptions.ConnectTimeout("t"))

    answers = [
        adapter.status(CHARGE),          # token fetched, status 401, token dropped
        adapter.request_to_pay(CHARGE),  # token endpoint 401
        adapter.status(CHARGE),          # token endpoint 401 again
    ]
    rsps.replace(responses.POST, TOKEN_URL, json={"access_token": SECOND_TOKEN, "expires_in": 3600})
    answers.append(adapter.request_to_pay(CHARGE))   # connect timeouts

    assert caplog.records, "the adapter should log its outcomes"
    assert any(r.name == "vpay.rails.mtn" for r in caplog.records)
    for record in caplog.records:
        text = record.getMessage() + repr(record.args) + (record.exc_text or "")
        for secret in SECRETS:
            assert secret not in text, f"{record.name} logged a credential"
    for answer in answers:
        assert not any(secret in repr(answer) for secret in SECRETS)



def test_a_success_reports_the_amount_and_currency_the_rail_moved(rsps, adapter):
    add_token(rsps)
    add_status(rsps, json={"status": "SUCCESSFUL", "financialTransactionId": "1",
                           "amount": "10.50", "currency": "EUR"})
    result = adapter.status(CHARGE)
    assert (result.amount, result.currency) == (1050, "EUR")


@pytest.mark.parametrize("value,currency,minor", [("10.50", "EUR", 1050), ("5000", "UGX", 5000),
                                                  ("10.505", "EUR", None), ("ten", "EUR", None),
                                                  (None, "EUR", None), ("NaN", "EUR", None)])
def test_major_string_to_minor_is_exact(value, currency, minor):
    from vpay.money.currency import major_string_to_minor
    assert major_string_to_minor(value, currency) == minor


def test_a_failed_token_fetch_is_remembered_so_waiting_calls_fail_fast(rsps, adapter, clock):
    # Found by review: a hung token endpoint held every claim loop in turn,
    # each thread making its own slow fetch, until the watchdog killed the worker.
    from vpay.rails.mtn import TOKEN_FAILURE_MEMORY_SECONDS
    rsps.add(responses.POST, TOKEN_URL, status=500, body=b"down")
    assert adapter.status(CHARGE).kind is StatusKind.NO_ANSWER
    assert adapter.status(CHARGE).kind is StatusKind.NO_ANSWER
    assert adapter.request_to_pay(CHARGE).kind is SubmitKind.NO_ANSWER
    assert len(calls_to(rsps, TOKEN_URL)) == 1  # one fetch; the others failed fast
    clock.now += TOKEN_FAILURE_MEMORY_SECONDS + 1
    rsps.replace(responses.POST, TOKEN_URL, status=200,
                 json={"access_token": ACCESS_TOKEN, "token_type": "access_token", "expires_in": 3600})
    add_status(rsps, json={"status": "PENDING"})
    assert adapter.status(CHARGE).kind is StatusKind.PENDING
    assert len(calls_to(rsps, TOKEN_URL)) == 2
