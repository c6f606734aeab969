"""Every rail adapter's every call answered with a redirect (a 3xx, the token
call's too or not) is MISCONFIGURED, reason ``HTTP_<status>``, and nothing
reaches the redirect's target: rail calls never follow one (docs/security.md,
"Rail calls"; vpay/rails/http.py ``exchange``). From a fresh-clone review
(issue 30): ``requests`` followed them, and sent MoMo's subscription key on.
Real HTTP servers on 127.0.0.1."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vpay.rails.mtn import MtnMomo
from vpay.rails.orange import OrangeMoney
from vpay.rails.mpesa import MpesaDaraja
from vpay.rails.pawapay import PawaPay
from vpay.rails.port import ChargeRequest, RefundRequest


def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
    handler.send_response(status)
    for name, value in {**headers, "content-length": str(len(body))}.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


class _Target(BaseHTTPRequestHandler):
    """Where the redirects point: keeps whatever reaches it."""

    def _any(self):
        self.server.seen.append((self.command, self.path, dict(self.headers)))
        _reply(self, 200, b'{"access_token":"t","expires_in":3600}')
    do_GET = do_POST = do_PUT = _any

    def log_message(self, *a):
        pass


class _Mover(BaseHTTPRequestHandler):
    """Answers the token call properly (when server.tokens) and redirects the rest."""

    def _any(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.server.tokens and ("token" in self.path or "oauth" in self.path):
            _reply(self, 200, b'{"access_token": "token-1", "token_type": "access_token", "expires_in": 3600}',
                   **{"content-type": "application/json"})
        else:
            _reply(self, self.server.code, b'{"status": "SUCCESSFUL"}',
                   **{"content-type": "application/json", "location": self.server.target + self.path})
    do_GET = do_POST = do_PUT = _any

    def log_message(self, *a):
        pass


def _serve(handler):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def servers():
    target, mover = _serve(_Target), _serve(_Mover)
    target.seen = []
    mover.target = f"http://127.0.0.1:{target.server_port}"
    yield mover, target
    for s in (mover, target):
        s.shutdown()
        s.server_close()


def _adapters(base):
    nosleep = dict(sleep=lambda s: None)
    return {
        "mtn": MtnMomo(base_url=base, subscription_key="key-1", api_user="user-1", api_key="secret-1", **nosleep),
        "orange": OrangeMoney(base, "cid", "csecret", "mkey", "cm", "https://pay.example/cb",
                              "https://shop.example/r", "https://shop.example/c", **nosleep),
        "mpesa": MpesaDaraja(base, "ck", "cs", "174379", "passkey", "https://pay.example/mpesa", **nosleep),
        "pawapay": PawaPay(base, "tok", "46=MTN_MOMO_ZMB:EUR", **nosleep),
    }


RAIL_DATA = {"pay_token": "pt", "checkout_request_id": "ws_CO_1", "notif_token": "n",
             "payment_url": "https://x.example/p"}
# Each rail's charge is one it sends (whole XOF for Orange, whole KES to a
# 2547 MSISDN for M-Pesa): an answer made without a request proves nothing.
CHARGES = {
    "mtn": ChargeRequest(charge_id="ch_1", rail_reference="3f0c3c1e-0000-4000-8000-000000000001",
                         amount=100, currency="EUR", payer="46700000001", rail_data=RAIL_DATA),
    "orange": ChargeRequest(charge_id="ch_1", rail_reference="3f0c3c1e-0000-4000-8000-000000000001",
                            amount=1000, currency="XOF", payer="22507000001", rail_data=RAIL_DATA),
    "mpesa": ChargeRequest(charge_id="ch_1", rail_reference="3f0c3c1e-0000-4000-8000-000000000001",
                           amount=10000, currency="KES", payer="254708374149", rail_data=RAIL_DATA),
    "pawapay": ChargeRequest(charge_id="ch_1", rail_reference="3f0c3c1e-0000-4000-8000-000000000001",
                             amount=100, currency="EUR", payer="46700000001", rail_data=RAIL_DATA),
}


def _refund(charge: ChargeRequest) -> RefundRequest:
    return RefundRequest(refund_id="re_1", rail_reference="3f0c3c1e-0000-4000-8000-000000000002",
                         charge_rail_reference=charge.rail_reference, amount=charge.amount,
                         currency=charge.currency, payer=charge.payer)


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("tokens", [True, False])
@pytest.mark.parametrize("rail", ["mtn", "orange", "mpesa", "pawapay"])
def test_a_redirected_call_is_misconfigured_and_reaches_nothing_else(servers, code, tokens, rail):
    mover, target = servers
    mover.code, mover.tokens = code, tokens
    adapter = _adapters(f"http://127.0.0.1:{mover.server_port}")[rail]
    charge = CHARGES[rail]
    results = {
        "request_to_pay": adapter.request_to_pay(charge),
        "status": adapter.status(charge),
        "refund": adapter.refund(_refund(charge)),
        "refund_status": adapter.refund_status(_refund(charge)),
    }
    asked = 0
    for op, answer in results.items():
        if answer.http_status is None and answer.kind.name != "MISCONFIGURED":
            continue  # the adapter's own answer, nothing sent: a refund the rail does not offer
        asked += 1
        assert (answer.kind.name, answer.reason, answer.http_status) == (
            "MISCONFIGURED", f"HTTP_{code}", code), (op, answer)
    assert asked >= 2
    assert target.seen == []


class _Scripted(BaseHTTPRequestHandler):
    """Answers the token call, then each other request with the next status
    of ``server.script`` (a 3xx pointing nowhere)."""

    def _any(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if "token" in self.path or "oauth" in self.path:
            _reply(self, 200, b'{"access_token": "token-1", "token_type": "access_token", "expires_in": 3600}')
            return
        status, body = self.server.script.pop(0), b"{}"
        if isinstance(status, tuple):
            status, body = status
        self.server.answered.append(status)
        _reply(self, status, body, **{"content-type": "application/json",
                                     "location": "http://127.0.0.1:9" + self.path})
    do_GET = do_POST = do_PUT = _any

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("rail", ["mtn", "pawapay"])
@pytest.mark.parametrize("then", [302, 403])
def test_a_refusal_after_an_attempt_that_may_have_reached_the_rail_is_no_answer(rail, then):
    """The first attempt answered 503 (the rail, or what fronts it, had the
    request; retried), the retry refused: that proves nothing about the
    first, so the create call is NO_ANSWER (sent again later by the resubmit
    job), never MISCONFIGURED (which fails a first send: no payer asked)."""
    srv = _serve(_Scripted)
    srv.script, srv.answered = [503, then], []
    try:
        adapter = _adapters(f"http://127.0.0.1:{srv.server_port}")[rail]
        answer = adapter.request_to_pay(CHARGES[rail])
        assert srv.answered == [503, then]
        assert (answer.kind.name, answer.http_status) == ("NO_ANSWER", then)
        srv.script = [then]  # the same refusal on a first attempt: our configuration
        assert adapter.request_to_pay(CHARGES[rail]).kind.name == "MISCONFIGURED"
    finally:
        srv.shutdown()
        srv.server_close()


_PAWAPAY_REJECTED = (b'{"depositId": "3f0c3c1e-0000-4000-8000-000000000001", "status": "REJECTED", '
                     b'"failureReason": {"failureCode": "PAYER_LIMIT_REACHED"}}')


@pytest.mark.parametrize("rail,rejected", [("mtn", (400, b'{"code": "PAYER_NOT_FOUND"}')),
                                           ("pawapay", (200, _PAWAPAY_REJECTED))])
def test_a_rejection_after_an_attempt_that_may_have_reached_the_rail_is_no_answer(rail, rejected):
    """A REJECTED answer to the retry proves no more than a refusal of our
    configuration does (a second review): NO_ANSWER; on a first attempt it
    stands."""
    srv = _serve(_Scripted)
    srv.script, srv.answered = [503, rejected], []
    try:
        adapter = _adapters(f"http://127.0.0.1:{srv.server_port}")[rail]
        assert adapter.request_to_pay(CHARGES[rail]).kind.name == "NO_ANSWER"
        srv.script = [rejected]
        assert adapter.request_to_pay(CHARGES[rail]).kind.name == "REJECTED"
    finally:
        srv.shutdown()
        srv.server_close()
