"""What one payment costs the worker and the database, at small scale
(docs/capacity.md is computed from these figures). Never a test.

    python bench/charges.py [--charges 300] [--json out.json]
    python bench/charges.py --against <git ref> [--rounds 3] [--json out.json]
    VPAY_DATABASE_URL=... python bench/charges.py ...

N MTN charges on the sandbox rail (vpay/sandbox/mtn/, a real HTTP server on
127.0.0.1, every payer approving within 0.2 s), created and submitted the
way the API does (``payments.create_and_submit``), then one ``vpay-worker``
at its default flags runs until every charge has settled and every job but
the recurring housekeeping ones (``scan``, ``sweep``, ``sample``) is gone.
Twice: merchant WITH an enabled webhook endpoint (a receiver on 127.0.0.1
answering 200) and WITHOUT one. The first poll is due 10 s after the charge
(the ladder's first rung), so each charge settles on its first status read.

Per settled charge: jobs run (by kind; counted by a bench trigger at each
claim), rail requests (by operation, from the sandbox's log; the
request-to-pay at creation included), round trips to Postgres (the worker's,
through bench/pgcount.py, also by statement), the worker's CPU and its
Postgres backends' CPU (from ``/proc``, this host only), with the machine's
load; and, when the server preloads ``pg_stat_statements``, Postgres's own
time per statement (``postgres_ms_by_statement``; docs/performance.md, "A
fourth run", for a throwaway server that does).

``--against REF`` holds this checkout against an older release in one run:
REF is checked out as a git worktree in a temporary directory, and each
measurement runs in a process of its own whose ``vpay`` is that release's
source tree (this one's, or REF's: its directory first on ``PYTHONPATH``,
the interpreter started with ``-S`` so that the installed, editable ``vpay``
of this checkout is not seen; the libraries come from this interpreter's
site-packages). The bench's own code (this file, pgcount, peers) is this
checkout's for both. Each round runs both releases, each with then without
an endpoint, the order of the releases rotated round by round (round r
starts with release r); every figure is the median of the rounds (default
3), and the ratio this / REF is printed for each.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from peers import LOGS, backends_cpu, embedded_server, load, proc_cpu, stop, vpay_db  # noqa: E402
from pgcount import CountingProxy  # noqa: E402
from release_path import ENV as RELEASE_ENV, install as use_release  # noqa: E402
from worker_cpu import user_system  # noqa: E402


class _Ok(BaseHTTPRequestHandler):
    """The merchant's receiver: 200 to every POST, closing each connection
    (HTTP/1.0, as every run before the fifth)."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.answer_headers()
        self.end_headers()

    def answer_headers(self) -> None:
        pass

    def log_message(self, *args):
        pass


class _OkKeepAlive(_Ok):
    """The same receiver keeping connections open (HTTP/1.1, an empty body
    of a stated length), as most servers do: ``--keep-alive-receiver``."""

    protocol_version = "HTTP/1.1"

    def answer_headers(self) -> None:
        self.send_header("content-length", "0")


KEEP_ALIVE_ENV = "BENCH_RECEIVER_KEEP_ALIVE"


def _rail_env(rail) -> dict[str, str]:
    return {"VPAY_MTN_BASE_URL": rail.url, "VPAY_MTN_SUBSCRIPTION_KEY": rail.subscription_key,
            "VPAY_MTN_API_USER": rail.api_user, "VPAY_MTN_API_KEY": rail.api_key,
            "VPAY_MTN_TARGET_ENVIRONMENT": rail.target_environment}


def worker_command() -> list[str]:
    """How to start ``vpay-worker`` of the release under measurement: the
    installed console script, or inside a release's process (``-S``; its
    tree from ``release_path``) the same entry point by hand."""
    if os.environ.get(RELEASE_ENV):
        boot = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import release_path; "
                "release_path.install(); sys.argv[0] = 'vpay-worker'; "
                "from vpay.cli import worker_main; worker_main()")
        return [sys.executable, "-S", "-c", boot]
    return [str(Path(sys.executable).with_name("vpay-worker"))]


def run(server: str, n: int, with_endpoint: bool, latency: float = 0.0) -> dict:
    from vpay.money import payments
    from vpay import webhooks
    from vpay.base.db import make_pool
    from vpay.money.merchants import create_merchant
    from vpay.rails.mtn import MtnMomo
    from vpay.sandbox.mtn import SandboxRail

    url = vpay_db(server, "vpay_bench_charges")
    keep_alive = os.environ.get(KEEP_ALIVE_ENV) == "1"
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _OkKeepAlive if keep_alive else _Ok)
    receiver.daemon_threads = True
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
        statements_kept = _reset_statements(conn)
        proxy = CountingProxy(url).start()
        # INFO, the production level: the log lines' cost is part of the figure
        env = {**os.environ, "VPAY_DATABASE_URL": proxy.url, "VPAY_LOG_LEVEL": "INFO",
               "VPAY_WEBHOOKS_ALLOW_PRIVATE": "1", **_rail_env(rail)}
        log = open(LOGS / f"charges-{time.monotonic_ns()}.log", "wb")
        proc = subprocess.Popen(worker_command(), env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            cpu0, pg0, rt0 = None, None, None
            deadline = time.monotonic() + 600
            while True:
                left = conn.execute("SELECT count(*) FROM charges WHERE status = 'pending'").fetchone()[0]
                jobs = conn.execute("SELECT count(*) FROM jobs WHERE kind NOT IN ('scan', 'sweep', 'sample')").fetchone()[0]
                if cpu0 is None:
                    # the worker is up once its pool is connected: count from here
                    if conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND pid <> pg_backend_pid()").fetchone()[0]:
                        cpu0, pg0, rt0 = proc_cpu(proc.pid), backends_cpu(conn), proxy.total()
                        us0 = user_system(proc.pid)
                if left == 0 and jobs == 0:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"charges did not settle: {left} pending, {jobs} jobs; logs {LOGS}")
                time.sleep(0.2)
            cpu1, pg1, rt1 = proc_cpu(proc.pid), backends_cpu(conn), proxy.total()
            us1 = user_system(proc.pid)
            statements = proxy.by_statement()
            pg_statements = _statement_times(conn) if statements_kept else None
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
        "round_trips_by_statement": dict(statements.most_common(25)),
        "worker_cpu_ms_per_charge": per(1000 * (cpu1 - cpu0)) if cpu0 is not None else None,
        # where the worker's CPU goes: its own code (user) or the kernel's work for it (system)
        "worker_user_ms_per_charge": per(1000 * (us1[0] - us0[0])) if cpu0 is not None else None,
        "worker_system_ms_per_charge": per(1000 * (us1[1] - us0[1])) if cpu0 is not None else None,
        "postgres_cpu_ms_per_charge": per(1000 * (pg1 - pg0)) if pg0 is not None and pg1 is not None else None,
        # Postgres's own time per statement (pg_stat_statements, when the server
        # preloads it; nested statements of functions and triggers included)
        "postgres_ms_by_statement": ({q: {"calls_per_charge": per(calls), "ms_per_charge": per(ms)}
                                      for q, calls, ms in pg_statements} if pg_statements else None),
        "rail_latency_s": latency, "mtn_loops": loops, "receiver_keep_alive": keep_alive,
        # Little's law check (docs/capacity.md): with every poll due at once,
        # the mtn loops settle them at loops / latency per second
        "settle_span_s": span,
        "predicted_span_s": (settled - 1) * latency / loops if latency and loops else None,
        "load": load(),
    }




def _reset_statements(conn) -> bool:
    """Start counting Postgres's time per statement from here, when the
    server preloads ``pg_stat_statements`` (``shared_preload_libraries``;
    neither the embedded Postgres nor most servers do: docs/performance.md,
    "A fourth run", for a throwaway server that does). Answers
    whether it can."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
    except psycopg.Error:
        return False
    return True


_BENCH_OWN = ("SELECT count(*) FROM charges WHERE status = $1",
              "SELECT count(*) FROM jobs WHERE kind NOT IN ($1, $2, $3)",
              "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
              "AND pid <> pg_backend_pid()",
              "SELECT extract($1 FROM max(settled_at) - min(settled_at))::float8 FROM charges")
"""The bench's own statements (its watch on the run), as pg_stat_statements
normalizes them: not the worker's, left out of its figures."""


def _statement_times(conn, top: int = 25) -> list[tuple[str, int, float]]:
    """The ``top`` statements of this database by total execution time since
    ``_reset_statements``: ``(first 70 characters, calls, milliseconds)``,
    the statements that begin alike summed (the claim's variants).
    Wall time inside Postgres, not CPU: on an idle box, close to it."""
    rows = conn.execute(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 70) AS q, sum(calls)::bigint, sum(total_exec_time)::float8 "
        "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND query NOT LIKE '%%pg_stat_statements%%' AND NOT query = ANY(%s) "
        "GROUP BY q ORDER BY 3 DESC LIMIT %s", (list(_BENCH_OWN), top)).fetchall()
    return [(q, calls, round(ms, 1)) for q, calls, ms in rows]


# ---- two releases in one run ---------------------------------------------------

FIGURES = ("jobs_per_charge", "rail_requests_per_charge", "round_trips_per_charge",
           "worker_cpu_ms_per_charge", "worker_user_ms_per_charge", "worker_system_ms_per_charge",
           "postgres_cpu_ms_per_charge", "settle_span_s")
"""The per-charge figures a run with ``--against`` takes the median of and
compares (this / the older release)."""


def _site_path() -> str:
    """This interpreter's site-packages, for a release's ``-S`` process."""
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    return os.pathsep.join(dirs)


def measure(root: Path, server: str, n: int, with_endpoint: bool, latency: float) -> dict:
    """One ``run`` in a process of its own, with ``vpay`` from ``root``."""
    env = {**os.environ, RELEASE_ENV: str(root), "VPAY_DATABASE_URL": server, "PYTHONPATH": _site_path()}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = Path(out.name)
    try:
        cmd = [sys.executable, "-S", str(Path(__file__).resolve()), "--one", "--charges", str(n),
               "--rail-latency", str(latency), "--json", str(path),
               "--endpoint" if with_endpoint else "--no-endpoint"]
        subprocess.run(cmd, env=env, check=True, cwd=str(root))
        return json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)


def checkout(ref: str, into: Path) -> tuple[Path, str]:
    """``ref`` as a detached git worktree under ``into``: its path and commit."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    path = into / f"release-{commit[:12]}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit],
                   check=True, capture_output=True)
    return path, commit


def compare(rows: dict[str, dict[bool, list[dict]]], names: list[str]) -> dict:
    """Medians per release, endpoint or not, and figure; ratios of the first
    release (this checkout) over the second."""
    med = {name: {we: {f: _median([r.get(f) for r in rows[name][we]]) for f in FIGURES}
                  for we in (True, False)} for name in names}
    out = {"medians": {name: {("with_endpoint" if we else "without_endpoint"): v for we, v in m.items()}
                       for name, m in med.items()}}
    if len(names) == 2:
        this, other = names
        out["ratios"] = {("with_endpoint" if we else "without_endpoint"): {
            f: (round(med[this][we][f] / med[other][we][f], 3)
                if med[this][we][f] is not None and med[other][we][f] else None)
            for f in FIGURES} for we in (True, False)}
    return out


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def print_table(summary: dict, names: list[str]) -> None:
    for key, title in (("with_endpoint", "merchant WITH an enabled endpoint"),
                       ("without_endpoint", "merchant WITHOUT an endpoint")):
        print(f"\nper settled charge, {title} (medians)")
        head = f"{'figure':30}" + "".join(f"{n:>16}" for n in names)
        if "ratios" in summary:
            head += f"{'ratio':>10}"
        print(head)
        for f in FIGURES:
            line = f"{f:30}" + "".join(f"{_fmt(summary['medians'][n][key][f]):>16}" for n in names)
            if "ratios" in summary:
                line += f"{_fmt(summary['ratios'][key][f]):>10}"
            print(line)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--charges", type=int, default=300)
    ap.add_argument("--rail-latency", type=float, default=0.0,
                    help="seconds each status read takes at the sandbox (capacity check)")
    ap.add_argument("--against", default=None, metavar="REF",
                    help="an older release (git ref) measured in the same run, rotated, for ratios")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds (default 3 with --against, else 1); figures are their medians")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep-alive-receiver", action="store_true",
                    help="the merchant's receiver keeps connections open (HTTP/1.1); default: closes each")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one measurement (internal)
    ap.add_argument("--endpoint", dest="endpoint", action="store_true", default=True, help=argparse.SUPPRESS)
    ap.add_argument("--no-endpoint", dest="endpoint", action="store_false", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        use_release()
        row = run(os.environ["VPAY_DATABASE_URL"], args.charges, args.endpoint, args.rail_latency)
        import vpay
        row["vpay_loaded_from"] = str(Path(vpay.__file__).parent)  # proof of which release ran
        Path(args.json).write_text(json.dumps(row, indent=1))
        return
    if args.keep_alive_receiver:
        os.environ[KEEP_ALIVE_ENV] = "1"  # read by each measurement's process (run)
    server = os.environ.get("VPAY_DATABASE_URL", "").strip() or embedded_server()
    # Webhook secrets are sealed under VPAY_SECRET_KEYS (docs/security.md): a
    # Fernet key (32 random bytes, URL-safe base64) when none is given.
    os.environ.setdefault("VPAY_SECRET_KEYS", base64.urlsafe_b64encode(os.urandom(32)).decode("ascii"))
    rounds = args.rounds or (3 if args.against else 1)
    tmp = Path(tempfile.mkdtemp(prefix="vpay-charges-"))
    releases: list[tuple[str, Path, str]] = [
        ("this", ROOT, subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                      text=True).stdout.strip() or "?")]
    try:
        if args.against:
            path, commit = checkout(args.against, tmp)
            releases.append((args.against, path, commit))
        names = [r[0] for r in releases]
        rows: dict[str, dict[bool, list[dict]]] = {n: {True: [], False: []} for n in names}
        for r in range(rounds):
            order = releases[r % len(releases):] + releases[:r % len(releases)]
            for name, root, _ in order:
                for with_endpoint in (True, False):
                    row = measure(root, server, args.charges, with_endpoint, args.rail_latency)
                    row |= {"release": name, "round": r}
                    rows[name][with_endpoint].append(row)
                    print(json.dumps({k: row[k] for k in ("release", "round", "with_endpoint", *FIGURES,
                                                          "load")}), flush=True)
        summary = compare(rows, names)
        summary["releases"] = {name: commit for name, _, commit in releases}
        summary["rounds"] = rounds
        summary["charges"] = args.charges
        print_table(summary, names)
        if args.json:
            Path(args.json).write_text(json.dumps({"summary": summary, "runs": rows}, indent=2, default=str))
    finally:
        if args.against and len(releases) > 1:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(releases[1][1])],
                           capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
