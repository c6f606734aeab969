"""The local MoMo Collection double (vpay/sandbox/mtn/), driven over real
HTTP with plain ``requests``, the way a MoMo client would. No database."""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run from a checkout without an installed vpay
    sys.path.insert(0, str(ROOT))

from vpay.sandbox.mtn import DEFAULT_API_KEY, DEFAULT_API_USER, SANDBOX_FAILURES, SandboxRail
from support import wait_until  # noqa: E402

SUB_KEY = "test-sub-key"
OK_PAYER = "46700000001"
RTP = "/collection/v1_0/requesttopay"


class Momo:
    """A minimal MoMo Collection client over requests."""

    def __init__(self, rail: SandboxRail, sub_key: str = SUB_KEY) -> None:
        self.rail = rail
        self.base = rail.url
        self.sub_key = sub_key
        self.s = requests.Session()
        self.s.trust_env = False  # never route loopback through a proxy
        self._token: str | None = None

    def close(self) -> None:
        self.s.close()

    def token_response(self, sub_key=None, user=DEFAULT_API_USER, key=DEFAULT_API_KEY, basic=True):
        headers = {"Ocp-Apim-Subscription-Key": sub_key if sub_key is not None else self.sub_key}
        if basic:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{key}".encode()).decode()
        return self.s.post(f"{self.base}/collection/token/", headers=headers, timeout=5)

    def token(self) -> str:
        if self._token is None:
            r = self.token_response()
            assert r.status_code == 200, r.text
            self._token = r.json()["access_token"]
        return self._token

    def headers(self, **over):
        h = {
            "Authorization": f"Bearer {self.token()}",
            "Ocp-Apim-Subscription-Key": self.sub_key,
            "X-Target-Environment": "sandbox",
        }
        for k, v in over.items():
            k = k.replace("_", "-")
            if v is None:
                h.pop(k, None)
            else:
                h[k] = v
        return h

    def rtp(self, ref=None, payer=OK_PAYER, amount="1500", callback_url=None, timeout=5, body=None, **hdrs):
        ref = ref or str(uuid.uuid4())
        h = self.headers(**hdrs)
        h["X-Reference-Id"] = ref
        if callback_url:
            h["X-Callback-Url"] = callback_url
        if body is None:
            body = {
                "amount": amount,
                "currency": "EUR",
                "externalId": "ch_123",
                "payer": {"partyIdType": "MSISDN", "partyId": payer},
                "payerMessage": "Order 42",
                "payeeNote": "vpay",
            }
        r = self.s.post(f"{self.base}{RTP}", headers=h, json=body, timeout=timeout)
        return ref, r

    def status(self, ref, timeout=5, **hdrs):
        return self.s.get(f"{self.base}{RTP}/{ref}", headers=self.headers(**hdrs), timeout=timeout)


@pytest.fixture
def make_rail():
    rails, clients = [], []

    def make(**kw):
        kw.setdefault("subscription_key", SUB_KEY)
        kw.setdefault("success_after_seconds", 0.2)
        rail = SandboxRail(**kw).start()
        rails.append(rail)
        client = Momo(rail)
        clients.append(client)
        return rail, client

    yield make
    for c in clients:
        c.close()
    for r in rails:
        r.stop()


@pytest.fixture
def rail_and_client(make_rail):
    return make_rail()


# --------------------------------------------------------------------------- token


def test_token_requires_subscription_key_and_basic_credentials(rail_and_client):
    rail, momo = rail_and_client
    r = momo.token_response(sub_key="wrong")
    assert r.status_code == 401
    assert r.json()["code"] and r.json()["message"]

    r = momo.token_response(key="not-the-key")
    assert r.status_code == 401
    assert r.json()["code"] and r.json()["message"]

    r = momo.token_response(user="someone-else")
    assert r.status_code == 401

    r = momo.token_response(basic=False)
    assert r.status_code == 401

    r = momo.token_response()
    assert r.status_code == 200
    body = r.json()
    assert body["token_type"] == "access_token"
    assert body["expires_in"] == 3600
    assert isinstance(body["access_token"], str) and len(body["access_token"]) >= 20
    # each token is fresh
    assert momo.token_response().json()["access_token"] != body["access_token"]


def test_token_expires_after_ttl(make_rail):
    rail, momo = make_rail(token_ttl_seconds=1)
    ref, r = momo.rtp()
    assert r.status_code == 202
    wait_until(lambda: momo.status(ref).status_code == 401, timeout=5, what="token expiry")


# --------------------------------------------------------------------------- request to pay


def test_rtp_accepted_then_duplicate_reference_is_409(rail_and_client):
    rail, momo = rail_and_client
    ref, r = momo.rtp()
    assert r.status_code == 202
    assert r.content == b""
    _, again = momo.rtp(ref=ref)
    assert again.status_code == 409
    assert again.json()["code"] == "RESOURCE_ALREADY_EXIST"
    assert [t["reference"] for t in rail.transactions()] == [ref]


def test_rtp_auth_and_validation(rail_and_client):
    rail, momo = rail_and_client
    _, r = momo.rtp(Authorization=None)
    assert r.status_code == 401
    _, r = momo.rtp(Authorization="Bearer not-a-token-we-issued")
    assert r.status_code == 401
    _, r = momo.rtp(Ocp_Apim_Subscription_Key=None)
    assert r.status_code == 401
    _, r = momo.rtp(X_Target_Environment="mtnuganda")
    assert r.status_code == 500  # MTN's common-errors table
    assert r.json()["code"] == "NOT_ALLOWED_TARGET_ENVIRONMENT"
    _, r = momo.rtp(ref="not-a-uuid")
    assert r.status_code == 400
    _, r = momo.rtp(amount=15)  # MoMo wants the amount as a string
    assert r.status_code == 400
    _, r = momo.rtp(body={"amount": "1", "currency": "EUR", "externalId": "x"})  # no payer
    assert r.status_code == 400
    _, r = momo.rtp(callback_url="http://example.com/cb")  # not a loopback host
    assert r.status_code == 500
    assert r.json()["code"] == "INVALID_CALLBACK_URL_HOST"
    assert rail.transactions() == []  # none of these recorded anything


def test_callback_hosts_option_allows_a_named_host(make_rail):
    rail, momo = make_rail(callback_hosts=["vpay.example"])
    rail.script(OK_PAYER, callback=False)  # never actually call out
    _, r = momo.rtp(callback_url="https://vpay.example/provider/mtn/callback")
    assert r.status_code == 202
    _, r = momo.rtp(callback_url="http://127.0.0.1:9/cb")  # loopback not in the list
    assert r.status_code == 500 and r.json()["code"] == "INVALID_CALLBACK_URL_HOST"


def test_status_requires_bearer_subscription_key_and_target(rail_and_client):
    rail, momo = rail_and_client
    ref, r = momo.rtp()
    assert r.status_code == 202
    assert momo.status(ref, Authorization=None).status_code == 401
    assert momo.status(ref, Authorization="Bearer forged").status_code == 401
    assert momo.status(ref, Ocp_Apim_Subscription_Key="nope").status_code == 401
    wrong_env = momo.status(ref, X_Target_Environment="mtnghana")
    assert wrong_env.status_code == 500  # MTN's common-errors table
    assert wrong_env.json()["code"] == "NOT_ALLOWED_TARGET_ENVIRONMENT"
    assert momo.status(ref).status_code == 200


def test_unknown_reference_is_404(rail_and_client):
    rail, momo = rail_and_client
    r = momo.status(str(uuid.uuid4()))
    assert r.status_code == 404
    assert r.json()["code"] == "RESOURCE_NOT_FOUND"


# --------------------------------------------------------------------------- outcomes


def test_pending_then_successful_after_success_delay(rail_and_client):
    rail, momo = rail_and_client
    started = time.monotonic()
    ref, r = momo.rtp(amount="1500")
    assert r.status_code == 202
    first = momo.status(ref)
    assert first.status_code == 200
    body = first.json()
    assert body["status"] == "PENDING"
    assert "financialTransactionId" not in body
    assert "reason" not in body
    assert body["amount"] == "1500" and body["currency"] == "EUR" and body["externalId"] == "ch_123"
    assert body["payer"] == {"partyIdType": "MSISDN", "partyId": OK_PAYER}
    assert body["payerMessage"] == "Order 42" and body["payeeNote"] == "vpay"

    final = wait_until(lambda: (b := momo.status(ref).json())["status"] == "SUCCESSFUL" and b,
                       what="SUCCESSFUL")
    assert time.monotonic() - started >= 0.2
    assert final["financialTransactionId"]
    assert "reason" not in final
    # terminal: stays SUCCESSFUL with the same id
    assert momo.status(ref).json()["financialTransactionId"] == final["financialTransactionId"]


@pytest.mark.parametrize("payer,reason", sorted(SANDBOX_FAILURES.items()))
def test_sandbox_failure_payers_object_reason(make_rail, payer, reason):
    rail, momo = make_rail(reason_shape="object")
    ref, r = momo.rtp(payer=payer)
    assert r.status_code == 202
    body = momo.status(ref).json()
    assert body["status"] == "FAILED"
    assert body["reason"]["code"] == reason
    assert isinstance(body["reason"]["message"], str) and body["reason"]["message"]
    assert "financialTransactionId" not in body


def test_sandbox_failure_payers_string_reason_by_default(make_rail):
    # MTN's published shape: "reason": "APPROVAL_REJECTED"
    rail, momo = make_rail()
    for payer, reason in SANDBOX_FAILURES.items():
        ref, r = momo.rtp(payer=payer)
        assert r.status_code == 202
        body = momo.status(ref).json()
        assert (body["status"], body["reason"]) == ("FAILED", reason), payer


def test_sandbox_table_has_mtn_numbers():
    assert len(SANDBOX_FAILURES) == 14
    assert SANDBOX_FAILURES["46733123451"] == "APPROVAL_REJECTED"
    assert SANDBOX_FAILURES["46733123453"] == "ONGOING"
    assert SANDBOX_FAILURES["46733123463"] == "COULD_NOT_PERFORM_TRANSACTION"


def test_ongoing_stays_failed_ongoing_past_success_delay(make_rail):
    rail, momo = make_rail(success_after_seconds=0.05)
    ref, _ = momo.rtp(payer="46733123453")
    seen = []
    deadline = time.monotonic() + 0.4
    while time.monotonic() < deadline:
        b = momo.status(ref).json()
        seen.append((b["status"], b["reason"]))
    assert set(seen) == {("FAILED", "ONGOING")}


# --------------------------------------------------------------------------- scripting


def test_scripted_pending_reads_then_successful(make_rail):
    rail, momo = make_rail(success_after_seconds=0.0)  # the script, not the timer, decides
    rail.script(OK_PAYER, pending_reads=3, outcome="SUCCESSFUL")
    ref, r = momo.rtp()
    assert r.status_code == 202
    statuses = [momo.status(ref).json()["status"] for _ in range(5)]
    assert statuses == ["PENDING", "PENDING", "PENDING", "SUCCESSFUL", "SUCCESSFUL"]


def test_scripted_failed_outcome_and_never_terminal(rail_and_client):
    rail, momo = rail_and_client
    rail.script("46711111111", pending_reads=1, outcome="FAILED", reason="NOT_ENOUGH_FUNDS")
    rail.script("46722222222", outcome="PENDING")
    ref1, _ = momo.rtp(payer="46711111111")
    ref2, _ = momo.rtp(payer="46722222222")
    assert momo.status(ref1).json()["status"] == "PENDING"
    b = momo.status(ref1).json()
    assert b["status"] == "FAILED" and b["reason"] == "NOT_ENOUGH_FUNDS"
    deadline = time.monotonic() + 0.5  # well past success_after_seconds
    while time.monotonic() < deadline:
        assert momo.status(ref2).json()["status"] == "PENDING"


def test_script_applies_only_to_transactions_created_after_it(rail_and_client):
    rail, momo = rail_and_client
    before, _ = momo.rtp()
    rail.script(OK_PAYER, outcome="FAILED", reason="EXPIRED")
    after, _ = momo.rtp()
    assert momo.status(after).json()["reason"] == "EXPIRED"
    wait_until(lambda: momo.status(before).json()["status"] == "SUCCESSFUL", what="unscripted success")


def test_status_errors_then_normal(rail_and_client):
    rail, momo = rail_and_client
    rail.script(OK_PAYER, status_errors=[500, 503], pending_reads=1, outcome="SUCCESSFUL")
    ref, _ = momo.rtp()
    r1, r2, r3, r4 = (momo.status(ref) for _ in range(4))
    assert (r1.status_code, r1.json()["code"]) == (500, "INTERNAL_PROCESSING_ERROR")
    assert (r2.status_code, r2.json()["code"]) == (503, "SERVICE_UNAVAILABLE")
    assert (r3.status_code, r3.json()["status"]) == (200, "PENDING")  # error reads did not count
    assert (r4.status_code, r4.json()["status"]) == (200, "SUCCESSFUL")


def test_rtp_errors_do_not_record_the_transaction(rail_and_client):
    rail, momo = rail_and_client
    rail.script(OK_PAYER, rtp_errors=[503, 500])
    ref, r = momo.rtp()
    assert r.status_code == 503
    assert r.json()["code"] == "SERVICE_UNAVAILABLE"
    assert momo.status(ref).status_code == 404
    _, r = momo.rtp(ref=ref)
    assert r.status_code == 500
    assert momo.status(ref).status_code == 404
    _, r = momo.rtp(ref=ref)  # errors used up: the rail takes it now
    assert r.status_code == 202
    assert momo.status(ref).status_code == 200


def test_rtp_record_then_error_records_the_transaction(rail_and_client):
    rail, momo = rail_and_client
    rail.script(OK_PAYER, rtp_record_then_error=[500])
    ref, r = momo.rtp()
    assert r.status_code == 500
    assert momo.status(ref).status_code == 200
    _, again = momo.rtp(ref=ref)
    assert again.status_code == 409


def test_status_delay_exceeds_client_read_timeout(rail_and_client):
    rail, momo = rail_and_client
    rail.script(OK_PAYER, status_delay_seconds=1.5)
    ref, r = momo.rtp()
    assert r.status_code == 202
    t0 = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        momo.status(ref, timeout=0.3)
    assert time.monotonic() - t0 < 1.4
    # the read reached the rail even though the client gave up
    wait_until(lambda: rail.count("GET", reference=ref) == 1, what="logged read")
    t0 = time.monotonic()
    rail.stop()  # a handler still sleeping must not hold up stop()
    assert time.monotonic() - t0 < 1.0


def test_rtp_delay_times_out_client_but_transaction_is_recorded(rail_and_client):
    rail, momo = rail_and_client
    rail.script(OK_PAYER, rtp_delay_seconds=1.0)
    with pytest.raises(requests.exceptions.ReadTimeout):
        momo.rtp(ref=(ref := str(uuid.uuid4())), timeout=0.3)
    assert rail.transaction(ref) is not None
    rail.script(OK_PAYER)  # back to the default: a resend answers at once
    _, again = momo.rtp(ref=ref)
    assert again.status_code == 409


def test_script_rejects_unknown_or_bad_options(rail_and_client):
    rail, momo = rail_and_client
    with pytest.raises(ValueError):
        rail.script(OK_PAYER, pending_read=3)
    with pytest.raises(ValueError):
        rail.script(OK_PAYER, status_errors=[200])
    with pytest.raises(ValueError):
        rail.script(OK_PAYER, outcome="SUCCESSFUL", reason="EXPIRED")
    for bad in ({"outcome": "MAYBE"}, {"payer": "x"}, {"pending_reads": -1}, [1, 2]):
        r = momo.s.put(f"{rail.url}/_sandbox/payers/{OK_PAYER}", json=bad, timeout=5)
        assert r.status_code == 400, bad
        assert r.json()["code"] == "BAD_REQUEST"
    assert rail.scripts() == {}


# --------------------------------------------------------------------------- control


def test_set_status_contradicts_a_settled_charge(rail_and_client):
    rail, momo = rail_and_client
    ref, _ = momo.rtp()
    wait_until(lambda: momo.status(ref).json()["status"] == "SUCCESSFUL", what="SUCCESSFUL")
    rail.set_status(ref, "FAILED", "INTERNAL_PROCESSING_ERROR")
    b = momo.status(ref).json()
    assert b["status"] == "FAILED" and b["reason"] == "INTERNAL_PROCESSING_ERROR"
    assert "financialTransactionId" not in b
    # and over HTTP, back to SUCCESSFUL
    r = momo.s.put(f"{rail.url}/_sandbox/transactions/{ref}", json={"status": "SUCCESSFUL"}, timeout=5)
    assert r.status_code == 200
    assert momo.status(ref).json()["status"] == "SUCCESSFUL"
    with pytest.raises(KeyError):
        rail.set_status(str(uuid.uuid4()), "FAILED")
    r = momo.s.put(f"{rail.url}/_sandbox/transactions/{uuid.uuid4()}", json={"status": "FAILED"}, timeout=5)
    assert r.status_code == 404


def test_set_status_pending_holds_against_the_timer(rail_and_client):
    rail, momo = rail_and_client
    ref, _ = momo.rtp()
    rail.set_status(ref, "PENDING")
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        assert momo.status(ref).json()["status"] == "PENDING"


def test_http_control_endpoints(rail_and_client):
    rail, momo = rail_and_client
    base = f"{rail.url}/_sandbox"
    r = momo.s.put(f"{base}/payers/{OK_PAYER}", json={"pending_reads": 2, "outcome": "FAILED",
                                                      "reason": "PAYER_LIMIT_REACHED"}, timeout=5)
    assert r.status_code == 200 and r.json()["script"]["pending_reads"] == 2
    ref, _ = momo.rtp()
    assert [momo.status(ref).json()["status"] for _ in range(3)] == ["PENDING", "PENDING", "FAILED"]

    txns = momo.s.get(f"{base}/transactions", timeout=5).json()
    assert [(t["reference"], t["status"], t["reason"]) for t in txns] == [(ref, "FAILED", "PAYER_LIMIT_REACHED")]

    assert momo.s.delete(f"{base}/transactions/{ref}", timeout=5).status_code == 204
    assert momo.status(ref).status_code == 404
    assert rail.forget(ref) is False

    log = momo.s.get(f"{base}/requests", timeout=5).json()
    assert all(not e["path"].startswith("/_sandbox") for e in log)
    assert log and set(log[0]) == {"method", "path", "reference", "status_code", "at"}

    assert momo.s.post(f"{base}/reset", timeout=5).status_code == 204
    assert rail.transactions() == [] and rail.requests_log() == []
    assert rail.scripts() == {}
    # tokens survive a reset
    ref2, r = momo.rtp()
    assert r.status_code == 202


def test_requests_log_counts(rail_and_client):
    rail, momo = rail_and_client
    momo.token()
    ref, _ = momo.rtp()
    momo.rtp(ref=ref)  # 409
    for _ in range(3):
        momo.status(ref)
    momo.status(str(uuid.uuid4()))  # 404
    momo.s.get(f"{rail.url}/_sandbox/transactions", timeout=5)  # control: not logged

    assert rail.count() == 7
    assert rail.count("POST", path_prefix="/collection/token") == 1
    assert rail.count("POST", path_prefix=RTP) == 2
    assert rail.count("GET", reference=ref) == 3
    assert rail.count(reference=ref) == 5
    assert rail.count("GET", path_prefix=RTP) == 4
    codes = [e["status_code"] for e in rail.requests_log()]
    assert codes == [200, 202, 409, 200, 200, 200, 404]
    assert all(isinstance(e["at"], float) for e in rail.requests_log())


# --------------------------------------------------------------------------- callbacks


class _Receiver:
    def __init__(self) -> None:
        self.bodies: list[tuple[str, str, dict]] = []
        self.first = threading.Event()
        self.second = threading.Event()
        receiver = self

        class H(BaseHTTPRequestHandler):
            def _any(self):
                n = int(self.headers.get("Content-Length", "0"))
                receiver.bodies.append((self.command, self.path, json.loads(self.rfile.read(n))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                (receiver.second if receiver.first.is_set() else receiver.first).set()

            do_POST = do_PUT = _any

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, path):
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    rec = _Receiver()
    yield rec
    rec.close()


def test_callback_delivered_once_on_success(rail_and_client, receiver):
    rail, momo = rail_and_client
    ref = str(uuid.uuid4())
    momo.rtp(ref=ref, callback_url=receiver.url(f"/provider/mtn/callback?ref={ref}"))
    # no status read: the success timer alone triggers the callback
    assert receiver.first.wait(5), "callback not delivered"
    method, path, body = receiver.bodies[0]
    assert method == "POST"
    assert path == f"/provider/mtn/callback?ref={ref}"
    assert body["status"] == "SUCCESSFUL"
    assert body["financialTransactionId"] and body["externalId"] == "ch_123"
    assert body["amount"] == "1500" and body["payer"]["partyId"] == OK_PAYER

    # reads, and a contradiction, never trigger another callback
    for _ in range(3):
        assert momo.status(ref).json()["status"] == "SUCCESSFUL"
    rail.set_status(ref, "FAILED", "EXPIRED")
    momo.status(ref)
    assert not receiver.second.wait(0.5), "callback sent twice"
    assert len(receiver.bodies) == 1
    wait_until(lambda: len(rail.callbacks()) == 1, what="callback logged")
    assert rail.callbacks()[0]["status_code"] == 200
    assert rail.transaction(ref)["callbackSent"] is True


def test_callback_on_failure_payer_and_disabled_by_script(rail_and_client, receiver):
    rail, momo = rail_and_client
    rail.script("46799999999", callback=False, outcome="FAILED", reason="EXPIRED")
    quiet, _ = momo.rtp(payer="46799999999", callback_url=receiver.url("/quiet"))
    assert momo.status(quiet).json()["status"] == "FAILED"

    loud, _ = momo.rtp(payer="46733123451", callback_url=receiver.url("/loud"))
    assert receiver.first.wait(5), "failure callback not delivered"
    _, path, body = receiver.bodies[0]
    assert path == "/loud"
    assert body["status"] == "FAILED" and body["reason"] == "APPROVAL_REJECTED"
    assert not receiver.second.wait(0.3)
    assert [p for _, p, _ in receiver.bodies] == ["/loud"]


def test_callback_errors_are_swallowed(make_rail):
    rail, momo = make_rail()
    # nothing listens on this port (bind then close to find a free one)
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead_port = s.getsockname()[1]
    s.close()
    ref, r = momo.rtp(callback_url=f"http://127.0.0.1:{dead_port}/cb")
    assert r.status_code == 202
    entry = wait_until(lambda: rail.callbacks(), what="callback attempt")[0]
    assert entry["reference"] == ref and entry["error"] and entry["status_code"] is None
    assert momo.status(ref).json()["status"] == "SUCCESSFUL"  # the rail keeps working


def test_context_manager_and_url():
    with SandboxRail(subscription_key=SUB_KEY) as rail:
        assert rail.url.startswith("http://127.0.0.1:")
        s = requests.Session()
        s.trust_env = False
        r = s.get(f"{rail.url}/_sandbox/transactions", timeout=5)
        assert r.status_code == 200 and r.json() == []
        s.close()
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"{rail.url}/_sandbox/transactions", timeout=1)
