"""The console's pages on a big database (issue 23, "Fast on a big
database": every page p99 <= 300 ms with 1M charges, 5M status reads and
100k alerts).

    VPAY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \
        python bench/console.py [--charges 1000000] [--requests 100] [--reuse] [--json out.json]

Setup, in SQL (``generate_series``) in a database of its own
(``vpay_bench_console``): 20 merchants (one of them holds half the
payments, one 0.1 %), ``--charges`` intents each with its charge over 30
days (89 % succeeded, 6 % failed, 4 % pending, 1 % unresolved; four rails),
an event per intent for the newest 10 %, 5 x ``--charges`` ``rail_calls``,
``--charges`` / 2 ``rail_callbacks``, ``--charges`` / 10 alerts (half open),
poll jobs for the live charges plus 1,000 dead letters and 100 stranded
leases, 20 statements of 10,000 lines, 50,000 audit rows, 24 h of samples.
``--reuse`` keeps a database made by an earlier run of the same size.

Then a real ``vpay-server console`` (gunicorn, 4 threads) on a free loopback
port, one signed-in client (``requests``), one request at a time: per page
3 warm-up requests, then ``--requests`` timed (client-measured, HTTP
included; a redirect is timed, not followed). Prints p50/p99/max per page
and the pages over the goal; ``--json`` writes them with the machine's load
average. Not a test: timings depend on the machine (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import requests
from psycopg import sql

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchdb  # noqa: E402

GOAL_MS = 300.0
DB = "vpay_bench_console"
PASSWORD = "bench console password 1"

SETUP = """
SET synchronous_commit = off;
SET maintenance_work_mem = '256MB';
INSERT INTO merchants (id, name) SELECT 'm' || lpad(g::text, 2, '0'), 'merchant ' || g FROM generate_series(0, 19) g;
-- half the payments are m00's, 0.1 % are m19's, the rest spread
CREATE TEMP TABLE seq AS
SELECT g,
       CASE WHEN g % 2 = 0 THEN 'm00' WHEN g % 1000 = 1 THEN 'm19' ELSE 'm' || lpad((1 + g % 18)::text, 2, '0') END AS merchant,
       (ARRAY['mtn', 'mtn', 'orange', 'mpesa', 'pawapay'])[1 + g % 5] AS rail,
       CASE WHEN g % 100 < 89 THEN 'succeeded' WHEN g % 100 < 95 THEN 'failed'
            WHEN g % 100 < 99 THEN 'pending' ELSE 'unresolved' END AS status,
       now() - make_interval(secs => (%(n)s - g) * (30 * 86400.0 / %(n)s)) AS at
  FROM generate_series(1, %(n)s) g;
INSERT INTO payment_intents (id, merchant_id, amount, currency, status, created_at, updated_at)
SELECT 'pi_' || lpad(g::text, 9, '0'), merchant, 1000 + g % 500, 'EUR',
       CASE status WHEN 'succeeded' THEN 'succeeded' WHEN 'failed' THEN 'requires_payment_method' ELSE 'processing' END,
       at, at
  FROM seq;
INSERT INTO charges (id, payment_intent_id, rail, rail_reference, payer, amount, currency, status, failure_code,
                     rail_transaction_id, created_at, submitted_at, settled_at, unresolved_at)
SELECT 'ch_' || lpad(g::text, 9, '0'), 'pi_' || lpad(g::text, 9, '0'), rail, md5(g::text),
       '2567' || lpad((g % 100000000)::text, 8, '0'), 1000 + g % 500, 'EUR', status,
       CASE WHEN status = 'failed' THEN 'APPROVAL_REJECTED' END,
       CASE WHEN status = 'succeeded' THEN 'tx' || g END,
       at, at + interval '1 second',
       CASE WHEN status IN ('succeeded', 'failed') THEN at + make_interval(secs => 5 + g % 60) END,
       CASE WHEN status = 'unresolved' THEN at + interval '24 hours' END
  FROM seq;
INSERT INTO events (id, type, payment_intent_id, merchant_id, data, created_at)
SELECT 'evt_' || lpad(g::text, 9, '0'), 'payment_intent.processing', 'pi_' || lpad(g::text, 9, '0'), merchant,
       '{}'::jsonb, at
  FROM seq WHERE g > %(n)s * 0.9;
INSERT INTO webhook_endpoints (id, merchant_id, url, secret, enabled, created_at)
SELECT 'we_' || lpad(g::text, 4, '0'), 'm' || lpad((g % 20)::text, 2, '0'), 'https://hooks.example.com/' || g,
       'whsec_bench', g % 7 <> 0, now() - interval '40 days'
  FROM generate_series(0, 39) g;
INSERT INTO webhook_deliveries (event_id, endpoint_id, status, attempts, last_status_code, created_at, updated_at)
SELECT e.id, 'we_' || lpad((substr(e.merchant_id, 2)::int)::text, 4, '0'), 'delivered', 1, 200, e.created_at, e.created_at
  FROM events e;
-- five status reads per charge on average, over the same 30 days
INSERT INTO rail_calls (rail, operation, reference, charge_id, http_status, answer, reason, latency_ms, created_at)
SELECT s.rail, 'status', md5(s.g::text), 'ch_' || lpad(s.g::text, 9, '0'),
       CASE WHEN k % 50 = 0 THEN 503 ELSE 200 END, CASE WHEN k % 50 = 0 THEN 'no_answer' ELSE 'pending' END,
       NULL, 40 + (k * 7) % 300, s.at + make_interval(secs => k * 10)
  FROM seq s CROSS JOIN generate_series(1, 5) k;
INSERT INTO rail_callbacks (rail, reference, charge_id, action, created_at)
SELECT rail, md5(g::text), 'ch_' || lpad(g::text, 9, '0'), 'pulled_forward', at + interval '3 seconds'
  FROM seq WHERE g % 2 = 0;
INSERT INTO rail_callbacks (rail, reference, action, created_at)
SELECT 'mtn', 'unknown-ref-' || (g % 100), 'unknown_reference', now() - make_interval(mins => g)
  FROM generate_series(1, 1000) g;
INSERT INTO alerts (kind, charge_id, details, created_at, acknowledged_at, note)
SELECT (ARRAY['rail_misconfigured', 'job_dead_lettered', 'rail_contradiction'])[1 + g % 3],
       CASE WHEN g % 3 = 2 THEN 'ch_' || lpad((g * 7 % %(n)s + 1)::text, 9, '0') END,
       jsonb_build_object('rail', 'mtn', 'code', 'HTTP_401_' || g, 'reason', 'bench'),  -- one open per code
       now() - make_interval(mins => g % 43200),
       CASE WHEN g % 2 = 0 THEN now() END, CASE WHEN g % 2 = 0 THEN 'bench' END
  FROM generate_series(1, %(n)s / 10) g;
INSERT INTO alerts (kind, charge_id, details, created_at)
SELECT 'charge_unresolved', id, '{}'::jsonb, unresolved_at FROM charges WHERE status = 'unresolved';
INSERT INTO jobs (kind, lane, dedupe_key, payload, run_at)
SELECT 'poll', rail, 'poll:' || id, jsonb_build_object('charge_id', id), now() + make_interval(secs => (hashtext(id) & 1023))
  FROM charges WHERE status IN ('pending', 'unresolved');
INSERT INTO jobs (kind, lane, dedupe_key, payload, run_at, last_error, dead_since)
SELECT 'deliver', 'webhooks', 'bench:dead:' || g, '{}'::jsonb, 'infinity', 'HTTP 500 from the endpoint', now()
  FROM generate_series(1, 1000) g;
INSERT INTO jobs (kind, lane, dedupe_key, payload, run_at, locked_by, locked_at, lease_token, lease_expires_at)
SELECT 'scan', 'housekeeping', 'bench:strand:' || g, '{}'::jsonb, now() - interval '1 hour', 'gone:1',
       now() - interval '1 hour', gen_random_uuid(), now() - interval '50 minutes'
  FROM generate_series(1, 100) g;
INSERT INTO statements (id, rail, file_sha256, file_name, profile, columns, line_count, imported_at)
SELECT 'st_' || lpad(g::text, 4, '0'), 'mtn', md5('st' || g) || md5('st' || g), 'bench-' || g || '.csv', 'default',
       '{}'::jsonb, 10000, now() - make_interval(days => g)
  FROM generate_series(1, 20) g;
INSERT INTO statement_lines (statement_id, line_no, kind, reference, rail_transaction_id, msisdn, amount_text,
                             amount, currency, status_text, line_time, outcome, charge_id)
SELECT 'st_' || lpad((1 + g % 20)::text, 4, '0'), 2 + g / 20, 'charge', md5((g * 5 % %(n)s + 1)::text), NULL,
       '256770000001', '10.00', 1000, 'EUR', 'SUCCESSFUL', now() - interval '2 days', 'matched',
       'ch_' || lpad((g * 5 % %(n)s + 1)::text, 9, '0')
  FROM generate_series(0, 199999) g;
INSERT INTO operator_actions (actor, action, target, note, result, via, created_at)
SELECT 'ops' || (g % 5) || '@example.com', 'alerts.ack', 'alert:' || g, 'bench', 'ok: 1 acknowledged', 'console',
       now() - make_interval(mins => g)
  FROM generate_series(1, 50000) g;
INSERT INTO console_samples (sampled_at, lane, due, leased, dead, oldest_due_seconds)
SELECT date_trunc('minute', now()) - make_interval(mins => m), lane, 10, 2, 0, (m % 60)::float8
  FROM generate_series(0, 1439) m CROSS JOIN unnest(ARRAY['housekeeping', 'webhooks', 'mtn', 'orange', 'mpesa', 'pawapay']) lane;
INSERT INTO console_figures (sampled_at, polls_due, poll_late_seconds, settled, settle_p50_seconds,
                             settle_p95_seconds, workers)
SELECT date_trunc('minute', now()) - make_interval(mins => m), 5, (m % 7)::float8, 30, 20.0, 55.0, 2
  FROM generate_series(0, 1439) m;
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(server: str, n: int, reuse: bool) -> str:
    url = psycopg.conninfo.make_conninfo(server, dbname=DB)
    if reuse:
        try:
            with psycopg.connect(url) as conn:
                have = conn.execute("SELECT count(*) FROM charges").fetchone()[0]
            if have == n:
                print(f"reusing {DB} ({have:,} charges)", flush=True)
                return url
        except psycopg.OperationalError:
            pass
    started = time.monotonic()
    url = benchdb.fresh(server, DB)
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in [s for s in SETUP.split(";\n") if s.strip()]:
            t = time.monotonic()
            conn.execute(statement.replace("%(n)s", str(int(n))))  # no parameters: '%' is modulo
            head = re.sub(r"\s+", " ", statement.strip().splitlines()[-1] if statement.strip().startswith("--")
                          else statement.strip())[:70]
            print(f"  {time.monotonic() - t:6.1f} s  {head}", flush=True)
        conn.execute("VACUUM ANALYZE")
        from vpay.console import accounts
        accounts.create_operator(conn, "bench@example.com", "operator", PASSWORD)
    print(f"setup {time.monotonic() - started:.0f} s", flush=True)
    return url


def pages(url: str) -> list[tuple[str, str, dict]]:
    """``[(label, path, params)]``: every page, with filters and deep pages."""
    with psycopg.connect(url) as conn:
        mid = conn.execute("SELECT created_at, id FROM charges WHERE id = 'ch_' || lpad(%s::text, 9, '0')",
                           (conn.execute("SELECT count(*) / 2 FROM charges").fetchone()[0],)).fetchone()
        # a charge of the newest tenth: it has an event and a webhook delivery
        some = conn.execute("SELECT c.id, c.rail_reference, c.payer FROM charges c "
                            "WHERE c.id = 'ch_' || lpad(((SELECT count(*) FROM charges) * 9 / 10 + 10)::text, 9, '0')"
                            ).fetchone()
        unresolved = conn.execute("SELECT id FROM charges WHERE status = 'unresolved' LIMIT 1").fetchone()[0]
        event = conn.execute("SELECT id FROM events ORDER BY id DESC LIMIT 1").fetchone()[0]
        alert_mid = conn.execute("SELECT max(id) / 2 FROM alerts").fetchone()[0]
        audit_mid = conn.execute("SELECT max(id) / 2 FROM operator_actions").fetchone()[0]
    day_from = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.time() - 10 * 86400))
    day_to = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.time() - 9 * 86400))
    charge_id, reference, payer = some
    return [
        ("overview", "/", {}),
        ("payments", "/payments", {}),
        ("payments, page in the middle", "/payments", {"before": f"{mid[0].isoformat()}|{mid[1]}"}),
        ("payments ?status=pending", "/payments", {"status": "pending"}),
        ("payments ?status=unresolved", "/payments", {"status": "unresolved"}),
        ("payments ?rail=orange", "/payments", {"rail": "orange"}),
        ("payments ?merchant= (half of all)", "/payments", {"merchant": "m00"}),
        ("payments ?merchant= (0.1 %)", "/payments", {"merchant": "m19"}),
        ("payments one-day window", "/payments", {"created_from": day_from, "created_to": day_to}),
        ("payments day + rail + merchant", "/payments",
         {"created_from": day_from, "created_to": day_to, "rail": "mpesa", "merchant": "m03"}),
        ("payments ?q=rail reference", "/payments", {"q": reference}),
        ("payments ?q=MSISDN", "/payments", {"q": payer}),
        ("payments ?q=unknown reference", "/payments", {"q": "unknown-ref-7"}),
        ("payments (htmx results)", "/payments", {"status": "failed", "_hx": "1"}),
        ("payment timeline", f"/payments/{charge_id}", {}),
        ("unresolved", "/unresolved", {}),
        ("alerts", "/alerts", {}),
        ("alerts ?kind&state=open", "/alerts", {"kind": "rail_misconfigured", "state": "open"}),
        ("alerts, page in the middle", "/alerts", {"after": str(alert_mid)}),
        ("jobs (dead)", "/jobs", {"state": "dead"}),
        ("jobs (stranded)", "/jobs", {"state": "stranded"}),
        ("statements", "/statements", {}),
        ("statement", "/statements/st_0001", {}),
        ("webhooks", "/webhooks", {}),
        ("webhooks ?event=", "/webhooks", {"event": event}),
        ("audit", "/audit", {}),
        ("audit, page in the middle", "/audit", {"before": str(audit_mid)}),
        ("unresolved charge's timeline", f"/payments/{unresolved}", {}),
    ]


def sign_in(base: str) -> requests.Session:
    s = requests.Session()
    page = s.get(f"{base}/login", timeout=30)
    token = re.search(r'name="login_token" value="([^"]+)"', page.text).group(1)
    r = s.post(f"{base}/login", data={"email": "bench@example.com", "password": PASSWORD, "login_token": token},
               allow_redirects=False, timeout=30)
    assert r.status_code == 303, r.text[:500]
    return s


def measure(base: str, session: requests.Session, path: str, params: dict, count: int) -> dict:
    headers = {}
    if params.pop("_hx", None):
        headers = {"HX-Request": "true", "HX-Target": "results"}
    times = []
    for i in range(count + 3):
        t = time.perf_counter()
        r = session.get(base + path, params=params, headers=headers, allow_redirects=False, timeout=60)
        elapsed = (time.perf_counter() - t) * 1000
        if r.status_code not in (200, 303):
            raise SystemExit(f"{path} {params}: {r.status_code} {r.text[:500]}")
        if i >= 3:
            times.append(elapsed)
    times.sort()
    return {"p50_ms": round(statistics.median(times), 1),
            "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 1),
            "max_ms": round(times[-1], 1), "status": r.status_code, "bytes": len(r.content)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--charges", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--reuse", action="store_true", help="keep a database of the same size from an earlier run")
    ap.add_argument("--only", help="a regular expression: only the pages whose label matches")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    server = benchdb.server()
    url = setup(server, args.charges, args.reuse)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "VPAY_DATABASE_URL": url}
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / "vpay-bench-console-server.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("vpay-server")), "console", "--bind",
                             f"127.0.0.1:{port}", "--insecure-cookie"], env=env, stdout=log, stderr=subprocess.STDOUT)
    results = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{base}/login", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the console did not come up; see {log.name}")
            time.sleep(0.3)
        session = sign_in(base)
        load_before = os.getloadavg()
        print(f"{'page':<36} {'p50':>8} {'p99':>8} {'max':>8}", flush=True)
        for label, path, params in pages(url):
            if args.only and not re.search(args.only, label):
                continue
            m = measure(base, session, path, dict(params), args.requests)
            results.append({"page": label, "path": path, "params": params, **m})
            flag = "  OVER" if m["p99_ms"] > GOAL_MS else ""
            print(f"{label:<36} {m['p50_ms']:>6.1f}ms {m['p99_ms']:>6.1f}ms {m['max_ms']:>6.1f}ms{flag}", flush=True)
        load_after = os.getloadavg()
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    over = [r["page"] for r in results if r["p99_ms"] > GOAL_MS]
    print(f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
          f"{'every page p99 <= 300 ms' if not over else 'over the goal: ' + ', '.join(over)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"charges": args.charges, "rail_calls": 5 * args.charges,
                                               "alerts": args.charges // 10 + args.charges // 100,
                                               "requests_per_page": args.requests,
                                               "load_before": load_before, "load_after": load_after,
                                               "pages": results}, indent=2) + "\n")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
