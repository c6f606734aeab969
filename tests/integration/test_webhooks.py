"""Webhooks: endpoints, the URL policy, fan-out, signed delivery and its
retry rules, against a real Postgres and a real HTTP receiver on loopback.

End-to-end tests run the installed ``vpay-worker``; the rest call the
handlers in-process through the loop's own ``Worker._run`` (same Outcome
dispatch and fenced writes). ``Receiver`` is shared with
test_webhooks_drain.py and test_webhooks_kill.py.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from support import ConnCounter, base_env, wait_until
from vpay import handlers, webhooks
from vpay.money import merchants, charges
from vpay.engine import queue
from vpay.webhooks import policy as _policy  # noqa: F401 (monkeypatched)
from vpay.money.ids import new_id, new_rail_reference
from vpay.worker.loop import Worker, WorkerConfig
from vpay.rails.port import StatusKind
from vpay.worker.signals import ShutdownSignals

ROOT = Path(__file__).resolve().parents[2]


# ---- a real receiver ----------------------------------------------------

@dataclass
class Reply:
    """How the receiver answers one POST. ``hold``: seconds to sleep, or an
    Event to wait for (at most 60 s), before answering. ``endless``: stream
    a body until the client goes away."""

    status: int = 200
    headers: dict = field(default_factory=dict)
    hold: float | threading.Event | None = None
    body: bytes = b"ok"
    endless: bool = False


@dataclass
class Posted:
    path: str
    headers: dict  # lower-case names
    body: bytes    # the raw bytes, as received
    at: float      # time.monotonic() when the request had been read


class Receiver:
    """A ThreadingHTTPServer on 127.0.0.1:0 recording every POST's raw body
    and headers before answering as scripted per path (default: 200)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._posts: list[Posted] = []
        self._scripts: dict[str, list[Reply]] = {}
        self._events: list[threading.Event] = []
        self.endless_bytes = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                path = self.path
                with receiver._lock:
                    receiver._posts.append(Posted(path, {k.lower(): v for k, v in self.headers.items()},
                                                  body, time.monotonic()))
                    script_ = receiver._scripts.get(path)
                    reply = script_.pop(0) if script_ else Reply()
                try:
                    if isinstance(reply.hold, threading.Event):
                        reply.hold.wait(60)
                    elif reply.hold:
                        time.sleep(reply.hold)
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    if reply.endless:
                        self.send_header("connection", "close")
                        self.end_headers()
                        chunk = b"x" * 65536
                        while receiver.endless_bytes < 200 * 2**20:
                            self.wfile.write(chunk)
                            receiver.endless_bytes += len(chunk)
                        return
                    self.send_header("content-length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:
                    pass  # the worker went away (killed, timed out): that is the test

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *replies: Reply) -> None:
        with self._lock:
            self._scripts[path] = list(replies)
            self._events += [r.hold for r in replies if isinstance(r.hold, threading.Event)]

    def posts(self, path: str | None = None) -> list[Posted]:
        with self._lock:
            return [p for p in self._posts if path is None or p.path == path]

    def wait_posts(self, path: str, n: int, timeout: float = 30.0) -> list[Posted]:
        wait_until(lambda: len(self.posts(path)) >= n, timeout, what=f"{n} POST(s) to {path}")
        return self.posts(path)

    def close(self) -> None:
        for ev in self._events:
            ev.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    rx = Receiver()
    yield rx
    rx.close()


# ---- helpers --------------------------------------------------------------

def make_payment(db, merchant: str, amount: int = 1050) -> str:
    """A processing intent with a pending charge, inserted directly (no rail,
    no poll job). Answers the charge id."""
    intent_id, charge_id = new_id("pi"), new_id("ch")
    db.execute("INSERT INTO payment_intents (id, merchant_id, amount, currency, status) "
               "VALUES (%s, %s, %s, 'EUR', 'processing')", (intent_id, merchant, amount))
    db.execute("INSERT INTO charges (id, payment_intent_id, rail, rail_reference, payer, amount, "
               "currency) VALUES (%s, %s, 'mtn', %s, '46733123453', %s, 'EUR')",
               (charge_id, intent_id, new_rail_reference(), amount))
    return charge_id


def settle(db, charge_id: str) -> str:
    """Settle the charge as succeeded (the event, born with its deliveries);
    answer the event id."""
    assert charges.settle(db, charge_id, StatusKind.SUCCEEDED).transitioned
    return db.execute("SELECT e.id FROM events e JOIN charges c ON c.payment_intent_id = "
                      "e.payment_intent_id WHERE c.id = %s AND e.type = 'payment_intent.succeeded'",
                      (charge_id,)).fetchone()[0]


def endpoint(db, merchant: str, url: str) -> dict:
    merchants.create_merchant(db, merchant)
    return webhooks.add_endpoint(db, merchant, url, permit_private=True)


def worker_env(db_url: str, **extra: str) -> dict:
    return base_env(db_url, VPAY_WEBHOOKS_ALLOW_PRIVATE="1", **extra)


def start_worker(spawn, db_url, *args: str, **env: str):
    return spawn("vpay-worker", "--idle-sleep", "0.1", *args, env=worker_env(db_url, **env))


def deliver_job(db, endpoint_id: str | None = None):
    """``(attempts, leased, due_in_seconds, last_error)`` of the deliver job, or None."""
    sql = ("SELECT attempts, locked_by IS NOT NULL, EXTRACT(EPOCH FROM run_at - now())::float8, "
           "last_error FROM jobs WHERE kind = 'deliver'")
    params: tuple = ()
    if endpoint_id:
        sql += " AND payload ->> 'endpoint_id' = %s"
        params = (endpoint_id,)
    return db.execute(sql, params).fetchone()


def webhook_jobs(db) -> int:
    return db.execute("SELECT count(*) FROM jobs WHERE kind IN ('fanout', 'deliver')").fetchone()[0]


def verify(secret: str, posted: Posted) -> dict:
    return Webhook(secret).verify(posted.body, posted.headers)


def run_queue(pool, db, wid: str = "t1") -> Worker:
    """Run every due job in-process through the loop's dispatch until none is due."""
    ctx = handlers.Context(pool=pool, worker_id=wid)
    w = Worker(pool, ctx, WorkerConfig(worker_id=wid, concurrency=1), ShutdownSignals())
    while (job := queue.claim(db, wid)) is not None:
        w._run(job)
    return w


def stop(proc, expect: int = 0) -> None:
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == expect, proc.text()[-3000:]


# ---- endpoints and the URL policy ---------------------------------------

@pytest.fixture
def no_dev_flag(monkeypatch):
    monkeypatch.delenv(webhooks.ALLOW_PRIVATE_ENV, raising=False)


@pytest.fixture
def dev_flag(monkeypatch):
    monkeypatch.setenv(webhooks.ALLOW_PRIVATE_ENV, "1")


def _resolver(monkeypatch, *answers: str) -> None:
    monkeypatch.setattr(_policy, "resolve_host", lambda host, port: list(answers))


@pytest.mark.parametrize("url, why", [
    ("http://example.com/hook", "https"),
    ("https://127.0.0.1/hook", "loopback"),
    ("https://10.1.2.3/hook", "private"),
    ("https://192.168.0.10:8443/hook", "private"),
    ("https://100.64.0.1/hook", "private"),
    ("https://169.254.169.254/latest/meta-data", "link-local"),
    ("https://[::1]/hook", "loopback"),
    ("https://[fd00::1]/hook", "private"),
    ("https://[::ffff:127.0.0.1]/hook", "loopback"),
    ("https://0.0.0.0/hook", "unspecified"),
    ("https://224.0.0.1/hook", "multicast"),
    ("https://user:pw@example.com/hook", "credentials"),
    ("ftp://example.com/hook", "scheme"),
    ("https:///hook", "host"),
])
def test_refused_urls_at_registration(db, no_dev_flag, monkeypatch, url, why):
    merchants.create_merchant(db, "m1")
    _resolver(monkeypatch, "93.184.216.34")
    with pytest.raises(webhooks.UrlRefused, match=why):
        webhooks.add_endpoint(db, "m1", url)
    assert db.execute("SELECT count(*) FROM webhook_endpoints").fetchone() == (0,)


@pytest.mark.parametrize("answers, why", [
    (["127.0.0.1"], "loopback"),
    (["93.184.216.34", "10.0.0.7"], "private"),  # any refused address refuses the name
    (["2606:4700::1111", "fe80::1"], "link-local"),
    (["64:ff9b::a00:1"], "private"),  # NAT64 of 10.0.0.1
])
def test_names_resolving_to_refused_addresses_are_refused(db, no_dev_flag, monkeypatch, answers, why):
    merchants.create_merchant(db, "m1")
    _resolver(monkeypatch, *answers)
    with pytest.raises(webhooks.UrlRefused, match=why):
        webhooks.add_endpoint(db, "m1", "https://hooks.example.test/vpay")


def test_public_https_is_accepted_and_dev_flag_allows_http_loopback_only(db, monkeypatch):
    merchants.create_merchant(db, "m1")
    _resolver(monkeypatch, "93.184.216.34", "2606:4700::1111")
    monkeypatch.delenv(webhooks.ALLOW_PRIVATE_ENV, raising=False)
    ep = webhooks.add_endpoint(db, "m1", "https://hooks.example.test/vpay?x=1")
    assert ep["secret"].startswith("whsec_") and ep["id"].startswith("we_")
    Webhook(ep["secret"])  # a valid Standard Webhooks secret
    monkeypatch.setenv(webhooks.ALLOW_PRIVATE_ENV, "1")
    webhooks.add_endpoint(db, "m1", "http://127.0.0.1:8080/hook")
    webhooks.add_endpoint(db, "m1", "http://10.0.0.5/hook")
    for still_refused in ("http://169.254.169.254/", "http://0.0.0.0:8080/", "http://[ff02::1]/"):
        with pytest.raises(webhooks.UrlRefused):
            webhooks.add_endpoint(db, "m1", still_refused)
    with pytest.raises(LookupError):
        webhooks.add_endpoint(db, "nobody", "http://127.0.0.1/hook")
    assert [e["url"] for e in webhooks.list_endpoints(db, "m1")] == [
        "https://hooks.example.test/vpay?x=1", "http://127.0.0.1:8080/hook", "http://10.0.0.5/hook"]


# ---- delivery in-process: the policy at delivery, pinning, TLS ----------


def test_dns_answer_changed_after_registration_is_refused_at_delivery(db, pool, no_dev_flag, monkeypatch):
    counter = ConnCounter()
    try:
        merchants.create_merchant(db, "m1")
        _resolver(monkeypatch, "93.184.216.34")
        ep = webhooks.add_endpoint(db, "m1", f"https://hooks.example.test:{counter.port}/vpay")
        _resolver(monkeypatch, "127.0.0.1")  # the DNS answer now points into our network
        settle(db, make_payment(db, "m1"))
        run_queue(pool, db)
        attempts, leased, due_in, last_error = deliver_job(db, ep["id"])
        assert attempts == 1 and not leased and due_in > 1
        assert "resolves to 127.0.0.1, a loopback address" in last_error
        assert counter.accepted == 0  # not even a connection
        assert db.execute("SELECT status FROM webhook_deliveries").fetchone() == ("pending",)
    finally:
        counter.close()


def test_the_connection_goes_to_the_address_that_was_checked(db, pool, receiver, dev_flag, monkeypatch):
    # hooks.example.test exists in no DNS: the POST can only arrive if the
    # worker connected to the address the policy resolved and checked.
    _resolver(monkeypatch, "127.0.0.1")
    ep = endpoint(db, "m1", f"http://hooks.example.test:{receiver.port}/pinned")
    event_id = settle(db, make_payment(db, "m1"))
    run_queue(pool, db)
    [posted] = receiver.posts("/pinned")
    assert posted.headers["host"] == f"hooks.example.test:{receiver.port}"
    assert verify(ep["secret"], posted)["id"] == event_id
    assert deliver_job(db) is None


def test_an_endpoint_row_with_a_private_url_is_refused_at_delivery_without_the_flag(
        db, pool, receiver, no_dev_flag, monkeypatch):
    # Refused for good, it holds the endpoint (one alert naming the reason),
    # not one dead letter per delivery; enabling it re-queues what waited.
    merchants.create_merchant(db, "m1")
    we = new_id("we")
    db.execute("INSERT INTO webhook_endpoints (id, merchant_id, url, secret) VALUES (%s, 'm1', %s, %s)",
               (we, receiver.url("/a"), webhooks.new_secret()))
    settled = [settle(db, make_payment(db, "m1")) for _ in range(3)]
    run_queue(pool, db)
    assert receiver.posts() == []
    assert db.execute("SELECT count(*) FROM jobs").fetchone() == (0,)  # nothing dead-lettered
    assert db.execute("SELECT enabled, disabled_cause FROM webhook_endpoints").fetchone() == (False, "url_policy")
    [(kind, details)] = db.execute("SELECT kind, details FROM alerts").fetchall()
    assert kind == "webhook_endpoint_disabled" and details["endpoint_id"] == we
    assert "the scheme must be https" in details["reason"]
    assert {r[0] for r in db.execute("SELECT status FROM webhook_deliveries")} == {"held"}
    later = settle(db, make_payment(db, "m1"))  # while held: the fan-out passes it by
    run_queue(pool, db)
    assert db.execute("SELECT count(*) FROM webhook_deliveries").fetchone() == (3,)

    # the operator fixes the worker (here: the flag), then enables the endpoint
    monkeypatch.setenv(webhooks.ALLOW_PRIVATE_ENV, "1")
    assert webhooks.enable_endpoint(db, we)["requeued"] == 4
    run_queue(pool, db)
    assert sorted(json.loads(p.body)["id"] for p in receiver.posts("/a")) == sorted(settled + [later])
    assert {r[0] for r in db.execute("SELECT status FROM webhook_deliveries")} == {"delivered"}
    assert webhooks.enable_endpoint(db, we)["requeued"] == 0  # nothing waits any more


# ---- delivery in-process: statuses, schedule, limits --------------------

def test_a_fanout_job_left_by_an_older_release_creates_nothing_new_after_deliveries_finished(
        db, pool, receiver, dev_flag):
    # Releases before issue 30 made each event's deliveries in a fanout:<event_id>
    # job; one still queued at an upgrade runs here and finds them made.
    endpoint(db, "m1", receiver.url("/a"))
    off = endpoint(db, "m1", receiver.url("/off"))
    webhooks.disable_endpoint(db, off["id"], "test")
    endpoint(db, "m2", receiver.url("/c"))
    event_id = settle(db, make_payment(db, "m1"))
    run_queue(pool, db)
    assert len(receiver.posts("/a")) == 1 and receiver.posts("/off") == receiver.posts("/c") == []
    assert webhook_jobs(db) == 0

    queue.enqueue(db, "fanout", f"fanout:{event_id}", {"event_id": event_id})
    run_queue(pool, db)
    assert webhook_jobs(db) == 0 and len(receiver.posts("/a")) == 1
    assert db.execute("SELECT count(*) FROM webhook_deliveries").fetchone() == (1,)


def test_a_delivery_costs_two_statements_around_its_post(db, db_url, receiver, dev_flag):
    # Counted at the wire (bench/pgcount.py): webhook_attempt_start (the event,
    # the endpoint, its back-off gate) and webhook_attempt_end (the outcome and
    # the endpoint's back-off cleared). Before issue 30: four (context, gate,
    # the endpoint answered, the outcome).
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from pgcount import CountingProxy
    from vpay.base import db as vdb
    ep = endpoint(db, "m1", receiver.url("/a"))
    settle(db, make_payment(db, "m1"))
    db.execute("UPDATE webhook_endpoints SET timeouts_in_row = 2, backoff_until = now() - interval '1 second'")
    job = queue.claim(db, "t1")
    assert job.kind == "deliver"
    proxy = CountingProxy(db_url).start()
    pool = vdb.make_pool(proxy.url, max_size=2)
    try:
        with pool.connection():
            pass
        before, checks = proxy.total(), proxy.by_statement()[""]
        outcome = handlers.handle(job, handlers.Context(pool=pool, worker_id="t1"))
        trips = proxy.total() - before - (proxy.by_statement()[""] - checks)
    finally:
        pool.close()
        proxy.stop()
    assert type(outcome).__name__ == "Done" and len(receiver.posts("/a")) == 1
    assert trips == 2, proxy.by_statement().most_common(6)
    # the probe went through and its answer cleared the back-off
    assert db.execute("SELECT timeouts_in_row, backoff_until FROM webhook_endpoints WHERE id = %s",
                      (ep["id"],)).fetchone() == (0, None)
    assert db.execute("SELECT status, attempts FROM webhook_deliveries WHERE event_id = %s",
                      (job.payload["event_id"],)).fetchone() == ("delivered", 1)


def test_a_disabled_endpoints_pending_delivery_ends_unsent(db, pool, receiver, dev_flag, caplog):
    ep = endpoint(db, "m1", receiver.url("/a"))
    settle(db, make_payment(db, "m1"))
    ctx = handlers.Context(pool=pool, worker_id="t1")
    w = Worker(pool, ctx, WorkerConfig(worker_id="t1", concurrency=1), ShutdownSignals())
    assert deliver_job(db, ep["id"]) is not None  # born with the event
    webhooks.disable_endpoint(db, ep["id"], "disabled by an operator")
    with caplog.at_level("INFO", logger="vpay.webhooks"):
        w._run(queue.claim(db, "t1"))
    assert deliver_job(db) is None and receiver.posts() == []
    assert any(r.getMessage() == "webhook delivery ended: endpoint disabled" for r in caplog.records)
    assert db.execute("SELECT status FROM webhook_deliveries").fetchone() == ("skipped",)


@pytest.mark.parametrize("reply, low, high", [
    (Reply(429, {"Retry-After": "120"}), 119.0, 121.0),   # above the 5 s rung: honoured
    (Reply(503, {"Retry-After": "99999"}), 3599.0, 3601.0),  # bounded to an hour
    (Reply(500, {"Retry-After": "120"}), 4.0, 6.0),        # only on 429/503
    (Reply(429), 4.0, 6.0),                                  # no header: the schedule
])
def test_retry_after_bounds(db, pool, receiver, dev_flag, reply, low, high):
    endpoint(db, "m1", receiver.url("/a"))
    receiver.script("/a", reply)
    settle(db, make_payment(db, "m1"))
    run_queue(pool, db)
    attempts, _, due_in, _ = deliver_job(db)
    assert attempts == 1 and low <= due_in <= high


def test_redirects_are_not_followed(db, pool, receiver, dev_flag):
    endpoint(db, "m1", receiver.url("/a"))
    receiver.script("/a", Reply(302, {"Location": receiver.url("/b")}))
    settle(db, make_payment(db, "m1"))
    run_queue(pool, db)
    assert receiver.posts("/b") == []
    assert "HTTP 302" in deliver_job(db)[3]


def test_the_tenth_failure_is_dead_lettered_with_an_alert(db, pool, receiver, dev_flag):
    endpoint(db, "m1", receiver.url("/a"))
    receiver.script("/a", Reply(500))
    settle(db, make_payment(db, "m1"))
    ctx = handlers.Context(pool=pool, worker_id="t1")
    w = Worker(pool, ctx, WorkerConfig(worker_id="t1", concurrency=1), ShutdownSignals())
    db.execute("UPDATE jobs SET attempts = %s WHERE kind = 'deliver'", (webhooks.MAX_ATTEMPTS - 1,))
    w._run(queue.claim(db, "t1"))  # attempt number 10
    parked, reason = db.execute("SELECT run_at = 'infinity', last_error FROM jobs").fetchone()
    assert parked and "gave up after 10 attempts" in reason and "HTTP 500" in reason
    assert db.execute("SELECT count(*) FROM alerts WHERE kind = 'job_dead_lettered'").fetchone() == (1,)
    assert db.execute("SELECT status, attempts FROM webhook_deliveries").fetchone() == ("dead_lettered", 10)


def test_the_response_body_is_read_at_most_64_kib(db, pool, receiver, dev_flag):
    endpoint(db, "m1", receiver.url("/a"))
    receiver.script("/a", Reply(200, endless=True))
    settle(db, make_payment(db, "m1"))
    started = time.monotonic()
    run_queue(pool, db)
    assert deliver_job(db) is None  # delivered: the endless body did not hold the worker
    assert time.monotonic() - started < 10
    wait_until(lambda: receiver.endless_bytes > 0, what="the receiver streaming")
    assert receiver.endless_bytes < 200 * 2**20  # it stopped because we hung up


def test_secret_rotation_signs_with_both_secrets_during_the_overlap(db, pool, receiver, dev_flag):
    ep = endpoint(db, "m1", receiver.url("/a"))
    rotated = webhooks.rotate_secret(db, ep["id"], overlap_seconds=3600)
    settle(db, make_payment(db, "m1"))
    run_queue(pool, db)
    posted = receiver.posts("/a")[0]
    assert len(posted.headers["webhook-signature"].split(" ")) == 2
    verify(ep["secret"], posted)       # the receiver still on the old secret
    verify(rotated["secret"], posted)  # or already on the new one

    newest = webhooks.rotate_secret(db, ep["id"], overlap_seconds=0)  # revoke at once
    settle(db, make_payment(db, "m1"))
    run_queue(pool, db)
    posted = receiver.posts("/a")[1]
    assert len(posted.headers["webhook-signature"].split(" ")) == 1
    verify(newest["secret"], posted)
    with pytest.raises(WebhookVerificationError):
        verify(rotated["secret"], posted)


def test_the_guides_python_snippet_verifies_a_real_delivery(db, pool, receiver, dev_flag, monkeypatch):
    text = (ROOT / "docs" / "webhooks.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    ep = endpoint(db, "m1", receiver.url("/a"))
    event_id = settle(db, make_payment(db, "m1"))
    run_queue(pool, db)
    posted = receiver.posts("/a")[0]
    monkeypatch.setenv("VPAY_WEBHOOK_SECRET", ep["secret"])
    ns: dict = {"__name__": "merchant_receiver"}
    exec(compile(snippet, "docs/webhooks.md", "exec"), ns)  # noqa: S102 - our own document
    assert ns["handle"](posted.body, posted.headers) == 200
    assert ns["handle"](posted.body, posted.headers) == 200  # a redelivery is acknowledged
    assert ns["seen_event_ids"] == {event_id}
    assert ns["handle"](posted.body.replace(b"succeeded", b"succeedeD"), posted.headers) == 400
