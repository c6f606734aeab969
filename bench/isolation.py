"""Isolation bench (issue 11; never run as a test): a hanging merchant
endpoint, a trickling rail and a burst of 500 payments at once, and what the
merchants not involved see.

    python bench/isolation.py                 # embedded Postgres under ./.vpay-bench
    VPAY_DATABASE_URL=... python bench/isolation.py [--seconds 60] [--burst 500]

What runs (all on 127.0.0.1, real processes for vpay):

* one ``vpay-worker`` with its defaults (all lanes, ``--worker-concurrency 4``);
* a MoMo stub (``tests/rail_stub.MomoStub``) that settles every charge on
  its first status read;
* Orange Money, trickling (``tests/rail_stub.OrangeTrickle``): every status
  answer sends its headers at once, then one byte a second; merchant
  ``t-trickle`` has ``--trickling`` charges on it;
* merchant ``s-hanging``'s webhook endpoint accepts connections and never
  answers; the burst (``--burst`` MoMo payments, 500) is theirs, created at
  once: 500 polls due together, then two events per payment to deliver to
  the hanging endpoint;
* merchant ``c-calm`` (not involved): ``--rate`` MoMo payments a second for
  ``--seconds``, webhooks to a receiver that answers 200 at once;
* ``vpay-server api`` (defaults: 2 workers x 4 threads) whose MoMo rail hangs
  (accepts, never answers), with 8 threads each creating a payment through
  it every second (8 concurrent creates at any time) for the first
  ``--api-seconds``, and a prober reading ``GET /healthz`` every
  ``--probe-interval`` (0.05 s: about 20 a second, so the p99 is not just
  the single slowest probe) meanwhile. Their payments reach the worker's (healthy) MoMo stub through
  the resubmit path.

Measured: poll lateness of ``c-calm``'s polls (the database's ``locked_at``
at the claim, which the status read follows at once, minus the job's
``run_at``: read time minus due time), p50/p99/max; ``/healthz`` latency
p50/p99/max over the probes made while the creates were running; the
machine's load average (1 min) at the start and the end. Goals (issue 11):
unaffected poll lateness p99 <= 2 s, ``/healthz`` p99 <= 100 ms.

Two more inputs (issue 30, "Speed II": a fair share in time, lanes that
lend idle loops), each alone against one ``vpay-worker`` at its defaults
(4 loops) with only MoMo configured (``mtn`` 2 loops, ``webhooks`` 1,
``housekeeping`` with the unconfigured rails 1):

    python bench/isolation.py --scenario ten-trickle   # --trickling 10 --rate 1 --seconds 60
    python bench/isolation.py --scenario burst         # --burst 500 --read-delay 0.15

* ``ten-trickle``: merchant ``t-trickle`` has ``--trickling`` MoMo charges
  whose every status answer trickles (headers at once, then a byte a
  second: each read is cut at the 20 s deadline), all due at the start;
  merchant ``c-calm`` takes ``--rate`` payments a second for ``--seconds``
  (60 payments), each first read due 10 s after it is created. Measured:
  ``c-calm``'s first-read lateness (the stub's arrival time of the first
  status read of the charge minus its poll's ``run_at``) p50/p99/max, and how
  many of its payments were still unread ``--window`` (80) s after the
  start. Goal: p99 <= 2 s.
* ``burst``: merchant ``s-burst``'s ``--burst`` MoMo payments created in one
  transaction (first reads due together), a rail taking ``--read-delay``
  (0.15) s per status read. Measured: reads a second (first reads over the
  time from the first to the last), first-read lateness p50/p99/max, and when
  the last charge settled (from the burst's due time), and how many of the
  4 loops were inside a read on average (the stub's answering time over the
  span). Goals: >= 25 reads/s, p99 <= 22 s.

``--worker-arg=--no-lend`` (repeatable) passes a flag to the worker;
``BENCH_WORKER_LOG_LEVEL=INFO`` keeps the worker's per-job lines in
``.vpay-bench/isolation-<scenario>-worker.log`` for a closer look (the
default, WARNING, keeps them out of the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import requests

import benchdb  # noqa: E402 (bench/ is the script's folder)
from benchdb import fresh  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the rail stubs the tests use

from rail_stub import HangingRail, MomoStub, OrangeTrickle  # noqa: E402

LATENESS_TRIGGER = """
CREATE TABLE bench_claims (dedupe_key text, merchant text, lateness float8);
CREATE FUNCTION bench_keep_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.kind = 'poll' AND NEW.locked_at IS NOT NULL AND OLD.locked_at IS NULL THEN
    INSERT INTO bench_claims
    SELECT NEW.dedupe_key, i.merchant_id, extract(epoch FROM NEW.locked_at - OLD.run_at)
      FROM charges c JOIN payment_intents i ON i.id = c.payment_intent_id
     WHERE c.id = NEW.payload ->> 'charge_id';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER bench_keep_claim AFTER UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION bench_keep_claim();
"""


class OkReceiver:
    """A webhook receiver that answers 200 at once."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0) or 0))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def _payment(conn, merchant: str, rail: str = "mtn", currency: str = "EUR", amount: int = 1000,
             payer: str = "256770000001") -> dict:
    from vpay.money import charges
    created = charges.create_payment(conn, merchant_id=merchant, amount=amount, currency=currency,
                                   rail=rail, payer=payer)
    if rail == "orange":
        charges.record_submission(conn, created.charge["id"],
                                {"pay_token": "pt_" + created.charge["id"],
                                 "payment_url": "https://pay.example/p"}, "nt")
    charges.mark_submitted(conn, created.charge["id"])
    return created.charge


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", choices=("combined", "ten-trickle", "burst"), default="combined",
                    help="combined (issue 11's inputs together), ten-trickle or burst (issue 30)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="how long c-calm takes payments [60]")
    ap.add_argument("--rate", type=float, default=None,
                    help="c-calm payments per second [4; ten-trickle: 1]")
    ap.add_argument("--burst", type=int, default=500, help="the burst merchant's payments, created at once")
    ap.add_argument("--trickling", type=int, default=10,
                    help="t-trickle's trickling charges (Orange in combined, MoMo in ten-trickle)")
    ap.add_argument("--api-seconds", type=float, default=20.0,
                    help="how long the 8 API creators run against the hung rail (from the start)")
    ap.add_argument("--worker-concurrency", type=int, default=4, help="the worker's claim loops")
    ap.add_argument("--probe-interval", type=float, default=0.05,
                    help="seconds between two /healthz probes (one prober: a probe waits for the last)")
    ap.add_argument("--read-delay", type=float, default=0.15,
                    help="burst: seconds the MoMo stub takes per status read")
    ap.add_argument("--window", type=float, default=80.0,
                    help="ten-trickle: c-calm payments still unread this many seconds after the start")
    ap.add_argument("--worker-arg", action="append", default=[],
                    help="one more argument for vpay-worker (repeat), e.g. --worker-arg=--no-lend")
    args = ap.parse_args()
    if not os.environ.get("VPAY_SECRET_KEYS", "").strip():
        # webhook secrets are sealed under it; the worker refuses to start without
        from vpay.base.secretbox import new_key
        os.environ["VPAY_SECRET_KEYS"] = new_key()
    if args.scenario == "combined":
        args.seconds = 60.0 if args.seconds is None else args.seconds
        args.rate = 4.0 if args.rate is None else args.rate
        return combined(args)
    args.seconds = 60.0 if args.seconds is None else args.seconds
    args.rate = 1.0 if args.rate is None else args.rate
    return ten_trickle(args) if args.scenario == "ten-trickle" else burst(args)


def combined(args) -> None:
    """Issue 11's inputs together (the module docstring)."""
    from vpay.money import merchants
    from vpay import webhooks

    url = fresh(benchdb.server(), "vpay_bench_isolation", LATENESS_TRIGGER)
    load_start = os.getloadavg()[0]
    momo = MomoStub(default_outcome=("10.00", "EUR"))
    orange = OrangeTrickle()
    hanging_endpoint = HangingRail()
    hung_rail = HangingRail()
    ok = OkReceiver()
    exe = Path(sys.executable).parent
    env = {**os.environ, "VPAY_DATABASE_URL": url, "VPAY_WEBHOOKS_ALLOW_PRIVATE": "1",
           "VPAY_LOG_LEVEL": "WARNING", **momo.env(), **orange.env()}
    with psycopg.connect(url, autocommit=True) as conn:
        for m in ("s-hanging", "c-calm", "t-trickle", "api-m"):
            merchants.create_merchant(conn, m, m)
        webhooks.add_endpoint(conn, "s-hanging", f"{hanging_endpoint.url}/hook", permit_private=True)
        webhooks.add_endpoint(conn, "c-calm", ok.url, permit_private=True)
        api_key = merchants.create_api_key(conn, "api-m")[1]

    log_dir = HERE.parent / ".vpay-bench"
    log_dir.mkdir(exist_ok=True)
    worker = subprocess.Popen([str(exe / "vpay-worker"), "--worker-concurrency", str(args.worker_concurrency),
                               *args.worker_arg],
                              env=env,
                              stdout=open(log_dir / "isolation-worker.log", "wb"), stderr=subprocess.STDOUT)
    port = _free_port()
    api_env = {**env, "VPAY_MTN_BASE_URL": hung_rail.url}
    api = subprocess.Popen([str(exe / "vpay-server"), "api", "--bind", f"127.0.0.1:{port}"], env=api_env,
                           stdout=open(log_dir / "isolation-api.log", "wb"), stderr=subprocess.STDOUT)
    api_url = f"http://127.0.0.1:{port}"
    stop = threading.Event()      # the end of the run
    api_stop = threading.Event()  # the end of the API window
    health: list[float] = []
    creates: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{api_url}/healthz", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the API did not come up")
            time.sleep(0.2)

        def create_forever():
            body = {"amount": 1000, "currency": "EUR",
                    "payment_method": {"type": "mtn_momo", "msisdn": "256770000099"}}
            while not api_stop.is_set():
                began = time.monotonic()
                try:
                    r = requests.post(f"{api_url}/v1/payment_intents", json=body, timeout=60,
                                      headers={"Authorization": f"Bearer {api_key}"})
                    creates.append(r.status_code)
                except requests.RequestException:
                    creates.append(0)
                api_stop.wait(max(0.0, 1.0 - (time.monotonic() - began)))  # at most one a second per thread

        def probe():
            while not api_stop.is_set():
                started = time.monotonic()
                try:
                    requests.get(f"{api_url}/healthz", timeout=10)
                    health.append(time.monotonic() - started)
                except requests.RequestException:
                    health.append(10.0)
                api_stop.wait(args.probe_interval)

        threading.Timer(args.api_seconds, api_stop.set).start()
        threads = [threading.Thread(target=create_forever, daemon=True) for _ in range(8)]
        threads.append(threading.Thread(target=probe, daemon=True))
        for t in threads:
            t.start()

        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(args.trickling):
                charge = _payment(conn, "t-trickle", rail="orange", currency="XOF", payer="22507000001")
                conn.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s", (f"poll:{charge['id']}",))
            with conn.transaction():
                for _ in range(args.burst):
                    _payment(conn, "s-hanging")
            calm: list[str] = []
            started = time.monotonic()
            n = 0
            while time.monotonic() - started < args.seconds:
                due = started + n / args.rate
                if time.monotonic() < due:
                    time.sleep(due - time.monotonic())
                calm.append(_payment(conn, "c-calm")["id"])
                n += 1
            wait_until = time.monotonic() + 120
            while conn.execute("SELECT count(*) FROM charges WHERE id = ANY(%s) AND status = 'pending'",
                               (calm,)).fetchone()[0]:
                if time.monotonic() > wait_until:
                    print("warning: some c-calm charges were still pending after 120 s", file=sys.stderr)
                    break
                time.sleep(0.5)
            stop.set()
            lateness = [r[0] for r in conn.execute(
                "SELECT lateness FROM bench_claims WHERE merchant = 'c-calm'")]
            others = {m: (len(v), _pct(v, 99)) for m in ("s-hanging", "t-trickle") if (v := [r[0] for r in conn.execute(
                "SELECT lateness FROM bench_claims WHERE merchant = %s", (m,))])}
            counts = dict(conn.execute("SELECT c.status, count(*) FROM charges c JOIN payment_intents i "
                                       "ON i.id = c.payment_intent_id WHERE i.merchant_id = 'c-calm' "
                                       "GROUP BY c.status").fetchall())
            hanging_posts = hanging_endpoint.accepted
            pending_to_hanging = conn.execute(
                "SELECT count(*) FROM webhook_deliveries d JOIN webhook_endpoints w ON w.id = d.endpoint_id "
                "WHERE w.merchant_id = 's-hanging' AND d.status = 'pending'").fetchone()[0]
        for t in threads:
            t.join(70)
    finally:
        stop.set()
        api_stop.set()
        for proc in (worker, api):
            proc.terminate()
        for proc in (worker, api):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for s in (momo, orange, hanging_endpoint, hung_rail):
            s.close()
    load_end = os.getloadavg()[0]
    result = {
        "c_calm_polls": len(lateness), "c_calm_charges": counts,
        "poll_lateness_seconds": {"p50": round(_pct(lateness, 50), 3), "p99": round(_pct(lateness, 99), 3),
                                  "max": round(max(lateness), 3) if lateness else None},
        "healthz_seconds": {"samples": len(health), "p50": round(_pct(health, 50), 4),
                            "p99": round(_pct(health, 99), 4), "max": round(max(health), 4) if health else None,
                            # (probe number, seconds) of the slowest three: is the worst the first?
                            "slowest": sorted(((i, round(h, 4)) for i, h in enumerate(health)),
                                              key=lambda ih: -ih[1])[:3]},
        "api_creates": {"answered_201": creates.count(201), "other": len(creates) - creates.count(201)},
        "involved_merchants_polls_p99": {m: {"polls": n, "p99": round(p, 3)} for m, (n, p) in others.items()},
        "hanging_endpoint_connections": hanging_posts, "deliveries_pending_to_hanging": pending_to_hanging,
        "orange_trickling_reads": orange.reads,
        "load_average_1min": {"start": round(load_start, 2), "end": round(load_end, 2)},
        "cpus": os.cpu_count(), "burst": args.burst, "rate": args.rate, "seconds": args.seconds,
        "api_seconds": args.api_seconds, "worker_concurrency": args.worker_concurrency,
    }
    print(json.dumps(result, indent=2))
    print(f"\nc-calm poll lateness (s): p50 {result['poll_lateness_seconds']['p50']}  "
          f"p99 {result['poll_lateness_seconds']['p99']}  max {result['poll_lateness_seconds']['max']}  "
          f"(goal p99 <= 2)")
    print(f"/healthz while the rail hangs (s): p99 {result['healthz_seconds']['p99']}  "
          f"max {result['healthz_seconds']['max']}  (goal p99 <= 0.1)")
    print(f"load average 1 min: {load_start:.2f} -> {load_end:.2f} on {os.cpu_count()} CPUs")


def _spawn_worker(args, env: dict, log_name: str) -> subprocess.Popen:
    exe = Path(sys.executable).parent
    log_dir = HERE.parent / ".vpay-bench"
    log_dir.mkdir(exist_ok=True)
    return subprocess.Popen([str(exe / "vpay-worker"), "--worker-concurrency", str(args.worker_concurrency),
                             *args.worker_arg], env=env,
                            stdout=open(log_dir / log_name, "wb"), stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def _alive(proc: subprocess.Popen) -> None:
    """Stop the bench when the worker has exited (its log says why)."""
    if proc.poll() is not None:
        raise SystemExit(f"vpay-worker exited with {proc.returncode}; see .vpay-bench/*worker.log")


def _due_epoch(conn, charge_id: str) -> float:
    """The first poll's ``run_at`` of a charge, as a Unix time."""
    return conn.execute("SELECT extract(epoch FROM run_at)::float8 FROM jobs WHERE dedupe_key = %s",
                        (f"poll:{charge_id}",)).fetchone()[0]


class FirstReads:
    """The first status read of each reference as the stub saw it arrive,
    as a Unix time (the stub logs monotonic times; one offset converts)."""

    def __init__(self, stub: MomoStub):
        self.stub = stub
        self.offset = time.time() - time.monotonic()

    def __call__(self) -> dict[str, float]:
        first: dict[str, float] = {}
        for e in self.stub.requests("/collection/v1_0/requesttopay/"):
            if e.method == "GET" and e.reference not in first:
                first[e.reference] = e.at + self.offset
        return first


def _mtn_only_env(url: str, momo: MomoStub) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VPAY_ORANGE_", "VPAY_MPESA_",
                                                                      "VPAY_PAWAPAY_", "VPAY_MTN_"))}
    return {**env, "VPAY_DATABASE_URL": url, "VPAY_WEBHOOKS_ALLOW_PRIVATE": "1",
            "VPAY_LOG_LEVEL": os.environ.get("BENCH_WORKER_LOG_LEVEL", "WARNING"), **momo.env()}


def ten_trickle(args) -> None:
    """Issue 30's first input: ten trickling MoMo charges and a calm merchant."""
    from vpay.money import merchants
    url = fresh(benchdb.server(), f"vpay_bench_isolation_{args.scenario.replace('-', '_')}")
    load_start = os.getloadavg()[0]
    momo = MomoStub(default_outcome=("10.00", "EUR"))
    reads = FirstReads(momo)
    with psycopg.connect(url, autocommit=True) as conn:
        for m in ("t-trickle", "c-calm"):
            merchants.create_merchant(conn, m, m)
    worker = _spawn_worker(args, _mtn_only_env(url, momo), "isolation-ten-trickle-worker.log")
    started = time.time()
    due: dict[str, float] = {}  # c-calm's rail reference -> its first read's due time
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(args.trickling):
                charge = _payment(conn, "t-trickle")
                momo.trickle(charge["rail_reference"])
                conn.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s", (f"poll:{charge['id']}",))
            for n in range(round(args.seconds * args.rate)):
                at = started + n / args.rate
                if time.time() < at:
                    time.sleep(at - time.time())
                charge = _payment(conn, "c-calm")
                due[charge["rail_reference"]] = _due_epoch(conn, charge["id"])
            if time.time() < started + args.window:
                time.sleep(started + args.window - time.time())
            unread_in_window = len([r for r in due if r not in reads()])
            wait_until = time.time() + 600
            while any(r not in reads() for r in due) and time.time() < wait_until:
                _alive(worker)
                time.sleep(0.5)
            first = reads()
            trickle_reads = len([e for e in momo.requests("/collection/v1_0/requesttopay/")
                                 if e.method == "GET" and e.reference in momo.trickles])
    finally:
        _stop(worker)
        momo.close()
    lateness = [first[r] - d for r, d in due.items() if r in first]
    result = {
        "scenario": "ten-trickle", "c_calm_payments": len(due),
        "first_read_lateness_seconds": {"p50": round(_pct(lateness, 50), 3), "p99": round(_pct(lateness, 99), 3),
                                        "max": round(max(lateness), 3) if lateness else None},
        f"unread_after_{args.window:g}s": unread_in_window, "never_read": len(due) - len(lateness),
        "trickling_charges": args.trickling, "trickle_reads": trickle_reads,
        "load_average_1min": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)},
        "cpus": os.cpu_count(), "worker_args": args.worker_arg,
    }
    print(json.dumps(result, indent=2))
    print(f"\nc-calm first-read lateness (s): p50 {result['first_read_lateness_seconds']['p50']}  "
          f"p99 {result['first_read_lateness_seconds']['p99']}  (goal p99 <= 2); "
          f"unread after {args.window:g} s: {unread_in_window} of {len(due)}")


def burst(args) -> None:
    """Issue 30's second input: one merchant's burst on a rail taking 150 ms a read."""
    from vpay.money import merchants
    url = fresh(benchdb.server(), f"vpay_bench_isolation_{args.scenario.replace('-', '_')}")
    load_start = os.getloadavg()[0]
    momo = MomoStub(default_outcome=("10.00", "EUR"), read_delay=args.read_delay)
    reads = FirstReads(momo)
    with psycopg.connect(url, autocommit=True) as conn:
        merchants.create_merchant(conn, "s-burst", "s-burst")
    worker = _spawn_worker(args, _mtn_only_env(url, momo), "isolation-burst-worker.log")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            time.sleep(3)  # the worker's boot, so the first reads are not its start-up
            _alive(worker)
            with conn.transaction():
                made = [_payment(conn, "s-burst") for _ in range(args.burst)]
            due_at = _due_epoch(conn, made[0]["id"])
            refs = {c["rail_reference"] for c in made}
            ids = [c["id"] for c in made]
            wait_until = time.time() + 900
            while conn.execute("SELECT count(*) FROM charges WHERE id = ANY(%s) AND status = 'pending'",
                               (ids,)).fetchone()[0] and time.time() < wait_until:
                _alive(worker)
                time.sleep(0.2)
            settled_at = conn.execute("SELECT extract(epoch FROM max(settled_at))::float8 FROM charges "
                                      "WHERE id = ANY(%s)", (ids,)).fetchone()[0]
            pending = conn.execute("SELECT count(*) FROM charges WHERE id = ANY(%s) AND status = 'pending'",
                                   (ids,)).fetchone()[0]
            first = {r: t for r, t in reads().items() if r in refs}
            gets = [e for e in momo.requests("/collection/v1_0/requesttopay/")
                    if e.method == "GET" and e.reference in refs and e.answered_at]
    finally:
        _stop(worker)
        momo.close()
    times = sorted(first.values())
    lateness = [t - due_at for t in times]
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    result = {
        "scenario": "burst", "burst": args.burst, "read_delay_seconds": args.read_delay,
        "first_reads": len(times), "reads_per_second": round((len(times) - 1) / span, 2) if span else None,
        "first_read_lateness_seconds": {"p50": round(_pct(lateness, 50), 3), "p99": round(_pct(lateness, 99), 3),
                                        "max": round(max(lateness), 3) if lateness else None},
        "all_settled_after_seconds": round(settled_at - due_at, 2) if settled_at else None,
        # the stub's time answering, over the span: how many loops were
        # reading at once on average (4 loops reading without a pause: 4)
        "mean_reads_in_flight": round(sum(e.answered_at - e.at for e in gets) / span, 2) if span else None,
        "still_pending": pending,
        "load_average_1min": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)},
        "cpus": os.cpu_count(), "worker_args": args.worker_arg,
    }
    print(json.dumps(result, indent=2))
    print(f"\nburst of {args.burst}: {result['reads_per_second']} reads/s (goal >= 25), first-read "
          f"p99 {result['first_read_lateness_seconds']['p99']} s (goal <= 22)")


if __name__ == "__main__":
    main()
