"""Fuzzing the app (hypothesis, falcon.testing.TestClient) against the real
test database and a sandbox MoMo rail, and keeping the OpenAPI document true.

For every generated request: no 5xx, the status is documented for the
operation, errors have the documented shape, and nothing is written that the
request had no right to write (a callback writes only poll jobs of charges
it names; a refused create writes nothing at all).
"""

from __future__ import annotations

import json
from urllib.parse import quote

import falcon.inspect
import pytest
from falcon import testing
from hypothesis import HealthCheck, given, settings, strategies as st

from api_support import MERCHANT, OTHER, make_payment, mtn_env, new_key, snapshot
from vpay.money import charges
from vpay.api.app import create_app
from vpay.api.openapi import DOCUMENT
from vpay.rails.port import StatusKind
from vpay.sandbox.mtn import SandboxRail

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
MONEY_TABLES = ("payment_intents", "charges", "events", "alerts", "merchants", "merchant_api_keys",
                "idempotency_keys")
ERROR_TYPES = set(DOCUMENT["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["type"]["enum"])


def _documented(template: str, method: str) -> set[int]:
    return {int(s) for s in DOCUMENT["paths"][template][method.lower()]["responses"]}


def _check_answer(resp, template: str | None, method: str) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    if template is not None:
        assert resp.status_code in _documented(template, method), (template, method, resp.status_code)
    else:
        assert resp.status_code == 404
    if resp.status_code >= 400:
        error = resp.json["error"]
        assert error["type"] in ERROR_TYPES and error["code"] and error["message"]
        assert "Traceback" not in resp.text


@pytest.fixture
def app(db, db_url):
    with SandboxRail(success_after_seconds=60) as rail:
        env = mtn_env(rail, 8080)

        def rail_for(code):
            from vpay.rails.mtn import MtnMomo
            return MtnMomo.from_env(env)

        application = create_app(db_url, rail_for)
        try:
            yield application
        finally:
            application.vpay_db.close()


@pytest.fixture
def client(app):
    return testing.TestClient(app)


# --- the document --------------------------------------------------------------


def test_every_route_of_the_app_is_in_the_openapi_document_and_vice_versa(app, client):
    in_app = {(route.path, m.method) for route in falcon.inspect.inspect_routes(app)
              for m in route.methods if not m.internal}
    in_doc = {(path, method.upper()) for path, ops in DOCUMENT["paths"].items() for method in ops}
    assert in_app == in_doc
    for path, ops in DOCUMENT["paths"].items():
        for method, op in ops.items():
            assert op["responses"], (path, method)
            for status, response in op["responses"].items():
                assert response["description"] and response["content"]["application/json"]["schema"]
            for param in (p["name"] for p in op.get("parameters", []) if p.get("in") == "path"):
                assert "{" + param + "}" in path
    served = client.simulate_get("/openapi.json")
    assert served.status_code == 200 and served.json == DOCUMENT
    assert DOCUMENT["openapi"] == "3.1.0"


# --- callbacks -----------------------------------------------------------------


def _arrange(db, made_charges: dict[str, dict]) -> None:
    """Put each named charge's poll job in its state again (every example starts the same)."""
    db.execute("UPDATE charges SET last_polled_at = NULL")
    db.execute("DELETE FROM jobs WHERE kind = 'poll'")
    for state, charge in made_charges.items():
        key, payload = f"poll:{charge['id']}", json.dumps({"charge_id": charge["id"]})
        if state == "parked":
            db.execute("INSERT INTO jobs (kind, lane, dedupe_key, payload, run_at) VALUES "
                       "('poll', %s, %s, %s, now() + interval '90 seconds')", (charge["rail"], key, payload))
        elif state == "leased":
            db.execute("INSERT INTO jobs (kind, lane, dedupe_key, payload, run_at, locked_by, locked_at, "
                       "lease_expires_at, lease_token, attempts) VALUES ('poll', %s, %s, %s, "
                       "now() + interval '90 seconds', 'w', now(), now() + interval '300 seconds', "
                       "gen_random_uuid(), 1)", (charge["rail"], key, payload))
        elif state == "dead":
            db.execute("INSERT INTO jobs (kind, lane, dedupe_key, payload, run_at, last_error) VALUES "
                       "('poll', %s, %s, %s, 'infinity', 'parked')", (charge["rail"], key, payload))
        # "terminal": no poll job


def _jobs(db) -> dict[str, tuple]:
    rows = db.execute("SELECT dedupe_key, kind, payload, attempts, failures, locked_by, lease_token, "
                      "last_error, run_at::text, run_at <= now() FROM jobs").fetchall()
    return {r[0]: r[1:] for r in rows}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=80)


@st.composite
def callback_bodies(draw) -> bytes:
    return draw(st.one_of(
        st.just(b""),
        st.binary(max_size=300),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries({"status": st.sampled_from(["SUCCESSFUL", "FAILED", "PENDING"]),
                               "externalId": st.text(max_size=200),
                               "financialTransactionId": json_values,
                               "reason": json_values}).map(lambda v: json.dumps(v).encode()),
        st.integers(65_537, 70_000).map(lambda n: b" " * n),
        st.integers(1_000, 60_000).map(lambda n: b"[" * n),
    ))


def test_fuzzed_callbacks_never_fail_and_write_only_poll_jobs_of_named_charges(client, db):
    new_key(db)
    made_charges = {state: make_payment(db, payer=f"2567700003{i:02d}") for i, state in
               enumerate(("parked", "leased", "dead", "terminal"))}
    charges.settle(db, made_charges["terminal"]["id"], StatusKind.SUCCEEDED)
    known = {c["id"]: c["rail_reference"] for c in made_charges.values()}
    references = list(known.values())

    @FUZZ
    @given(data=st.data())
    def run(data):
        _arrange(db, made_charges)
        method = data.draw(st.sampled_from(["POST", "PUT"]))
        code = data.draw(st.one_of(st.just("mtn"), st.just("mtn"), st.just("mtn"), st.text(st.characters(min_codepoint=33,
                                                                         max_codepoint=0x10FFFF,
                                                                         exclude_characters="/?#%",
                                                                         exclude_categories=["Cs"]),
                                                            min_size=1, max_size=8)))
        ref = data.draw(st.one_of(st.sampled_from(references), st.sampled_from(references),
                                  st.sampled_from(references).map(str.upper), st.uuids().map(str),
                                  header_text, st.none()))
        query = data.draw(st.one_of(
            st.just({} if ref is None else {"ref": ref}),
            st.just({} if ref is None else {"ref": ref}),
            st.lists(st.sampled_from(references + ["x"]), min_size=2, max_size=3).map(lambda r: {"ref": r}),
            st.just({"ref": ref, "other": "1"})))
        headers = {"Content-Type": data.draw(st.sampled_from(["application/json", "text/plain", "", "x/y"]))}
        body = data.draw(callback_bodies())
        before_money, before_jobs = snapshot(db, *MONEY_TABLES), _jobs(db)

        resp = client.simulate_request(method, f"/provider/{quote(code, safe='')}/callback",
                                       params=query or None, body=body, headers=headers)

        _check_answer(resp, "/provider/{code}/callback", method)
        assert snapshot(db, *MONEY_TABLES) == before_money
        after_jobs = _jobs(db)
        if resp.status_code != 202:
            assert after_jobs == before_jobs
            return
        assert resp.content == b'{"received":true}'
        for key, row in before_jobs.items():  # nothing removed; only run_at may move, and only to now
            assert key in after_jobs
            assert after_jobs[key][:7] == row[:7]
            if after_jobs[key][7] != row[7]:
                assert key.startswith("poll:") and after_jobs[key][8] is True
        for key in set(after_jobs) - set(before_jobs):  # new: a poll of a charge the reference names
            assert key.startswith("poll:") and key[5:] in known
            assert after_jobs[key][0] == "poll"

    run()


# --- payment intents -----------------------------------------------------------

VALID = {"amount": 1500, "currency": "EUR", "payment_method": {"type": "mtn_momo", "msisdn": "256770000001"}}


@st.composite
def intent_bodies(draw) -> bytes:
    shaped = st.fixed_dictionaries(
        {},
        optional={
            "amount": st.one_of(st.integers(-10, 10**13), json_values),
            "currency": st.one_of(st.sampled_from(["EUR", "eur", "XAF", "UGX", "ZZZ", ""]), json_values),
            "payment_method": st.one_of(
                st.fixed_dictionaries({}, optional={
                    "type": st.one_of(st.sampled_from(["mtn_momo", "orange_money", "card"]), json_values),
                    "msisdn": st.one_of(st.sampled_from(["256770000001", "+256770000002", "12", "x" * 20]),
                                        json_values),
                    "pin": json_values}),
                json_values),
            "description": st.one_of(st.none(), st.text(max_size=170), json_values),
            "metadata": json_values,
        })
    return draw(st.one_of(
        st.just(VALID).map(json.dumps).map(str.encode),
        st.just(VALID).map(json.dumps).map(str.encode),
        shaped.map(lambda v: json.dumps(v).encode()),
        st.builds(lambda amount, desc: json.dumps({**VALID, "amount": amount, "description": desc}).encode(),
                  st.integers(1, 5000), st.one_of(st.none(), st.text(max_size=40))),
        st.builds(lambda amount, cur, msisdn: json.dumps({"amount": amount, "currency": cur, "payment_method": {
            "type": "mtn_momo", "msisdn": msisdn}}).encode(),
            st.one_of(st.integers(-5, 10**13), json_values), st.sampled_from(["EUR", "xaf", "ZZZ", "EURO"]),
            st.text(alphabet="+0123456789 x", max_size=17)),
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.integers(65_537, 70_000).map(lambda n: b" " * n),
    ))


@st.composite
def authorizations(draw, keys: dict[str, str]) -> str | None:
    """An Authorization header or None; a valid key about two times in three."""
    kind = draw(st.sampled_from(["mine"] * 6 + ["theirs"] * 2 + ["bare", "mangled", "text", "none"]))
    key = keys.get(kind) or keys["mine"]
    if kind == "bare":
        return key
    if kind == "mangled":
        return f"Bearer {key[:-1]}" + draw(st.sampled_from("xyz0"))
    if kind == "text":
        return draw(header_text)
    if kind == "none":
        return None
    return f"Bearer {key}"


def _counts(db) -> tuple[int, ...]:
    return tuple(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                 for t in ("payment_intents", "charges", "events", "jobs", "idempotency_keys"))


def test_fuzzed_creates_never_fail_and_a_refused_one_writes_nothing(client, db):
    mine, theirs = new_key(db, MERCHANT), new_key(db, OTHER)

    @FUZZ
    @given(auth=authorizations({"mine": mine, "theirs": theirs}),
           idem=st.one_of(st.none(), st.sampled_from(["k1", "k2"]), st.none(), st.sampled_from(["k1", "k3"]),
                          header_text),
           content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded"]),
           body=intent_bodies())
    def run(auth, idem, content_type, body):
        headers = {"Content-Type": content_type}
        if auth is not None:
            headers["Authorization"] = auth
        if idem is not None:
            headers["Idempotency-Key"] = idem
        before, before_rows = _counts(db), snapshot(db)

        resp = client.simulate_post("/v1/payment_intents", body=body, headers=headers)

        _check_answer(resp, "/v1/payment_intents", "POST")
        if resp.status_code != 201:
            assert snapshot(db) == before_rows
            return
        intent = resp.json
        assert intent["id"].startswith("pi_") and intent["latest_charge"].startswith("ch_")
        assert isinstance(intent["amount"], int) and intent["status"] in ("processing", "requires_payment_method")
        after = _counts(db)
        if resp.headers.get("Idempotent-Replayed") == "true":
            assert after == before
        else:
            assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
            assert after[4] - before[4] == (1 if idem is not None else 0)

    run()


def test_fuzzed_reads_never_fail_and_write_nothing(client, db):
    mine = new_key(db, MERCHANT)
    theirs = make_payment(db, merchant_id=OTHER)["payment_intent_id"]

    @FUZZ
    @given(intent_id=st.one_of(st.just(theirs), st.just(theirs),
                               st.text(st.characters(exclude_categories=["Cs"]), max_size=80),
                               st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789").map("pi_{}".format)),
           auth=authorizations({"mine": mine}))
    def run(intent_id, auth):
        before = snapshot(db)
        headers = {"Authorization": auth} if auth is not None else {}
        resp = client.simulate_get(f"/v1/payment_intents/{quote(intent_id, safe='')}", headers=headers)
        if intent_id and "/" not in intent_id:
            _check_answer(resp, "/v1/payment_intents/{intent_id}", "GET")
        else:
            assert resp.status_code in (401, 404) and resp.status_code < 500
        assert resp.status_code != 200  # the only intent belongs to another merchant
        assert snapshot(db) == before

    run()


def test_an_unexpected_error_is_a_generic_500_without_its_trace(app, client, db):
    class Boom:
        def on_get(self, req, resp):
            raise RuntimeError("secret detail")

    app.add_route("/boom", Boom())
    resp = client.simulate_get("/boom")
    assert resp.status_code == 500
    assert resp.json == {"error": {"type": "api_error", "code": "internal_error",
                                   "message": "An error occurred on our side; the request may be retried."}}
