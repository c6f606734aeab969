"""Idempotency-Key recovery against a real Postgres, with the API app in
process (the same app gunicorn serves). The integration half of
tests/acceptance/test_api_intents.py, which keeps the ``local`` fixture.
"""

from __future__ import annotations

import json

from falcon import testing

from api_support import MERCHANT, new_key
from vpay.money import charges
from vpay.api.app import create_app
from vpay.api.intents import parse_new_payment
from vpay.base.queries import Q
from vpay.rails.port import RailError
from test_api_intents import _count, _rtp_count, local  # helpers kept in tests/acceptance/test_api_intents.py

BODY = {"amount": 1500, "currency": "EUR", "payment_method": {"type": "mtn_momo", "msisdn": "256770000001"}}


def _post(client, key, idem, body=BODY):
    return client.simulate_post("/v1/payment_intents", body=json.dumps(body),
                                headers={"Authorization": f"Bearer {key}", "Idempotency-Key": idem,
                                         "Content-Type": "application/json"})


def _in_progress(db, idem: str, intent_id: str, age: str, body=BODY) -> None:
    fingerprint = parse_new_payment(json.dumps(body).encode(), MERCHANT).fingerprint
    db.execute("INSERT INTO idempotency_keys (merchant_id, key, request_sha256, payment_intent_id, "
               "created_at, locked_at) VALUES (%s, %s, %s, %s, now() - %s::interval, now() - %s::interval)",
               (MERCHANT, idem, fingerprint, intent_id, age, age))


def test_a_live_in_progress_key_is_409_in_use(local, db):
    client, _ = local
    key = new_key(db)
    _in_progress(db, "k1", "pi_pending000000000000001", "2 seconds")
    resp = _post(client, key, "k1")
    assert resp.status_code == 409 and resp.json["error"]["code"] == "idempotency_key_in_use"
    assert _count(db, "payment_intents") == 0


def test_a_stale_attempt_that_never_committed_is_created_under_its_chosen_id(local, db):
    client, rail = local
    key = new_key(db)
    _in_progress(db, "k2", "pi_chosenbeforecrash00001", "10 minutes")
    resp = _post(client, key, "k2")
    assert resp.status_code == 201 and resp.json["id"] == "pi_chosenbeforecrash00001"
    assert (_count(db, "payment_intents"), _count(db, "charges"), _rtp_count(rail)) == (1, 1, 1)
    replay = _post(client, key, "k2")
    assert replay.status_code == 201 and replay.content == resp.content


def test_a_stale_attempt_that_committed_is_answered_from_its_intent_not_created_twice(local, db):
    client, rail = local
    key = new_key(db)
    created = charges.create_payment(db, merchant_id=MERCHANT, amount=1500, currency="EUR", rail="mtn",
                                   payer="256770000001", intent_id="pi_committedbeforecrash01")
    _in_progress(db, "k3", created.intent["id"], "10 minutes")
    resp = _post(client, key, "k3")
    assert resp.status_code == 201 and resp.json["id"] == created.intent["id"]
    assert resp.json["latest_charge"] == created.charge["id"]
    assert (_count(db, "payment_intents"), _count(db, "charges")) == (1, 1)
    assert _rtp_count(rail) == 0  # its poll recovers the request-to-pay (404 → resubmit)
    row = db.execute("SELECT status_code, response_body FROM idempotency_keys WHERE key = 'k3'").fetchone()
    assert row[0] == 201 and json.loads(row[1])["id"] == created.intent["id"]


def test_a_key_older_than_24_hours_is_new_again_and_the_sweep_query_deletes_it(local, db):
    client, _ = local
    key = new_key(db)
    first = _post(client, key, "k4")
    db.execute("UPDATE idempotency_keys SET created_at = now() - interval '25 hours'")
    second = _post(client, key, "k4")
    assert first.status_code == second.status_code == 201
    assert first.json["id"] != second.json["id"]
    _post(client, key, "k5")
    db.execute("UPDATE idempotency_keys SET created_at = now() - interval '25 hours' WHERE key = 'k5'")
    deleted = db.execute(Q["delete_expired_idempotency_keys"]).rowcount
    assert deleted == 1
    assert [r[0] for r in db.execute("SELECT key FROM idempotency_keys")] == ["k4"]


def test_a_request_that_fails_before_creating_releases_its_key(db, db_url):
    def unconfigured(code):
        raise RailError("MTN MoMo adapter: missing environment variable(s): VPAY_MTN_BASE_URL")

    app = create_app(db_url, unconfigured)
    try:
        key = new_key(db)
        resp = _post(testing.TestClient(app), key, "k6")
        # the rail is not configured here: the merchant is told so, once (a 503
        # with Retry-After would be retried for ever), and the key is released
        assert resp.status_code == 422 and "Retry-After" not in resp.headers
        assert resp.json["error"] == {
            "type": "invalid_request_error", "code": "payment_method_unavailable",
            "param": "payment_method[type]",
            "message": "Payment method mtn_momo is not available on this deployment."}
        assert _count(db, "idempotency_keys") == 0 and _count(db, "payment_intents") == 0
    finally:
        app.vpay_db.close()
