"""The merchant API (/v1/payment_intents) and /healthz against a real
gunicorn (`vpay-server api`), the sandbox MoMo rail and a real Postgres;
the merchants CLI as a subprocess; Idempotency-Key recovery in process."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest
import requests
from falcon import testing

from api_support import (MERCHANT, OTHER, api_stack, charge_of, mtn_env, new_key, snapshot,  # noqa: F401
                         stack)
from support import base_env, script
from vpay.money import merchants
from vpay.api.app import create_app
from vpay.sandbox.mtn import SandboxRail

BODY = {"amount": 1500, "currency": "EUR", "payment_method": {"type": "mtn_momo", "msisdn": "256770000001"}}


def _count(db, table: str) -> int:
    return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def _rtp_count(rail) -> int:
    return rail.count(method="POST", path_prefix="/collection/v1_0/requesttopay")


def test_create_answers_201_with_the_prompt_and_writes_intent_charge_and_poll(stack, db):
    key = new_key(db)
    resp = stack.create(key, description="Order 42")
    assert resp.status_code == 201, resp.text
    intent = resp.json()
    assert intent["object"] == "payment_intent" and intent["id"].startswith("pi_")
    assert (intent["amount"], intent["currency"], intent["status"]) == (1500, "EUR", "processing")
    assert intent["merchant"] == MERCHANT and intent["description"] == "Order 42"
    assert intent["next_action"]["type"] == "mobile_money_prompt"
    assert intent["next_action"]["expires_at"].endswith("Z")
    charge = charge_of(db, intent["id"])
    assert intent["latest_charge"] == charge["id"]
    assert (charge["status"], charge["payer"], charge["amount"]) == ("pending", "256770000001", 1500)
    assert charge["submitted_at"] is not None  # the request-to-pay was accepted
    assert db.execute("SELECT kind FROM jobs WHERE dedupe_key = %s",
                      (f"poll:{charge['id']}",)).fetchone() == ("poll",)
    sent = stack.rail.transaction(charge["rail_reference"])
    assert sent["callbackUrl"] == (f"http://127.0.0.1:{stack.port}/provider/mtn/callback"
                                   f"?ref={charge['rail_reference']}")
    got = requests.get(f"{stack.url}/v1/payment_intents/{intent['id']}",
                       headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert got.status_code == 200 and got.json() == intent


def test_another_merchants_intent_reads_exactly_like_a_missing_one(stack, db):
    mine, theirs = new_key(db, MERCHANT), new_key(db, OTHER)
    intent = stack.create(theirs).json()
    auth = {"Authorization": f"Bearer {mine}"}
    other = requests.get(f"{stack.url}/v1/payment_intents/{intent['id']}", headers=auth, timeout=10)
    missing = requests.get(f"{stack.url}/v1/payment_intents/pi_nosuchintent000000000000",
                           headers=auth, timeout=10)
    odd = requests.get(f"{stack.url}/v1/payment_intents/%00x", headers=auth, timeout=10)
    assert other.status_code == missing.status_code == odd.status_code == 404
    assert other.content == missing.content == odd.content
    assert other.json()["error"]["code"] == "resource_missing"


def test_a_bad_key_is_401_and_writes_nothing(stack, db):
    key = new_key(db)
    revoked = new_key(db)
    merchants.revoke_api_key(db, "key_" + revoked.split("_")[1])
    before = snapshot(db)
    rtp_before = _rtp_count(stack.rail)
    forged = key[:-1] + ("A" if key[-1] != "A" else "B")
    for auth in (None, "", "Bearer", f"Basic {key}", f"Bearer {forged}", f"Bearer {revoked}",
                 "Bearer sk_live_whatever", f"Bearer {key} extra", "Bearer \u00e9t\u00e9"):
        headers = {"Idempotency-Key": "k-401"}
        if auth is not None:
            headers["Authorization"] = auth.encode("utf-8").decode("latin-1")
        resp = requests.post(f"{stack.url}/v1/payment_intents", json=BODY, headers=headers, timeout=10)
        assert resp.status_code == 401, (auth, resp.text)
        assert resp.json()["error"]["type"] == "authentication_error"
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        got = requests.get(f"{stack.url}/v1/payment_intents/pi_x", headers=headers, timeout=10)
        assert got.status_code == 401
    assert snapshot(db) == before
    assert _rtp_count(stack.rail) == rtp_before


@pytest.mark.parametrize("body, status, code, param", [
    (b"", 400, "parameter_missing", None),
    (b"{nope", 400, "invalid_json", None),
    (b"[]", 400, "invalid_json", None),
    ({**BODY, "customer": "c"}, 400, "parameter_unknown", "customer"),
    ({k: v for k, v in BODY.items() if k != "amount"}, 400, "parameter_missing", "amount"),
    ({**BODY, "payment_method": {"type": "mtn_momo"}}, 400, "parameter_missing", "payment_method[msisdn]"),
    ({**BODY, "payment_method": {**BODY["payment_method"], "pin": "1"}}, 400, "parameter_unknown",
     "payment_method[pin]"),
    ({**BODY, "amount": "1500"}, 422, "parameter_invalid", "amount"),
    ({**BODY, "amount": 15.5}, 422, "parameter_invalid", "amount"),
    ({**BODY, "amount": 0}, 422, "parameter_invalid", "amount"),
    ({**BODY, "amount": True}, 422, "parameter_invalid", "amount"),
    ({**BODY, "currency": "ZZZ"}, 422, "parameter_invalid", "currency"),
    ({**BODY, "payment_method": "mtn"}, 422, "parameter_invalid", "payment_method"),
    ({**BODY, "payment_method": {"type": "card", "msisdn": "256770000001"}}, 422, "parameter_invalid",
     "payment_method[type]"),
    ({**BODY, "payment_method": {"type": "mtn_momo", "msisdn": "12"}}, 422, "parameter_invalid",
     "payment_method[msisdn]"),
    ({**BODY, "description": "x" * 161}, 422, "parameter_invalid", "description"),
    ({**BODY, "description": "nul\u0000"}, 422, "parameter_invalid", "description"),
    (b'{"amount": 1500, "currency": "EUR", "payment_method": {"type": "mtn_momo", "msisdn": '
     b'"256770000001"}, "description": "\\ud800"}', 422, "parameter_invalid", "description"),
])
def test_invalid_requests_are_400_or_422_with_param_and_write_nothing(stack, db, body, status, code, param):
    key = new_key(db)
    before = snapshot(db)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = requests.post(f"{stack.url}/v1/payment_intents", data=data, timeout=10,
                         headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "k-bad",
                                  "Content-Type": "application/json"})
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["code"], error.get("param")) == ("invalid_request_error", code, param)
    assert snapshot(db) == before


def test_the_same_key_and_body_replay_the_first_answer(stack, db):
    key = new_key(db)
    first = stack.create(key, idempotency_key="order-7")
    again = stack.create(key, idempotency_key="order-7")
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert (_count(db, "payment_intents"), _count(db, "charges")) == (1, 1)
    assert _rtp_count(stack.rail) == 1


def test_the_same_key_with_another_body_is_409(stack, db):
    key = new_key(db)
    assert stack.create(key, idempotency_key="order-8").status_code == 201
    before = snapshot(db)
    resp = stack.create(key, amount=1600, idempotency_key="order-8")
    assert resp.status_code == 409
    assert resp.json()["error"] == {
        "type": "idempotency_error", "code": "idempotency_key_reused",
        "message": "Keys for idempotent requests can only be used with the same parameters they "
                   "were first used with."}
    assert snapshot(db) == before


def test_keys_are_per_merchant(stack, db):
    a, b = new_key(db, MERCHANT), new_key(db, OTHER)
    first, second = stack.create(a, idempotency_key="same"), stack.create(b, idempotency_key="same")
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] != second.json()["id"]


def test_concurrent_requests_with_one_key_create_one_intent_and_one_charge(stack, db):
    key = new_key(db)
    # The rail holds each request-to-pay for a second: the first request is in
    # progress while the others arrive.
    stack.rail.script("256770000201", rtp_delay_seconds=1.0)
    barrier = threading.Barrier(8)
    answers: list[requests.Response] = []

    def post():
        barrier.wait()
        answers.append(stack.create(key, payer="256770000201", idempotency_key="race-1"))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    statuses = sorted(a.status_code for a in answers)
    assert len(statuses) == 8 and set(statuses) <= {201, 409}, [a.text for a in answers]
    created = [a for a in answers if a.status_code == 201]
    assert created and len({a.content for a in created}) == 1
    for a in answers:
        if a.status_code == 409:
            assert a.json()["error"]["code"] == "idempotency_key_in_use"
            assert a.headers["Retry-After"] == "1"
    assert (_count(db, "payment_intents"), _count(db, "charges")) == (1, 1)
    assert _rtp_count(stack.rail) == 1
    replay = stack.create(key, payer="256770000201", idempotency_key="race-1")
    assert replay.status_code == 201 and replay.content == created[0].content


def test_healthz_on_the_server(stack):
    resp = requests.get(f"{stack.url}/healthz", timeout=5)
    assert resp.status_code == 200 and resp.json() == {"status": "ok", "database": "ok"}
    doc = requests.get(f"{stack.url}/openapi.json", timeout=5).json()
    assert doc["openapi"].startswith("3.1")


# --- Idempotency-Key recovery, in process (the same app gunicorn serves) ------


@pytest.fixture
def local(db, db_url):
    """The app in process against the test database and a sandbox rail."""
    with SandboxRail(success_after_seconds=60) as rail:
        env = mtn_env(rail, None)

        def rail_for(code):
            from vpay.rails.mtn import MtnMomo
            return MtnMomo.from_env(env)

        app = create_app(db_url, rail_for)
        client = testing.TestClient(app)
        try:
            yield client, rail
        finally:
            app.vpay_db.close()


# --- the merchants CLI ---------------------------------------------------------


def test_merchants_cli_creates_a_key_shown_once_that_the_api_accepts(db, db_url, local):
    client, _ = local
    env = base_env(db_url)
    def cli(*args):
        return subprocess.run([script("vpay-server"), "merchants", *args], env=env, capture_output=True,
                              text=True, timeout=60)
    out = cli("create", "--id", "acme", "--name", "Acme", "--json")
    assert out.returncode == 0, out.stderr
    issued = json.loads(out.stdout)
    assert issued["merchant"] == "acme" and issued["created"] is True
    assert issued["api_key"].startswith("sk_") and "shown once" in out.stderr
    # run twice, create issues no second key: it names the command that does
    twice = cli("create", "--id", "acme", "--json")
    assert twice.returncode == 1 and twice.stdout == ""
    assert twice.stderr.splitlines() == ["vpay: merchant 'acme' exists, nothing changed; to issue it another "
                                         "key run vpay-server merchants create-key --id acme"]
    again = json.loads(cli("create-key", "--id", "acme", "--json").stdout)
    assert again["created"] is False and again["api_key"] != issued["api_key"]
    assert cli("create-key", "--id", "nobody").returncode == 1

    listed = cli("list", "--json")
    assert listed.returncode == 0
    assert issued["api_key"] not in listed.stdout and again["api_key"] not in listed.stdout
    [acme] = json.loads(listed.stdout)
    assert acme["name"] == "Acme" and [k["id"] for k in acme["keys"]] == [issued["key_id"], again["key_id"]]
    stored = db.execute("SELECT secret_sha256 FROM merchant_api_keys").fetchall()
    assert all(issued["api_key"].encode() not in bytes(s[0]) for s in stored)

    assert client.simulate_get("/v1/payment_intents/pi_x", headers={
        "Authorization": f"Bearer {issued['api_key']}"}).status_code == 404
    revoke = subprocess.run([script("vpay-server"), "merchants", "revoke-key", issued["key_id"]],
                            env=env, capture_output=True, text=True, timeout=60)
    assert revoke.returncode == 0
    assert client.simulate_get("/v1/payment_intents/pi_x", headers={
        "Authorization": f"Bearer {issued['api_key']}"}).status_code == 401
    bad = subprocess.run([script("vpay-server"), "merchants", "create", "--id", "no spaces"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2


# --- the server process ----------------------------------------------------------


def test_the_server_sends_ready_from_its_main_process_and_stops_cleanly_on_sigterm(db_url, spawn, tmp_path):
    import socket as socketlib
    from api_support import free_port
    notify = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(30)
    with SandboxRail() as rail:
        port = free_port()
        env = base_env(db_url, NOTIFY_SOCKET=str(tmp_path / "notify.sock"), **mtn_env(rail, port))
        proc = spawn("vpay-server", "api", "--bind", f"127.0.0.1:{port}", env=env)
        message, _ = notify.recvfrom(4096)
        assert b"READY=1" in message.split(b"\n")
        proc.wait_for_log("api ready")
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        proc.signal()
        assert proc.wait(40) == 0
    notify.close()
