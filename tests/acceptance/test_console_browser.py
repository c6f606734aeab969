"""The console in a real browser: Debian's chromium driven by Playwright for
Python (``executable_path``; ``playwright install`` cannot download here),
against ``vpay-server console`` running as its own process. One console and
one browser per module; each test its own browser context and a screenshot
under its tmp_path. Skips with one line when chromium is absent, unless
``VPAY_REQUIRE_BROWSER=1`` (``.ci/run``), which makes that a failure."""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta, timezone
import socket
from pathlib import Path

import pytest

from support import Proc, base_env, script, wait_until
from console_support import PASSWORD, alert, dead_letter, operator, unresolved_charge

CHROMIUM = "/usr/bin/chromium"


def _browser_or_skip():
    if not Path(CHROMIUM).exists():
        if os.environ.get("VPAY_REQUIRE_BROWSER") == "1":
            pytest.fail(f"VPAY_REQUIRE_BROWSER=1 but {CHROMIUM} is missing (apt-get install chromium)")
        pytest.skip(f"no {CHROMIUM}: apt-get install -y chromium fonts-dejavu-core to run the browser tests")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("VPAY_REQUIRE_BROWSER") == "1":
            raise
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def console_url(db_url, tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("console") / "console.log"
    proc = Proc([script("vpay-server"), "console", "--bind", f"127.0.0.1:{port}", "--insecure-cookie"],
                base_env(db_url), log)
    try:
        proc.wait_for_log("console starting")

        def up():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return True
            except OSError:
                if proc.popen.poll() is not None:
                    raise AssertionError(proc.text()[-3000:])
                return False
        wait_until(up, 30, what="the console to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.close()


@pytest.fixture
def page_as(browser, console_url, db):
    contexts = []

    def make(email: str, role: str = "operator"):
        operator(db, email, role)
        ctx = browser.new_context()
        contexts.append(ctx)
        page = ctx.new_page()
        page.goto(console_url + "/login")
        page.get_by_label("Email").fill(email)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        try:
            page.get_by_role("navigation").get_by_role("link", name="Overview").wait_for(timeout=10000)
        except Exception:
            raise AssertionError(page.url + "\n" + page.content()[:3000])
        return page
    yield make
    for ctx in contexts:
        ctx.close()


def test_log_in_and_find_a_payment_by_rail_reference_and_read_its_timeline(page_as, db, merchant, tmp_path):
    ch = unresolved_charge(db, merchant)
    db.execute("INSERT INTO rail_calls (rail, operation, reference, charge_id, http_status, answer, reason, latency_ms) "
               "VALUES ('mtn', 'status', %s, %s, 200, 'pending', '<script>x</script>', 42)",
               (ch["rail_reference"], ch["id"]))
    page = page_as("viewer@example.com", "viewer")
    nav = page.get_by_role("navigation")
    for name in ("Overview", "Payments", "Unresolved", "Alerts", "Jobs", "Statements", "Webhooks", "Audit"):
        assert nav.get_by_role("link", name=name).is_visible()
    assert page.get_by_role("button", name="Sign out").is_visible()
    nav.get_by_role("link", name="Payments").click()
    page.get_by_label("Search").fill(ch["rail_reference"])
    page.get_by_role("button", name="Search").click()
    page.get_by_role("heading", name=f"Payment {ch['id']}").wait_for()
    timeline = page.get_by_role("table", name="Timeline")
    assert timeline.get_by_text("rail status").is_visible()
    assert timeline.get_by_text("42 ms", exact=False).is_visible()
    assert timeline.get_by_text("<script>x</script>", exact=False).is_visible()  # shown as text
    page.screenshot(path=str(tmp_path / "timeline.png"), full_page=True)


def test_two_operators_resolve_an_unresolved_charge(page_as, db, merchant, tmp_path):
    ch = unresolved_charge(db, merchant)
    maker = page_as("maker@example.com")
    maker.get_by_role("navigation").get_by_role("link", name="Unresolved").click()
    form = maker.get_by_role("group", name=f"Propose a resolution for {ch['id']}")
    form.get_by_label("succeeded").check()
    form.get_by_label("Evidence").fill("statement line 3: SUCCESSFUL")
    form.get_by_role("button", name="Propose").click()
    maker.get_by_text("Waiting for another operator to approve.").wait_for()
    assert maker.get_by_role("button", name=re.compile("Approve proposal")).count() == 0
    checker = page_as("checker@example.com")
    checker.get_by_role("navigation").get_by_role("link", name="Unresolved").click()
    checker.get_by_role("button", name=re.compile("Approve proposal")).click()
    checker.get_by_text("approve done").wait_for()
    assert db.execute("SELECT status FROM charges WHERE id = %s", (ch["id"],)).fetchone()[0] == "succeeded"
    checker.screenshot(path=str(tmp_path / "resolved.png"), full_page=True)


def test_acknowledge_alerts_in_bulk(page_as, db, tmp_path):
    for _ in range(3):
        alert(db, "rail_misconfigured", {"reason": "bad key"})
    page = page_as("ops@example.com")
    page.get_by_role("navigation").get_by_role("link", name="Alerts").click()
    page.get_by_label("Kind").select_option("rail_misconfigured")
    page.get_by_label("State").select_option("open")
    page.get_by_role("button", name="Filter", exact=True).click()
    # htmx swaps the filtered list in and then pushes its URL; filling the note
    # before that filled the page about to be replaced (a CI flake under load)
    page.wait_for_url(re.compile(r"[?&]kind=rail_misconfigured"))
    page.get_by_label("Note").fill("key rotated, INC-42")
    page.get_by_role("button", name="Acknowledge every open alert matching the filter").click()
    page.get_by_text("Acknowledged 3 alert(s).").wait_for()
    assert db.execute("SELECT count(*) FROM alerts WHERE acknowledged_at IS NULL").fetchone()[0] == 0
    page.screenshot(path=str(tmp_path / "alerts.png"), full_page=True)


def test_retry_a_dead_letter(page_as, db, tmp_path):
    job = dead_letter(db, "k:browser", "rail said 500")
    page = page_as("ops@example.com")
    page.get_by_role("navigation").get_by_role("link", name="Jobs").click()
    assert page.get_by_text("rail said 500").is_visible()
    page.get_by_label(f"Job {job}").check()
    page.get_by_role("button", name="Retry selected").click()
    page.get_by_text("Retried 1 job(s).").wait_for()
    assert db.execute("SELECT run_at <> 'infinity' FROM jobs WHERE id = %s", (job,)).fetchone()[0]
    page.screenshot(path=str(tmp_path / "jobs.png"), full_page=True)


def test_upload_a_statement_dry_run_then_apply(page_as, db, merchant, tmp_path):
    from vpay.money import charges
    created = charges.create_payment(db, merchant_id=merchant, amount=1000, currency="EUR", rail="mtn",
                                     payer="256770000001")
    db.execute("UPDATE charges SET created_at = now() - interval '3 hours'")
    csv = tmp_path / "statement.csv"
    # a line of two hours ago (a statement lists what happened: a future time is that line's error)
    when = (datetime.now(timezone.utc) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    csv.write_text("reference,rail_transaction_id,msisdn,amount,currency,status,time\n"
                   f"{created.charge['rail_reference']},tx1,256770000001,10.00,EUR,SUCCESSFUL,{when}\n")
    page = page_as("ops@example.com")
    page.get_by_role("navigation").get_by_role("link", name="Statements").click()
    page.get_by_label("Statement file").set_input_files(str(csv))
    page.get_by_label("Rail").select_option("mtn")
    page.get_by_role("button", name="Dry run").click()
    page.get_by_role("heading", name="Dry run: statement.csv").wait_for()
    assert db.execute("SELECT count(*) FROM statements").fetchone()[0] == 0
    page.get_by_role("button", name="Apply").click()
    page.get_by_role("heading", name=re.compile("^Statement st_")).wait_for()
    assert db.execute("SELECT count(*) FROM statements").fetchone()[0] == 1
    assert db.execute("SELECT status FROM charges").fetchone()[0] == "succeeded"
    page.screenshot(path=str(tmp_path / "statement.png"), full_page=True)


def test_htmx_swaps_the_payments_results_without_a_reload_and_the_console_works_without_script(
        page_as, browser, console_url, db, merchant, tmp_path):
    from vpay.money import charges
    for i, rail in enumerate(("mtn", "mtn", "orange")):
        charges.create_payment(db, merchant_id=merchant, amount=100 + i, currency="EUR" if rail == "mtn" else "XOF",
                               rail=rail, payer=f"25677000010{i}")
    page = page_as("ops@example.com")
    page.get_by_role("navigation").get_by_role("link", name="Payments").click()
    page.get_by_role("heading", name="Payments").wait_for()
    page.evaluate("window.vpayNoReload = true")
    rows = page.locator("#results tbody tr")
    assert rows.count() == 3
    page.get_by_label("Rail").select_option("orange")
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"rail=orange"))  # htmx pushed the filtered address
    wait_until(lambda: rows.count() == 1, 10, what="the results to be swapped")
    assert page.evaluate("window.vpayNoReload") is True  # swapped in place, not a new page
    page.screenshot(path=str(tmp_path / "payments-htmx.png"), full_page=True)

    # the same console with script off: a bulk acknowledgement is a plain form post
    alert(db, "rail_misconfigured", {"reason": "bad key"})
    operator(db, "nojs@example.com")
    ctx = browser.new_context(java_script_enabled=False)
    try:
        plain = ctx.new_page()
        plain.goto(console_url + "/login")
        plain.get_by_label("Email").fill("nojs@example.com")
        plain.get_by_label("Password").fill(PASSWORD)
        plain.get_by_role("button", name="Sign in").click()
        plain.get_by_role("navigation").get_by_role("link", name="Alerts").click()
        plain.get_by_label("Note").fill("no script needed")
        plain.get_by_role("button", name="Acknowledge every open alert matching the filter").click()
        plain.get_by_text("Acknowledged 1 alert(s).").wait_for()
    finally:
        ctx.close()
    assert db.execute("SELECT note FROM alerts").fetchone()[0] == "no script needed"
