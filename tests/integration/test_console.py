"""The operator console through falcon.testing against a real Postgres:
every page and action, roles, CSRF, sessions, throttling, escaping and
maker-checker (issue 23, "Must show"). The browser half is
tests/acceptance/test_console_browser.py."""

from __future__ import annotations

import pytest

from vpay.console.app import COOKIE, create_app
from vpay.console import accounts
from console_support import Client, alert, dead_letter, operator, unresolved_charge

SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture(scope="module")
def app(db_url):
    app = create_app(db_url, secure_cookie=False, limits=accounts.SessionLimits(idle=900, maximum=43200))
    yield app
    app.vpay_db.close()


@pytest.fixture
def signed_in(app, db):
    def make(email="ops@example.com", role="operator", address="10.0.0.1"):
        operator(db, email, role)
        c = Client(app, address)
        assert c.login(email).status_code == 303
        return c
    return make


def _count(db, sql, *args):
    return db.execute(sql, args).fetchone()[0]


# -- sign-in, sessions -----------------------------------------------------

def test_the_login_page_has_the_contracts_labels_and_every_page_needs_a_session(app, db):
    c = Client(app)
    page = c.get("/login")
    assert page.status_code == 200
    assert '<label for="email">Email</label>' in page.text and '<label for="password">Password</label>' in page.text
    assert ">Sign in</button>" in page.text
    for path in ("/", "/payments", "/unresolved", "/alerts", "/jobs", "/statements", "/webhooks", "/audit"):
        r = c.get(path)
        assert r.status_code == 303 and r.headers["location"].endswith("/login"), path


def test_every_page_renders_with_the_nav_landmark_and_security_headers(signed_in):
    c = signed_in(role="viewer")
    for path in ("/", "/payments", "/unresolved", "/alerts", "/jobs", "/jobs?state=stranded", "/statements",
                 "/webhooks", "/audit"):
        r = c.get(path.split("?")[0], **dict(p.split("=") for p in path.split("?")[1:]))
        assert r.status_code == 200, (path, r.text[:500])
        assert '<nav aria-label="Main">' in r.text and ">Sign out</button>" in r.text
        for name in ("Overview", "Payments", "Unresolved", "Alerts", "Jobs", "Statements", "Webhooks", "Audit"):
            assert f">{name}</a>" in r.text
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "<script>" not in r.text  # no inline script: only <script src=...>


def test_the_session_cookie_is_httponly_strict_and_secure_by_default(db_url, db):
    app = create_app(db_url)  # secure_cookie defaults to True
    try:
        operator(db, "a@example.com")
        c = Client(app)
        result = c.login("a@example.com")
        cookie = result.cookies[COOKIE]
        assert cookie.http_only and cookie.secure and cookie.same_site == "Strict"
    finally:
        app.vpay_db.close()


def test_only_a_hash_of_the_session_id_is_stored(signed_in, db):
    c = signed_in()
    stored = db.execute("SELECT id_sha256 FROM operator_sessions").fetchall()
    assert len(stored) == 1 and stored[0][0] != c.cookies[COOKIE] and len(stored[0][0]) == 64


def test_a_wrong_password_is_refused_and_throttled_per_account(app, db):
    operator(db, "t@example.com")
    c = Client(app)
    for _ in range(accounts.THROTTLE_FAILURES):
        assert c.login("t@example.com", "wrong password!!").status_code == 401
    # the right password no longer opens it while throttled
    assert c.login("t@example.com").status_code == 401
    assert _count(db, "SELECT count(*) FROM operator_sessions") == 0


def test_sign_in_is_throttled_per_address_across_accounts(app, db):
    operator(db, "victim@example.com")
    c = Client(app, address="10.9.9.9")
    for i in range(accounts.THROTTLE_ADDRESS_FAILURES):
        c.login(f"nobody{i}@example.com", "wrong password!!")
    assert c.login("victim@example.com").status_code == 401
    assert Client(app, address="10.1.1.1").login("victim@example.com").status_code == 303


def test_an_idle_or_too_old_session_ends(signed_in, db):
    c = signed_in()
    assert c.get("/").status_code == 200
    db.execute("UPDATE operator_sessions SET seen_at = now() - interval '1 hour'")
    assert c.get("/").status_code == 303
    c2 = signed_in("b@example.com")
    db.execute("UPDATE operator_sessions SET created_at = now() - interval '13 hours'")
    assert c2.get("/").status_code == 303


def test_sign_out_ends_the_session_server_side(signed_in, db, app):
    c = signed_in()
    old = c.cookies[COOKIE]
    assert c.post("/logout").status_code == 303
    assert _count(db, "SELECT count(*) FROM operator_sessions") == 0
    replay = Client(app)
    replay.cookies[COOKIE] = old
    assert replay.get("/").status_code == 303


def test_a_session_id_set_before_sign_in_is_never_the_one_signed_in(app, db):
    operator(db, "f@example.com")
    c = Client(app)
    c.cookies[COOKIE] = "attacker-chosen-id"
    assert c.login("f@example.com").status_code == 303
    assert c.cookies[COOKIE] != "attacker-chosen-id"


def test_a_disabled_operator_is_signed_out_at_once(signed_in, db):
    c = signed_in("d@example.com")
    accounts.disable_operator(db, "d@example.com")
    assert c.get("/").status_code == 303


def test_login_without_its_token_is_refused(app, db):
    operator(db, "x@example.com")
    c = Client(app)
    r = c.post("/login", {"email": "x@example.com", "password": "correct horse battery staple"}, csrf=None)
    assert r.status_code == 403 and _count(db, "SELECT count(*) FROM operator_sessions") == 0


# -- roles and CSRF --------------------------------------------------------

ACTIONS = [("/alerts/ack", {"every": "1", "note": "n"}), ("/jobs/retry", {"every": "1"}),
           ("/jobs/release", {"every": "1"})]


@pytest.mark.parametrize("path, form", ACTIONS)
def test_a_viewers_post_is_403_and_changes_nothing(signed_in, db, path, form):
    dead_letter(db)
    alert(db)
    c = signed_in(role="viewer")
    c.get("/alerts")
    assert c.post(path, form).status_code == 403
    assert _count(db, "SELECT count(*) FROM alerts WHERE acknowledged_at IS NULL") == 1
    assert _count(db, "SELECT count(*) FROM jobs WHERE run_at = 'infinity'") == 1
    assert _count(db, "SELECT count(*) FROM operator_actions") == 0


def test_a_viewer_cannot_propose_and_an_operator_cannot_manage_endpoints(signed_in, db, merchant):
    ch = unresolved_charge(db, merchant)
    v = signed_in("v@example.com", role="viewer")
    v.get("/unresolved")
    assert v.post(f"/unresolved/{ch['id']}/propose", {"outcome": "succeeded", "evidence": "e"}).status_code == 403
    assert _count(db, "SELECT count(*) FROM resolution_proposals") == 0
    from vpay.webhooks import add_endpoint
    import os
    os.environ["VPAY_WEBHOOKS_ALLOW_PRIVATE"] = "1"
    ep = add_endpoint(db, merchant, "http://127.0.0.1:9/hook")
    o = signed_in("o@example.com", role="operator")
    o.get("/webhooks")
    assert o.post(f"/webhooks/endpoints/{ep['id']}/disable").status_code == 403
    a = signed_in("adm@example.com", role="admin")
    a.get("/webhooks")
    assert a.post(f"/webhooks/endpoints/{ep['id']}/disable").status_code == 303
    assert _count(db, "SELECT count(*) FROM webhook_endpoints WHERE NOT enabled") == 1
    assert db.execute("SELECT actor, action, via FROM operator_actions").fetchall() == [
        ("adm@example.com", "webhooks.disable", "console")]


@pytest.mark.parametrize("token", [None, "wrong"])
def test_a_post_with_a_missing_or_wrong_csrf_token_is_403_and_writes_nothing(signed_in, db, token):
    alert(db)
    c = signed_in()
    assert c.post("/alerts/ack", {"every": "1", "note": "n"}, csrf=token).status_code == 403
    assert _count(db, "SELECT count(*) FROM alerts WHERE acknowledged_at IS NULL") == 1
    assert _count(db, "SELECT count(*) FROM operator_actions") == 0


# -- actions through the CLI's functions, audited ---------------------------

def test_acknowledge_one_or_every_alert_matching_with_a_note_audited(signed_in, db):
    a1, a2, a3 = alert(db), alert(db), alert(db, "job_dead_lettered")
    c = signed_in()
    c.get("/alerts")
    assert c.post("/alerts/ack", {"id": [str(a1)], "note": "owned by me"}).status_code == 303
    assert c.post("/alerts/ack", {"every": "1", "kind": "rail_misconfigured", "note": "bulk"}).status_code == 303
    rows = dict(db.execute("SELECT id, note FROM alerts WHERE acknowledged_at IS NOT NULL").fetchall())
    assert rows == {a1: "owned by me", a2: "bulk"}
    assert db.execute("SELECT actor, action, target, result FROM operator_actions ORDER BY id").fetchall() == [
        ("ops@example.com", "alerts.ack", f"alert:{a1}", "ok: 1 acknowledged"),
        ("ops@example.com", "alerts.ack", f"alert:{a2}", "ok: 1 acknowledged")]
    page = c.get("/audit")
    assert "alerts.ack" in page.text and "bulk" in page.text


def test_retry_a_dead_letter_and_a_refusal_is_audited_and_changes_nothing(signed_in, db):
    job = dead_letter(db)
    c = signed_in()
    c.get("/jobs")
    assert c.post("/jobs/retry", {"id": [str(job)], "note": "fixed"}).status_code == 303
    assert _count(db, "SELECT count(*) FROM jobs WHERE run_at = 'infinity'") == 0
    r = c.post("/jobs/retry", {"id": [str(job)]})  # no longer dead
    assert r.status_code == 409 and "not a dead letter" in r.text
    assert [r[0] for r in db.execute("SELECT result FROM operator_actions ORDER BY id").fetchall()] == [
        "ok: 1 retried", f"refused: job {job} (k:dead) is due, not a dead letter"]


def test_release_a_stranded_lease(signed_in, db):
    job = dead_letter(db, "k:strand")
    db.execute("UPDATE jobs SET run_at = now(), locked_by = 'gone', locked_at = now() - interval '1 hour', "
               "lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 minute' WHERE id = %s", (job,))
    c = signed_in()
    page = c.get("/jobs", state="stranded")
    assert "k:strand" in page.text
    assert c.post("/jobs/release", {"every": "1"}).status_code == 303
    assert _count(db, "SELECT count(*) FROM jobs WHERE locked_at IS NOT NULL") == 0


# -- maker-checker ---------------------------------------------------------

def test_maker_checker_the_proposer_cannot_approve_and_approval_settles_once_with_one_event(app, db, merchant):
    ch = unresolved_charge(db, merchant)
    events_before = _count(db, "SELECT count(*) FROM events")
    operator(db, "maker@example.com")
    operator(db, "checker@example.com")
    maker, checker = Client(app), Client(app, "10.0.0.2")
    maker.login("maker@example.com")
    checker.login("checker@example.com")
    maker.get("/unresolved")
    assert maker.post(f"/unresolved/{ch['id']}/propose",
                      {"outcome": "succeeded", "evidence": "statement line 7 says SUCCESSFUL"}).status_code == 303
    pid = _count(db, "SELECT id FROM resolution_proposals")
    page = maker.get("/unresolved")
    assert f"Approve proposal {pid}" not in page.text  # the proposer is not offered it...
    r = maker.post(f"/proposals/{pid}/approve", {})  # ...and refused when they try
    assert r.status_code == 409 and "cannot approve their own" in r.text
    assert db.execute("SELECT status FROM charges WHERE id = %s", (ch["id"],)).fetchone()[0] == "unresolved"
    checker.get("/unresolved")
    assert checker.post(f"/proposals/{pid}/approve", {"note": "checked"}).status_code == 303
    assert db.execute("SELECT status FROM charges WHERE id = %s", (ch["id"],)).fetchone()[0] == "succeeded"
    assert _count(db, "SELECT count(*) FROM events") == events_before + 1
    assert _count(db, "SELECT count(*) FROM settlement_evidence WHERE source = 'operator'") == 1
    # a second approval changes nothing
    assert checker.post(f"/proposals/{pid}/approve", {}).status_code == 409
    assert _count(db, "SELECT count(*) FROM events") == events_before + 1
    actions = db.execute("SELECT actor, action, target FROM operator_actions ORDER BY id").fetchall()
    assert ("maker@example.com", "charges.propose", f"charge:{ch['id']}") in actions
    assert ("checker@example.com", "charges.approve", f"charge:{ch['id']}") in actions
    timeline = checker.get(f"/payments/{ch['id']}").text
    assert "charges.approve" in timeline and "statement line 7 says SUCCESSFUL" in timeline


def test_a_proposal_is_withdrawn_by_its_proposer_or_rejected_by_another_with_a_note(app, db, merchant):
    ch = unresolved_charge(db, merchant)
    operator(db, "m@example.com")
    operator(db, "c@example.com")
    m, k = Client(app), Client(app, "10.0.0.3")
    m.login("m@example.com")
    k.login("c@example.com")
    m.get("/unresolved")
    m.post(f"/unresolved/{ch['id']}/propose", {"outcome": "failed", "evidence": "payer says no"})
    p1 = _count(db, "SELECT max(id) FROM resolution_proposals")
    assert m.post(f"/proposals/{p1}/withdraw", {"note": "wrong charge"}).status_code == 303
    m.post(f"/unresolved/{ch['id']}/propose", {"outcome": "failed", "evidence": "payer says no"})
    p2 = _count(db, "SELECT max(id) FROM resolution_proposals")
    k.get("/unresolved")
    assert k.post(f"/proposals/{p2}/reject", {"note": "need the statement"}).status_code == 303
    assert db.execute("SELECT state, decision_note FROM resolution_proposals ORDER BY id").fetchall() == [
        ("withdrawn", "wrong charge"), ("rejected", "need the statement")]
    assert db.execute("SELECT status FROM charges WHERE id = %s", (ch["id"],)).fetchone()[0] == "unresolved"


# -- payments and timeline --------------------------------------------------

def test_a_payment_is_found_by_id_rail_reference_and_msisdn_and_its_timeline_shows_rail_calls(signed_in, db, merchant):
    ch = unresolved_charge(db, merchant, payer="237670001234")
    db.execute("INSERT INTO rail_calls (rail, operation, reference, charge_id, http_status, answer, reason, latency_ms) "
               "VALUES ('mtn', 'status', %s, %s, 200, 'pending', %s, 87)", (ch["rail_reference"], ch["id"], SCRIPT))
    c = signed_in(role="viewer")
    for q in (ch["id"], ch["payment_intent_id"], ch["rail_reference"], "237670001234"):
        r = c.get("/payments", q=q)
        assert r.status_code == 303 and r.headers["location"].endswith(f"/payments/{ch['id']}"), q
    page = c.get(f"/payments/{ch['id']}").text
    assert "rail status" in page and "87 ms" in page and "HTTP 200" in page
    assert "23767…1234" in page and "237670001234" not in page  # the MSISDN masked
    assert SCRIPT not in page and ESCAPED in page  # a rail's reason is text


def test_a_payments_timeline_shows_its_callbacks_and_what_they_did(signed_in, db, merchant):
    ch = unresolved_charge(db, merchant)
    for action in ("pulled_forward", "due_soon"):
        db.execute("INSERT INTO rail_callbacks (rail, reference, charge_id, action) VALUES ('mtn', %s, %s, %s)",
                   (ch["rail_reference"], ch["id"], action))
    db.execute("INSERT INTO rail_callbacks (rail, reference, action) VALUES ('mtn', %s, 'unknown_reference')",
               (SCRIPT,))
    c = signed_in(role="viewer")
    page = c.get(f"/payments/{ch['id']}").text
    assert page.count("callback from mtn") == 2
    assert "pulled the status read forward to now" in page and "left alone: a status read was due within 10 s" in page
    # a callback naming no charge is found by its reference, escaped
    search = c.get("/payments", q=SCRIPT).text
    assert "No payment matches" in search and "1 callback named this reference" in search
    assert SCRIPT not in search and ESCAPED in search


def test_the_payments_list_pages_without_reading_everything(signed_in, db, merchant):
    from vpay.money import charges as ch
    for i in range(55):
        ch.create_payment(db, merchant_id=merchant, amount=100 + i, currency="EUR", rail="mtn", payer="256770000001")
    c = signed_in(role="viewer")
    first = c.get("/payments")
    assert first.text.count('<a href="/payments/ch_') == 50 and 'rel="next"' in first.text
    import re
    nxt = re.search(r'href="/payments\?([^"]+)" rel="next"', first.text).group(1).replace("&amp;", "&")
    from urllib.parse import parse_qsl
    second = c.get("/payments", **dict(parse_qsl(nxt)))
    assert second.text.count('<a href="/payments/ch_') == 5


def test_payments_filter_by_created_time_rail_merchant_and_status_and_page_with_the_filters(signed_in, db, merchant):
    import re
    from urllib.parse import parse_qsl
    from vpay.money import charges as ch
    from vpay.money.merchants import create_merchant
    create_merchant(db, "other", "Other")
    made = {}
    for i, (m, rail, hours_ago) in enumerate([(merchant, "mtn", 50), (merchant, "orange", 26), ("other", "mtn", 25),
                                              ("other", "mtn", 1)]):
        c = ch.create_payment(db, merchant_id=m, amount=100 + i, currency="EUR" if rail == "mtn" else "XOF",
                              rail=rail, payer="256770000001").charge
        db.execute("UPDATE charges SET created_at = now() - make_interval(hours => %s) WHERE id = %s", (hours_ago, c["id"]))
        made[(m, rail, hours_ago)] = c["id"]
    c = signed_in(role="viewer")

    def ids(**params):
        page = c.get("/payments", **params)
        assert page.status_code == 200, page.text[:300]
        return re.findall(r'<a href="/payments/(ch_[^"]+)">', page.text)
    from datetime import datetime, timedelta, timezone
    day_ago = (datetime.now(timezone.utc) - timedelta(hours=30)).strftime("%Y-%m-%dT%H:%M")
    two_h_ago = (datetime.now(timezone.utc) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    assert ids(created_from=day_ago) == [made[("other", "mtn", 1)], made[("other", "mtn", 25)],
                                         made[(merchant, "orange", 26)]]
    assert ids(created_from=day_ago, created_to=two_h_ago) == [made[("other", "mtn", 25)], made[(merchant, "orange", 26)]]
    assert ids(rail="orange") == [made[(merchant, "orange", 26)]]
    assert ids(merchant="other", created_to=two_h_ago) == [made[("other", "mtn", 25)]]
    assert ids(merchant=merchant, rail="mtn", status="pending") == [made[(merchant, "mtn", 50)]]
    assert ids(status="succeeded") == []
    page = c.get("/payments", created_from=day_ago, rail="mtn").text
    assert f'value="{day_ago}"' in page  # the form shows the filter back
    for bad in ({"created_from": "yesterday"}, {"created_from": two_h_ago, "created_to": day_ago}, {"rail": "visa"}):
        assert c.get("/payments", **bad).status_code == 400, bad
    # a next page keeps the filters
    for i in range(55):
        ch.create_payment(db, merchant_id="other", amount=500 + i, currency="EUR", rail="mtn", payer="256770000001")
    first = c.get("/payments", merchant="other", rail="mtn", created_from=day_ago).text
    nxt = dict(parse_qsl(re.search(r'href="/payments\?([^"]+)" rel="next"', first).group(1).replace("&amp;", "&")))
    assert (nxt["merchant"], nxt["rail"], nxt["created_from"]) == ("other", "mtn", day_ago)
    rest = ids(**nxt)  # 57 match: 50, then the 5 oldest new ones and the two made above
    assert len(rest) == 7 and rest[-2:] == [made[("other", "mtn", 1)], made[("other", "mtn", 25)]]


HX = {"HX-Request": "true", "HX-Target": "results"}


def test_htmx_gets_only_the_payments_results_and_a_single_hit_as_a_whole_page_visit(signed_in, db, merchant):
    from vpay.money import charges as ch
    made = [ch.create_payment(db, merchant_id=merchant, amount=100 + i, currency="EUR", rail="mtn",
                              payer=f"25677000000{i}").charge for i in range(2)]
    c = signed_in(role="viewer")
    whole = c.get("/payments")
    assert '<div id="results"' in whole.text and 'hx-get="/payments"' in whole.text and "<nav" in whole.text
    part = c.get("/payments", headers=HX)
    assert part.status_code == 200 and part.text.lstrip().startswith("<div id=\"results\"")
    assert "<nav" not in part.text and "<html" not in part.text and part.text.count("/payments/ch_") == 2
    hit = c.get("/payments", headers=HX, q=made[0]["rail_reference"])
    assert hit.status_code == 200 and hit.headers["HX-Redirect"] == f"/payments/{made[0]['id']}"
    # htmx restoring its history wants the whole page
    restore = c.get("/payments", headers={**HX, "HX-History-Restore-Request": "true"})
    assert "<nav" in restore.text
    bad = c.get("/payments", headers=HX, created_from="soon")
    assert bad.status_code == 400 and bad.headers["HX-Retarget"] == "#main"


def test_htmx_bulk_actions_answer_as_without_script_and_a_refusal_replaces_main(signed_in, db):
    a1 = alert(db)
    c = signed_in()
    page = c.get("/alerts")
    assert 'hx-post="/alerts/ack"' in page.text and 'hx-select="#main"' in page.text
    headers = {"HX-Request": "true", "HX-Target": "main"}
    done = c.post("/alerts/ack", {"id": [str(a1)], "note": "n"}, headers=headers)
    assert done.status_code == 303 and "done=" in done.headers["location"]  # htmx follows it and swaps #main
    refused = c.post("/alerts/ack", {"note": "n"}, headers=headers)
    assert refused.status_code == 409 and refused.headers["HX-Retarget"] == "#main"
    assert '<main id="main">' in refused.text and "No alert chosen" in refused.text


# -- escaping --------------------------------------------------------------

def test_a_statement_line_and_a_webhook_url_containing_script_render_as_text(signed_in, db, merchant, monkeypatch):
    monkeypatch.setenv("VPAY_WEBHOOKS_ALLOW_PRIVATE", "1")
    from vpay.webhooks import add_endpoint
    add_endpoint(db, merchant, f"http://127.0.0.1:9/{SCRIPT}")
    alert(db, details={"reason": SCRIPT})
    c = signed_in(role="operator")
    for path in ("/webhooks", "/alerts"):
        page = c.get(path).text
        assert SCRIPT not in page, path
    csv = ("reference,rail_transaction_id,msisdn,amount,currency,status,time\n"
           f"{SCRIPT},tx1,256770000001,1.00,EUR,SUCCESSFUL,2024-01-01T00:00:00Z\n").encode()
    c.get("/statements")
    r = c.post("/statements/import", {"rail": "mtn", "profile": "default"}, files={"file": ("s.csv", csv, "text/csv")})
    assert r.status_code == 200, r.text[:800]
    assert SCRIPT not in r.text


# -- statements ------------------------------------------------------------

def test_upload_dry_run_then_apply_settles_through_the_importer(signed_in, db, merchant):
    from vpay.money import charges as ch
    created = ch.create_payment(db, merchant_id=merchant, amount=1000, currency="EUR", rail="mtn", payer="256770000001")
    ref = created.charge["rail_reference"]
    db.execute("UPDATE charges SET created_at = now() - interval '3 hours'")
    from datetime import datetime, timedelta, timezone
    when = (datetime.now(timezone.utc) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    csv = ("reference,rail_transaction_id,msisdn,amount,currency,status,time\n"
           f"{ref},tx9,256770000001,10.00,EUR,SUCCESSFUL,{when}\n").encode()
    c = signed_in()
    c.get("/statements")
    dry = c.post("/statements/import", {"rail": "mtn", "profile": "default"}, files={"file": ("s.csv", csv, "text/csv")})
    assert dry.status_code == 200 and "Dry run" in dry.text and ">Apply</button>" in dry.text
    assert _count(db, "SELECT count(*) FROM statements") == 0
    c._keep(dry)
    import re
    payload = re.search(r'name="payload" value="([^"]+)"', dry.text).group(1)
    applied = c.post("/statements/import", {"rail": "mtn", "profile": "default", "payload": payload,
                                            "file_name": "s.csv", "apply": "1"})
    assert applied.status_code == 200, applied.text[:500]
    assert _count(db, "SELECT count(*) FROM statements") == 1
    assert db.execute("SELECT status FROM charges").fetchone()[0] == "succeeded"
    assert db.execute("SELECT action, via FROM operator_actions").fetchall() == [("statements.apply", "console")]


# -- webhooks --------------------------------------------------------------

def test_redeliver_an_event_to_an_endpoint(signed_in, db, merchant, monkeypatch):
    monkeypatch.setenv("VPAY_WEBHOOKS_ALLOW_PRIVATE", "1")
    from vpay.webhooks import add_endpoint
    ep = add_endpoint(db, merchant, "http://127.0.0.1:9/hook")
    from vpay.money import charges as ch
    ch.create_payment(db, merchant_id=merchant, amount=100, currency="EUR", rail="mtn", payer="256770000001")
    event = db.execute("SELECT id FROM events").fetchone()[0]
    db.execute("DELETE FROM jobs WHERE kind IN ('fanout', 'deliver')")
    c = signed_in()
    c.get("/webhooks", event=event)
    assert c.post("/webhooks/redeliver", {"event": event, "endpoint": ep["id"]}).status_code == 303
    assert _count(db, "SELECT count(*) FROM jobs WHERE dedupe_key = %s", f"deliver:{event}:{ep['id']}") == 1
    page = c.get("/webhooks", event=event).text
    assert ep["id"] in page


# -- overview --------------------------------------------------------------

def test_the_overview_shows_lanes_statuses_alerts_and_sampled_history(signed_in, db, merchant):
    from vpay.money import overview
    dead_letter(db)
    alert(db)
    overview.sample(db)
    c = signed_in(role="viewer")
    page = c.get("/").text
    assert "housekeeping" in page and "rail_misconfigured" in page and "<polyline" in page


def test_a_rails_429_with_retry_after_is_stored_with_its_pause_and_a_held_back_call_is_not(pool, db):
    from vpay.rails.calls import database_recorder, rail_call, set_recorder
    from vpay.rails.port import RailPaused

    class Paused:
        code = "mtn"

        @rail_call("status")
        def status(self, request, http_status=429):
            raise RailPaused("mtn", 30.0, "HTTP 429 with Retry-After", http_status=http_status)

    set_recorder(database_recorder(pool))
    try:
        for http_status in (429, None):  # the answer that asked, then a call the gate held back
            with pytest.raises(RailPaused):
                Paused().status(None, http_status=http_status)
    finally:
        set_recorder(None)
    rows = db.execute("SELECT http_status, answer, reason, extract(epoch FROM paused_until - created_at) "
                      "FROM rail_calls").fetchall()
    assert len(rows) == 1 and rows[0][:3] == (429, "paused", "HTTP 429 with Retry-After")
    assert 29 <= rows[0][3] <= 31


def test_the_overview_shows_rails_paused_misconfigured_workers_and_the_figures_charts(signed_in, db, db_url, merchant):
    from vpay.engine import queue
    from vpay.money import charges as ch
    from vpay.money import overview
    db.execute("INSERT INTO rail_calls (rail, operation, reference, http_status, answer, reason, latency_ms, "
               "paused_until) VALUES ('orange', 'status', 'r1', 503, 'paused', %s, 12, now() + interval '2 minutes')",
               (SCRIPT,))
    # the pause every process honours (rail_pauses), with who set it
    db.execute("INSERT INTO rail_pauses (rail, paused_until, reason, set_by) "
               "VALUES ('orange', now() + interval '2 minutes', %s, 'worker-b:7')", ("HTTP 503 Retry-After 120 " + SCRIPT,))
    db.execute("INSERT INTO rail_pauses (rail, paused_until, reason, set_by) "
               "VALUES ('mpesa', now() - interval '1 minute', 'HTTP 429 Retry-After 5', 'worker-c:8')")
    alert(db, details={"rail": "mtn", "code": "HTTP_401"})
    # workers as rows: one live, one dead (its heartbeat past its bound) still holding a lease
    from vpay.engine import workers as wk
    wk.register(db, "host:7", host="host", pid=7, lanes=["mtn"], version="9.9", dead_after=30)
    wk.register(db, "host:42", host="host", pid=42, lanes=["mtn", "orange"], version="9.9", dead_after=30)
    db.execute("UPDATE workers SET heartbeat_at = now() - interval '1 minute' WHERE id = 'host:42'")
    queue.enqueue(db, "test.count", "k:leased", {})
    db.execute("UPDATE jobs SET locked_by = 'host:42', locked_at = now(), lease_token = gen_random_uuid(), "
               "lease_expires_at = now() + interval '5 minutes' WHERE dedupe_key = 'k:leased'")
    # a status read 90 s overdue, a charge settled 42 s after its creation
    queue.enqueue(db, "poll", "poll:late", {}, rail="mtn")
    db.execute("UPDATE jobs SET run_at = now() - interval '90 seconds' WHERE dedupe_key = 'poll:late'")
    created = ch.create_payment(db, merchant_id=merchant, amount=100, currency="EUR", rail="mtn",
                                payer="256770000001")
    db.execute("UPDATE charges SET status = 'succeeded', settled_at = now(), "
               "created_at = now() - interval '42 seconds' WHERE id = %s", (created.charge["id"],))
    overview.sample(db)
    page = signed_in(role="viewer").get("/").text
    figures = db.execute("SELECT polls_due, poll_late_seconds, settled, settle_p50_seconds, workers "
                         "FROM console_figures").fetchall()
    assert len(figures) == 1
    polls_due, late, settled, p50, workers = figures[0]
    assert (polls_due, settled, workers) == (1, 1, 1) and 89 <= late <= 120 and 41 <= p50 <= 43
    assert "Rails paused and why" in page and "orange" in page and "HTTP 503" in page
    assert "worker-b:7" in page and "worker-c:8" not in page  # the pause in force, by whom; not one that is over
    assert SCRIPT not in page and ESCAPED in page  # the rail's reason is text
    assert "HTTP_401" in page  # the open rail_misconfigured alert, per rail and code
    assert "host:7" in page and "host:42" in page and "later issue" not in page
    rows = {w["worker_id"]: w for w in overview.workers(db)}
    assert (rows["host:7"]["state"], rows["host:7"]["leases"]) == ("live", 0)
    assert (rows["host:42"]["state"], rows["host:42"]["leases"]) == ("dead", 1)
    assert "<td>dead</td>" in page and "mtn,orange" in page
    assert "Poll lateness" in page and "Settle time, median" in page
    assert page.count("<polyline") >= 5  # the lanes' chart and the four figures


def test_the_cli_actions_are_audited_with_the_os_user(db):
    from vpay.money import operator as op
    from vpay.money.audit import os_actor
    job = dead_letter(db)
    op.retry(db, [job], "from the shell", os_actor())
    assert db.execute("SELECT actor, via, action FROM operator_actions").fetchone() == (os_actor(), "cli", "jobs.retry")


def test_a_sample_prunes_samples_and_figures_older_than_two_days(db):
    from vpay.money import overview
    for age in ("47 hours", "49 hours"):
        db.execute("INSERT INTO console_samples (sampled_at, lane, due, leased, dead, oldest_due_seconds) "
                   "VALUES (now() - %s::interval, 'mtn', 0, 0, 0, 0)", (age,))
        db.execute("INSERT INTO console_figures (sampled_at, polls_due, settled, workers) "
                   "VALUES (now() - %s::interval, 0, 0, 0)", (age,))
    overview.sample(db)
    for table in ("console_samples", "console_figures"):
        ages = db.execute(f"SELECT round(extract(epoch FROM now() - sampled_at) / 3600) FROM {table} "
                          "WHERE sampled_at < now() - interval '1 hour'").fetchall()
        assert ages == [(47,)], table
