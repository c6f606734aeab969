"""Unit tests for the Orange Money Web Payment adapter (vpay/rails/orange.py).

HTTP is faked with ``responses``; time is injected (``clock``, ``sleep``), so
nothing here sleeps and nothing needs a database. Shapes: design/rails.md,
"Orange Money Web Payment".
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import responses

from vpay.rails.orange import MAX_ATTEMPTS, OrangeMoney, notif_url_with_reference, order_id_for
from vpay.rails.port import CallbackIds, ChargeRequest, MalformedCallback, RailError, RefundRequest, StatusKind, SubmitKind

BASE = "https://orange.test"
TOKEN_URL = f"{BASE}/oauth/v3/token"
INIT_URL = f"{BASE}/orange-money-webpay/cm/v1/webpayment"
STATUS_URL = f"{BASE}/orange-money-webpay/cm/v1/transactionstatus"
REFERENCE = "3f2c1b7e-9a4d-4c2e-8f1a-5b6d7e8f9a0b"
ORDER_ID = "3f2c1b7e9a4d4c2e8f1a5b6d7e8f9a"
NOTIF_URL = "https://pay.example/provider/orange/callback?tenant=a"

CLIENT_ID = "client-SECRET-1111"
CLIENT_SECRET = "secret-SECRET-2222"
MERCHANT_KEY = "merchant-SECRET-3333"
ACCESS_TOKEN = "token-SECRET-4444"
SECOND_TOKEN = "token-SECRET-5555"
PAY_TOKEN = "paytoken-SECRET-6666"
NOTIF_TOKEN = "notiftoken-SECRET-7777"
BASIC = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
SECRETS = (CLIENT_ID, CLIENT_SECRET, MERCHANT_KEY, ACCESS_TOKEN, SECOND_TOKEN, PAY_TOKEN,
           NOTIF_TOKEN, BASIC)

CHARGE = ChargeRequest(charge_id="ch_123", rail_reference=REFERENCE, amount=5000, currency="XAF",
                       payer="237690000001", description="Order 42")
SUBMITTED = dataclasses.replace(CHARGE, rail_data={"pay_token": PAY_TOKEN,
                                                   "payment_url": "https://pay.orange.test/p/1"})
INIT_OK = {"status": 201, "message": "OK", "pay_token": PAY_TOKEN,
           "payment_url": "https://webpayment.orange.test/payment/pay_token/abc", "notif_token": NOTIF_TOKEN}

ENV = {
    "VPAY_ORANGE_BASE_URL": BASE, "VPAY_ORANGE_CLIENT_ID": CLIENT_ID,
    "VPAY_ORANGE_CLIENT_SECRET": CLIENT_SECRET, "VPAY_ORANGE_MERCHANT_KEY": MERCHANT_KEY,
    "VPAY_ORANGE_COUNTRY": "cm", "VPAY_ORANGE_NOTIF_URL": NOTIF_URL,
    "VPAY_ORANGE_RETURN_URL": "https://shop.example/return",
    "VPAY_ORANGE_CANCEL_URL": "https://shop.example/cancel",
}


class FakeClock:
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
    return OrangeMoney.from_env(ENV, clock=clock, sleep=sleeps.append)


def token_ok(rsps, token=ACCESS_TOKEN, expires_in=3600):
    rsps.add(responses.POST, TOKEN_URL, json={"token_type": "Bearer", "access_token": token,
                                              "expires_in": expires_in}, status=200)


def calls_to(rsps, url):
    return [c for c in rsps.calls if c.request.url.split("?")[0] == url]


# --- configuration -------------------------------------------------------------


def test_from_env_names_every_missing_variable_and_no_value():
    with pytest.raises(RailError) as err:
        OrangeMoney.from_env({"VPAY_ORANGE_CLIENT_SECRET": CLIENT_SECRET})
    text = str(err.value)
    for name in ENV:
        if name != "VPAY_ORANGE_CLIENT_SECRET":
            assert name in text
    assert CLIENT_SECRET not in text


@pytest.mark.parametrize("name,value", [("VPAY_ORANGE_COUNTRY", "Cameroon/1"),
                                        ("VPAY_ORANGE_BASE_URL", "ftp://orange.test"),
                                        ("VPAY_ORANGE_NOTIF_URL", "notif"),
                                        ("VPAY_ORANGE_READ_TIMEOUT_SECONDS", "soon")])
def test_bad_settings_are_refused(name, value):
    with pytest.raises(RailError):
        OrangeMoney.from_env({**ENV, name: value})


@pytest.mark.parametrize("name", ["VPAY_ORANGE_BASE_URL", "VPAY_ORANGE_NOTIF_URL", "VPAY_ORANGE_RETURN_URL",
                                  "VPAY_ORANGE_CANCEL_URL"])
@pytest.mark.parametrize("value, says", [("https://orange.example/ x", "whitespace"),
                                         ("https://orange.example\r\n", "whitespace"),
                                         ("javascript://orange.example", "http:// or https://")])
def test_a_url_with_whitespace_or_another_scheme_is_refused_naming_the_variable(name, value, says):
    with pytest.raises(RailError) as caught:
        OrangeMoney.from_env({**ENV, name: value})
    assert name in str(caught.value) and says in str(caught.value)


def test_from_env_reads_timeouts_and_options_and_repr_has_no_secret():
    a = OrangeMoney.from_env({**ENV, "VPAY_ORANGE_CONNECT_TIMEOUT_SECONDS": "1.5",
                              "VPAY_ORANGE_READ_TIMEOUT_SECONDS": "4", "VPAY_ORANGE_LANG": "en",
                              "VPAY_ORANGE_REFERENCE": "Shop"})
    assert a.timeout == (1.5, 4.0) and a.lang == "en" and a.reference == "Shop" and a.code == "orange"
    assert not any(s in repr(a) for s in SECRETS)


def test_order_id_is_the_references_first_30_hex_digits():
    assert order_id_for(REFERENCE) == ORDER_ID == order_id_for(REFERENCE.upper())
    assert len(ORDER_ID) == 30
    with pytest.raises(ValueError):
        order_id_for("not-a-uuid")


def test_notif_url_carries_our_reference_and_keeps_other_parameters():
    url = notif_url_with_reference(NOTIF_URL + "&ref=evil", REFERENCE)
    assert parse_qs(urlsplit(url).query) == {"tenant": ["a"], "ref": [REFERENCE]}


# --- request_to_pay ------------------------------------------------------------


def test_init_sends_orange_shapes_and_hands_back_the_three_tokens(adapter, rsps):
    token_ok(rsps)
    rsps.add(responses.POST, INIT_URL, json=INIT_OK, status=201)
    submit = adapter.request_to_pay(CHARGE)
    assert submit.kind is SubmitKind.ACCEPTED and submit.http_status == 201
    assert dict(submit.rail_data) == {"pay_token": PAY_TOKEN, "payment_url": INIT_OK["payment_url"],
                                      "notif_token": NOTIF_TOKEN}

    token_call, init_call = rsps.calls
    assert token_call.request.headers["Authorization"] == f"Basic {BASIC}"
    assert parse_qs(token_call.request.body) == {"grant_type": ["client_credentials"]}
    assert init_call.request.headers["Authorization"] == f"Bearer {ACCESS_TOKEN}"
    body = json.loads(init_call.request.body)
    assert body == {"merchant_key": MERCHANT_KEY, "currency": "XAF", "order_id": ORDER_ID,
                    "amount": 5000, "return_url": ENV["VPAY_ORANGE_RETURN_URL"],
                    "cancel_url": ENV["VPAY_ORANGE_CANCEL_URL"],
                    "notif_url": notif_url_with_reference(NOTIF_URL, REFERENCE),
                    "lang": "fr", "reference": "vpay"}
    assert isinstance(body["amount"], int) and len(body["order_id"]) <= 30


@pytest.mark.parametrize("currency", ["EUR", "USD", "GHS", "MGA", "TND", "CDF"])
def test_a_currency_with_minor_units_is_rejected_before_anything_is_sent(adapter, rsps, currency):
    submit = adapter.request_to_pay(dataclasses.replace(CHARGE, currency=currency))
    assert submit.kind is SubmitKind.REJECTED and submit.reason == "UNSUPPORTED_CURRENCY"
    assert len(rsps.calls) == 0


@pytest.mark.parametrize("currency", ["XOF", "XAF", "GNF", "RWF"])
def test_currencies_without_minor_units_are_sent_whole(adapter, rsps, currency):
    token_ok(rsps)
    rsps.add(responses.POST, INIT_URL, json=INIT_OK, status=201)
    assert adapter.request_to_pay(dataclasses.replace(CHARGE, currency=currency)).kind is SubmitKind.ACCEPTED
    assert json.loads(rsps.calls[-1].request.body)["amount"] == 5000


@pytest.mark.parametrize("status,body,kind,reason", [
    (400, {"code": "INVALID_AMOUNT", "message": "x"}, SubmitKind.REJECTED, "INVALID_AMOUNT"),
    (400, b"", SubmitKind.REJECTED, "BAD_REQUEST"),
    # issue 12: on a first send the order id is fresh, so 403 is the merchant key (a re-send: see
    # test_a_403_to_a_resend_is_no_answer)
    (403, {"code": 403, "message": "merchant_key not allowed"}, SubmitKind.MISCONFIGURED, "FORBIDDEN"),
    (404, {"code": 404, "message": "Resource not found"}, SubmitKind.NO_ANSWER, "404"),
    (429, b"", SubmitKind.NO_ANSWER, "HTTP_429"),
    (500, {"code": 500, "message": "boom"}, SubmitKind.NO_ANSWER, "500"),
    (503, b"", SubmitKind.NO_ANSWER, "HTTP_503"),
])
def test_init_error_mapping(adapter, rsps, status, body, kind, reason):
    token_ok(rsps)
    if isinstance(body, dict):
        rsps.add(responses.POST, INIT_URL, json=body, status=status)
    else:
        rsps.add(responses.POST, INIT_URL, body=body, status=status)
    submit = adapter.request_to_pay(CHARGE)
    assert (submit.kind, submit.reason, submit.http_status) == (kind, reason, status)
    assert len(calls_to(rsps, INIT_URL)) == 1  # an init that may have landed is never re-sent


@pytest.mark.parametrize("body", [
    b"not json", b"[1]", json.dumps({**INIT_OK, "pay_token": None}).encode(),
    json.dumps({k: v for k, v in INIT_OK.items() if k != "notif_token"}).encode(),
    json.dumps({**INIT_OK, "payment_url": "javascript:alert(1)"}).encode(),
    json.dumps({**INIT_OK, "payment_url": 7}).encode(),
    json.dumps({**INIT_OK, "notif_token": "x" * 300}).encode(),
])
def test_a_malformed_init_answer_is_no_answer(adapter, rsps, body):
    token_ok(rsps)
    rsps.add(responses.POST, INIT_URL, body=body, status=201)
    submit = adapter.request_to_pay(CHARGE)
    assert submit.kind is SubmitKind.NO_ANSWER and submit.reason == "MALFORMED_INIT_ANSWER"
    assert not submit.rail_data


def test_init_is_retried_only_when_the_connection_never_opened(adapter, rsps, sleeps):
    token_ok(rsps)
    rsps.add(responses.POST, INIT_URL, body=requests.ConnectTimeout("connect"))
    rsps.add(responses.POST, INIT_URL, json=INIT_OK, status=201)
    assert adapter.request_to_pay(CHARGE).kind is SubmitKind.ACCEPTED
    assert len(calls_to(rsps, INIT_URL)) == 2 and sleeps == [0.2]


@pytest.mark.parametrize("exc,reason", [(requests.ReadTimeout("read"), "TIMEOUT"),
                                        (requests.ConnectionError("reset"), "CONNECTION_ERROR")])
def test_an_init_that_may_have_landed_is_not_retried(adapter, rsps, exc, reason):
    token_ok(rsps)
    rsps.add(responses.POST, INIT_URL, body=exc)
    submit = adapter.request_to_pay(CHARGE)
    assert (submit.kind, submit.reason) == (SubmitKind.NO_ANSWER, reason)
    assert len(calls_to(rsps, INIT_URL)) == 1


# --- the token -----------------------------------------------------------------


def test_the_token_is_cached_until_expires_in_less_a_margin(adapter, rsps, clock):
    token_ok(rsps, ACCESS_TOKEN, expires_in=3600)
    rsps.add(responses.POST, STATUS_URL, json={"status": "INITIATED"}, status=201)
    for _ in range(3):
        assert adapter.status(SUBMITTED).kind is StatusKind.PENDING
    assert len(calls_to(rsps, TOKEN_URL)) == 1
    clock.now += 3600 - 61
    adapter.status(SUBMITTED)
    assert len(calls_to(rsps, TOKEN_URL)) == 1
    rsps.replace(responses.POST, TOKEN_URL, json={"access_token": SECOND_TOKEN, "expires_in": "3600"})
    clock.now += 2
    adapter.status(SUBMITTED)
    assert len(calls_to(rsps, TOKEN_URL)) == 2
    assert calls_to(rsps, STATUS_URL)[-1].request.headers["Authorization"] == f"Bearer {SECOND_TOKEN}"


@pytest.mark.parametrize("expires_in", [None, 0, -5, "soon", float("nan")])
def test_a_token_without_a_usable_lifetime_is_used_once(adapter, rsps, expires_in):
    rsps.add(responses.POST, TOKEN_URL, json={"access_token": ACCESS_TOKEN, "expires_in": expires_in}
             if expires_in == expires_in else {"access_token": ACCESS_TOKEN})
    rsps.add(responses.POST, STATUS_URL, json={"status": "INITIATED"}, status=201)
    adapter.status(SUBMITTED)
    adapter.status(SUBMITTED)
    assert len(calls_to(rsps, TOKEN_URL)) == 2


def test_a_401_fetches_a_new_token_and_retries_once_in_the_same_call(adapter, rsps):
    token_ok(rsps)
    rsps.add(responses.POST, STATUS_URL, json={"code": 42, "message": "Expired credentials"}, status=401)
    rsps.add(responses.POST, STATUS_URL, json={"status": "SUCCESS", "txnid": "MP1"}, status=201)
    assert adapter.status(SUBMITTED).kind is StatusKind.SUCCEEDED
    assert len(calls_to(rsps, TOKEN_URL)) == 2
    assert len(calls_to(rsps, STATUS_URL)) == 2


def test_a_401_twice_is_no_answer_after_one_retry(adapter, rsps):
    token_ok(rsps)
    rsps.add(responses.POST, STATUS_URL, json={"code": 42, "message": "Expired credentials"}, status=401)
    result = adapter.status(SUBMITTED)
    assert (result.kind, result.reason) == (StatusKind.NO_ANSWER, "UNAUTHORIZED")
    assert len(calls_to(rsps, TOKEN_URL)) == 2
    assert len(calls_to(rsps, STATUS_URL)) == 2


# A token 401 is our configuration (issue 12): test_a_token_401_is_misconfigured.
@pytest.mark.parametrize("status,body", [(500, {}),
                                         (200, {"token_type": "Bearer"}), (200, [1])])
def test_a_token_failure_is_no_answer_for_both_calls(adapter, rsps, status, body):
    rsps.add(responses.POST, TOKEN_URL, json=body, status=status)
    assert adapter.request_to_pay(CHARGE).kind is SubmitKind.NO_ANSWER
    assert adapter.status(SUBMITTED).kind is StatusKind.NO_ANSWER
    assert not calls_to(rsps, INIT_URL) and not calls_to(rsps, STATUS_URL)


# --- status ----------------------------------------------------------------------


@pytest.mark.parametrize("orange,kind,reason,txn", [
    ("INITIATED", StatusKind.PENDING, "INITIATED", None),
    ("PENDING", StatusKind.PENDING, "PENDING", None),
    ("SUCCESS", StatusKind.SUCCEEDED, None, "MP220915.1234.A00001"),
    ("FAILED", StatusKind.FAILED, "FAILED", None),
    ("EXPIRED", StatusKind.FAILED, "EXPIRED", None),
])
@pytest.mark.parametrize("http", [201, 200])
def test_every_orange_status(adapter, rsps, orange, kind, reason, txn, http):
    token_ok(rsps)
    rsps.add(responses.POST, STATUS_URL, json={"status": orange, "order_id": ORDER_ID,
                                               "txnid": "MP220915.1234.A00001"}, status=http)
    result = adapter.status(SUBMITTED)
    assert (result.kind, result.reason, result.financial_transaction_id) == (kind, reason, txn)
    assert json.loads(calls_to(rsps, STATUS_URL)[0].request.body) == {
        "order_id": ORDER_ID, "amount": 5000, "pay_token": PAY_TOKEN}


def test_without_a_pay_token_nothing_is_asked_and_the_answer_is_not_found(adapter, rsps):
    result = adapter.status(CHARGE)
    assert (result.kind, result.reason) == (StatusKind.NOT_FOUND, "NO_PAY_TOKEN")
    assert len(rsps.calls) == 0


def test_404_is_not_found(adapter, rsps):
    token_ok(rsps)
    rsps.add(responses.POST, STATUS_URL, json={"code": 404, "message": "Resource not found"}, status=404)
    assert adapter.status(SUBMITTED).kind is StatusKind.NOT_FOUND


@pytest.mark.parametrize("status", [500, 502, 503, 504, 400, 429])
def test_errors_are_no_answer_never_a_decline(adapter, rsps, status):
    token_ok(rsps)
    rsps.add(responses.POST, STATUS_URL, json={"code": status, "message": "x"}, status=status)
    result = adapter.status(SUBMITTED)
    assert result.kind is StatusKind.NO_ANSWER and result.http_status == status
    retried = status in (502, 503, 504)
    assert len(calls_to(rsps, STATUS_URL)) == (MAX_ATTEMPTS if retried else 1)


@pytest.mark.parametrize("exc,reason", [(requests.ReadTimeout("read"), "TIMEOUT"),
                                        (requests.ConnectTimeout("connect"), "TIMEOUT"),
                                        (requests.ConnectionError("refused"), "CONNECTION_ERROR")])
def test_timeouts_are_retried_a_bounded_number_of_times_then_no_answer(adapter, rsps, sleeps, exc, reason):
    token_ok(rsps)
    rsps.add(responses.POST, STATUS_URL, body=exc)
    result = adapter.status(SUBMITTED)
    assert (result.kind, result.reason) == (StatusKind.NO_ANSWER, reason)
    assert len(calls_to(rsps, STATUS_URL)) == MAX_ATTEMPTS and sleeps == [0.2, 0.5]


def test_a_5xx_then_an_answer_is_the_answer(adapter, rsps):
    token_ok(rsps)
    rsps.add(responses.POST, STATUS_URL, body=b"", status=503)
    rsps.add(responses.POST, STATUS_URL, json={"status": "SUCCESS", "txnid": "MP9"}, status=201)
    assert adapter.status(SUBMITTED).financial_transaction_id == "MP9"


@pytest.mark.parametrize("body", [
    b"", b"<html>gateway</html>", b"[]", b'"SUCCESS"', b"{}",
    json.dumps({"status": "SUCCESSFUL"}).encode(),   # MoMo's word, not Orange's
    json.dumps({"status": "success"}).encode(),
    json.dumps({"status": None}).encode(),
    json.dumps({"status": "SUCCESS", "order_id": "someone-elses-order"}).encode(),
    b"\xff\xfe", b"[" * 10_000,
])
def test_malformed_status_bodies_are_no_answer(adapter, rsps, body):
    token_ok(rsps)
    rsps.add(responses.POST, STATUS_URL, body=body, status=201)
    assert adapter.status(SUBMITTED).kind is StatusKind.NO_ANSWER


# --- callbacks ---------------------------------------------------------------------


@pytest.mark.parametrize("claimed", ["SUCCESS", "FAILED", "PENDING", "INITIATED", "EXPIRED", None])
def test_parse_callback_returns_identifiers_and_never_a_status(adapter, claimed):
    body = json.dumps({"status": claimed, "notif_token": NOTIF_TOKEN, "txnid": "MP1"}).encode()
    ids = adapter.parse_callback({"ref": REFERENCE.upper()}, body)
    assert ids == CallbackIds(rail_reference=REFERENCE, hints={"notif_token": NOTIF_TOKEN, "txnid": "MP1"})
    # identifiers only: status_keys is a rail-assigned id for a lost answer (M-Pesa), never a status
    assert [f.name for f in dataclasses.fields(ids)] == ["rail_reference", "hints", "status_keys"]
    assert ids.status_keys == {}
    assert all(claimed is None or claimed not in str(v) for v in ids.hints.values())


@pytest.mark.parametrize("body,hints", [
    (b"", {}),
    (b"{}", {}),
    (json.dumps({"status": "SUCCESS", "notif_token": 123}).encode(), {}),
    (json.dumps({"notif_token": ""}).encode(), {}),
    (json.dumps({"notif_token": "x" * 257}).encode(), {}),
    (json.dumps({"txnid": 42}).encode(), {"txnid": "42"}),
])
def test_a_missing_or_unusable_token_is_simply_absent(adapter, body, hints):
    assert dict(adapter.parse_callback({"ref": REFERENCE}, body).hints) == hints


@pytest.mark.parametrize("query,body", [
    ({}, b"{}"), ({"ref": ""}, b"{}"), ({"ref": "ch_123"}, b"{}"), ({"ref": [REFERENCE, REFERENCE]}, b"{}"),
    ({"ref": REFERENCE}, b"{not json"), ({"ref": REFERENCE}, b"[1]"), ({"ref": REFERENCE}, b"\xff"),
    ({"ref": REFERENCE}, b"[" * 50_000),
])
def test_unreadable_callbacks_raise_malformed(adapter, query, body):
    with pytest.raises(MalformedCallback):
        adapter.parse_callback(query, body)


# --- refunds ---------------------------------------------------------------------


def test_refunds_are_refused_without_asking_orange(adapter, rsps):
    refund = RefundRequest(refund_id="re_1", rail_reference=REFERENCE, charge_rail_reference=REFERENCE,
                           amount=100, currency="XAF", payer="237690000001")
    assert adapter.refund(refund).kind is SubmitKind.REJECTED
    assert adapter.refund_status(refund).kind is StatusKind.NOT_FOUND
    assert len(rsps.calls) == 0


# --- no credential ever in a log line --------------------------------------------


def test_no_credential_or_token_in_any_log_line_or_detail(adapter, rsps, caplog):
    caplog.set_level(logging.DEBUG)
    token_ok(rsps)
    rsps.add(responses.POST, INIT_URL, json=INIT_OK, status=201)
    results = [adapter.request_to_pay(CHARGE)]
    for status, body in ((201, {"status": "SUCCESS", "txnid": "MP1"}), (401, {"message": ACCESS_TOKEN}),
                         (503, {"message": "x"}), (201, {"status": PAY_TOKEN})):
        rsps.upsert(responses.POST, STATUS_URL, json=body, status=status)
        results.append(adapter.status(SUBMITTED))
    rsps.replace(responses.POST, TOKEN_URL, json={"error": CLIENT_SECRET}, status=401)
    results.append(adapter.request_to_pay(CHARGE))
    results.append(adapter.status(SUBMITTED))
    rsps.replace(responses.POST, TOKEN_URL, body=requests.ConnectionError(f"{BASE}?secret={CLIENT_SECRET}"))
    results.append(adapter.status(SUBMITTED))
    adapter.parse_callback({"ref": REFERENCE}, json.dumps({"notif_token": NOTIF_TOKEN}).encode())

    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "orange" in text
    for secret in SECRETS:
        assert secret not in text, secret
    for result in results[1:]:
        assert not any(s in f"{result.reason} {getattr(result, 'detail', '')}" for s in SECRETS)
