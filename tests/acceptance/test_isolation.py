"""Isolation (issue 11): no slow rail, hanging merchant endpoint or burst holds
up anyone else's reconciliation. Each of the issue's inputs against real
processes: the installed ``vpay-worker`` / ``vpay-server api``, a real
Postgres, rail stubs that trickle, throttle, revoke tokens or hang
(``rail_stub``), and real webhook receivers (``test_webhooks.Receiver``).

No timing assertions: the tests wait on conditions, and read what happened
from the stubs' logs (their monotonic timestamps, where the rule is about
time).
"""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from api_support import free_port, new_key
from rail_stub import HangingRail, MomoStub
from support import base_env, wait_until
from test_webhooks import Receiver, Reply, endpoint, make_payment as bare_payment, settle, worker_env
from vpay.money import charges

pytestmark = pytest.mark.slow


@pytest.fixture
def stub():
    s = MomoStub()
    yield s
    s.close()


def _charge(db, merchant: str, payer: str) -> dict:
    """A submitted MoMo charge of 10.00 EUR whose poll job is parked an hour out."""
    created = charges.create_payment(db, merchant_id=merchant, amount=1000, currency="EUR", rail="mtn",
                                   payer=payer)
    charges.mark_submitted(db, created.charge["id"])
    db.execute("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE dedupe_key = %s",
               (f"poll:{created.charge['id']}",))
    return created.charge


def _due(db, *made_charges: dict, ago: float = 0.0) -> None:
    db.execute("UPDATE jobs SET run_at = now() - make_interval(secs => %s) WHERE dedupe_key = ANY(%s)",
               (ago, [f"poll:{c['id']}" for c in made_charges]))


def _status(db, charge: dict) -> str:
    return db.execute("SELECT status FROM charges WHERE id = %s", (charge["id"],)).fetchone()[0]


def _worker(spawn, db_url, stub: MomoStub, *args: str, **env: str):
    return spawn("vpay-worker", "--idle-sleep", "0.1", *args,
                 env=base_env(db_url, **stub.env(**env)))


def test_two_trickling_charges_do_not_stop_a_third_and_sigterm_drains_clean(db, db_url, merchant, spawn, stub):
    # Input 2: with 2 claim loops, two trickling charges held both for 100 s and
    # a third charge on the same rail was never read.
    slow = [_charge(db, merchant, "256770000011"), _charge(db, merchant, "256770000012")]
    third = _charge(db, merchant, "256770000013")
    for c in slow:
        stub.trickle(c["rail_reference"])
    stub.succeed(third["rail_reference"], "10.00", "EUR")
    _due(db, *slow, ago=2.0)   # first in line
    _due(db, third, ago=1.0)
    # The mtn lane with two loops of its own: lanes keep other rails and
    # webhooks away, the per-call deadline keeps the two trickles from holding both.
    worker = _worker(spawn, db_url, stub, "--queues", "mtn", "--worker-concurrency", "2",
                     VPAY_MTN_TOTAL_TIMEOUT_SECONDS="2")
    wait_until(lambda: _status(db, third) == "succeeded", timeout=60, what="the third charge to settle")
    for c in slow:
        trickles = stub.trickles.get(c["rail_reference"], [])
        assert trickles, "each trickling charge was read"
        assert not any(t.finished for t in trickles)  # still trickling: the reads were cut, not waited out
        assert _status(db, c) == "pending"
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.text()[-3000:]
    assert worker.find("drain clean")


# --- 2. backpressure -----------------------------------------------------------


def test_a_429_with_retry_after_pauses_every_read_to_the_rail(db, db_url, merchant, spawn, stub):
    # Input 5: a 429 with Retry-After was "no answer" for that one charge, and
    # the worker read the other charges on the same rail at once.
    first = _charge(db, merchant, "256770000021")
    others = [_charge(db, merchant, f"25677000002{i}") for i in (2, 3, 4)]
    for c in (first, *others):
        stub.succeed(c["rail_reference"], "10.00", "EUR")
    stub.throttle(first["rail_reference"], "4")
    worker = _worker(spawn, db_url, stub, "--queues", "mtn", "--worker-concurrency", "3")  # 3 mtn loops
    worker.wait_for_log("worker started")
    _due(db, first)
    throttled = wait_until(lambda: [e for e in stub.requests(reference=first["rail_reference"])
                                    if e.status == 429], what="the 429")[0]
    # Due once the worker has the 429 (not merely once the stub sent it): a
    # claim woken at once by the commit could otherwise read in between.
    worker.wait_for_log("rail paused", rail="mtn")
    _due(db, *others)  # due during the pause
    wait_until(lambda: all(_status(db, c) == "succeeded" for c in (first, *others)), timeout=60,
               what="every charge to settle after the pause")

    # The stub's own clock: nothing reached the rail between the 429 and the end of its Retry-After.
    # A read another loop sent before the 429 reached the worker may land a few ms after it (seen
    # once in a full run); any read the pause should have held starts later than that.
    during = [e for e in stub.log if throttled.answered_at + 0.5 < e.at < throttled.answered_at + 4]
    assert during == []
    # The deferred reads spent no rail request and no rung: one read each, after the pause.
    for c in others:
        reads = stub.requests("/collection/v1_0/requesttopay/", c["rail_reference"])
        assert len(reads) == 1 and reads[0].at >= throttled.answered_at + 4
    assert worker.find("rail paused", rail="mtn")
    assert worker.find("rail paused: job deferred", rail="mtn")

    # The pause is visible in the gauge line.
    last = _charge(db, merchant, "256770000025")
    stub.throttle(last["rail_reference"], "120")
    _due(db, last)
    wait_until(lambda: len(worker.find("rail paused", rail="mtn")) >= 2, what="a second pause")
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.text()[-3000:]
    [gauge] = [line for line in worker.find("gauge") if line.get("final")]
    assert gauge["rail_paused_until"]["mtn"] is not None


def test_a_429_with_an_http_date_retry_after_pauses_the_rail(db, db_url, merchant, spawn, stub):
    from email.utils import format_datetime
    from datetime import datetime, timedelta, timezone
    first, other = _charge(db, merchant, "256770000031"), _charge(db, merchant, "256770000032")
    for c in (first, other):
        stub.succeed(c["rail_reference"], "10.00", "EUR")
    stub.throttle(first["rail_reference"],
                  format_datetime(datetime.now(timezone.utc) + timedelta(seconds=120), usegmt=True))
    worker = _worker(spawn, db_url, stub, "--queues", "mtn", "--worker-concurrency", "2")
    worker.wait_for_log("worker started")
    _due(db, first)
    worker.wait_for_log("rail paused", rail="mtn")
    _due(db, other)
    wait_until(lambda: worker.find("rail paused: job deferred", dedupe_key=f"poll:{other['id']}"),
               what="the other charge's poll deferred")
    assert stub.requests("/collection/v1_0/requesttopay/", other["rail_reference"]) == []
    row = db.execute("SELECT run_at > now() + interval '60 seconds', attempts, failures, last_error "
                     "FROM jobs WHERE dedupe_key = %s", (f"poll:{other['id']}",)).fetchone()
    assert row[0] is True and row[1] == 0 and row[2] == 0 and "paused" in row[3]
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0


def test_a_429_answered_to_one_worker_pauses_the_rail_for_another_worker_too(db, db_url, merchant, spawn, stub):
    # Issue 25, item 6: a rail's 429/503 Retry-After paused only the process
    # that got it; the other replicas kept sending. Two real workers on the
    # mtn lane, both running when one of them (X, whichever claims the first
    # charge) meets the 429. X then exits cleanly, so every read of the other
    # charges is the other worker's (Y): Y never got a 429, and sends nothing
    # to the rail while the pause lasts.
    # Not SIGSTOP: a claim the stopped process had sent runs in the database
    # afterwards (its backend is not stopped), so the frozen process took a
    # charge made due after the stop and held it until reaped as dead (30 s).
    # The pause (120 s) outlasts every step below, so each is taken while it
    # is in force however loaded the machine; that it ends, and the deferred
    # reads go out once after it, is the single-worker test's.
    first = _charge(db, merchant, "256770000051")
    others = [_charge(db, merchant, f"25677000005{i}") for i in (2, 3, 4)]
    for c in (first, *others):
        stub.succeed(c["rail_reference"], "10.00", "EUR")
    stub.throttle(first["rail_reference"], "120")
    workers = {}
    for wid in ("replica-a", "replica-b"):
        port = free_port()
        workers[wid] = (_worker(spawn, db_url, stub, "--queues", "mtn", "--worker-concurrency", "2",
                                "--worker-id", wid, "--metrics-port", str(port)), port)
    for w, _ in workers.values():
        w.wait_for_log("worker started")
    _due(db, first)
    [set_by] = wait_until(lambda: db.execute("SELECT set_by FROM rail_pauses WHERE rail = 'mtn' "
                                             "AND paused_until > now()").fetchone(), what="the pause on the board")
    x, _ = workers.pop(set_by)
    [(y, metrics)] = workers.values()
    x.wait_for_log("rail paused", rail="mtn")
    x.signal(signal.SIGTERM)
    assert x.wait(60) == 0, x.text()[-3000:]
    assert x.find("drain clean")  # the first charge's poll deferred, nothing left leased
    sent_before = len(stub.requests())
    _due(db, *others)  # due during the pause, and only Y is running

    def handled(c):  # deferred, or (the bug) read from the paused rail
        return (y.find("rail paused: job deferred", dedupe_key=f"poll:{c['id']}")
                or stub.requests("/collection/v1_0/requesttopay/", c["rail_reference"]))
    wait_until(lambda: all(handled(c) for c in others), timeout=60, what="Y to take every other charge's poll")
    scraped = requests.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
    sent = stub.requests()[sent_before:]
    assert db.execute("SELECT paused_until > now() FROM rail_pauses WHERE rail = 'mtn'").fetchone()[0], \
        "the pause must outlast the steps above"
    assert sent == []  # Y sent nothing to the rail: no read, not even a token
    for c in others:
        [deferred] = y.find("rail paused: job deferred", dedupe_key=f"poll:{c['id']}")
        assert f"set by {set_by}" in deferred["reason"]
        # Deferred to the end of the pause, the claim's attempt given back.
        # (Y's copy ages on its monotonic clock, the row on the database's.)
        row = db.execute("SELECT j.run_at >= p.paused_until - interval '1 second', j.attempts, j.failures, "
                         "j.locked_by, j.last_error FROM jobs j, rail_pauses p "
                         "WHERE j.dedupe_key = %s AND p.rail = 'mtn'", (f"poll:{c['id']}",)).fetchone()
        assert row[:4] == (True, 0, 0, None) and "paused" in row[4], row
    [adopted] = y.find("rail paused by another process", rail="mtn")
    assert adopted["set_by"] == set_by
    assert db.execute("SELECT reason FROM rail_pauses WHERE rail = 'mtn'").fetchone()[0] == "HTTP 429 Retry-After 120"
    assert any(line.startswith('vpay_rail_paused_seconds{rail="mtn"}') and float(line.split()[-1]) > 0
               for line in scraped.splitlines()), scraped
    y.signal(signal.SIGTERM)
    assert y.wait(60) == 0, y.text()[-3000:]
    assert y.find("drain clean")


def test_a_401_renews_the_token_once_and_the_charge_settles_in_the_same_attempt(db, db_url, merchant, spawn, stub):
    charge = _charge(db, merchant, "256770000041")
    ref = charge["rail_reference"]
    stub.succeed(ref, "10.00", "EUR")
    stub.revoke_on_read(ref)  # the token is revoked before its expires_in: 401 once
    worker = _worker(spawn, db_url, stub)
    _due(db, charge)
    wait_until(lambda: _status(db, charge) == "succeeded", timeout=30, what="the charge to settle")
    assert stub.tokens_issued() == 2
    assert [e.status for e in stub.requests("/collection/v1_0/requesttopay/", ref)] == [401, 200]
    handled = worker.wait_for_log("job handled", dedupe_key=f"poll:{charge['id']}")
    assert handled["attempts"] == 1 and handled["outcome"] == "Done"
    assert len(worker.find("job handled", dedupe_key=f"poll:{charge['id']}")) == 1


# --- 3. the API never waits on a hung rail -----------------------------------------


def test_the_api_answers_health_callbacks_and_reads_while_the_rail_hangs(db, db_url, spawn):
    hang = HangingRail()
    try:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = base_env(db_url, VPAY_MTN_BASE_URL=hang.url, VPAY_MTN_SUBSCRIPTION_KEY="k",
                       VPAY_MTN_API_USER="u", VPAY_MTN_API_KEY="s",
                       VPAY_MTN_CALLBACK_URL=f"{url}/provider/mtn/callback")
        api = spawn("vpay-server", "api", "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4",
                    env=env)

        def healthy():
            assert api.popen.poll() is None, api.text()[-3000:]
            try:
                return requests.get(f"{url}/healthz", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False
        wait_until(healthy, timeout=30, what="the API")
        key = new_key(db)
        existing = charges.create_payment(db, merchant_id="shop-1", amount=1000, currency="EUR", rail="mtn",
                                        payer="256770000051")
        headers = {"Authorization": f"Bearer {key}"}
        body = {"amount": 1500, "currency": "EUR", "payment_method": {"type": "mtn_momo", "msisdn": "256770000052"}}

        with ThreadPoolExecutor(8) as pool:
            creates = [pool.submit(requests.post, f"{url}/v1/payment_intents", json=body, headers=headers,
                                   timeout=60) for _ in range(8)]
            wait_until(lambda: hang.accepted >= 1, what="a create to be inside the rail call")
            # While the creates wait on the rail: each of these answers.
            health = requests.get(f"{url}/healthz", timeout=10)
            callback = requests.post(f"{url}/provider/mtn/callback",
                                     params={"ref": existing.charge["rail_reference"]}, json={}, timeout=10)
            read = requests.get(f"{url}/v1/payment_intents/{existing.intent['id']}", headers=headers, timeout=10)
            answers = [f.result() for f in creates]
        assert health.status_code == 200
        assert callback.status_code == 202
        assert read.status_code == 200 and read.json()["id"] == existing.intent["id"]
        assert [a.status_code for a in answers] == [201] * 8
        assert {a.json()["status"] for a in answers} == {"processing"}
        # None was confirmed by the hung rail: each is left to the worker's resubmit.
        created = [a.json()["latest_charge"] for a in answers]
        rows = db.execute("SELECT c.submitted_at IS NULL, j.id IS NOT NULL FROM charges c LEFT JOIN jobs j "
                          "ON j.dedupe_key = 'resubmit:' || c.id WHERE c.id = ANY(%s)", (created,)).fetchall()
        assert rows == [(True, True)] * 8
    finally:
        hang.close()


# --- 5. one merchant's hanging endpoint ---------------------------------------


def test_a_hanging_endpoint_is_backed_off_as_a_whole_and_others_are_delivered(db, db_url, spawn):
    rx = Receiver()
    hold = threading.Event()  # never set before teardown: endpoint A never answers
    try:
        rx.script("/a", *[Reply(hold=hold) for _ in range(20)])
        a = endpoint(db, "m_a", rx.url("/a"))
        b = endpoint(db, "m_b", rx.url("/b"))
        for _ in range(5):
            settle(db, bare_payment(db, "m_a"))
            settle(db, bare_payment(db, "m_b"))
        # The webhooks lane with two loops: both could be spent on A's timeouts.
        worker = spawn("vpay-worker", "--idle-sleep", "0.1", "--queues", "webhooks", "--worker-concurrency", "2",
                       env=worker_env(db_url, VPAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS="1",
                                      VPAY_WEBHOOK_READ_TIMEOUT_SECONDS="1"))

        def delivered(endpoint_id):
            return db.execute("SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = %s "
                              "AND status = 'delivered'", (endpoint_id,)).fetchone()[0]

        def a_jobs():
            return db.execute("SELECT attempts, last_error FROM jobs WHERE kind = 'deliver' "
                              "AND payload ->> 'endpoint_id' = %s", (a["id"],)).fetchall()

        # B's five deliveries complete, and every one of A's was taken up at least once.
        wait_until(lambda: delivered(b["id"]) == 5 and len(a_jobs()) == 5
                   and all(err for _, err in a_jobs()), timeout=60, what="B delivered, A's handled")
        # A cost a timeout or two (one per claim loop before the back-off), not one per delivery.
        assert 1 <= len(rx.posts("/a")) <= 2
        deferred = [row for row in a_jobs() if row[1].startswith("endpoint backed off")]
        assert len(deferred) >= 3 and all(attempts == 0 for attempts, _ in deferred)
        assert db.execute("SELECT timeouts_in_row >= 1, backoff_until > now() FROM webhook_endpoints "
                          "WHERE id = %s", (a["id"],)).fetchone() == (True, True)
        assert db.execute("SELECT timeouts_in_row, backoff_until FROM webhook_endpoints WHERE id = %s",
                          (b["id"],)).fetchone() == (0, None)
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.text()[-3000:]
    finally:
        hold.set()
        rx.close()


# --- settings are checked at boot -------------------------------------------------

_RAIL = {"VPAY_MTN_BASE_URL": "http://127.0.0.1:9", "VPAY_MTN_SUBSCRIPTION_KEY": "k",
         "VPAY_MTN_API_USER": "u", "VPAY_MTN_API_KEY": "p"}


@pytest.mark.parametrize("command", [["vpay-worker"], ["vpay-server", "api", "--bind", "127.0.0.1:9"]],
                         ids=["worker", "api"])
@pytest.mark.parametrize("name, value", [
    ("VPAY_MTN_TOTAL_TIMEOUT_SECONDS", "0"), ("VPAY_MTN_TOTAL_TIMEOUT_SECONDS", "abc"),
    ("VPAY_MTN_MAX_PAUSE_SECONDS", "-5"), ("VPAY_API_RAIL_TIMEOUT_SECONDS", "inf"),
    ("VPAY_API_RAIL_TIMEOUT_SECONDS", "61"),
])
def test_bad_deadline_and_pause_settings_are_refused_at_boot_with_78(db_url, command, name, value):
    import subprocess
    from support import script
    res = subprocess.run([script(command[0]), *command[1:]], env=base_env(db_url, **_RAIL, **{name: value}),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 78, res.stdout[-2000:] + res.stderr[-2000:]


def test_each_api_worker_opens_its_database_connection_before_the_first_request(db, db_url, spawn, stub):
    # A load balancer's first /healthz must not pay for a new connection
    # (bench/isolation.py: the first probe was the slowest). Nothing is asked
    # of the API here: the connections appear on their own.
    port = free_port()
    api = spawn("vpay-server", "api", "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "2",
                env=base_env(db_url, **stub.env()))

    def api_connections():
        assert api.popen.poll() is None, api.text()[-3000:]
        return db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND application_name = 'vpay-api'").fetchone()[0]
    wait_until(lambda: api_connections() == 2, timeout=30, what="one standing connection per API worker")
    assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    assert api_connections() == 2  # the probe used a standing connection
