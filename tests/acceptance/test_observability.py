"""Metrics and logs of live processes: a real ``vpay-worker`` with
``--metrics-port`` settling payments through the sandbox rail and delivering
webhooks to a real receiver, and a real ``vpay-server api`` (gunicorn, two
worker processes) answering callbacks; both scraped over HTTP and their
counters asserted to move with the work done."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import uuid
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from api_support import api_stack, new_key, stack  # noqa: F401  (fixtures)
from support import TimeMachine, base_env, rail_env, script, wait_until
from test_webhooks import Receiver, Reply
from vpay.money import payments
from vpay import webhooks
from vpay.rails.mtn import MtnMomo
from vpay.sandbox.mtn import SandboxRail

pytestmark = pytest.mark.slow

SUCCESS = "256770000001"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str, headers: dict | None = None) -> dict[tuple, float]:
    """``{(sample name, frozenset(labels.items())): value}`` of one scrape,
    parsed by prometheus_client's own parser."""
    resp = requests.get(url, timeout=10, headers=headers or {})
    resp.raise_for_status()
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def present(samples: dict, name: str, **labels: str) -> bool:
    want = set(labels.items())
    return any(n == name and want <= ls for (n, ls) in samples)


# --- the worker ----------------------------------------------------------------


@pytest.fixture
def secret_rail():
    """A sandbox MoMo rail whose credentials are random, so a log can be
    searched for them."""
    with SandboxRail(success_after_seconds=0.2, subscription_key=secrets.token_hex(16),
                     api_user=str(uuid.uuid4()), api_key=secrets.token_hex(16)) as rail:
        yield rail


@pytest.fixture
def receiver():
    rx = Receiver()
    yield rx
    rx.close()


def test_a_live_worker_counts_its_work_and_logs_it_with_the_jobs_fields(
        db, db_url, pool, secret_rail, merchant, receiver, spawn):
    rail = secret_rail
    env = base_env(db_url, **rail_env(rail), VPAY_WEBHOOKS_ALLOW_PRIVATE="1")
    ok = webhooks.add_endpoint(db, merchant, receiver.url("/ok"), permit_private=True)
    gone = webhooks.add_endpoint(db, merchant, receiver.url("/gone"), permit_private=True)
    receiver.script("/gone", Reply(status=410))
    adapter = MtnMomo.from_env(rail_env(rail))
    created = payments.create_and_submit(pool, lambda code: adapter, merchant_id=merchant, amount=1500,
                                         currency="EUR", rail="mtn", payer=SUCCESS)
    charge_id = created["charge"]["id"]

    port = free_port()
    worker = spawn("vpay-worker", "--idle-sleep", "0.1", "--metrics-port", str(port), env=env)
    worker.wait_for_log("metrics served")
    url = f"http://127.0.0.1:{port}/metrics"
    with TimeMachine(db_url):
        wait_until(lambda: db.execute("SELECT status FROM charges WHERE id = %s",
                                      (charge_id,)).fetchone()[0] == "succeeded",
                   timeout=60, what="the charge to settle")
        # processing + succeeded, each delivered to /ok and refused for good by /gone
        receiver.wait_posts("/ok", 2, timeout=60)

    def settled_and_delivered():
        s = scrape(url)
        return s if (value(s, "vpay_jobs_total", kind="poll", outcome="done") >= 1
                     and value(s, "vpay_webhook_attempts_total", result="delivered") >= 2) else None
    samples = wait_until(settled_and_delivered, timeout=30, what="the counters to move")

    assert value(samples, "vpay_jobs_total", kind="poll", lane="mtn", outcome="done") >= 1
    assert value(samples, "vpay_job_seconds_count", kind="poll", lane="mtn") >= 1
    assert value(samples, "vpay_rail_requests_total", rail="mtn", operation="status",
                 answer="succeeded") >= 1
    assert value(samples, "vpay_rail_request_seconds_count", rail="mtn", operation="status") >= 1
    assert value(samples, "vpay_poll_lateness_seconds_count", lane="mtn") >= 1
    assert value(samples, "vpay_webhook_attempts_total", result="gone") == 1
    # read from the database at scrape
    assert value(samples, "vpay_database_up") == 1
    assert value(samples, "vpay_charges", status="succeeded") == 1
    assert value(samples, "vpay_charges", status="pending") == 0
    assert value(samples, "vpay_webhook_endpoints_disabled") == 1
    assert db.execute("SELECT enabled FROM webhook_endpoints WHERE id = %s",
                      (gone["id"],)).fetchone()[0] is False
    assert present(samples, "vpay_queue_jobs", lane="mtn", state="due")
    assert value(samples, "vpay_queue_jobs", state="dead") == 0
    assert present(samples, "vpay_alerts_open", kind="rail_contradiction")
    assert value(samples, "vpay_leases_lost_total") == 0
    assert present(samples, "process_resident_memory_bytes")
    # the queue gauge is exact at scrape: park a job, scrape again after the cache
    db.execute("INSERT INTO jobs (kind, dedupe_key, payload, run_at, lane, last_error) VALUES "
               "('poll', 'poll:ch_parked', '{}', 'infinity', 'mtn', 'parked by the test')")
    wait_until(lambda: value(scrape(url), "vpay_queue_jobs", lane="mtn", state="dead") == 1,
               timeout=30, what="the dead job in vpay_queue_jobs")

    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0

    lines = worker.lines()
    # the adapter's structured line, inside the poll job's context
    reads = [l for l in lines if l.get("message") == "rail call" and l.get("operation") == "status"
             and l.get("answer") == "succeeded"]
    assert reads, "no structured rail call line"
    read = reads[-1]
    assert read["rail"] == "mtn" and read["http_status"] == 200 and read["seconds"] >= 0
    assert read["charge_id"] == charge_id and read["kind"] == "poll" and read["lane"] == "mtn"
    assert read["dedupe_key"] == f"poll:{charge_id}" and isinstance(read["job_id"], int)
    assert read["worker_id"] and read["worker_id"] == worker.find("worker started")[0]["worker_id"]
    # every line a rail adapter, a handler or the money module wrote ran inside a job
    for line in lines:
        if line.get("logger", "").startswith(("vpay.rails", "vpay.handlers", "vpay.money", "vpay.webhooks")):
            assert {"worker_id", "job_id", "kind", "lane", "dedupe_key"} <= line.keys(), line
    delivered = [l for l in lines if l.get("message") == "webhook delivered"]
    assert delivered and all(l["endpoint_id"] == ok["id"] and l["lane"] == "webhooks"
                             for l in delivered)
    # never a credential, whole log
    text = worker.text()
    import base64
    basic = base64.b64encode(f"{rail.api_user}:{rail.api_key}".encode()).decode()
    for secret in (rail.subscription_key, rail.api_key, rail.api_user, basic,
                   ok["secret"], gone["secret"]):
        assert secret not in text


def test_a_metrics_port_that_cannot_be_bound_refuses_the_boot(db, db_url, spawn):
    # A port that cannot be had is 69 ("the database (or a port) is
    # unavailable", docs/cli.md), as for sandbox-rail and the API; it was 78.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = subprocess.run([script("vpay-worker"), "--metrics-port", str(port)],
                             env=base_env(db_url), capture_output=True, text=True, timeout=60)
    assert out.returncode == 69, out.stdout + out.stderr
    [line] = out.stderr.splitlines()  # one line, nothing else on stderr
    assert line.startswith(f"vpay: cannot serve metrics on 127.0.0.1:{port}: "), line
    assert db.execute("SELECT count(*) FROM workers").fetchone()[0] == 0  # the database untouched
    out = subprocess.run([script("vpay-worker")], env=base_env(db_url, VPAY_METRICS_PORT="70000"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 78 and "--metrics-port 70000 is not a TCP port" in out.stderr


# --- the API -------------------------------------------------------------------


def _gunicorn_workers(arbiter: int) -> set[int]:
    """Pids of the arbiter's children (gunicorn's worker processes)."""
    children = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == arbiter:
                children.add(int(entry.name))
    return children


CALLBACK = "/provider/{code}/callback"


def test_api_metrics_add_up_across_gunicorn_workers_even_after_they_are_replaced(stack, db):
    url = f"{stack.url}/metrics"
    # callbacks answered 400 (a ref that is not a UUID): the sandbox's own
    # callbacks for the payment below are 202s and cannot be mistaken for them
    before = value(scrape(url), "vpay_api_requests_total", method="POST", route=CALLBACK, status="400")
    n = 12
    for i in range(n):
        assert stack.callback(f"not-a-uuid-{i}", {}).status_code == 400
    # whichever worker answers the scrape, it reports every worker's requests
    for _ in range(6):
        samples = scrape(url)
        assert value(samples, "vpay_api_requests_total", method="POST", route=CALLBACK,
                     status="400") == before + n
    assert value(samples, "vpay_api_request_seconds_count", method="POST", route=CALLBACK) >= before + n
    # a payment created through the API counts the rail request its worker made
    key = new_key(db)
    assert stack.create(key).status_code in (200, 201)
    assert value(scrape(url), "vpay_rail_requests_total", rail="mtn", operation="request_to_pay",
                 answer="accepted") >= 1

    # kill every gunicorn worker: the arbiter starts new ones, whose memory is
    # empty; the counts survive in the multiprocess files
    old = _gunicorn_workers(stack.proc.pid)
    assert len(old) == 2
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: len(_gunicorn_workers(stack.proc.pid) - old) == 2, timeout=30,
               what="gunicorn to replace its workers")
    wait_until(lambda: requests.get(f"{stack.url}/healthz", timeout=5).status_code == 200, timeout=30,
               what="the API to answer again")
    samples = scrape(url)
    assert value(samples, "vpay_api_requests_total", method="POST", route=CALLBACK,
                 status="400") == before + n
    assert value(samples, "vpay_rail_requests_total", rail="mtn", operation="request_to_pay",
                 answer="accepted") >= 1


def test_api_metrics_are_not_served_through_a_proxy_nor_in_the_openapi_document(stack):
    assert requests.get(f"{stack.url}/metrics", timeout=5).status_code == 200
    proxied = requests.get(f"{stack.url}/metrics", headers={"X-Forwarded-For": "203.0.113.9"}, timeout=5)
    assert proxied.status_code == 404 and "vpay_" not in proxied.text
    assert requests.get(f"{stack.url}/metrics", headers={"Forwarded": "for=203.0.113.9"},
                        timeout=5).status_code == 404
    doc = requests.get(f"{stack.url}/openapi.json", timeout=5).json()
    assert "/metrics" not in doc["paths"]


def test_the_api_removes_its_metrics_directory_at_exit_and_one_a_killed_api_left(db_url, spawn):
    import tempfile

    from api_support import mtn_env
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = Path(tempfile.gettempdir()) / f"vpay-api-metrics-{gone.pid}-left"
    orphan.mkdir()
    (orphan / "counter_1.db").write_bytes(b"\0" * 8)
    with SandboxRail() as rail:
        port = free_port()
        api = spawn("vpay-server", "api", "--bind", f"127.0.0.1:{port}", "--workers", "1",
                    env=base_env(db_url, **mtn_env(rail, port)))
        path = Path(api.wait_for_log("api metrics directory")["path"])
        def serving():
            assert api.popen.poll() is None, api.text()
            try:
                return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).ok
            except requests.ConnectionError:
                return False
        wait_until(serving, timeout=30, what="the API to serve /metrics")
        assert path.is_dir() and path.name.startswith(f"vpay-api-metrics-{api.pid}-")
        assert oct(path.stat().st_mode & 0o777) == "0o700"
        assert not orphan.exists()
        api.signal(signal.SIGTERM)
        assert api.wait(30) == 0
    assert not path.exists()
