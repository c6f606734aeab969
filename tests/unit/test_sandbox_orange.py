"""The Orange Money Web Payment sandbox (vpay/sandbox/orange/) over
real HTTP on 127.0.0.1: it must refuse what Orange refuses, so that the e2e
tests built on it mean something. No database."""

from __future__ import annotations

import dataclasses
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from support import wait_until
from vpay.rails.orange import OrangeMoney, order_id_for
from vpay.rails.port import ChargeRequest, StatusKind, SubmitKind
from vpay.sandbox.orange import OrangeSandbox


class Receiver:
    """A notif_url that records what it is posted and answers 202."""

    def __init__(self):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append((self.path, json.loads(body)))
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/provider/orange/callback"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def orange():
    with OrangeSandbox() as sandbox:
        yield sandbox


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _token(orange) -> str:
    resp = requests.post(f"{orange.url}/oauth/v3/token", auth=(orange.client_id, orange.client_secret),
                         data={"grant_type": "client_credentials"}, timeout=5)
    assert resp.status_code == 200
    return resp.json()["access_token"]


def _init_body(orange, **over):
    return {"merchant_key": orange.merchant_key, "currency": "XOF", "order_id": "order1", "amount": 100,
            "return_url": "http://127.0.0.1/r", "cancel_url": "http://127.0.0.1/c",
            "notif_url": "http://127.0.0.1:9/n?ref=x", "lang": "fr", "reference": "shop", **over}


def _charge(ref=None, **over):
    return ChargeRequest(**{"charge_id": "ch_1", "rail_reference": ref or str(uuid.uuid4()), "amount": 700,
                            "currency": "XOF", "payer": "22500000001", **over})


def test_the_token_needs_the_client_credentials_and_the_grant(orange):
    url = f"{orange.url}/oauth/v3/token"
    assert requests.post(url, auth=(orange.client_id, "nope"), data={"grant_type": "client_credentials"},
                         timeout=5).status_code == 401
    assert requests.post(url, auth=(orange.client_id, orange.client_secret), data={"grant_type": "password"},
                         timeout=5).status_code == 400
    assert _token(orange)


@pytest.mark.parametrize("over,status", [
    ({"amount": "100"}, 400), ({"amount": 1.5}, 400), ({"amount": 0}, 400), ({"order_id": "x" * 31}, 400),
    ({"currency": "xof"}, 400), ({"notif_url": "http://203.0.113.5/n"}, 400), ({"notif_url": ""}, 400),
    ({"merchant_key": "other"}, 403),
])
def test_init_refuses_what_orange_refuses(orange, over, status):
    headers = {"Authorization": f"Bearer {_token(orange)}"}
    url = f"{orange.url}/orange-money-webpay/dev/v1/webpayment"
    assert requests.post(url, json=_init_body(orange, **over), headers=headers, timeout=5).status_code == status
    assert orange.payments() == []


def test_init_needs_a_token_and_the_country_and_refuses_a_reused_order_id(orange):
    url = f"{orange.url}/orange-money-webpay/dev/v1/webpayment"
    assert requests.post(url, json=_init_body(orange), headers={"Authorization": "Bearer nope"},
                         timeout=5).status_code == 401
    headers = {"Authorization": f"Bearer {_token(orange)}"}
    assert requests.post(f"{orange.url}/orange-money-webpay/cm/v1/webpayment", json=_init_body(orange),
                         headers=headers, timeout=5).status_code == 404
    first = requests.post(url, json=_init_body(orange), headers=headers, timeout=5)
    assert first.status_code == 201 and set(first.json()) >= {"pay_token", "payment_url", "notif_token"}
    assert requests.post(url, json=_init_body(orange), headers=headers, timeout=5).status_code == 403
    assert requests.get(first.json()["payment_url"], timeout=5).status_code == 200


def test_status_checks_order_and_amount_and_payments_wait_for_ever_by_default(orange, receiver):
    adapter = OrangeMoney.from_env(orange.env(receiver.url))
    charge = _charge()
    submit = adapter.request_to_pay(charge)
    assert submit.kind is SubmitKind.ACCEPTED
    known = ChargeRequest(**{**charge.__dict__, "rail_data": {"pay_token": submit.rail_data["pay_token"]}})
    for _ in range(5):
        assert adapter.status(known).reason == "INITIATED"
    assert adapter.status(ChargeRequest(**{**known.__dict__, "amount": 701})).kind is StatusKind.NO_ANSWER
    assert adapter.status(ChargeRequest(**{**known.__dict__, "rail_data": {"pay_token": "x"}})).kind \
        is StatusKind.NOT_FOUND
    # the read with an unknown pay_token names no order
    assert orange.count(path_suffix="/transactionstatus", order_id=charge.rail_reference) == 6
    assert orange.count(path_suffix="/transactionstatus") == 7


def test_scripts_notifications_and_forced_statuses(orange, receiver):
    adapter = OrangeMoney.from_env(orange.env(receiver.url))
    charge = _charge()
    orange.script_order(charge.rail_reference, pending_reads=1, waiting_status="PENDING", outcome="SUCCESS",
                        status_errors=[503, 503, 503])
    submit = adapter.request_to_pay(charge)
    known = ChargeRequest(**{**charge.__dict__, "rail_data": {"pay_token": submit.rail_data["pay_token"]}})
    assert adapter.status(known).kind is StatusKind.NO_ANSWER       # three 503s: one call's attempts
    assert adapter.status(known).reason == "PENDING"
    result = adapter.status(known)
    assert result.kind is StatusKind.SUCCEEDED and result.financial_transaction_id
    payment = orange.payment(charge.rail_reference)
    wait_until(lambda: receiver.received, timeout=10, what="the notification")
    path, body = receiver.received[0]
    assert path.endswith(f"?ref={charge.rail_reference}")
    assert body == {"status": "SUCCESS", "txnid": payment["txnid"], "notif_token": payment["notif_token"]}

    other = _charge()
    orange.script_order(other.rail_reference, notify=False)
    adapter.request_to_pay(other)
    assert orange.set_status(order_id_for(other.rail_reference), "FAILED")["status"] == "FAILED"
    assert orange.notify(other.rail_reference, token="missing") == 202
    assert orange.notify(other.rail_reference, token="wrong", status="SUCCESS") == 202
    claims = [b for p, b in receiver.received if other.rail_reference in p]
    assert claims[0] == {"status": "FAILED", "txnid": None}
    assert claims[1]["status"] == "SUCCESS"
    assert claims[1]["notif_token"] != orange.payment(other.rail_reference)["notif_token"]
    with pytest.raises(ValueError):
        orange.script_order(other.rail_reference, outcome="SUCCESSFUL")


def test_lost_and_failed_inits(orange, receiver):
    adapter = OrangeMoney.from_env(orange.env(receiver.url))
    charge = _charge()
    orange.fail_next_inits(503)
    orange.lose_next_init_answers(504)
    assert adapter.request_to_pay(charge).http_status == 503 and orange.payments() == []
    assert adapter.request_to_pay(charge).http_status == 504 and len(orange.payments()) == 1
    again = adapter.request_to_pay(dataclasses.replace(charge, resend=True))
    assert (again.kind, again.http_status) == (SubmitKind.NO_ANSWER, 403)
