"""The merchant API under load (issue 24): list p99 for one merchant with 1M
payment intents, and create p99 at concurrency 8.

Against a real `vpay-server api` (gunicorn, `--workers 2 --threads 4`, the
defaults) and the sandbox MoMo rail on loopback, on a fresh database
``vpay_bench_api`` (``bench/benchdb.py``). Setup writes ``--intents`` intents
(each with its charge) for merchant ``big`` straight in SQL, one second apart,
plus 10,000 for another merchant, then ANALYZE. Then, one client at a time:

* ``list first``: ``GET /v1/payment_intents?limit=100``;
* ``list deep``: the same with ``starting_after`` a random intent of the 1M
  (a page anywhere in the history: a keyset page, never OFFSET);
* ``list status``: ``status=succeeded&limit=100`` (a third of them);
* ``list created``: a random one-day ``created[gte]``/``created[lte]`` window;
* ``events``: ``GET /v1/events?limit=100`` (one event per intent);

and ``create``: ``POST /v1/payment_intents`` from 8 threads at once (the
rail answers at once; its latency is not the API's). Latencies are measured
by the client (``time.perf_counter`` around the whole request), reported as
p50/p99/max in ms. Never run as a timed test; run once, it takes minutes:

    VPAY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        python bench/api.py --json bench/results/api.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchdb import fresh, server  # noqa: E402

SETUP = """
INSERT INTO merchants (id, name) VALUES ('big', 'big'), ('small', 'small');
INSERT INTO payment_intents (id, merchant_id, amount, currency, status, created_at, updated_at)
SELECT 'pi_big' || lpad(g::text, 9, '0'), 'big', 1000 + g % 500, 'EUR',
       (ARRAY['processing', 'succeeded', 'requires_payment_method'])[1 + g % 3],
       now() - make_interval(secs => %(n)s - g), now()
  FROM generate_series(1, %(n)s) g;
INSERT INTO charges (id, payment_intent_id, rail, rail_reference, payer, amount, currency, created_at)
SELECT 'ch_big' || lpad(g::text, 9, '0'), 'pi_big' || lpad(g::text, 9, '0'), 'mtn',
       gen_random_uuid()::text, '256770000001', 1000 + g % 500, 'EUR', now() - make_interval(secs => %(n)s - g)
  FROM generate_series(1, %(n)s) g;
INSERT INTO events (id, type, payment_intent_id, data, created_at)
SELECT 'evt_big' || lpad(g::text, 9, '0'), 'payment_intent.processing', 'pi_big' || lpad(g::text, 9, '0'),
       '{}'::jsonb, now() - make_interval(secs => %(n)s - g)
  FROM generate_series(1, %(n)s) g;
INSERT INTO payment_intents (id, merchant_id, amount, currency, status, created_at, updated_at)
SELECT 'pi_small' || lpad(g::text, 9, '0'), 'small', 1000, 'EUR', 'processing',
       now() - make_interval(secs => 10000 - g), now()
  FROM generate_series(1, 10000) g;
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stats(samples: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in samples)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1),
            "p99_ms": round(ms[max(0, int(len(ms) * 0.99) - 1)], 1), "max_ms": round(ms[-1], 1)}


def _timed(fn) -> float:
    started = time.perf_counter()
    resp = fn()
    elapsed = time.perf_counter() - started
    if resp.status_code >= 300:
        raise SystemExit(f"bench: {resp.request.method} {resp.request.url} answered {resp.status_code}: "
                         f"{resp.text[:300]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intents", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=300, help="requests per list kind")
    parser.add_argument("--creates", type=int, default=400)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true",
                        help="measure on the database a previous run set up (no setup)")
    parser.add_argument("--only", default=None, help="measure one kind only (e.g. 'list created')")
    args = parser.parse_args()

    from vpay.money import merchants
    from vpay.sandbox.mtn import DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_SUBSCRIPTION_KEY, SandboxRail

    started = time.monotonic()
    if args.reuse:
        url = psycopg.conninfo.make_conninfo(server(), dbname="vpay_bench_api")
    else:
        url = fresh(server(), "vpay_bench_api")
    with psycopg.connect(url, autocommit=True) as conn:
        if not args.reuse:
            with conn.transaction():
                conn.execute(SETUP.replace("%(n)s", str(int(args.intents))))
            conn.execute("ANALYZE")
        key = merchants.create_api_key(conn, "big")[1]
        load = os.getloadavg()[0]
    setup_s = time.monotonic() - started
    print(f"setup: {args.intents} intents in {setup_s:.0f} s", file=sys.stderr)

    rail = SandboxRail(success_after_seconds=3600).start()
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPAY_")}
    env.update({"VPAY_DATABASE_URL": url, "VPAY_MTN_BASE_URL": rail.url,
                "VPAY_MTN_SUBSCRIPTION_KEY": DEFAULT_SUBSCRIPTION_KEY, "VPAY_MTN_API_USER": DEFAULT_API_USER,
                "VPAY_MTN_API_KEY": DEFAULT_API_KEY, "VPAY_LOG_LEVEL": "WARNING"})
    api = subprocess.Popen([str(Path(sys.executable).parent / "vpay-server"), "api", "--bind", f"127.0.0.1:{port}"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {key}"}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("bench: the API did not come up")
            time.sleep(0.1)
        session = requests.Session()
        rng = random.Random(24)
        get = lambda **p: _timed(lambda: session.get(f"{base}/v1/payment_intents", params=p,  # noqa: E731
                                                     headers=auth, timeout=30))
        for _ in range(20):  # warm both workers' pools and plans
            get(limit=100)
        results = {}
        wanted = (lambda kind: args.only in (None, kind))  # noqa: E731
        if wanted("list first"):
            results["list first"] = _stats([get(limit=100) for _ in range(args.reads)])
        if wanted("list deep"):
            results["list deep"] = _stats([get(limit=100, starting_after=f"pi_big{rng.randint(200, args.intents):09d}")
                                       for _ in range(args.reads)])
        if wanted("list status"):
            results["list status"] = _stats([get(limit=100, status="succeeded") for _ in range(args.reads)])
        now = int(time.time())

        def window():
            start = now - rng.randint(86400, max(86401, args.intents))
            return get(limit=100, **{"created[gte]": str(start), "created[lte]": str(start + 86400)})
        if wanted("list created"):
            results["list created"] = _stats([window() for _ in range(args.reads)])
        if wanted("events"):
            results["events"] = _stats([_timed(lambda: session.get(f"{base}/v1/events", params={"limit": 100},
                                                               headers=auth, timeout=30))
                                    for _ in range(args.reads)])
        body = {"amount": 1500, "currency": "EUR", "payment_method": {"type": "mtn_momo", "msisdn": "256770000001"}}

        def create(_):
            return _timed(lambda: requests.post(f"{base}/v1/payment_intents", json=body, headers=auth, timeout=30))
        if wanted("create c8"):
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(create, range(16)))  # warm
                t0 = time.perf_counter()
                samples = list(pool.map(create, range(args.creates)))
                wall = time.perf_counter() - t0
            results["create c8"] = _stats(samples) | {"per_second": round(args.creates / wall, 1)}
        plan = None
        with psycopg.connect(url) as conn:
            plan = [r[0] for r in conn.execute(
                "EXPLAIN SELECT id FROM payment_intents WHERE merchant_id = 'big' AND (created_at, id) < "
                "(now(), 'pi_big000500000') AND created_at >= '-infinity' AND created_at <= 'infinity' "
                "ORDER BY created_at DESC, id DESC LIMIT 101").fetchall()]
    finally:
        api.terminate()
        api.wait(30)
        rail.stop()
    report = {"intents": args.intents, "setup_seconds": round(setup_s), "load_1m_at_start": round(load, 2),
              "load_1m_at_end": round(os.getloadavg()[0], 2), "results": results, "deep_page_plan": plan}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
