"""What dead row versions cost a claim, and what one vacuum gives back (issue #15,
"Churn"; docs/performance.md). Never a test.

    python bench/claim_pages.py                 # the embedded Postgres under ./.vpay-bench
    VPAY_DATABASE_URL=... python bench/claim_pages.py

On a fresh database with autovacuum off for ``jobs``: 100,000 due no-op jobs,
then batches of claims and finishes on one connection (``claim_lane``, with
the fenced finish of the previous job and without, as a busy loop sends it)
with no vacuum between, and after each batch the index pages one claim reads
(``EXPLAIN (ANALYZE, BUFFERS)`` of ``claim_lane`` with nothing to finish,
rolled back); then one ``vacuum_jobs`` (the worker's own statement, timed)
and a last batch. Twice: with every job's ``run_at`` the same (as
bench/peers.py inserts them: the btree deduplicates equal keys) and with
distinct ``run_at`` (as real jobs have).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402

BATCHES = (2_000, 9_000, 12_000, 32_000)
"""Jobs finished per batch: 2,000, 11,000, 23,000, 55,000 since the vacuum."""


def pages_per_claim(conn) -> int:
    """Shared buffers one ``claim_lane`` with nothing to finish touches (the
    top plan node's)."""
    from vpay.base.queries import Q
    text = Q["claim_lane"].replace("%(worker)s", "'bench'").replace("%(lease)s", "300") \
                          .replace("%(lane)s", "'housekeeping'") \
                          .replace("%(id)s", "NULL").replace("%(token)s", "NULL") \
                          .replace("%(new_token)s", "gen_random_uuid()")
    with conn.transaction(force_rollback=True):
        plan = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + text)]
    line = next(l for l in plan if "Buffers:" in l)
    return sum(int(part.split("=")[1]) for part in line.split(":")[1].split()
               if part.startswith(("hit=", "read=")))


def finish(conn, n: int) -> None:
    """Claim and finish ``n`` jobs as a busy claim loop does."""
    from vpay.engine import queue
    job = None
    for _ in range(n):
        if job is None:
            job, _ = queue.claim_or_next_due(conn, "bench", 300.0, ["housekeeping"])
        else:
            _, job, _ = queue.finish_and_claim(conn, job, 300.0, ["housekeeping"])
    if job is not None:
        queue.finish(conn, job)


def run(server: str, distinct: bool) -> None:
    from vpay.base.queries import Q
    url = peers.vpay_db(server, "vpay_bench_claim_pages")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        run_at = "now() - (100000 - g) * interval '1 millisecond'" if distinct else "now()"
        conn.execute("INSERT INTO jobs (kind, lane, dedupe_key, run_at) SELECT 'test.noop', "
                     f"'housekeeping', 'pages:' || g, {run_at} FROM generate_series(1, 100000) g")
        conn.execute("VACUUM ANALYZE jobs")
        done = 0
        row = []
        for n in BATCHES:
            finish(conn, n)
            done += n
            row.append(f"{done:,} finished: {pages_per_claim(conn)}")
        started = time.monotonic()
        conn.execute(Q["vacuum_jobs"])
        seconds = time.monotonic() - started
        finish(conn, BATCHES[0])
        row.append(f"vacuum {seconds * 1000:.0f} ms, then {BATCHES[0]:,} finished: {pages_per_claim(conn)}")
    label = "distinct run_at" if distinct else "same run_at"
    print(f"{label:16}  " + "  |  ".join(row), flush=True)


def main() -> None:
    url = os.environ.get("VPAY_DATABASE_URL", "").strip()
    server = url or peers.embedded_server()
    print(f"# index pages one claim reads; load={peers.load()}", flush=True)
    for distinct in (False, True):
        run(server, distinct)


if __name__ == "__main__":
    main()
