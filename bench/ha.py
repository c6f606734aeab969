"""Failover under load: what a promoted standby has lost, with asynchronous
and with synchronous replication (issue 25; docs/deployment.md,
"Replication and failover").

    python bench/ha.py [--rate 8] [--before 10] [--lag 3] [--after 10]
                       [--scenarios async,sync] [--lease-seconds 300] [--json out.json]

Each scenario builds its own primary and streaming standby with Debian's
PostgreSQL 15 binaries (tests/replicas.py: ``initdb``, ``pg_basebackup -R``),
the sandbox MoMo rail in this process (payers approve 3 s after the request,
the rail's callback goes to the API), a webhook receiver, the installed
``vpay-server api`` (2 gunicorn workers) and one ``vpay-worker``, both on the
multi-host URL with ``target_session_attrs=read-write``. A thread makes
``--rate`` payments a second through the API for the whole run. After
``--before`` seconds:

* ``async``: the standby stops receiving WAL (its ``primary_conninfo``
  emptied) ``--lag`` seconds before the primary dies: a standby that many
  seconds behind at the crash, which is what asynchronous replication allows;
* ``sync``: the standby is the primary's synchronous standby
  (``synchronous_standby_names``), nothing is cut.

Then the primary and every process of it are SIGKILLed and the standby is
promoted (``pg_ctl promote``); payments go on for ``--after`` seconds, and
the run waits (at most ``--settle-timeout``) until every charge on the new
primary is final and every webhook job has run. Time is real (the poll
ladder's own rungs, no queue clock). Printed per scenario:

* ``answered_201``: payments the API answered 201;
* ``lost``: of those, not on the new primary; ``lost_approved``: of those,
  approved by the payer at the rail (money taken, no payment of ours);
* ``phantom_webhooks``: events the merchant received that the new primary
  does not have (they belonged to lost payments);
* ``duplicated``: transitions (intent, type, expired) the merchant received
  under two or more event ids (their dedupe on the id cannot catch them;
  0 since event ids are deterministic per transition);
* ``redelivered``: event ids received more than once (their dedupe does);
* ``orphaned``: jobs still leased once everything else had settled, and how
  long their leases had left (``--lease-seconds``: reaped at expiry);
  ``held_by_orphans``: charges still pending then, behind those leases;
* ``statement_unknown``: lines a statement import of the rail's ledger
  finds with no charge (``unknown_rail_transaction``): the lost approved
  payments, found;
* ``api_gap_s``: from the kill (every process of the primary gone) to the
  first 201 answer to a payment asked after it: the promotion, then the
  API finding the promoted standby.

Never run as a test (timing, load). Figures: docs/deployment.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/replicas.py: the pair of servers

import psycopg  # noqa: E402
import requests  # noqa: E402

from replicas import Pair, free_port, pg_bin  # noqa: E402

from vpay.base import db as vdb  # noqa: E402
from vpay.money import merchants  # noqa: E402
from vpay import webhooks  # noqa: E402
from vpay.sandbox import statement  # noqa: E402
from vpay.sandbox.mtn import DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_SUBSCRIPTION_KEY, SandboxRail  # noqa: E402

MERCHANT = "m_ha"
LIVE_NOT_HELD = ("SELECT count(*) FROM charges c WHERE c.status IN ('pending', 'unresolved') "
                 "AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.dedupe_key = 'poll:' || c.id "
                 "AND j.locked_by IS NOT NULL)")


THREADS = 2  # the load's threads: a slow answer does not stop the other


def log(msg: str) -> None:
    print(f"[ha {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def script_path(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else name


class Receiver:
    """The merchant's webhook endpoint: answers 200, records every event."""

    def __init__(self):
        self.lock = threading.Lock()
        self.posts: list[tuple[str, str, str, object]] = []  # (webhook-id, type, intent, expired)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                with receiver.lock:
                    receiver.posts.append((self.headers["webhook-id"], body["type"],
                                           body["data"]["object"]["id"], body["data"].get("expired")))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def snapshot(self) -> list[tuple[str, str, str, object]]:
        with self.lock:
            return list(self.posts)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def env_for(url: str, rail: SandboxRail, api_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPAY_") and k != "NOTIFY_SOCKET"}
    env.update({"VPAY_DATABASE_URL": url, "PYTHONUNBUFFERED": "1", "VPAY_SECRET_KEYS": os.environ["VPAY_SECRET_KEYS"],
                "VPAY_MTN_BASE_URL": rail.url, "VPAY_MTN_SUBSCRIPTION_KEY": DEFAULT_SUBSCRIPTION_KEY,
                "VPAY_MTN_API_USER": DEFAULT_API_USER, "VPAY_MTN_API_KEY": DEFAULT_API_KEY,
                "VPAY_MTN_CALLBACK_URL": f"http://127.0.0.1:{api_port}/provider/mtn/callback",
                "VPAY_WEBHOOKS_ALLOW_PRIVATE": "1", **extra})
    return env


def wait(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"ha: timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def commit_modes(log_path: Path) -> list[bool]:
    """The ``synchronous`` of every ``database commit mode`` line of a log."""
    out = []
    for raw in log_path.read_bytes().splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if line.get("message") == "database commit mode":
            out.append(line["synchronous"])
    return out


def run(scenario: str, args, workdir: Path) -> dict:
    synchronous = scenario == "sync"
    log(f"{scenario}: building a primary and a streaming standby")
    pair = Pair(synchronous=synchronous)
    rail = SandboxRail(success_after_seconds=3.0).start()
    receiver = Receiver()
    procs: list[subprocess.Popen] = []
    try:
        url = pair.url()
        with psycopg.connect(url, autocommit=True) as conn:
            vdb.migrate(conn)
            merchants.create_merchant(conn, MERCHANT, MERCHANT)
            key = merchants.create_api_key(conn, MERCHANT)[1]
            webhooks.add_endpoint(conn, MERCHANT, receiver.url, permit_private=True)
        api_port = free_port()
        env = env_for(url, rail, api_port)
        api_log, worker_log = workdir / f"{scenario}-api.log", workdir / f"{scenario}-worker.log"
        procs.append(subprocess.Popen([script_path("vpay-server"), "api", "--bind", f"127.0.0.1:{api_port}",
                                       "--workers", "2"], env=env, stdout=open(api_log, "wb"),
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        procs.append(subprocess.Popen([script_path("vpay-worker"), "--lease-seconds", str(args.lease_seconds)],
                                      env=env, stdout=open(worker_log, "wb"), stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL))
        api = f"http://127.0.0.1:{api_port}"
        wait(lambda: _healthy(api), 60, "the API")

        answered: list[tuple[float, float, dict]] = []  # (sent, answered, intent)
        stop = threading.Event()
        numbers = itertools.count(1)

        def load() -> None:
            period = THREADS / args.rate
            next_at = time.monotonic()
            while not stop.is_set():
                n = next(numbers)
                body = {"amount": 1000 + n, "currency": "EUR",
                        "payment_method": {"type": "mtn_momo", "msisdn": f"2567712{n:05d}"}}
                sent_at = time.monotonic()
                try:
                    r = requests.post(f"{api}/v1/payment_intents", json=body, timeout=15,
                                      headers={"Authorization": f"Bearer {key}"})
                    if r.status_code == 201:
                        answered.append((sent_at, time.monotonic(), r.json()))
                except requests.RequestException:
                    pass
                next_at += period
                stop.wait(max(0.0, next_at - time.monotonic()))

        threads = [threading.Thread(target=load, daemon=True) for _ in range(THREADS)]
        for t in threads:
            t.start()
        time.sleep(args.before)
        if not synchronous:
            pair.cut_stream()
            log(f"{scenario}: the standby stopped receiving WAL; the primary dies in {args.lag}s")
            time.sleep(args.lag)
        pair.primary.kill()  # every process of it: what it answered before this is all it answered
        killed_at = time.monotonic()
        pair.standby.promote()
        log(f"{scenario}: primary killed, standby promoted in {time.monotonic() - killed_at:.1f}s")
        time.sleep(args.after)
        stop.set()
        for t in threads:
            t.join(20)

        log(f"{scenario}: {len(answered)} payments answered 201; waiting for everything to settle")
        with psycopg.connect(url, autocommit=True) as conn:
            def quiet():
                # A charge whose poll job is leased to nobody running it (an
                # orphan) waits for the lease to expire: not waited for here.
                live = conn.execute(LIVE_NOT_HELD).fetchone()[0]
                hooks = conn.execute("SELECT count(*) FROM jobs WHERE kind IN ('fanout', 'deliver') "
                                     "AND locked_by IS NULL").fetchone()[0]
                return live == 0 and hooks == 0
            settled_in = time.monotonic()
            wait(quiet, args.settle_timeout, "every charge final and every webhook job run", interval=1.0)
            settled_in = time.monotonic() - settled_in
            time.sleep(3)  # in-flight outcomes land
            orphans = conn.execute("SELECT dedupe_key, EXTRACT(EPOCH FROM lease_expires_at - now())::float8 "
                                   "FROM jobs WHERE locked_by IS NOT NULL").fetchall()
            held = conn.execute("SELECT count(*) FROM charges WHERE status IN ('pending', 'unresolved')"
                                ).fetchone()[0]
            intents = {r[0] for r in conn.execute("SELECT id FROM payment_intents")}
            events = {r[0] for r in conn.execute("SELECT id FROM events")}
        posts = receiver.snapshot()
        by_transition: dict[tuple, set[str]] = defaultdict(set)
        counts: dict[str, int] = defaultdict(int)
        for event_id, type_, intent, expired in posts:
            by_transition[(intent, type_, expired)].add(event_id)
            counts[event_id] += 1
        lost = [a for _, _, a in answered if a["id"] not in intents]
        by_charge = {t.get("externalId"): t for t in rail.transactions()}
        lost_approved = [a for a in lost if (by_charge.get(a["latest_charge"]) or {}).get("status") == "SUCCESSFUL"]
        after_kill = [at for sent, at, _ in answered if sent > killed_at]  # asked after the kill
        path = workdir / f"{scenario}-statement.csv"
        path.write_bytes(statement.export(rail))
        out = subprocess.run([script_path("vpay-server"), "statements", "import", str(path), "--rail", "mtn",
                              "--profile", "sandbox", "--json"], env=env, capture_output=True, text=True,
                             timeout=300)
        report = json.loads(out.stdout) if out.returncode == 0 else {"summary": {}}
        unknown = report["summary"].get("unknown_rail_transaction", {}).get("count", 0)
        return {
            "scenario": scenario,
            "commit_mode_said": {"api": commit_modes(api_log)[:1], "worker": commit_modes(worker_log)},
            "answered_201": len(answered),
            "lost": len(lost),
            "lost_approved": len(lost_approved),
            "phantom_webhooks": len({e for e, *_ in posts if e not in events}),
            "duplicated": sum(1 for ids in by_transition.values() if len(ids) > 1),
            "redelivered": sum(1 for n in counts.values() if n > 1),
            "orphaned": len(orphans),
            "orphan_lease_left_s": round(max((o[1] for o in orphans), default=0.0), 1),
            "held_by_orphans": held,
            "statement_unknown": unknown,
            "api_gap_s": round(min(after_kill) - killed_at, 2) if after_kill else None,
            "settled_in_s": round(settled_in, 1),
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(40)
                except subprocess.TimeoutExpired:
                    p.kill()
        receiver.close()
        rail.stop()
        pair.close()


def _healthy(api: str) -> bool:
    try:
        return requests.get(f"{api}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


COLUMNS = ("answered_201", "lost", "lost_approved", "phantom_webhooks", "duplicated", "redelivered",
           "orphaned", "orphan_lease_left_s", "held_by_orphans", "statement_unknown", "api_gap_s",
           "settled_in_s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=8.0, help="payments per second (two threads)")
    parser.add_argument("--before", type=float, default=10.0, help="seconds of load before the failure")
    parser.add_argument("--lag", type=float, default=3.0, help="async: seconds the standby is behind at the crash")
    parser.add_argument("--after", type=float, default=10.0, help="seconds of load after the promotion")
    parser.add_argument("--lease-seconds", type=float, default=300.0, help="the worker's --lease-seconds")
    parser.add_argument("--settle-timeout", type=float, default=240.0)
    parser.add_argument("--scenarios", default="async,sync")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if pg_bin() is None:
        raise SystemExit("ha: PostgreSQL server binaries not found (apt-get install postgresql-15)")
    if not os.environ.get("VPAY_SECRET_KEYS", "").strip():
        from vpay.base.secretbox import new_key
        os.environ["VPAY_SECRET_KEYS"] = new_key()
    results = []
    with tempfile.TemporaryDirectory(prefix="vpay-ha-") as tmp:
        for scenario in args.scenarios.split(","):
            results.append(run(scenario.strip(), args, Path(tmp)))
            log(f"{scenario}: {results[-1]}")
    load = os.getloadavg()[0]
    print(f"\nfailover under {args.rate:g} payments/s, {args.before:g}s + {args.after:g}s "
          f"(async lag {args.lag:g}s), load average {load:.1f}")
    print("scenario  " + "  ".join(COLUMNS))
    for r in results:
        print(f"{r['scenario']:<8}  " + "  ".join(f"{str(r[c]):>{len(c)}}" for c in COLUMNS))
    if args.json:
        args.json.write_text(json.dumps({"load_average": load, "args": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
