"""Failover to a streaming standby under a running API and worker.

Each test starts its own primary and streaming standby (``pg_basebackup -R``,
tests/replicas.py), the sandbox MoMo rail, a webhook receiver, the installed
``vpay-server api`` and ``vpay-worker``, both on the multi-host URL
``postgresql://…@127.0.0.1:P1,127.0.0.1:P2/vpay?target_session_attrs=read-write``.
Payments are made through the API; mid-flow the primary and every process
of it are SIGKILLed (its host died) and the standby is promoted. Nothing is
restarted: the services find the new primary through the URL.

* Synchronous replication (``synchronous_standby_names`` names the standby):
  every payment the API answered 201 for is on the new primary and settles
  as the rail holds it, nothing is left leased, and each transition reaches
  the merchant under one event id, the one in the surviving ``events``.
  Both services say at start that the primary commits synchronously, and
  the worker's gauge follows the failover to the promoted server (which has
  no standby of its own: 0).
* Asynchronous replication, the standby cut off before the tail (a lagging
  standby): a settle the merchant was sent is lost with the tail, the
  worker polls the charge again and settles it again, and the merchant
  receives it a second time under the SAME event id (deterministic per
  transition: their dedupe holds). A payment answered 201 after the cut is
  gone, and the statement import finds its money at the rail as an
  ``unknown_rail_transaction``.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict

import psycopg
import pytest
import requests

from api_support import free_port, start_api, stop_api
from replicas import Pair, QueueClock, pg_bin
from support import base_env, script, wait_until
from test_webhooks import receiver  # noqa: F401  (fixture)
from vpay import webhooks
from vpay.base import db as vdb
from vpay.money import merchants
from vpay.sandbox import statement

pytestmark = pytest.mark.slow

MERCHANT = "m_failover"
HOLDS = "256770000301", "256770000302", "256770000303"  # the rail says PENDING until told otherwise
PAYS = "256770000311"  # the rail says SUCCESSFUL at once
LEASE = "5"  # --lease-seconds: a lease held across the kill comes back within seconds


def _require_binaries() -> None:
    import os
    if pg_bin() is None:
        if os.environ.get("VPAY_REQUIRE_PG_SERVER") == "1":
            pytest.fail("VPAY_REQUIRE_PG_SERVER=1 but no PostgreSQL server binaries "
                        "(apt-get install postgresql-15)")
        pytest.skip("no PostgreSQL server binaries (/usr/lib/postgresql/15/bin or VPAY_TEST_PG_BIN): "
                    "apt-get install -y postgresql-15")


class Deployment:
    """The pair, the API, the worker and the merchant's endpoint."""

    def __init__(self, pair: Pair, sandbox, receiver, spawn, tmp_path):  # noqa: F811
        self.pair, self.sandbox, self.receiver = pair, sandbox, receiver
        self.url = pair.url()
        with psycopg.connect(self.url, autocommit=True) as conn:
            vdb.migrate(conn)
            merchants.create_merchant(conn, MERCHANT, MERCHANT)
            self.key = merchants.create_api_key(conn, MERCHANT)[1]
            webhooks.add_endpoint(conn, MERCHANT, receiver.url("/hooks"), permit_private=True)
        for payer in HOLDS:
            sandbox.script(payer, outcome="PENDING")
        self.api = start_api(self.url, tmp_path, rail=sandbox, workers=1)
        self.metrics_port = free_port()
        self.worker = spawn("vpay-worker", "--idle-sleep", "0.1", "--lease-seconds", LEASE,
                            env={**self.api.env(), "VPAY_WEBHOOKS_ALLOW_PRIVATE": "1",
                                 "VPAY_METRICS_PORT": str(self.metrics_port)})

    def pay(self, payer: str) -> requests.Response:
        return self.api.create(self.key, payer=payer)

    def paid(self, payer: str) -> dict:
        """A payment the API answered 201 for: its intent."""
        answer = self.pay(payer)
        assert answer.status_code == 201, answer.text
        return answer.json()

    def conn(self) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True, connect_timeout=5)

    def rail_reference(self, charge_id: str) -> str:
        return next(t["reference"] for t in self.sandbox.transactions() if t.get("externalId") == charge_id)

    def synchronous_gauge(self) -> float | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("vpay_database_synchronous_commit "):
                    return float(line.split()[1])
        return None

    def deliveries(self) -> dict[tuple[str, str, object], set[str]]:
        """``{(intent, type, expired): {webhook-id, …}}`` of what the receiver got."""
        seen: dict[tuple, set[str]] = defaultdict(set)
        for post in self.receiver.posts("/hooks"):
            body = json.loads(post.body)
            assert post.headers["webhook-id"] == body["id"]  # Standard Webhooks: the event id
            seen[(body["data"]["object"]["id"], body["type"], body["data"].get("expired"))].add(body["id"])
        return dict(seen)

    def leased(self, conn) -> list[str]:
        return [r[0] for r in conn.execute("SELECT dedupe_key FROM jobs WHERE locked_by IS NOT NULL")]

    def close(self) -> None:
        stop_api(self.api)


@pytest.fixture
def deploy(sandbox, receiver, spawn, tmp_path):  # noqa: F811
    _require_binaries()
    made: list[tuple[Pair, Deployment | None]] = []

    def make(synchronous: bool) -> Deployment:
        pair = Pair(synchronous=synchronous)
        made.append((pair, None))
        d = Deployment(pair, sandbox, receiver, spawn, tmp_path)
        made[-1] = (pair, d)
        return d

    yield make
    for pair, d in made:
        if d is not None:
            d.worker.close()
            d.close()
        pair.close()


def _said_commit_mode(proc, synchronous: bool) -> dict:
    return proc.wait_for_log("database commit mode", timeout=60, synchronous=synchronous)


def test_with_synchronous_replication_a_failover_loses_nothing_and_sends_each_transition_once(deploy):
    d = deploy(synchronous=True)
    for proc in (d.api.proc, d.worker):
        line = _said_commit_mode(proc, True)
        assert line["synchronous_standby_names"] == "vpay_standby" and line["synchronous_commit"] == "on"
        assert line["failover_may_lose_commits"] is False
    assert wait_until(lambda: d.synchronous_gauge() == 1, timeout=30, what="the gauge to say synchronous")

    answered: list[dict] = [d.paid(PAYS), d.paid(PAYS)] + [d.paid(p) for p in HOLDS]
    stop = threading.Event()

    def keep_paying() -> None:  # payments arriving across the kill and the promotion
        while not stop.is_set():
            try:
                answer = d.pay(PAYS)
            except requests.RequestException:
                answer = None
            if answer is not None and answer.status_code == 201:
                answered.append(answer.json())
            stop.wait(0.2)

    payer_thread = threading.Thread(target=keep_paying, daemon=True)
    with QueueClock(d.url):
        with d.conn() as conn:
            # mid-flow: some settled and delivered, the held ones still polling
            wait_until(lambda: conn.execute("SELECT count(*) FROM charges WHERE status = 'succeeded'")
                       .fetchone()[0] >= 2 and len(d.deliveries()) >= 4, timeout=60, what="a run in progress")
        payer_thread.start()
        wait_until(lambda: len(answered) >= 7, timeout=30, what="payments answered while running")
        d.pair.fail_over()
        wait_until(lambda: len(answered) >= 10, timeout=60, what="payments answered after the failover")
        stop.set()
        payer_thread.join(15)
        for intent in answered[2:5]:  # the payers approve the held ones now
            d.sandbox.set_status(d.rail_reference(intent["latest_charge"]), "SUCCESSFUL")

        with d.conn() as conn:
            assert conn.info.port == d.pair.standby.port
            ids = [i["id"] for i in answered]

            def settled():
                rows = dict(conn.execute("SELECT id, status FROM payment_intents WHERE id = ANY(%s)", (ids,)))
                return len(rows) == len(ids) and set(rows.values()) == {"succeeded"} and not d.leased(conn)

            wait_until(settled, timeout=90, what="every payment answered 201 to settle, nothing leased")
            events = conn.execute("SELECT payment_intent_id, type, data->'expired', id FROM events").fetchall()
            wait_until(lambda: len(d.deliveries()) == len(events), timeout=60,
                       what="every event of the surviving timeline delivered")
    assert len(answered) == len(set(ids)) >= 10
    # each transition under one id, the one the surviving database holds
    delivered = d.deliveries()
    assert {(i, t, e): {eid} for i, t, e, eid in events} == delivered
    assert all(len(seen) == 1 for seen in delivered.values())
    assert not d.worker.find("event already written: the same transition again, kept once")
    # the promoted server has no synchronous standby of its own: said and scraped
    _said_commit_mode(d.worker, False)
    assert wait_until(lambda: d.synchronous_gauge() == 0, timeout=30, what="the gauge to follow the failover")
    assert d.worker.popen.poll() is None and d.api.proc.popen.poll() is None  # nothing restarted


def test_with_asynchronous_replication_a_settle_lost_in_the_tail_reaches_the_merchant_again_under_its_id(
        deploy, tmp_path):
    d = deploy(synchronous=False)
    line = _said_commit_mode(d.worker, False)
    assert line["failover_may_lose_commits"] is True and line["synchronous_standby_names"] == ""
    _said_commit_mode(d.api.proc, False)

    with QueueClock(d.url):
        held = d.paid(HOLDS[0])
        ref = d.rail_reference(held["latest_charge"])
        wait_until(lambda: (held["id"], "payment_intent.processing", False) in d.deliveries(), timeout=60,
                   what="the processing event delivered")
        wait_until(d.pair.caught_up, timeout=30, what="the standby to catch up")
        d.pair.cut_stream()  # from here on the standby falls behind: the tail

        d.sandbox.set_status(ref, "SUCCESSFUL")
        key = (held["id"], "payment_intent.succeeded", None)
        first = wait_until(lambda: d.deliveries().get(key), timeout=60, what="the settle delivered")
        lost = d.paid(PAYS)  # answered 201, committed on the primary only
        wait_until(lambda: d.sandbox.transaction(d.rail_reference(lost["latest_charge"]))["status"] == "SUCCESSFUL",
                   timeout=30, what="the lost payment approved at the rail")

        d.pair.fail_over()
        # the new primary has the charge pending: the worker reads the rail
        # again and settles it again; the merchant gets the same id
        with d.conn() as conn:
            wait_until(lambda: conn.execute("SELECT status FROM charges WHERE id = %s",
                                            (held["latest_charge"],)).fetchone() == ("succeeded",),
                       timeout=90, what="the charge settled again on the promoted standby")
            [(event_id,)] = conn.execute("SELECT id FROM events WHERE payment_intent_id = %s "
                                         "AND type = 'payment_intent.succeeded'", (held["id"],)).fetchall()
            posts = lambda: [p for p in d.receiver.posts("/hooks")  # noqa: E731
                             if json.loads(p.body)["type"] == "payment_intent.succeeded"
                             and json.loads(p.body)["data"]["object"]["id"] == held["id"]]
            wait_until(lambda: len(posts()) >= 2, timeout=60, what="the settle delivered again")
            wait_until(lambda: not d.leased(conn), timeout=60, what="nothing left leased")
            assert conn.execute("SELECT count(*) FROM payment_intents WHERE id = %s", (lost["id"],)).fetchone() == (0,)
    assert first == {event_id}
    assert {p.headers["webhook-id"] for p in posts()} == {event_id}  # twice, one id: the dedupe holds
    assert all(len(ids) == 1 for ids in d.deliveries().values())
    assert requests.get(f"{d.api.url}/v1/payment_intents/{lost['id']}", timeout=10,
                        headers={"Authorization": f"Bearer {d.key}"}).status_code == 404

    # The rail's statement finds the money of the payment the failover lost.
    path = tmp_path / "statement.csv"
    path.write_bytes(statement.export(d.sandbox))
    out = subprocess.run([script("vpay-server"), "statements", "import", str(path), "--rail", "mtn",
                          "--profile", "sandbox", "--json"], env=base_env(d.url), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    by_ref = {r["reference"]: r["outcome"] for r in report["exceptions"]}
    assert by_ref[d.rail_reference(lost["latest_charge"])] == "unknown_rail_transaction"
    assert ref not in by_ref  # the re-settled one matches
