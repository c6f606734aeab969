"""The merchant API's rules in process (falcon's TestClient, the real test
database, a sandbox MoMo rail): list paging and its edges, event filters and
retention, endpoint registration rules, refund refusals. The same routes
against gunicorn are tests/acceptance/test_merchant_api.py."""

from __future__ import annotations

import pytest
from falcon import testing

from api_support import MERCHANT, OTHER, make_payment, mtn_env, new_key, snapshot
from vpay.api.app import create_app
from vpay.base.settings import Settings
from vpay.money import charges
from vpay.rails.port import StatusKind
from vpay.sandbox.mtn import SandboxRail
from vpay.webhooks import MAX_ENDPOINTS_PER_MERCHANT


@pytest.fixture
def client(db, db_url):
    with SandboxRail(success_after_seconds=60) as rail:
        env = mtn_env(rail, 8080)

        def rail_for(code):
            from vpay.rails.mtn import MtnMomo
            from vpay.rails.orange import OrangeMoney
            if code == "orange":  # never called: a rail without refunds is refused first
                return OrangeMoney.__new__(OrangeMoney)
            return MtnMomo.from_env(env)

        app = create_app(db_url, rail_for, Settings(retention_days=30))
        try:
            yield testing.TestClient(app)
        finally:
            app.vpay_db.close()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _intents(db, n: int, merchant: str = MERCHANT) -> list[str]:
    """``n`` intents, one per distinct created_at (1 s apart, oldest first)."""
    ids = []
    for i in range(n):
        charge = make_payment(db, merchant)
        ids.append(charge["payment_intent_id"])
        db.execute("UPDATE payment_intents SET created_at = now() - make_interval(secs => %s) WHERE id = %s",
                   (1000 - i, charge["payment_intent_id"]))
    return ids


def _walk(client, key: str, path: str, **params) -> list[str]:
    seen, after = [], None
    while True:
        query = dict(params, **({"starting_after": after} if after else {}))
        page = client.simulate_get(path, params=query, headers=_auth(key))
        assert page.status_code == 200, page.text
        seen += [o["id"] for o in page.json["data"]]
        if not page.json["has_more"]:
            return seen
        after = page.json["data"][-1]["id"]


def test_intent_pages_walk_newest_first_each_way_and_filter(client, db):
    key = new_key(db)
    ids = _intents(db, 7)
    _intents(db, 2, OTHER)
    assert _walk(client, key, "/v1/payment_intents", limit=3) == ids[::-1]
    first = client.simulate_get("/v1/payment_intents", params={"limit": 3}, headers=_auth(key)).json
    assert first["object"] == "list" and first["has_more"] is True and len(first["data"]) == 3
    assert first["data"][0]["object"] == "payment_intent" and first["data"][0]["latest_charge"].startswith("ch_")
    back = client.simulate_get("/v1/payment_intents", params={"limit": 2, "ending_before": ids[2]},
                               headers=_auth(key)).json
    assert [o["id"] for o in back["data"]] == [ids[4], ids[3]] and back["has_more"] is True
    oldest_charge = db.execute("SELECT id FROM charges WHERE payment_intent_id = %s", (ids[0],)).fetchone()[0]
    charges.settle(db, oldest_charge, StatusKind.SUCCEEDED)
    done = client.simulate_get("/v1/payment_intents", params={"status": "succeeded"}, headers=_auth(key)).json
    assert [o["id"] for o in done["data"]] == [ids[0]]
    created = db.execute("SELECT floor(extract(epoch FROM created_at))::bigint FROM payment_intents WHERE id = %s",
                         (ids[3],)).fetchone()[0]
    ranged = client.simulate_get("/v1/payment_intents", params={"created[gte]": str(created),
                                                                "created[lte]": str(created + 2)},
                                 headers=_auth(key)).json
    assert [o["id"] for o in ranged["data"]] == [ids[4], ids[3]]


def test_bad_list_parameters_are_400_and_another_merchants_cursor_is_missing(client, db):
    key = new_key(db)
    theirs = _intents(db, 1, OTHER)[0]
    for params, param in (({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "x"}, "limit"),
                          ({"status": "paid"}, "status"), ({"created[gte]": "yesterday"}, "created[gte]"),
                          ({"starting_after": "ch_abc"}, "starting_after"),
                          ({"starting_after": "pi_a", "ending_before": "pi_b"}, "ending_before"),
                          ({"colour": "red"}, "colour")):
        resp = client.simulate_get("/v1/payment_intents", params=params, headers=_auth(key))
        assert resp.status_code == 400, (params, resp.text)
        assert resp.json["error"]["param"] == param
    other = client.simulate_get("/v1/payment_intents", params={"starting_after": theirs}, headers=_auth(key))
    missing = client.simulate_get("/v1/payment_intents", params={"starting_after": "pi_" + "0" * 24},
                                  headers=_auth(key))
    assert other.status_code == missing.status_code == 404
    assert other.json["error"]["code"] == missing.json["error"]["code"] == "resource_missing"


def test_events_list_type_filters_and_states_the_retention(client, db):
    key = new_key(db)
    charge = make_payment(db)
    charges.settle(db, charge["id"], StatusKind.SUCCEEDED)
    _intents(db, 1, OTHER)
    page = client.simulate_get("/v1/events", headers=_auth(key)).json
    assert page["retention_days"] == 30
    assert [e["type"] for e in page["data"]] == ["payment_intent.succeeded", "payment_intent.processing"]
    event = page["data"][0]
    assert event["object"] == "event" and event["payment_intent"] == charge["payment_intent_id"]
    assert event["data"]["object"]["status"] == "succeeded" and event["created"].endswith("Z")
    one = client.simulate_get(f"/v1/events/{event['id']}", headers=_auth(key))
    assert one.status_code == 200 and one.json == event
    only = client.simulate_get("/v1/events", params={"type": "payment_intent.processing"}, headers=_auth(key))
    assert [e["type"] for e in only.json["data"]] == ["payment_intent.processing"]
    family = client.simulate_get("/v1/events", params={"type": "refund.*"}, headers=_auth(key))
    assert family.json["data"] == []
    gone = client.simulate_get("/v1/events", params={"starting_after": "evt_" + "0" * 24}, headers=_auth(key))
    assert gone.status_code == 404 and "30 days" in gone.json["error"]["message"]
    theirs = db.execute("SELECT id FROM events WHERE merchant_id = %s", (OTHER,)).fetchone()[0]
    assert client.simulate_get(f"/v1/events/{theirs}", headers=_auth(key)).status_code == 404


def test_endpoint_rules_limit_ssrf_scoping_and_secret_shown_once(client, db, monkeypatch):
    monkeypatch.setenv("VPAY_WEBHOOKS_ALLOW_PRIVATE", "1")
    key, other = new_key(db), new_key(db, OTHER)
    made = client.simulate_post("/v1/webhook_endpoints", json={"url": "http://127.0.0.1:9/hook",
                                                               "enabled_events": ["refund.succeeded"]},
                                headers=_auth(key))
    assert made.status_code == 201, made.text
    assert made.json["secret"].startswith("whsec_") and made.json["enabled_events"] == ["refund.succeeded"]
    got = client.simulate_get(f"/v1/webhook_endpoints/{made.json['id']}", headers=_auth(key))
    assert got.status_code == 200 and "secret" not in got.json
    assert client.simulate_get(f"/v1/webhook_endpoints/{made.json['id']}", headers=_auth(other)).status_code == 404
    assert client.simulate_delete(f"/v1/webhook_endpoints/{made.json['id']}",
                                  headers=_auth(other)).status_code == 404
    assert client.simulate_post(f"/v1/webhook_endpoints/{made.json['id']}/rotate_secret",
                                headers=_auth(other)).status_code == 404
    before = snapshot(db, "merchants")
    for url in ("http://169.254.169.254/latest/meta-data", "ftp://example.com/x", "http://[::]/x"):
        refused = client.simulate_post("/v1/webhook_endpoints", json={"url": url}, headers=_auth(key))
        assert refused.status_code == 422 and refused.json["error"]["code"] == "url_refused", url
    bad = client.simulate_post("/v1/webhook_endpoints", json={"url": "http://127.0.0.1:9/h",
                                                              "enabled_events": ["charge.refunded"]},
                               headers=_auth(key))
    assert bad.status_code == 422 and bad.json["error"]["param"] == "enabled_events"
    for i in range(MAX_ENDPOINTS_PER_MERCHANT - 1):
        assert client.simulate_post("/v1/webhook_endpoints", json={"url": f"http://127.0.0.1:9/{i}"},
                                    headers=_auth(key)).status_code == 201
    over = client.simulate_post("/v1/webhook_endpoints", json={"url": "http://127.0.0.1:9/x"}, headers=_auth(key))
    assert over.status_code == 422 and over.json["error"]["code"] == "webhook_endpoint_limit"
    assert db.execute("SELECT count(*) FROM webhook_endpoints WHERE merchant_id = %s",
                      (MERCHANT,)).fetchone()[0] == MAX_ENDPOINTS_PER_MERCHANT
    assert snapshot(db, "merchants") == before
    listed = client.simulate_get("/v1/webhook_endpoints", headers=_auth(key)).json
    assert len(listed["data"]) == MAX_ENDPOINTS_PER_MERCHANT and all("secret" not in e for e in listed["data"])


def test_refund_refusals_write_nothing(client, db):
    key, other = new_key(db), new_key(db, OTHER)
    pending = make_payment(db)
    paid = make_payment(db)
    charges.settle(db, paid["id"], StatusKind.SUCCEEDED)
    orange = charges.create_payment(db, merchant_id=MERCHANT, amount=5000, currency="XOF", rail="orange",
                                    payer="2250700000001").charge
    charges.settle(db, orange["id"], StatusKind.SUCCEEDED)
    before = snapshot(db)
    cases = [
        (key, {"payment_intent": pending["payment_intent_id"]}, 422, "charge_not_refundable"),
        (key, {"charge": paid["id"], "amount": 1001}, 422, "amount_exceeds_refundable"),
        (key, {"charge": paid["id"], "amount": 0}, 422, "parameter_invalid"),
        (key, {"charge": orange["id"]}, 422, "refunds_unsupported"),
        (other, {"charge": paid["id"]}, 404, "resource_missing"),
        (key, {"charge": paid["id"], "payment_intent": paid["payment_intent_id"]}, 400, "parameter_missing"),
        (key, {"charge": paid["id"], "colour": 1}, 400, "parameter_unknown"),
    ]
    for auth, body, status, code in cases:
        resp = client.simulate_post("/v1/refunds", json=body, headers=_auth(auth))
        assert (resp.status_code, resp.json["error"]["code"]) == (status, code), (body, resp.text)
    assert snapshot(db) == before
    assert db.execute("SELECT count(*) FROM refunds").fetchone()[0] == 0


def test_a_cursor_row_inserted_in_the_same_microsecond_is_kept_apart_by_id(client, db):
    key = new_key(db)
    ids = _intents(db, 4)
    db.execute("UPDATE payment_intents SET created_at = now() - interval '1 hour'")
    assert sorted(_walk(client, key, "/v1/payment_intents", limit=1)) == sorted(ids)
    assert _walk(client, key, "/v1/payment_intents", limit=1) == sorted(ids, reverse=True)


# ---- found by the fresh-clone review ------------------------------------------


def test_the_endpoint_limit_holds_under_concurrent_registrations(db, db_url):
    # The count used to be read in the locking statement, from the snapshot
    # taken before the lock was granted: 20 parallel POSTs left 18 endpoints
    # under a limit of 16.
    import threading

    import psycopg

    from vpay.money.merchants import create_merchant
    from vpay.webhooks import endpoints
    create_merchant(db, "m_race", "Race")
    limit, tries = 3, 8
    outcomes: list[str] = []
    start = threading.Barrier(tries)

    def register(n: int) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            start.wait(timeout=10)
            try:
                endpoints.add_endpoint(conn, "m_race", f"http://127.0.0.1:9/{n}", permit_private=True,
                                       limit=limit)
                outcomes.append("made")
            except endpoints.EndpointLimitReached:
                outcomes.append("refused")

    threads = [threading.Thread(target=register, args=(n,)) for n in range(tries)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == ["made"] * limit + ["refused"] * (tries - limit)
    assert db.execute("SELECT count(*) FROM webhook_endpoints WHERE merchant_id = 'm_race'").fetchone()[0] == limit


def test_a_process_whose_keys_open_no_stored_secret_stores_none(db, monkeypatch):
    # An API started with other keys than the workers' sealed new secrets the
    # workers could not open (and a worker then refused to boot): now the
    # write is refused and nothing is stored.
    import pytest

    from vpay.base import secretbox
    from vpay.money.merchants import create_merchant
    from vpay.webhooks import endpoints
    create_merchant(db, "m_keys", "Keys")
    first = endpoints.add_endpoint(db, "m_keys", "http://127.0.0.1:9/a", permit_private=True)
    before = db.execute("SELECT id, secret FROM webhook_endpoints ORDER BY id").fetchall()
    monkeypatch.setenv("VPAY_SECRET_KEYS", secretbox.new_key())
    with pytest.raises(secretbox.WrongKey):
        endpoints.add_endpoint(db, "m_keys", "http://127.0.0.1:9/b", permit_private=True)
    with pytest.raises(secretbox.WrongKey):
        endpoints.rotate_secret(db, first["id"], 0)
    assert db.execute("SELECT id, secret FROM webhook_endpoints ORDER BY id").fetchall() == before
