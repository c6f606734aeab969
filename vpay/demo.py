"""``vpay-server demo``: the main job, end to end, on one machine.

It starts the sandbox MoMo rail on a free loopback port, makes a fresh
``vpay_demo`` database on the embedded Postgres (or on the server of
``VPAY_DATABASE_URL``; it never writes into that URL's own database),
creates a batch of payments across the sandbox's behaviours, runs the real
``vpay-worker`` as a child process, shows live progress, and prints a table.
It exits 0 only if every charge ended as the sandbox scripted it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

DEMO_DB = "vpay_demo"


@dataclass(frozen=True)
class Scenario:
    """One payment of the batch: what the sandbox is told to do, and the
    state vpay must reach (``pending`` = still polling at the end, as for
    MoMo's not-final ONGOING / PAYER_DELAYED)."""

    label: str
    payer: str
    expect: str
    reason: str | None = None
    script: dict[str, Any] | None = None


SCENARIOS: tuple[Scenario, ...] = (
    *(Scenario("approves", f"25677000010{i}", "succeeded") for i in range(8)),
    Scenario("declines on the phone", "46733123451", "failed", "APPROVAL_REJECTED"),
    Scenario("lets the prompt expire", "46733123452", "failed", "EXPIRED"),
    Scenario("unknown payer", "46733123455", "failed", "PAYER_NOT_FOUND"),
    Scenario("did not approve in time", "46733123463", "failed", "COULD_NOT_PERFORM_TRANSACTION"),
    Scenario("rail internal error", "46733123450", "failed", "INTERNAL_PROCESSING_ERROR"),
    Scenario("rail says ONGOING: not final", "46733123453", "pending"),
    Scenario("rail says PAYER_DELAYED: not final", "46733123454", "pending"),
    Scenario("approves after 2 pending reads", "256770000201", "succeeded",
             script={"pending_reads": 2, "outcome": "SUCCESSFUL"}),
    Scenario("declines after 1 pending read", "256770000202", "failed", "APPROVAL_REJECTED",
             script={"pending_reads": 1, "outcome": "FAILED", "reason": "APPROVAL_REJECTED"}),
    Scenario("status read answers 500, then 503", "256770000203", "succeeded",
             script={"status_errors": [500, 503], "pending_reads": 0, "outcome": "SUCCESSFUL"}),
    Scenario("request-to-pay lost: resubmitted", "256770000204", "succeeded",
             script={"rtp_errors": [500]}),
)


def _database(server_url: str) -> str:
    """A fresh ``vpay_demo`` database on ``server_url``'s server, migrated."""
    from .db import connect, migrate
    admin_url = psycopg.conninfo.make_conninfo(server_url, dbname="postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DEMO_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DEMO_DB)))
    url = psycopg.conninfo.make_conninfo(server_url, dbname=DEMO_DB)
    with connect(url) as conn:
        migrate(conn)
    return url


def _console(name: str) -> list[str]:
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from vpay.cli import worker_main; sys.exit(worker_main())"]


def _counts(conn, ids: list[str]) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM charges WHERE id = ANY(%s) GROUP BY 1", (ids,)).fetchall()
    return dict(rows)


def run(*, deadline_seconds: float, out=sys.stdout) -> int:
    """Run the demo; answers the process exit code (0 = every charge as scripted)."""
    from .db import database_url, make_pool
    from .merchants import create_merchant
    from .payments import create_and_submit
    from .rails.mtn import MtnMomo
    from .rails.sandbox import SandboxRail

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    # The live view is the demo's output; per-request rail lines would drown it.
    logging.getLogger("vpay.rails.sandbox").setLevel(logging.WARNING)
    started = time.monotonic()
    server = database_url()
    url = _database(server)
    data_dir = Path(os.environ.get("VPAY_DATA_DIR", "./.vpay")).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    worker_log = data_dir / "demo-worker.log"

    rail = SandboxRail(success_after_seconds=3.0).start()
    for s in SCENARIOS:
        if s.script:
            rail.script(s.payer, **s.script)
    rail_env = {"VPAY_MTN_BASE_URL": rail.url, "VPAY_MTN_SUBSCRIPTION_KEY": rail.subscription_key,
                "VPAY_MTN_API_USER": rail.api_user, "VPAY_MTN_API_KEY": rail.api_key,
                "VPAY_MTN_TARGET_ENVIRONMENT": rail.target_environment}
    say(f"vpay demo: sandbox MoMo rail at {rail.url}, database {DEMO_DB} "
        f"({'VPAY_DATABASE_URL' if os.environ.get('VPAY_DATABASE_URL') else 'embedded, ' + str(data_dir)})")

    pool = make_pool(url, max_size=3)
    worker = None
    try:
        with pool.connection() as conn:
            create_merchant(conn, "demo", "Demo merchant")
        adapter = MtnMomo.from_env(rail_env)
        batch: list[tuple[Scenario, dict[str, Any]]] = []
        for i, s in enumerate(SCENARIOS):
            created = create_and_submit(pool, lambda code: adapter, merchant_id="demo",
                                        amount=1000 + 50 * i, currency="EUR", rail="mtn",
                                        payer=s.payer, description=f"demo {i + 1}: {s.label}")
            batch.append((s, created["charge"]))
        ids = [c["id"] for _, c in batch]
        say(f"created {len(batch)} payments; starting vpay-worker (log: {worker_log})")

        env = {**os.environ, **rail_env, "VPAY_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
        with open(worker_log, "wb") as log_file:
            worker = subprocess.Popen(_console("vpay-worker") + ["--worker-concurrency", "4"],
                                      env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
        expected_final = sum(1 for s, _ in batch if s.expect != "pending")
        deadline = time.monotonic() + deadline_seconds
        last = ""
        while True:
            with pool.connection() as conn:
                counts = _counts(conn, ids)
            terminal = counts.get("succeeded", 0) + counts.get("failed", 0)
            line = (f"  t={time.monotonic() - started:5.1f}s  pending {counts.get('pending', 0):2d}  "
                    f"succeeded {counts.get('succeeded', 0):2d}  failed {counts.get('failed', 0):2d}  "
                    f"rail requests {len(rail.requests_log()):3d}")
            if line[12:] != last:
                say(line)
                last = line[12:]
            if terminal >= expected_final or time.monotonic() > deadline:
                break
            if worker.poll() is not None:
                say(f"vpay-worker exited early with {worker.returncode}; see {worker_log}")
                break
            time.sleep(1.0)

        worker.send_signal(signal.SIGTERM)
        worker_rc = worker.wait(60)
        return _report(say, pool, rail, batch, worker_rc, time.monotonic() - started)
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        pool.close()
        rail.stop()


def _report(say, pool, rail, batch, worker_rc: int, elapsed: float) -> int:
    with pool.connection() as conn:
        rows = {r[0]: r for r in conn.execute(
            "SELECT id, status, failure_code, EXTRACT(EPOCH FROM settled_at - created_at) "
            "FROM charges WHERE id = ANY(%s)", ([c["id"] for _, c in batch],)).fetchall()}
        events = conn.execute("SELECT count(*) FROM events e JOIN charges c "
                              "ON c.payment_intent_id = e.payment_intent_id "
                              "WHERE c.id = ANY(%s)", ([c["id"] for _, c in batch],)).fetchone()[0]
    say("")
    say(f"{'charge':<28} {'payer':<13} {'scenario':<36} {'status':<10} {'reason':<30} "
        f"{'polls':>5} {'settle s':>8}  ok")
    good = 0
    for s, c in batch:
        _, status, reason, secs = rows[c["id"]]
        polls = rail.count(method="GET", reference=c["rail_reference"])
        ok = status == s.expect and (reason == s.reason)
        good += ok
        say(f"{c['id']:<28} {s.payer:<13} {s.label:<36} {status:<10} {reason or '-':<30} "
            f"{polls:>5} {(f'{secs:.1f}' if secs is not None else '-'):>8}  {'yes' if ok else 'NO'}")
    requests = rail.requests_log()
    by_kind = {
        "token": sum(1 for r in requests if r["path"].startswith("/collection/token")),
        "request-to-pay": sum(1 for r in requests if r["method"] == "POST" and "requesttopay" in r["path"]),
        "status": sum(1 for r in requests if r["method"] == "GET"),
    }
    say("")
    say(f"rail requests: {len(requests)} ({', '.join(f'{k} {v}' for k, v in by_kind.items())}); "
        f"events written: {events}; worker drained with exit {worker_rc}; {elapsed:.0f}s in all")
    ok = good == len(batch) and worker_rc == 0
    say(f"{good}/{len(batch)} charges ended as the sandbox scripted them: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1
