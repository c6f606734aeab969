"""vpay's queue held against its peers, in one run (issue #15). Never a test.

    pip install -e '.[bench]'                       # procrastinate, bench-only
    VPAY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python bench/peers.py
    python bench/peers.py --quick                   # one round, smaller counts but throughput's

Three systems run the same work, no-op jobs, at concurrency 5 in one process,
in rounds whose order is rotated (round r starts with system r), and every
figure is the median of the rounds (default 3):

* **vpay**: ``vpay-worker`` (the installed console script) on ``test.noop``
  jobs (vpay/handlers/testing.py: ``Done``, no database work).
* **procrastinate** (the ``bench`` extra): ``procrastinate worker`` on a
  no-op task (bench/procrastinate_app.py), its default flags but the
  concurrency. Finished jobs stay in its table (its default, ``delete_jobs``
  never); vpay deletes them.
* **pgbench**: vpay's own claim and finish SQL (``Q["claim..."]`` and
  ``Q["finish"]``, read from sql/queries/queue.sql) as a pgbench script,
  ``-c 5 -j 1 -M prepared``: the database's ceiling for our SQL with no
  Python in the way.

Figures (each printed with the machine's 1-minute load average, taken when it
was measured):

1. **throughput**, jobs/s: N jobs committed first, then the worker started;
   the rate from the first finished job to an empty queue (polled every
   10 ms on a separate connection), so boot is not counted. For pgbench, its
   own ``tps`` (one transaction = one claim + one finish).
   Also the worker's CPU seconds per job (``/proc/<pid>/stat`` over the
   same window) and the Postgres backends' CPU per job (the bench
   database's backends, read from ``/proc`` when the server is on this host).
2. **commit-to-claim**, ms, p50 and p99, at each worker's DEFAULT flags
   (vpay: ``vpay-worker`` with no flag; procrastinate: ``worker`` with no
   flag): an idle worker, one job committed at a time at random gaps; the
   database's clock on both sides (vpay: ``locked_at - created_at`` copied
   by a bench trigger; procrastinate: its ``started`` event minus its
   ``deferred`` event).
3. **round trips per job**: every client connection goes through
   bench/pgcount.py, a wire-protocol proxy that counts ``Sync`` and simple
   ``Query`` messages (one ``ReadyForQuery`` wait each). The worker idles,
   then N jobs are committed in one transaction; the round trips of every
   connection of the process (claims, finishes, pool checks, heartbeat,
   the listener, idle claims) from that commit to an empty queue, divided
   by N.
4. **backlog** (vpay): 10k due jobs drained with 1k vs 1M other rows in the
   table (scheduled a day ahead, as live charges' polls are), the rate
   ratio 1M/1k. ``VACUUM ANALYZE`` before each drain.
5. **churn** (vpay): 100k due jobs drained on a Postgres with DEFAULT
   autovacuum (the embedded pgserver one, even when ``VPAY_DATABASE_URL``
   names another: the shared server here runs with autovacuum off): the rate
   of the last 10k over the rate of the first 10k. The worker runs as
   deployed, so it vacuums ``jobs`` itself every ``VPAY_JOBS_VACUUM_EVERY``
   finished jobs (vpay/engine/vacuum.py; set it to 0 in the environment to measure
   autovacuum alone); ``worker_vacuums`` and ``autovacuums`` count each kind.

Options: ``--rounds``, ``--jobs`` (throughput N), ``--samples`` (latency
samples per round), ``--only`` (comma list of: throughput, latency,
roundtrips, backlog, churn), ``--json PATH`` (all raw figures).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pgcount import CountingProxy  # noqa: E402

SYSTEMS = ("vpay", "procrastinate", "pgbench")
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOGS = Path(tempfile.mkdtemp(prefix="vpay-peers-"))


def load() -> float:
    """The machine's 1-minute load average now."""
    return round(os.getloadavg()[0], 2)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def pct(values, q):
    values = sorted(values)
    if not values:
        return None
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]


# ---- databases ---------------------------------------------------------------

def embedded_server() -> str:
    from vpay.base.db import embedded_url
    return embedded_url(os.environ.get("VPAY_BENCH_DATA_DIR", str(HERE.parent / ".vpay-bench")))


def fresh(server: str, name: str) -> str:
    admin = psycopg.conninfo.make_conninfo(server, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return psycopg.conninfo.make_conninfo(server, dbname=name)


def vpay_db(server: str, name: str) -> str:
    from vpay.base.db import migrate
    url = fresh(server, name)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    return url


def has_lanes(conn) -> bool:
    return conn.execute("SELECT 1 FROM information_schema.columns "
                        "WHERE table_name = 'jobs' AND column_name = 'lane'").fetchone() is not None


def insert_noops(conn, n: int, prefix: str, delay: str = "0") -> None:
    """``n`` due ``test.noop`` jobs in one statement (one transaction)."""
    lane_col, lane_val = ("lane,", "'housekeeping',") if has_lanes(conn) else ("", "")
    conn.execute(f"INSERT INTO jobs (kind, {lane_col} dedupe_key, run_at) "
                 f"SELECT 'test.noop', {lane_val} %s::text || g, now() + %s::interval "
                 f"FROM generate_series(1, %s) g", (prefix, delay, n))


def proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of a local process, or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def backends_cpu(conn) -> float | None:
    """CPU seconds of every other backend of this database (this host only)."""
    pids = [p for (p,) in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
    cpus = [proc_cpu(p) for p in pids]
    if any(c is None for c in cpus):
        return None
    return sum(cpus)


# ---- processes ---------------------------------------------------------------

def vpay_lanes_flag() -> list[str]:
    """``--queues housekeeping`` once lanes exist: the test kinds' lane, so
    all five loops serve it."""
    try:
        import vpay.engine.lanes  # noqa: F401
    except ImportError:
        return []
    return ["--queues", "housekeeping"]


def start_vpay(url: str, *args: str) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("vpay-worker")
    env = {**os.environ, "VPAY_DATABASE_URL": url, "VPAY_TEST_HANDLERS": "1", "VPAY_LOG_LEVEL": "WARNING"}
    log = open(LOGS / f"vpay-{time.monotonic_ns()}.log", "wb")
    return subprocess.Popen([str(exe), *args], env=env, stdout=log, stderr=subprocess.STDOUT)


def start_procrastinate(url: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "BENCH_PROCRASTINATE_URL": url,
           "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = open(LOGS / f"procrastinate-{time.monotonic_ns()}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "procrastinate", "--app=procrastinate_app.app",
                             "worker", *args], env=env, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def procrastinate_db(server: str, name: str) -> str:
    url = fresh(server, name)
    env = {**os.environ, "BENCH_PROCRASTINATE_URL": url,
           "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-m", "procrastinate", "--app=procrastinate_app.app",
                    "schema", "--apply"], env=env, check=True, capture_output=True)
    return url


def insert_procrastinate(conn, n: int) -> None:
    conn.execute("INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
                 "SELECT 'default', 'noop', '{}' FROM generate_series(1, %s)", (n,))


# Jobs not yet claimed, read through the claim's own partial indexes (a
# seq-scan count would cost the server a core at this polling rate, and with
# the backlog figure's 1M standing rows it halved vpay's rate): one count per
# index, since sql/0015_fair_claims.sql each partial index holds one
# side of share_round. The last five, claimed and not yet finished, finish
# within milliseconds.
_LEFT_WHERE = ("lane = 'housekeeping' AND locked_at IS NULL AND run_at <> 'infinity' "
               "AND run_at <= now() AND kind = 'test.noop'")
VPAY_LEFT = (f"SELECT (SELECT count(*) FROM jobs WHERE {_LEFT_WHERE} AND share_round = 0)"
             f" + (SELECT count(*) FROM jobs WHERE {_LEFT_WHERE} AND share_round > 0)")
PROC_LEFT = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"


def drain(conn, left_sql: str, n: int, pid: int | None = None, until: int = 0,
          timeout: float = 1800, every: float = 0.05) -> dict:
    """Poll ``left_sql`` until it answers ``until`` or less; the rate from
    the first observed progress. Also the worker's CPU over that window."""
    deadline = time.monotonic() + timeout
    t0 = r0 = cpu0 = pg0 = None
    while True:
        left = conn.execute(left_sql).fetchone()[0]
        now = time.monotonic()
        if t0 is None and left < n:
            t0, r0, cpu0 = now, left, proc_cpu(pid) if pid else None
            pg0 = backends_cpu(conn) if pid else None
        if left <= until:
            break
        if now > deadline:
            raise SystemExit(f"queue did not drain: {left} left")
        time.sleep(every)
    done = r0 - left
    cpu1 = proc_cpu(pid) if pid else None
    pg1 = backends_cpu(conn) if pid else None
    out = {"jobs_per_s": done / (now - t0) if now > t0 else None, "jobs": done, "seconds": now - t0}
    if cpu0 is not None and cpu1 is not None and done:
        out["worker_cpu_ms_per_job"] = 1000 * (cpu1 - cpu0) / done
    if pg0 is not None and pg1 is not None and done:
        # every backend of the bench database but the poller: the worker's
        # connections (a backend that closed in the window is not counted)
        out["postgres_cpu_ms_per_job"] = 1000 * (pg1 - pg0) / done
    return out


def wait_booted(conn, left_sql: str, insert) -> None:
    """One sentinel job through the worker: it is up and has gone idle."""
    insert()
    deadline = time.monotonic() + 120
    while conn.execute(left_sql).fetchone()[0]:
        if time.monotonic() > deadline:
            raise SystemExit(f"worker did not boot; logs in {LOGS}")
        time.sleep(0.02)
    time.sleep(1.5)


# ---- 1. throughput -------------------------------------------------------------

def throughput_vpay(server: str, n: int) -> dict:
    url = vpay_db(server, "vpay_bench_tp_vpay")
    with psycopg.connect(url, autocommit=True) as conn:
        insert_noops(conn, n, "tp:")
        conn.execute("VACUUM ANALYZE jobs")
        proc = start_vpay(url, "--worker-concurrency", "5", *vpay_lanes_flag())
        try:
            return drain(conn, VPAY_LEFT, n, proc.pid)
        finally:
            stop(proc)


def throughput_procrastinate(server: str, n: int) -> dict:
    url = procrastinate_db(server, "vpay_bench_tp_procrastinate")
    with psycopg.connect(url, autocommit=True) as conn:
        insert_procrastinate(conn, n)
        conn.execute("VACUUM ANALYZE procrastinate_jobs")
        proc = start_procrastinate(url, "--concurrency", "5")
        try:
            return drain(conn, PROC_LEFT, n, proc.pid)
        finally:
            stop(proc)


def _one_line(text: str) -> str:
    lines = [l for l in text.splitlines() if not l.strip().startswith("--")]
    return " ".join(" ".join(lines).split()).rstrip(";")


def pgbench_script(lanes: bool, combined: bool) -> str:
    """vpay's per-job SQL for pgbench, with the worker's parameters as
    literals and the claimed row's columns carried by ``\\gset``.

    ``combined``: what a busy vpay loop sends per job, ``claim_lane`` with
    the fenced finish of the previous job (one statement; the first
    transaction of a client finishes nothing). Otherwise two statements:
    ``claim_lane`` with nothing to finish (id and token NULL), then
    ``finish``."""
    from vpay.base.queries import Q
    subst = {"%(worker)s": "'pgbench'", "%(lease)s": "300", "%(lane)s": "'housekeeping'",
             "%(id)s": ":id", "%(token)s": ":lease_token",
             # vpay's loop sends a uuid4 of its own; pgbench has none to send
             "%(new_token)s": "gen_random_uuid()",
             # a loop of one lane alone: nothing to borrow, nobody at a share
             "%(lent)s": "'{}'", "%(skip)s": "'{}'"}
    nothing_to_finish = {"%(id)s": "NULL", "%(token)s": "NULL"}

    def text(name: str, over: dict[str, str] | None = None) -> str:
        out = _one_line(Q[name])
        for k, v in {**subst, **(over or {})}.items():
            out = out.replace(k, v)
        return out

    if combined:
        return f"{text('claim_lane')} \\gset\n"
    claim = text("claim_lane", nothing_to_finish) if lanes else text("claim")
    return f"{claim} \\gset\n{text('finish')};\n"


def pgbench_bin() -> str:
    exe = shutil.which("pgbench")
    if not exe:
        raise SystemExit("pgbench not found: apt-get install -y postgresql-client")
    return exe


def run_pgbench(url: str, n: int, clients: int = 5, combined: bool = True) -> dict:
    with psycopg.connect(url, autocommit=True) as conn:
        lanes = has_lanes(conn)
    script = LOGS / ("finish_claim.sql" if combined else "claim_finish.sql")
    script.write_text(pgbench_script(lanes, combined))
    parts = psycopg.conninfo.conninfo_to_dict(url)
    env = {**os.environ, "PGHOST": parts.get("host") or "", "PGPORT": str(parts.get("port") or 5432),
           "PGUSER": parts.get("user") or "postgres", "PGSSLMODE": parts.get("sslmode") or "prefer",
           "PGPASSWORD": parts.get("password") or ""}
    first = ["-D", "id=0", "-D", "lease_token=00000000-0000-0000-0000-000000000000"] if combined else []
    res = subprocess.run([pgbench_bin(), "-n", "-M", "prepared", "-c", str(clients), "-j", "1",
                          "-t", str(n // clients), *first, "-f", str(script), parts["dbname"]],
                         env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"pgbench failed:\n{res.stdout}\n{res.stderr}")
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", res.stdout)
    return {"jobs_per_s": float(m.group(1)), "jobs": n}


def throughput_pgbench(server: str, n: int) -> dict:
    """Both scripts on fresh tables: ``jobs_per_s`` is the SQL vpay sends
    per job (finish+claim in one statement), ``two_statements_jobs_per_s``
    the separate claim and finish."""
    out = {}
    for combined, key in ((True, "jobs_per_s"), (False, "two_statements_jobs_per_s")):
        url = vpay_db(server, "vpay_bench_tp_pgbench")
        with psycopg.connect(url, autocommit=True) as conn:
            insert_noops(conn, n, "tp:")
            conn.execute("VACUUM ANALYZE jobs")
        out[key] = run_pgbench(url, n, combined=combined)["jobs_per_s"]
    return out


# ---- 2. commit-to-claim ----------------------------------------------------------

def latency_vpay(server: str, samples: int) -> list[float]:
    url = vpay_db(server, "vpay_bench_lat_vpay")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_claims (seconds float8)")
        conn.execute("CREATE FUNCTION bench_keep_claim() RETURNS trigger LANGUAGE plpgsql AS $$ "
                     "BEGIN INSERT INTO bench_claims VALUES (extract(epoch FROM NEW.locked_at - NEW.created_at)::float8); "
                     "RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER bench_keep_claim AFTER UPDATE ON jobs FOR EACH ROW "
                     "WHEN (OLD.locked_at IS NULL AND NEW.locked_at IS NOT NULL AND NEW.kind = 'test.noop') "
                     "EXECUTE FUNCTION bench_keep_claim()")
        proc = start_vpay(url)  # DEFAULT flags
        try:
            wait_booted(conn, VPAY_LEFT, lambda: insert_noops(conn, 1, "boot:"))
            conn.execute("TRUNCATE bench_claims")
            for i in range(samples):
                time.sleep(random.uniform(0.1, 0.8))
                insert_noops(conn, 1, f"lat:{i}:")
                deadline = time.monotonic() + 30
                while conn.execute("SELECT count(*) FROM bench_claims").fetchone()[0] <= i:
                    if time.monotonic() > deadline:
                        raise SystemExit("vpay did not claim a latency job within 30 s")
                    time.sleep(0.002)
            return [s * 1000 for (s,) in conn.execute("SELECT seconds FROM bench_claims")]
        finally:
            stop(proc)


def latency_procrastinate(server: str, samples: int) -> list[float]:
    url = procrastinate_db(server, "vpay_bench_lat_procrastinate")
    q = ("SELECT extract(epoch FROM s.at - d.at)::float8 FROM procrastinate_events d "
         "JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started' "
         "WHERE d.type = 'deferred' AND d.job_id > %s")
    with psycopg.connect(url, autocommit=True) as conn:
        proc = start_procrastinate(url)  # DEFAULT flags
        try:
            wait_booted(conn, PROC_LEFT, lambda: insert_procrastinate(conn, 1))
            first = conn.execute("SELECT coalesce(max(id), 0) FROM procrastinate_jobs").fetchone()[0]
            for i in range(samples):
                time.sleep(random.uniform(0.1, 0.8))
                insert_procrastinate(conn, 1)
                deadline = time.monotonic() + 30
                while len(conn.execute(q, (first,)).fetchall()) <= i:
                    if time.monotonic() > deadline:
                        raise SystemExit("procrastinate did not start a latency job within 30 s")
                    time.sleep(0.002)
            return [s * 1000 for (s,) in conn.execute(q, (first,))]
        finally:
            stop(proc)


# ---- 3. round trips ---------------------------------------------------------------

def roundtrips_vpay(server: str, n: int) -> dict:
    url = vpay_db(server, "vpay_bench_rt_vpay")
    proxy = CountingProxy(url).start()
    with psycopg.connect(url, autocommit=True) as conn:
        proc = start_vpay(proxy.url, "--worker-concurrency", "5", *vpay_lanes_flag())
        try:
            wait_booted(conn, VPAY_LEFT, lambda: insert_noops(conn, 1, "boot:"))
            before, stmts = proxy.total(), proxy.by_statement()
            insert_noops(conn, n, "rt:")
            drain(conn, VPAY_LEFT, n)
            total = proxy.total() - before
            by = proxy.by_statement() - stmts
        finally:
            stop(proc)
            proxy.stop()
    return {"per_job": total / n, "by_statement": {k: round(v / n, 3) for k, v in by.most_common(6)}}


def roundtrips_procrastinate(server: str, n: int) -> dict:
    url = procrastinate_db(server, "vpay_bench_rt_procrastinate")
    proxy = CountingProxy(url).start()
    with psycopg.connect(url, autocommit=True) as conn:
        proc = start_procrastinate(proxy.url, "--concurrency", "5")
        try:
            wait_booted(conn, PROC_LEFT, lambda: insert_procrastinate(conn, 1))
            before, stmts = proxy.total(), proxy.by_statement()
            insert_procrastinate(conn, n)
            drain(conn, PROC_LEFT, n)
            total = proxy.total() - before
            by = proxy.by_statement() - stmts
        finally:
            stop(proc)
            proxy.stop()
    return {"per_job": total / n, "by_statement": {k: round(v / n, 3) for k, v in by.most_common(6)}}


def roundtrips_pgbench(server: str, n: int) -> dict:
    url = vpay_db(server, "vpay_bench_rt_pgbench")
    with psycopg.connect(url, autocommit=True) as conn:
        insert_noops(conn, n, "rt:")
    proxy = CountingProxy(url).start()
    try:
        run_pgbench(proxy.url, n)
        total = proxy.total()
    finally:
        proxy.stop()
    return {"per_job": total / n, "by_statement": {k: round(v / n, 3) for k, v in proxy.by_statement().most_common(4)}}


# ---- 4. backlog, 5. churn ------------------------------------------------------------

def backlog_vpay(server: str, standing: int, n: int = 10_000) -> dict:
    url = vpay_db(server, f"vpay_bench_backlog_{standing}")
    with psycopg.connect(url, autocommit=True) as conn:
        insert_noops(conn, standing, "later:", delay="1 day")
        insert_noops(conn, n, "due:")
        conn.execute("VACUUM ANALYZE jobs")
        left = VPAY_LEFT  # the standing rows are not due: not counted
        proc = start_vpay(url, "--worker-concurrency", "5", *vpay_lanes_flag())
        try:
            out = drain(conn, left, n, proc.pid)
        finally:
            stop(proc)
    return out


def churn_vpay(server: str, n: int = 100_000, window: int = 10_000) -> dict:
    url = vpay_db(server, "vpay_bench_churn")
    with psycopg.connect(url, autocommit=True) as conn:
        insert_noops(conn, n, "churn:")
        conn.execute("VACUUM ANALYZE jobs")
        proc = start_vpay(url, "--worker-concurrency", "5", *vpay_lanes_flag())
        try:
            # count(*) over 100k rows is not free: polled every 0.1 s only
            first = drain(conn, VPAY_LEFT, n, proc.pid, until=n - window, every=0.1)
            drain(conn, VPAY_LEFT, n - window, until=window, every=0.5)
            last = drain(conn, VPAY_LEFT, window + 1, proc.pid, until=0, every=0.1)
        finally:
            stop(proc)
        # vacuum_count: the worker's own vacuums (vpay/engine/vacuum.py), less the
        # bench's VACUUM ANALYZE before the start
        vac = conn.execute("SELECT autovacuum_count, vacuum_count - 1 FROM pg_stat_user_tables "
                           "WHERE relname = 'jobs'").fetchone()
    out = {"first_jobs_per_s": first["jobs_per_s"], "last_jobs_per_s": last["jobs_per_s"],
           "ratio": last["jobs_per_s"] / first["jobs_per_s"], "autovacuums": vac[0],
           "worker_vacuums": vac[1]}
    # The same comparison by CPU per job (worker + its Postgres backends):
    # what the dead entries cost each claim, much less sensitive than a
    # 5-second rate to whatever else the machine runs meanwhile.
    try:
        cpu = lambda d: d["worker_cpu_ms_per_job"] + d["postgres_cpu_ms_per_job"]  # noqa: E731
        out |= {"first_cpu_ms_per_job": cpu(first), "last_cpu_ms_per_job": cpu(last),
                "cpu_ratio": cpu(first) / cpu(last)}
    except (KeyError, TypeError):
        pass
    return out


# ---- the run ----------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=60)
    ap.add_argument("--rt-jobs", type=int, default=2_000)
    ap.add_argument("--churn-jobs", type=int, default=100_000)
    ap.add_argument("--backlog-rows", type=int, default=1_000_000)
    ap.add_argument("--only", default="throughput,latency,roundtrips,backlog,churn")
    ap.add_argument("--quick", action="store_true", help="one round, small counts")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    # Webhook secrets are sealed under VPAY_SECRET_KEYS (docs/security.md): the
    # worker refuses to start without one, and the bench would wait for it for
    # ever. A Fernet key (32 random bytes, URL-safe base64) when none is given.
    os.environ.setdefault("VPAY_SECRET_KEYS", base64.urlsafe_b64encode(os.urandom(32)).decode("ascii"))
    if args.quick:
        # Throughput keeps its 10,000 jobs: at 2,000 the worker drained in
        # 0.7 s, where its start-up (loops spreading over a backlog) and the
        # 50 ms poll of the queue weighed most, and the pgbench ratio with it.
        args.rounds, args.samples, args.rt_jobs, args.churn_jobs = 1, 15, 500, 20_000
        args.backlog_rows = 100_000
    only = set(args.only.split(","))
    url = os.environ.get("VPAY_DATABASE_URL", "").strip()
    server = url or embedded_server()
    churn_server = os.environ.get("VPAY_BENCH_CHURN_URL", "").strip() or embedded_server()
    results: dict = {"load_at_start": load(), "cpus": os.cpu_count(), "rounds": args.rounds,
                     "server": "VPAY_DATABASE_URL" if url else "embedded", "raw": {}}
    raw = results["raw"]
    print(f"# bench/peers.py  cpus={os.cpu_count()}  load={load()}  rounds={args.rounds}  logs={LOGS}",
          flush=True)

    def note(fig: str, system: str, value) -> None:
        value = {**value, "load": load()} if isinstance(value, dict) else {"value": value, "load": load()}
        raw.setdefault(fig, {}).setdefault(system, []).append(value)
        print(f"  {fig:<12} {system:<14} {json.dumps(value, default=str)}", flush=True)

    for r in range(args.rounds):
        order = SYSTEMS[r % 3:] + SYSTEMS[:r % 3]
        print(f"round {r + 1}: {', '.join(order)}", flush=True)
        for system in order:
            if "throughput" in only:
                fn = {"vpay": throughput_vpay, "procrastinate": throughput_procrastinate,
                      "pgbench": throughput_pgbench}[system]
                note("throughput", system, fn(server, args.jobs))
            if "roundtrips" in only:
                fn = {"vpay": roundtrips_vpay, "procrastinate": roundtrips_procrastinate,
                      "pgbench": roundtrips_pgbench}[system]
                note("roundtrips", system, fn(server, args.rt_jobs))
            if "latency" in only and system != "pgbench":
                fn = {"vpay": latency_vpay, "procrastinate": latency_procrastinate}[system]
                lat = fn(server, args.samples)
                note("latency", system, {"p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99),
                                         "max_ms": max(lat), "samples": len(lat)})
        if "backlog" in only:
            small = backlog_vpay(server, 1_000)
            big = backlog_vpay(server, args.backlog_rows)
            note("backlog", "vpay", {"1k_jobs_per_s": small["jobs_per_s"], "big_jobs_per_s": big["jobs_per_s"],
                                     "big_rows": args.backlog_rows,
                                     "ratio": big["jobs_per_s"] / small["jobs_per_s"]})
        if "churn" in only:
            note("churn", "vpay", churn_vpay(churn_server, args.churn_jobs, args.churn_jobs // 10))

    def med(fig, system, key):
        rows = raw.get(fig, {}).get(system, [])
        return median([row.get(key) for row in rows]), median([row["load"] for row in rows])

    summary = {}
    print("\n# medians of rounds (load = median 1-min load average when measured)")
    for fig, key in (("throughput", "jobs_per_s"), ("throughput", "worker_cpu_ms_per_job"),
                     ("throughput", "postgres_cpu_ms_per_job"), ("roundtrips", "per_job"),
                     ("latency", "p50_ms"), ("latency", "p99_ms"), ("backlog", "ratio"),
                     ("churn", "ratio"), ("churn", "cpu_ratio")):
        for system in SYSTEMS:
            value, ld = med(fig, system, key)
            if value is not None:
                summary[f"{fig}.{key}.{system}"] = value
                print(f"  {fig}.{key:<24} {system:<14} {value:10.3f}   load {ld}")
    ratios = {}
    tp = {s: summary.get(f"throughput.jobs_per_s.{s}") for s in SYSTEMS}
    if tp["vpay"] and tp["procrastinate"]:
        ratios["throughput vpay/procrastinate (goal >= 4)"] = tp["vpay"] / tp["procrastinate"]
    if tp["vpay"] and tp["pgbench"]:
        ratios["throughput vpay/pgbench (goal >= 0.6)"] = tp["vpay"] / tp["pgbench"]
    p99 = {s: summary.get(f"latency.p99_ms.{s}") for s in SYSTEMS}
    if p99["vpay"] and p99["procrastinate"]:
        ratios["commit-to-claim p99 vpay/procrastinate (goal <= 1)"] = p99["vpay"] / p99["procrastinate"]
    if "roundtrips.per_job.vpay" in summary:
        ratios["round trips per no-op job, vpay (goal <= 2)"] = summary["roundtrips.per_job.vpay"]
    if "churn.ratio.vpay" in summary:
        ratios["churn last/first 10k of 100k (goal >= 0.95)"] = summary["churn.ratio.vpay"]
    if "churn.cpu_ratio.vpay" in summary:
        ratios["churn by CPU per job, first/last 10k"] = summary["churn.cpu_ratio.vpay"]
    if "backlog.ratio.vpay" in summary:
        ratios["backlog 1M/1k rate"] = summary["backlog.ratio.vpay"]
    print("\n# the issue's ratios")
    for k, v in ratios.items():
        print(f"  {k:<56} {v:8.3f}")
    results |= {"summary": summary, "ratios": ratios, "load_at_end": load()}
    print(f"\nload at end {load()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
