"""The merchant API end to end: one `vpay-server api` (gunicorn) and one
`vpay-worker` for the module, the sandbox MoMo rail, a webhook receiver on
loopback and a real Postgres. Refunds (partial, full, concurrent, replayed,
another merchant's), pagination while payments are created (a hypothesis
property), events after a webhook outage, the endpoint lifecycle with
enabled_events, secret rotation's overlap; then schemathesis against the
served OpenAPI document, and the curl examples of docs/api.md."""

from __future__ import annotations

import re
import subprocess
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (content_type_conformance, ignored_auth, not_a_server_error,
                                 response_schema_conformance, status_code_conformance)
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from api_support import MERCHANT, OTHER, make_payment, new_key, running_api
from support import Proc, TimeMachine, base_env, script, wait_until
from test_webhooks import Receiver, Reply
from vpay.api.openapi import DOCUMENT
from vpay.money import charges
from vpay.rails.port import StatusKind

pytestmark = pytest.mark.slow
DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


@pytest.fixture(scope="module")
def mapi(db_url, tmp_path_factory):
    """The API (endpoints on loopback allowed, retention stated as 30 days) and
    a worker on the same database and rail, for the whole module."""
    logs = tmp_path_factory.mktemp("mapi")
    with running_api(db_url, logs, VPAY_WEBHOOKS_ALLOW_PRIVATE="1", VPAY_RETENTION_DAYS="30") as stack:
        worker = Proc([script("vpay-worker"), "--idle-sleep", "0.1", "--worker-concurrency", "2"],
                      stack.env() | {"VPAY_WEBHOOKS_ALLOW_PRIVATE": "1"}, logs / "worker.log")
        try:
            yield stack
        finally:
            worker.close()


@pytest.fixture
def api(mapi, db):
    mapi.rail.reset()
    return mapi


@pytest.fixture
def rx():
    receiver = Receiver()
    yield receiver
    receiver.close()


class Client:
    """requests with a merchant's key against the API."""

    def __init__(self, url: str, key: str):
        self.url, self.headers = url, {"Authorization": f"Bearer {key}"}

    def get(self, path: str, **params) -> requests.Response:
        return requests.get(self.url + path, params=params, headers=self.headers, timeout=30)

    def post(self, path: str, body: dict | None = None, key: str | None = None) -> requests.Response:
        headers = self.headers | ({"Idempotency-Key": key} if key else {})
        return requests.post(self.url + path, json=body, headers=headers, timeout=30)

    def delete(self, path: str) -> requests.Response:
        return requests.delete(self.url + path, headers=self.headers, timeout=30)


def _paid(api, db, client: Client, amount: int = 1500) -> dict:
    """A payment taken through the API and settled by the worker's poll."""
    intent = client.post("/v1/payment_intents", {"amount": amount, "currency": "EUR", "payment_method": {
        "type": "mtn_momo", "msisdn": "256770000001"}}).json()
    with TimeMachine(api.db_url, kinds=("poll",)):
        wait_until(lambda: client.get(f"/v1/payment_intents/{intent['id']}").json()["status"] == "succeeded",
                   timeout=30, what="the payment to succeed")
    return client.get(f"/v1/payment_intents/{intent['id']}").json()


# --- refunds ------------------------------------------------------------------


def test_partial_then_full_refund_are_polled_to_succeeded_and_webhooked_by_enabled_events(api, db, rx):
    me = Client(api.url, new_key(db))
    hook = me.post("/v1/webhook_endpoints", {"url": rx.url("/refunds"),
                                             "enabled_events": ["refund.succeeded", "refund.failed"]})
    assert hook.status_code == 201, hook.text
    intent = _paid(api, db, me)
    partial = me.post("/v1/refunds", {"payment_intent": intent["id"], "amount": 500, "reason": "one item"})
    assert partial.status_code == 201, partial.text
    assert partial.json()["status"] == "pending" and partial.json()["amount"] == 500
    rest = me.post("/v1/refunds", {"charge": intent["latest_charge"]})
    assert rest.status_code == 201 and rest.json()["amount"] == 1000
    again = me.post("/v1/refunds", {"payment_intent": intent["id"]})
    assert again.status_code == 422 and again.json()["error"]["code"] == "charge_already_refunded"
    ids = {partial.json()["id"], rest.json()["id"]}
    with TimeMachine(api.db_url, kinds=("refund_poll",)):
        wait_until(lambda: {me.get(f"/v1/refunds/{i}").json()["status"] for i in ids} == {"succeeded"},
                   timeout=30, what="both refunds to succeed")
    posts = rx.wait_posts("/refunds", 2)
    secret = hook.json()["secret"]
    got = [Webhook(secret).verify(p.body, p.headers) for p in posts]
    assert sorted(d["data"]["refund"]["id"] for d in got) == sorted(ids)
    assert {d["type"] for d in got} == {"refund.succeeded"}  # no payment_intent.* event reached it
    listed = me.get("/v1/refunds", payment_intent=intent["id"]).json()
    assert [r["id"] for r in listed["data"]] == [rest.json()["id"], partial.json()["id"]]


def test_concurrent_refunds_never_give_back_more_than_the_charge(api, db):
    me = Client(api.url, new_key(db))
    intent = _paid(api, db, me, amount=1500)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: me.post("/v1/refunds", {"payment_intent": intent["id"],
                                                                  "amount": 400}), range(8)))
    made = [a for a in answers if a.status_code == 201]
    refused = [a for a in answers if a.status_code == 422]
    assert len(made) == 3 and len(refused) == 5, [a.status_code for a in answers]
    assert {a.json()["error"]["code"] for a in refused} == {"amount_exceeds_refundable"}
    assert db.execute("SELECT sum(amount) FROM refunds").fetchone()[0] == 1200


def test_a_refund_replays_under_its_key_and_another_merchant_cannot_see_or_refund_it(api, db):
    me, them = Client(api.url, new_key(db)), Client(api.url, new_key(db, OTHER))
    intent = _paid(api, db, me)
    body = {"payment_intent": intent["id"], "amount": 300}
    first = me.post("/v1/refunds", body, key="refund-42")
    replay = me.post("/v1/refunds", body, key="refund-42")
    assert first.status_code == replay.status_code == 201
    assert replay.content == first.content and replay.headers["Idempotent-Replayed"] == "true"
    assert me.post("/v1/refunds", body | {"amount": 301}, key="refund-42").json()["error"]["code"] == \
        "idempotency_key_reused"
    assert db.execute("SELECT count(*) FROM refunds").fetchone()[0] == 1
    refund_id = first.json()["id"]
    theirs, missing = them.get(f"/v1/refunds/{refund_id}"), them.get("/v1/refunds/re_" + "0" * 24)
    assert theirs.status_code == missing.status_code == 404 and theirs.content == missing.content
    stolen = them.post("/v1/refunds", {"payment_intent": intent["id"]})
    nothing = them.post("/v1/refunds", {"payment_intent": "pi_" + "0" * 24})
    assert stolen.status_code == nothing.status_code == 404
    assert stolen.json()["error"]["code"] == nothing.json()["error"]["code"] == "resource_missing"
    assert them.get("/v1/refunds").json()["data"] == []
    assert db.execute("SELECT count(*) FROM refunds").fetchone()[0] == 1


# --- lists --------------------------------------------------------------------


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(existing=st.integers(0, 12), limit=st.integers(1, 5), created_per_page=st.integers(0, 3))
def test_walking_all_pages_while_payments_are_created_sees_each_earlier_one_exactly_once(
        mapi, db_url, existing, limit, created_per_page):
    merchant = f"walk-{uuid.uuid4().hex[:8]}"
    import psycopg
    with psycopg.connect(db_url, autocommit=True) as conn:
        key = new_key(conn, merchant)
        before = [make_payment(conn, merchant)["payment_intent_id"] for _ in range(existing)]
    me = Client(mapi.url, key)
    stop = threading.Event()

    def create_meanwhile():  # a second writer, racing the walk through the API
        while not stop.is_set():
            me.post("/v1/payment_intents", {"amount": 100, "currency": "EUR", "payment_method": {
                "type": "mtn_momo", "msisdn": "256770000001"}})

    writer = threading.Thread(target=create_meanwhile, daemon=True)
    writer.start()
    seen, after = [], None
    try:
        while True:
            for _ in range(created_per_page):
                me.post("/v1/payment_intents", {"amount": 100, "currency": "EUR", "payment_method": {
                    "type": "mtn_momo", "msisdn": "256770000001"}})
            page = me.get("/v1/payment_intents", limit=limit, **({"starting_after": after} if after else {}))
            assert page.status_code == 200, page.text
            seen += [o["id"] for o in page.json()["data"]]
            if not page.json()["has_more"]:
                break
            after = page.json()["data"][-1]["id"]
    finally:
        stop.set()
        writer.join(30)
    assert len(seen) == len(set(seen))  # nothing repeated
    assert [i for i in seen if i in set(before)] == before[::-1]  # each earlier one, once, newest first


# --- events -------------------------------------------------------------------


def test_a_merchant_that_missed_n_webhooks_lists_exactly_those_n(api, db, rx):
    me = Client(api.url, new_key(db))
    hook = me.post("/v1/webhook_endpoints", {"url": rx.url("/hook"),
                                             "enabled_events": ["payment_intent.succeeded"]}).json()
    for _ in range(2):  # delivered before the outage
        charges.settle(db, make_payment(db)["id"], StatusKind.SUCCEEDED)
    rx.wait_posts("/hook", 2)
    wait_until(lambda: db.execute("SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'")
               .fetchone()[0] == 2, timeout=30, what="the first two deliveries recorded")
    rx.script("/hook", *[Reply(status=503)] * 100)  # the merchant's endpoint is down
    missed = []
    for _ in range(3):
        charge = make_payment(db)
        charges.settle(db, charge["id"], StatusKind.SUCCEEDED)
        missed.append(db.execute("SELECT id FROM events WHERE payment_intent_id = %s AND type = "
                                 "'payment_intent.succeeded'", (charge["payment_intent_id"],)).fetchone()[0])
    rx.wait_posts("/hook", 5)  # each missed one was tried and refused
    listed = me.get("/v1/events", delivery_success="false").json()
    assert [e["id"] for e in listed["data"]] == missed[::-1] and listed["retention_days"] == 30
    for event in listed["data"]:
        one = me.get(f"/v1/events/{event['id']}")
        assert one.status_code == 200 and one.json() == event
    delivered = me.get("/v1/events", delivery_success="true", type="payment_intent.succeeded").json()
    assert len(delivered["data"]) == 2 and not set(missed) & {e["id"] for e in delivered["data"]}
    them = Client(api.url, new_key(db, OTHER))
    assert them.get("/v1/events").json()["data"] == []
    assert them.get(f"/v1/events/{missed[0]}").status_code == 404
    assert hook["id"].startswith("we_")


# --- endpoints ----------------------------------------------------------------


def test_endpoint_lifecycle_register_list_read_delete_and_no_delivery_after(api, db, rx):
    me = Client(api.url, new_key(db))
    made = me.post("/v1/webhook_endpoints", {"url": rx.url("/life"), "description": "shop"})
    assert made.status_code == 201 and made.json()["enabled_events"] == ["*"]
    endpoint = made.json()
    assert me.get("/v1/webhook_endpoints").json()["data"] == [
        {k: v for k, v in endpoint.items() if k != "secret"}]
    charges.settle(db, make_payment(db)["id"], StatusKind.SUCCEEDED)
    rx.wait_posts("/life", 2)  # processing and succeeded: every type
    gone = me.delete(f"/v1/webhook_endpoints/{endpoint['id']}")
    assert gone.status_code == 200 and gone.json() == {"id": endpoint["id"], "object": "webhook_endpoint",
                                                       "deleted": True}
    assert me.get(f"/v1/webhook_endpoints/{endpoint['id']}").status_code == 404
    assert me.delete(f"/v1/webhook_endpoints/{endpoint['id']}").status_code == 404
    assert db.execute("SELECT count(*) FROM webhook_endpoints").fetchone()[0] == 0
    refused = me.post("/v1/webhook_endpoints", {"url": "http://169.254.169.254/latest"})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "url_refused"


def test_rotation_signs_with_both_secrets_during_the_overlap_then_the_new_one_only(api, db, rx):
    me = Client(api.url, new_key(db))
    endpoint = me.post("/v1/webhook_endpoints", {"url": rx.url("/rot"),
                                                 "enabled_events": ["payment_intent.succeeded"]}).json()
    old = endpoint["secret"]
    rotated = me.post(f"/v1/webhook_endpoints/{endpoint['id']}/rotate_secret", {"overlap_seconds": 3600})
    assert rotated.status_code == 200 and rotated.json()["previous_secret_expires_at"]
    new = rotated.json()["secret"]
    assert new != old and "secret" not in me.get(f"/v1/webhook_endpoints/{endpoint['id']}").json()
    charges.settle(db, make_payment(db)["id"], StatusKind.SUCCEEDED)
    [during] = rx.wait_posts("/rot", 1)
    assert len(re.findall(r"v1,", during.headers["webhook-signature"])) == 2
    for secret in (old, new):  # a receiver on either secret accepts it
        Webhook(secret).verify(during.body, during.headers)
    last = me.post(f"/v1/webhook_endpoints/{endpoint['id']}/rotate_secret", {"overlap_seconds": 0}).json()
    charges.settle(db, make_payment(db)["id"], StatusKind.SUCCEEDED)
    after = rx.wait_posts("/rot", 2)[1]
    assert len(re.findall(r"v1,", after.headers["webhook-signature"])) == 1
    Webhook(last["secret"]).verify(after.body, after.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(after.body, after.headers)
    them = Client(api.url, new_key(db, OTHER))
    assert them.post(f"/v1/webhook_endpoints/{endpoint['id']}/rotate_secret").status_code == 404


# --- the document, fuzzed against the live API --------------------------------


CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance,
          content_type_conformance, ignored_auth]
EXAMPLES_PER_OPERATION = 15  # per generation mode (valid and invalid data)


def test_schemathesis_finds_no_server_error_no_schema_mismatch_and_no_unauthenticated_success(api, db):
    """schemathesis reads the served document and fuzzes every operation with
    a valid key: valid and invalid data, each answer checked for a 5xx, a body
    or status or content type the document does not describe, and (sent again
    without the key) a success without authentication. Run through its Python
    API: its pytest plugin does not load under this pytest."""
    key = new_key(db)
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    failures: dict[str, str] = {}
    calls: dict[str, int] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    merchant_routes = {f"{m.upper()} {p}" for p, ops in DOCUMENT["paths"].items() if p.startswith("/v1/")
                       for m in ops}
    assert merchant_routes <= {o.label for o in operations}  # (it leaves out /openapi.json itself)
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                if isinstance(case.body, dict) and isinstance(case.body.get("url"), str):
                    case.body["url"] = "http://127.0.0.1:9/fuzz"  # registration resolves it: stay on loopback
                case.call_and_validate(base_url=api.url, headers={"Authorization": f"Bearer {key}"},
                                       checks=CHECKS)
                calls[operation.label] = calls.get(operation.label, 0) + 1
            try:
                run()
            except Unsatisfiable:  # no invalid input exists (an operation without parameters)
                assert mode is GenerationMode.NEGATIVE, operation.label
            except Exception as exc:  # noqa: BLE001 - every failure is reported below, by operation
                failures[f"{operation.label} ({mode.value})"] = str(exc)[:1500]
    assert not failures, "\n\n".join(f"{k}: {v}" for k, v in failures.items())
    assert all(calls.get(route, 0) >= 5 for route in merchant_routes), calls  # it did exercise each


# --- docs/api.md's curl examples ----------------------------------------------


def _examples() -> list[str]:
    """Every ```sh block of docs/api.md that calls curl, in order."""
    blocks = re.findall(r"```sh\n(.*?)```", DOCS.read_text(), re.S)
    return [b for b in blocks if "curl" in b]


def test_the_curl_examples_of_docs_api_md_run_against_the_api(api, db, rx, tmp_path):
    """The blocks run in order in one bash (set -euo pipefail; every curl -f,
    every jq -e), so a block that fails or answers otherwise fails the test.
    Between taking the payment and refunding it the payment is settled, as
    the worker would."""
    key = new_key(db)
    blocks = _examples()
    assert len(blocks) >= 5 and any("# --- refund ---" in b for b in blocks)
    cut = next(i for i, b in enumerate(blocks) if "# --- refund ---" in b)
    env = base_env(api.db_url, VPAY=api.url, SK=key, HOOK_URL=rx.url("/docs"))

    def run(script_text: str) -> None:
        done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script_text], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    run("".join(blocks[:cut]) + f'echo "$PI" > {tmp_path}/pi\n')
    pi = (tmp_path / "pi").read_text().strip()
    charge = db.execute("SELECT id FROM charges WHERE payment_intent_id = %s", (pi,)).fetchone()[0]
    assert charges.settle(db, charge, StatusKind.SUCCEEDED).transitioned
    run(f"PI={pi}\n" + "".join(blocks[cut:]))
    assert db.execute("SELECT amount FROM refunds").fetchall() == [(500,)]
    assert db.execute("SELECT count(*) FROM webhook_endpoints").fetchone()[0] == 0  # created, then deleted
