"""Queue benchmarks (never run as tests): claim latency and throughput.

    python bench/queue_bench.py            # embedded Postgres under ./.vpay-bench
    VPAY_DATABASE_URL=... python bench/queue_bench.py

1. Claim latency (design page, "The poll ladder": "the last of a backlog of
   eight was claimed 1.028 s after it committed at worst"): one idle worker
   (--idle-sleep 1.0, 4 loops); eight jobs committed at once; the seconds
   from that commit to each claim, measured by the database's clock
   (``locked_at - created_at``).
2. Throughput: 2 worker processes x 5 loops over N no-op jobs
   (``test.count``), jobs per second from the first claim to the queue
   being empty.

The test kinds live in the ``housekeeping`` lane (vpay/engine/lanes.py), so the
workers run with ``--queues housekeeping``: every loop claims them, through
the per-lane claim (``claim_lane``), as a one-lane replica would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

import benchdb  # noqa: E402 (bench/ is the script's folder)
from benchdb import fresh  # noqa: E402

HERE = Path(__file__).resolve().parent
TEST_EXECUTIONS = "CREATE TABLE test_executions (job_key text NOT NULL, worker text NOT NULL)"


def _worker(url: str, *args: str) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("vpay-worker")
    env = {**os.environ, "VPAY_DATABASE_URL": url, "VPAY_TEST_HANDLERS": "1", "VPAY_LOG_LEVEL": "WARNING"}
    return subprocess.Popen([str(exe), *args], env=env, stdout=subprocess.DEVNULL)


def _wait_empty(conn, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while conn.execute("SELECT count(*) FROM jobs WHERE kind = 'test.count'").fetchone()[0]:
        if time.monotonic() > deadline:
            raise SystemExit("queue did not drain")
        time.sleep(0.02)


def claim_latency(server: str, rounds: int = 10) -> None:
    url = fresh(server, "vpay_bench_latency", TEST_EXECUTIONS)
    # Test kinds live in the housekeeping lane: serve only it, so every loop claims them.
    proc = _worker(url, "--worker-concurrency", "4", "--idle-sleep", "1.0", "--queues", "housekeeping")
    worst = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE claim_latency (job_key text, seconds float8)")
            conn.execute("CREATE OR REPLACE FUNCTION keep_claim() RETURNS trigger LANGUAGE plpgsql AS $$ "
                         "BEGIN IF NEW.locked_at IS NOT NULL THEN INSERT INTO claim_latency "
                         "VALUES (NEW.dedupe_key, extract(epoch FROM NEW.locked_at - NEW.created_at)); "
                         "END IF; RETURN NEW; END $$")
            conn.execute("CREATE TRIGGER keep_claim AFTER UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION keep_claim()")
            time.sleep(2)  # let the worker boot and go idle
            for r in range(rounds):
                conn.execute("TRUNCATE claim_latency")
                with conn.transaction():
                    for i in range(8):
                        conn.execute("INSERT INTO jobs (kind, lane, dedupe_key) "
                                     "VALUES ('test.count', 'housekeeping', %s)",
                                     (f"lat:{r}:{i}",))
                _wait_empty(conn)
                lat = [s for (s,) in conn.execute("SELECT seconds FROM claim_latency")]
                worst.append(max(lat))
                time.sleep(1.3)  # land the next backlog at a random point of the idle sleep
    finally:
        proc.terminate()
        proc.wait(60)
    print(f"claim latency, backlog of 8 on an idle worker (idle-sleep 1.0 s), {rounds} rounds: "
          f"worst {max(worst):.3f} s, median of worsts {sorted(worst)[len(worst) // 2]:.3f} s")


def throughput(server: str, n: int = 10_000) -> None:
    url = fresh(server, "vpay_bench_throughput", TEST_EXECUTIONS)
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO jobs (kind, lane, dedupe_key) VALUES ('test.count', 'housekeeping', %s)",
                            [(f"t:{i}",) for i in range(n)])
        started = time.monotonic()
        procs = [_worker(url, "--worker-concurrency", "5", "--idle-sleep", "0.1", "--queues", "housekeeping")
                 for _ in range(2)]
        try:
            _wait_empty(conn)
            elapsed = time.monotonic() - started
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(60)
        done, distinct = conn.execute("SELECT count(*), count(DISTINCT job_key) FROM test_executions").fetchone()
    print(f"throughput, 2 processes x 5 loops, {n} jobs: {n / elapsed:.0f} jobs/s "
          f"({elapsed:.1f} s incl. boot); executions {done}, distinct {distinct}")


if __name__ == "__main__":
    server = benchdb.server()
    claim_latency(server)
    throughput(server)
