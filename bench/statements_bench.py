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
    for n in [int(a) for a in sys.argv[1:]] or [50_000]:
        _run(n)


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
