"""Statement import benchmark (never run as a test): lines/s and peak RSS.

    python bench/statements_bench.py                 # 50,000 lines, embedded Postgres under ./.vpay-bench
    python bench/statements_bench.py 50000 1000000   # each size in turn (issue 26's two)
    VPAY_DATABASE_URL=... python bench/statements_bench.py [LINES ...]

Sizes above ``APPLY_UP_TO`` run the dry run only (the issue's goal for
1,000,000 lines: ≤ 25 s and ≤ 300 MB RSS on the 2-core box); peak RSS is the
command's own (``wait4``'s ``ru_maxrss``), process start included; the
ledger is made in a separate process, so the bench's own memory is not
counted (see ``_run``).

Makes a fresh ``vpay_bench_statements`` database with LINES charges on the
MTN rail (default 50,000): 96 % succeeded, 2 % failed (matched by the
statement), 2 % still pending with us (the statement settles them), plus 1 %
more lines naming nothing of ours. Writes the statement in the default
profile and times the installed ``vpay-server statements import`` end to end
(process start, read, match, report): a dry run, then ``--apply`` (records
every line, settles the pending ones with one event each, raises the alerts,
recorded in one transaction, then settled in batches), then the same file
again (already imported).
"""

from __future__ import annotations

import csv
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

import benchdb  # noqa: E402 (bench/ is the script's folder)
from benchdb import fresh  # noqa: E402

HERE = Path(__file__).resolve().parent


def _ledger(url: str, n: int, path: Path) -> dict[str, int]:
    """``n`` charges and their statement; answers how many of each."""
    rows, lines = [], []
    kinds = {"succeeded": 0, "failed": 0, "pending": 0, "unknown": 0}
    for i in range(n):
        status = "failed" if i % 50 == 1 else "pending" if i % 50 == 2 else "succeeded"
        kinds[status] += 1
        ref = str(uuid.uuid4())
        amount = 500 + i % 10_000
        rows.append((f"pi_b{i}", f"ch_b{i}", ref, amount, status))
        rail_says = "FAILED" if status == "failed" else "SUCCESSFUL"
        lines.append([ref, f"{9_000_000_000 + i}" if rail_says == "SUCCESSFUL" else "", f"{amount // 100}.{amount % 100:02d}",
                      "EUR", rail_says, f"2026-11-{1 + i * 29 // n:02d}T12:00:00Z"])
    for i in range(n // 100):
        kinds["unknown"] += 1
        lines.append([str(uuid.uuid4()), f"{8_000_000_000 + i}", "7.00", "EUR", "SUCCESSFUL",
                      "2026-11-15T12:00:00Z"])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO merchants (id) VALUES ('m_bench')")
        with conn.transaction(), conn.cursor() as cur:
            with cur.copy("COPY payment_intents (id, merchant_id, amount, currency, status, created_at) "
                          "FROM STDIN") as copy:
                for pi, _ch, _ref, amount, status in rows:
                    copy.write_row((pi, "m_bench", amount, "EUR",
                                    {"succeeded": "succeeded", "failed": "requires_payment_method"}.get(
                                        status, "processing"), "2026-11-01T00:00:00Z"))
            with cur.copy("COPY charges (id, payment_intent_id, rail, rail_reference, payer, amount, currency, "
                          "status, failure_code, created_at, settled_at) FROM STDIN") as copy:
                for pi, ch, ref, amount, status in rows:
                    copy.write_row((ch, pi, "mtn", ref, "256770000001", amount, "EUR", status,
                                    "APPROVAL_REJECTED" if status == "failed" else None,
                                    "2026-11-01T00:00:00Z",
                                    "2026-11-01T00:01:00Z" if status != "pending" else None))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")  # as autovacuum keeps a live ledger: the import's joins are planned on statistics
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\r\n")
        writer.writerow(["reference", "rail_transaction_id", "amount", "currency", "status", "time"])
        writer.writerows(lines)
    return kinds


APPLY_UP_TO = 100_000


def _timed(url: str, *args: str) -> tuple[float, float, str]:
    """``(seconds, peak RSS in MB, stdout)`` of one ``statements import``."""
    exe = Path(sys.executable).with_name("vpay-server")
    env = {**os.environ, "VPAY_DATABASE_URL": url, "VPAY_LOG_LEVEL": "WARNING"}
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([str(exe), "statements", "import", *args], env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.perf_counter() - started
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(stderr)
    return elapsed, usage.ru_maxrss / 1024, stdout


def main() -> None:
    if sys.argv[1:2] == ["--with-worker"]:
        _with_worker(int(sys.argv[2]) if len(sys.argv) > 2 else 6000)
        return
    for n in [int(a) for a in sys.argv[1:]] or [50_000]:
        _run(n)


CLAIMS = """
CREATE TABLE bench_claims (merchant text, claimed_at timestamptz, lateness float8);
CREATE FUNCTION bench_keep_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.kind = 'poll' AND NEW.locked_at IS NOT NULL AND OLD.locked_at IS NULL THEN
    INSERT INTO bench_claims
    SELECT i.merchant_id, NEW.locked_at, extract(epoch FROM NEW.locked_at - OLD.run_at)
      FROM charges c JOIN payment_intents i ON i.id = c.payment_intent_id
     WHERE c.id = NEW.payload ->> 'charge_id';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER bench_keep_claim AFTER UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION bench_keep_claim();
"""


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))] if ordered else float("nan")


def _with_worker(settles: int, calm_rate: float = 4.0, before_seconds: float = 10.0) -> None:
    """Issue 26, input 5: a real ``vpay-worker`` (2 claim loops) polls the
    sandbox MoMo rail (real HTTP, in this process) while ``statements import
    --apply`` settles ``settles`` charges of merchant ``m_big``, whose polls
    are all due at once when the import starts (the worker and the batches
    race for them). Merchant ``m_calm`` makes ``calm_rate`` payments a
    second throughout; its polls' lateness (claimed minus due, from a
    trigger on ``jobs``) is reported for ``before_seconds`` without an
    import, and while the import runs."""
    import threading

    from vpay.base import db as vdb
    from vpay.money import payments
    from vpay.money.merchants import create_merchant
    from vpay.rails.mtn import MtnMomo
    from vpay.sandbox.mtn.rail import SandboxRail

    url = fresh(benchdb.server(), "vpay_bench_statements_worker", CLAIMS)
    with SandboxRail(success_after_seconds=0.2) as rail, psycopg.connect(url, autocommit=True) as conn, \
            tempfile.TemporaryDirectory() as tmp:
        rail_env = {"VPAY_MTN_BASE_URL": rail.url, "VPAY_MTN_SUBSCRIPTION_KEY": rail.subscription_key,
                    "VPAY_MTN_API_USER": rail.api_user, "VPAY_MTN_API_KEY": rail.api_key,
                    "VPAY_MTN_TARGET_ENVIRONMENT": rail.target_environment}
        adapter = MtnMomo.from_env(rail_env)
        pool = vdb.make_pool(url, max_size=8)
        for m in ("m_big", "m_calm"):
            create_merchant(conn, m, m)

        def pay(merchant: str, payer: str) -> dict:
            return payments.create_and_submit(pool, lambda code: adapter, merchant_id=merchant, amount=2500,
                                              currency="EUR", rail="mtn", payer=payer)["charge"]
        from concurrent.futures import ThreadPoolExecutor
        started = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:
            big = list(ex.map(lambda i: pay("m_big", f"2567701{i:05d}"), range(settles)))
        conn.execute("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE dedupe_key = ANY(%s)",
                     ([f"poll:{c['id']}" for c in big],))
        print(f"{settles} charges of m_big made through the sandbox in {time.perf_counter() - started:.1f} s")
        path = Path(tmp) / "big.csv"
        at = conn.execute("SELECT to_char(now() AT TIME ZONE 'UTC' - interval '5 minutes', "
                          "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')").fetchone()[0]
        with path.open("w", newline="") as f:
            writer = csv.writer(f, lineterminator="\r\n")
            writer.writerow(["reference", "rail_transaction_id", "amount", "currency", "status", "time"])
            writer.writerows([c["rail_reference"], "", "25.00", "EUR", "SUCCESSFUL", at] for c in big)
        exe = Path(sys.executable).with_name
        from vpay.base.secretbox import new_key
        env = {"VPAY_SECRET_KEYS": new_key(), **os.environ, "VPAY_DATABASE_URL": url, "VPAY_LOG_LEVEL": "WARNING",
               **rail_env}
        worker_log = open(Path(tmp) / "worker.log", "wb")
        worker = subprocess.Popen([str(exe("vpay-worker")), "--worker-concurrency", "2"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=worker_log)
        time.sleep(2)
        if worker.poll() is not None:
            raise SystemExit(f"vpay-worker exited: {(Path(tmp) / 'worker.log').read_text()}")
        stop = threading.Event()

        def calm() -> None:
            i = 0
            with psycopg.connect(url, autocommit=True) as own:
                while not stop.wait(1 / calm_rate):
                    charge = pay("m_calm", f"2567702{i:05d}")
                    # due at once (not at the ladder's first rung): every payment is a measured poll
                    own.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s", (f"poll:{charge['id']}",))
                    i += 1
        thread = threading.Thread(target=calm, daemon=True)
        thread.start()
        try:
            time.sleep(before_seconds)
            t0 = conn.execute("SELECT now()").fetchone()[0]
            conn.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = ANY(%s)",
                         ([f"poll:{c['id']}" for c in big],))
            elapsed, rss, out = _timed(url, str(path), "--rail", "mtn", "--apply")
            t1 = conn.execute("SELECT now()").fetchone()[0]
            time.sleep(3)  # the polls due just before the end are claimed
        finally:
            stop.set()
            thread.join(10)
            worker.terminate()
            worker.wait(30)
            worker_log.close()
            pool.close()
        print(f"--apply of {settles} lines: {elapsed:.2f} s, peak RSS {rss:.0f} MB")
        print("\n".join(out.splitlines()[2:6]))
        for label, (a, b) in (("before (no import)", (None, t0)), ("during the --apply", (t0, t1))):
            late = [r[0] for r in conn.execute(
                "SELECT lateness FROM bench_claims WHERE merchant = 'm_calm' AND (%s::timestamptz IS NULL "
                "OR claimed_at >= %s) AND claimed_at < %s", (a, a, b))]
            print(f"m_calm poll lateness {label:<20}: n {len(late):4}  p50 {_pct(late, 50):.3f} s  "
                  f"p99 {_pct(late, 99):.3f} s  max {max(late, default=float('nan')):.3f} s")
        big_late = [r[0] for r in conn.execute(
            "SELECT lateness FROM bench_claims WHERE merchant = 'm_big' AND claimed_at >= %s", (t0,))]
        settled = conn.execute("SELECT count(*) FROM settlement_evidence").fetchone()[0]
        events = conn.execute("SELECT count(*), count(DISTINCT payment_intent_id) FROM events "
                              "WHERE type = 'payment_intent.succeeded'").fetchone()
        print(f"m_big: {settled} settled by the statement, {settles - settled} by their polls "
              f"({len(big_late)} polls claimed during the import); succeeded events {events[0]} "
              f"for {events[1]} intents")


def _run(n: int) -> None:
    url = fresh(benchdb.server(), "vpay_bench_statements")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "statement.csv"
        # In a process of its own: a child's peak RSS (wait4) counts the image
        # it was forked from until its exec (Linux keeps the old image's
        # high-water mark), so a bench holding a million rows would report
        # them as the import's.
        with multiprocessing.get_context("spawn").Pool(1) as helper:
            kinds = helper.apply(_ledger, (url, n, path))
        lines = n + kinds["unknown"]
        print(f"ledger: {kinds}; statement: {lines} lines, {path.stat().st_size / 1e6:.1f} MB")
        runs = (("dry run", ()), ("--apply", ("--apply",)), ("same file again", ("--apply",)))
        for label, args in runs if n <= APPLY_UP_TO else runs[:1]:
            elapsed, rss, out = _timed(url, str(path), "--rail", "mtn", *args)
            print(f"{label:<16} {elapsed:6.2f} s  {lines / elapsed:>9,.0f} lines/s  peak RSS {rss:6.0f} MB "
                  "(process start included)")
            if label == "--apply":
                print("\n".join(out.splitlines()[2:10]))
    with psycopg.connect(url, autocommit=True) as conn:
        events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        pending = conn.execute("SELECT count(*) FROM charges WHERE status = 'pending'").fetchone()[0]
    print(f"after: {events} events written (one per settled charge), {pending} charges still pending")


if __name__ == "__main__":
    main()
