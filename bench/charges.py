"""What one payment costs the worker and the database, at small scale
(docs/capacity.md is computed from these figures). Never a test.

    python bench/charges.py [--charges 300] [--json out.json]
    VPAY_DATABASE_URL=... python bench/charges.py

N MTN charges on the sandbox rail (vpay/sandbox/mtn/, a real HTTP server on
127.0.0.1, every payer approving within 0.2 s), created and submitted the
way the API does (``payments.create_and_submit``), then one ``vpay-worker``
at its default flags runs until every charge has settled and every job but
the hourly two is gone. Twice: merchant WITH an enabled webhook endpoint (a
receiver on 127.0.0.1 answering 200) and WITHOUT one. The first poll is due
10 s after the charge (the ladder's first rung), so each charge settles on
its first status read.

Per settled charge: jobs run (by kind; counted by a bench trigger at each
claim), rail requests (by operation, from the sandbox's log; the
request-to-pay at creation included), round trips to Postgres (the worker's,
through bench/pgcount.py), the worker's CPU and its Postgres backends' CPU
(from ``/proc``, this host only), with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peers import LOGS, backends_cpu, embedded_server, load, proc_cpu, stop, vpay_db  # noqa: E402
from pgcount import CountingProxy  # noqa: E402


class _Ok(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _rail_env(rail) -> dict[str, str]:
    return {"VPAY_MTN_BASE_URL": rail.url, "VPAY_MTN_SUBSCRIPTION_KEY": rail.subscription_key,
            "VPAY_MTN_API_USER": rail.api_user, "VPAY_MTN_API_KEY": rail.api_key,
            "VPAY_MTN_TARGET_ENVIRONMENT": rail.target_environment}


def run(server: str, n: int, with_endpoint: bool, latency: float = 0.0) -> dict:
    from vpay.money import payments
    from vpay import webhooks
    from vpay.base.db import make_pool
    from vpay.money.merchants import create_merchant
    from vpay.rails.mtn import MtnMomo
    from vpay.sandbox.mtn import SandboxRail

    url = vpay_db(server, "vpay_bench_charges")
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    with SandboxRail(success_after_seconds=0.2) as rail, \
            psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_claims (kind text)")
        conn.execute("CREATE FUNCTION bench_keep_claim() RETURNS trigger LANGUAGE plpgsql AS $$ "
                     "BEGIN INSERT INTO bench_claims VALUES (NEW.kind); RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER bench_keep_claim AFTER UPDATE ON jobs FOR EACH ROW "
                     "WHEN (OLD.locked_at IS NULL AND NEW.locked_at IS NOT NULL) "
                     "EXECUTE FUNCTION bench_keep_claim()")
        create_merchant(conn, "m_bench", "Bench merchant")
        if with_endpoint:
            webhooks.add_endpoint(conn, "m_bench", f"http://127.0.0.1:{receiver.server_port}/hook",
                                  permit_private=True)
        if latency:
            for i in range(n):
                rail.script(f"25677{i:07d}", status_delay_seconds=latency, pending_reads=0,
                            outcome="SUCCESSFUL")
        adapter = MtnMomo.from_env(_rail_env(rail))
        pool = make_pool(url, max_size=4)
        try:
            for i in range(n):
                payments.create_and_submit(pool, lambda code: adapter, merchant_id="m_bench", amount=900,
                                           currency="EUR", rail="mtn", payer=f"25677{i:07d}")
        finally:
            pool.close()
        created_requests = len(rail.requests_log())
        proxy = CountingProxy(url).start()
        # INFO, the production level: the log lines' cost is part of the figure
        env = {**os.environ, "VPAY_DATABASE_URL": proxy.url, "VPAY_LOG_LEVEL": "INFO",
               "VPAY_WEBHOOKS_ALLOW_PRIVATE": "1", **_rail_env(rail)}
        import subprocess
        log = open(LOGS / f"charges-{time.monotonic_ns()}.log", "wb")
        proc = subprocess.Popen([str(Path(sys.executable).with_name("vpay-worker"))], env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            cpu0, pg0, rt0 = None, None, None
            deadline = time.monotonic() + 600
            while True:
                left = conn.execute("SELECT count(*) FROM charges WHERE status = 'pending'").fetchone()[0]
                jobs = conn.execute("SELECT count(*) FROM jobs WHERE kind NOT IN ('scan', 'sweep')").fetchone()[0]
                if cpu0 is None:
                    # the worker is up once its pool is connected: count from here
                    if conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND pid <> pg_backend_pid()").fetchone()[0]:
                        cpu0, pg0, rt0 = proc_cpu(proc.pid), backends_cpu(conn), proxy.total()
                if left == 0 and jobs == 0:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"charges did not settle: {left} pending, {jobs} jobs; logs {LOGS}")
                time.sleep(0.2)
            cpu1, pg1, rt1 = proc_cpu(proc.pid), backends_cpu(conn), proxy.total()
        finally:
            stop(proc)
            proxy.stop()
            receiver.shutdown()
        kinds = Counter(k for (k,) in conn.execute("SELECT kind FROM bench_claims"))
        settled = conn.execute("SELECT count(*) FROM charges WHERE status <> 'pending'").fetchone()[0]
        span = conn.execute("SELECT extract(epoch FROM max(settled_at) - min(settled_at))::float8 "
                            "FROM charges").fetchone()[0]
        loops = None
        for line in Path(log.name).read_text(errors="replace").splitlines():
            if '"worker started"' in line:
                split = json.loads(line).get("loops", {})
                loops = sum(v for k, v in split.items() if "mtn" in k.split("+"))
        requests = Counter(f"{e['method']} {e['path'].split('/')[-2] if e['path'].count('/') > 3 else e['path']}"
                           for e in rail.requests_log())
    per = lambda x: round(x / settled, 3) if x is not None else None  # noqa: E731
    return {
        "with_endpoint": with_endpoint, "charges": settled,
        "jobs_per_charge": per(sum(kinds.values())),
        "jobs_by_kind_per_charge": {k: per(v) for k, v in kinds.items()},
        "rail_requests_per_charge": per(len(rail.requests_log())),
        "rail_requests_at_create_per_charge": per(created_requests),
        "rail_requests_by_kind": dict(requests),
        "round_trips_per_charge": per(rt1 - rt0),
        "worker_cpu_ms_per_charge": per(1000 * (cpu1 - cpu0)) if cpu0 is not None else None,
        "postgres_cpu_ms_per_charge": per(1000 * (pg1 - pg0)) if pg0 is not None and pg1 is not None else None,
        "rail_latency_s": latency, "mtn_loops": loops,
        # Little's law check (docs/capacity.md): with every poll due at once,
        # the mtn loops settle them at loops / latency per second
        "settle_span_s": span,
        "predicted_span_s": (settled - 1) * latency / loops if latency and loops else None,
        "load": load(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--charges", type=int, default=300)
    ap.add_argument("--rail-latency", type=float, default=0.0,
                    help="seconds each status read takes at the sandbox (capacity check)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    server = os.environ.get("VPAY_DATABASE_URL", "").strip() or embedded_server()
    out = [run(server, args.charges, True, args.rail_latency),
           run(server, args.charges, False, args.rail_latency)]
    for row in out:
        print(json.dumps(row, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
