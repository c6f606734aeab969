"""Where a busy vpay-worker's CPU goes, per no-op job (issue #15). Never a test.

    VPAY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        python bench/worker_cpu.py --jobs 40000 --log-level WARNING

Commits ``--jobs`` due ``test.noop`` jobs, starts the installed
``vpay-worker`` (``--worker-concurrency``, default 5, on the test kinds'
lane), waits for it to start draining, then over a ``--window`` of seconds
(default 6) reads from ``/proc``: the jobs it finished, its user and system
CPU per job (ms), its threads' voluntary and involuntary context switches
per job, and its Postgres backends' CPU per job. Prints one line; run it
twice back to back per build to compare builds (the box's load moves every
figure).

It measures the steady middle of a drain, where ``bench/peers.py`` measures
a whole one beside its peers: use this one to find what a change to the
loop costs or saves, and peers.py for the ratios.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers  # noqa: E402  (the benches' shared helpers)


def user_system(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a local process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / peers.CLK_TCK, int(fields[12]) / peers.CLK_TCK


def switches(pid: int) -> tuple[int, int]:
    """Voluntary and involuntary context switches of all of a process's threads."""
    vol = invol = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        for line in Path(f"/proc/{pid}/task/{task}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol += int(line.split()[1])
    return vol, invol


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=40_000)
    ap.add_argument("--window", type=float, default=6.0, help="seconds measured")
    ap.add_argument("--log-level", default="WARNING")
    ap.add_argument("--concurrency", default="5")
    args = ap.parse_args()
    url = peers.vpay_db(os.environ["VPAY_DATABASE_URL"], "vpay_bench_worker_cpu")
    exe = Path(sys.executable).with_name("vpay-worker")
    env = {**os.environ, "VPAY_DATABASE_URL": url, "VPAY_TEST_HANDLERS": "1",
           "VPAY_LOG_LEVEL": args.log_level}
    with psycopg.connect(url, autocommit=True) as conn:
        peers.insert_noops(conn, args.jobs, "cpu:")
        conn.execute("VACUUM ANALYZE jobs")
        proc = subprocess.Popen([str(exe), "--worker-concurrency", args.concurrency,
                                 *peers.vpay_lanes_flag()], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while conn.execute(peers.VPAY_LEFT).fetchone()[0] >= args.jobs:
                if time.monotonic() > deadline:
                    raise SystemExit("the worker did not start draining")
                time.sleep(0.01)
            time.sleep(0.3)  # past the loops' first claims
            before = (conn.execute(peers.VPAY_LEFT).fetchone()[0], user_system(proc.pid),
                      switches(proc.pid), peers.backends_cpu(conn), time.monotonic())
            time.sleep(args.window)
            after = (conn.execute(peers.VPAY_LEFT).fetchone()[0], user_system(proc.pid),
                     switches(proc.pid), peers.backends_cpu(conn), time.monotonic())
        finally:
            peers.stop(proc)
    done = before[0] - after[0]
    if after[0] == 0 or done <= 0:
        raise SystemExit("the queue ran dry inside the window: more --jobs or a shorter --window")
    per = 1000.0 / done
    pg = f"{(after[3] - before[3]) * per:.3f}" if None not in (before[3], after[3]) else "n/a"
    print(f"rate {done / (after[4] - before[4]):.0f} jobs/s; worker user "
          f"{(after[1][0] - before[1][0]) * per:.3f} + system {(after[1][1] - before[1][1]) * per:.3f}"
          f" ms/job; Postgres backends {pg} ms/job; context switches per job: voluntary "
          f"{(after[2][0] - before[2][0]) / done:.2f}, involuntary {(after[2][1] - before[2][1]) / done:.2f};"
          f" load {peers.load():.2f}")


if __name__ == "__main__":
    main()
