"""Statements II (issue 26), input 5 with real processes: the installed
``vpay-worker`` polls the sandbox MoMo rail (a real HTTP server in this
process) while the installed ``vpay-server statements import --apply``
settles a large statement of another merchant's charges.

The worker and the import race for the same charges (their polls are due
while the batches run): each must end settled exactly once. An unrelated
merchant's charges, due while the batches run, are read and settled before
the import ends. How late those polls are is measured, not asserted here
(``bench/statements_bench.py --with-worker``; docs/performance.md).

How the test knows the import has not ended, without timing anything: one
of the statement's charges is held locked from the start (its poll parked),
so the import cannot finish its batches; once the statement is recorded its
row is held too, so the import cannot record its end. Both are let go only
after the other merchant's charges are settled.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess

import psycopg
import pytest

from support import base_env, rail_env, script, wait_until
from vpay.money import payments
from vpay.rails.mtn import MtnMomo

pytestmark = pytest.mark.slow

SETTLES = 600
"""The statement's charges (12 batches of ``importer.BATCH_SETTLES``). The
issue's 6,000 is the bench's (``statements_bench.py --with-worker``): here
it would take minutes to make them through the rail."""


def _park(db, charges: list[dict]) -> None:
    db.execute("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE dedupe_key = ANY(%s)",
               ([f"poll:{c['id']}" for c in charges],))


def _due(db, charges: list[dict]) -> None:
    db.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = ANY(%s)", ([f"poll:{c['id']}" for c in charges],))


def _statement(tmp_path, charges: list[dict], at: str) -> str:
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(("reference", "rail_transaction_id", "amount", "currency", "status", "time"))
    for c in charges:
        writer.writerow((c["rail_reference"], "", "25.00", "EUR", "SUCCESSFUL", at))
    path = tmp_path / "big.csv"
    path.write_bytes(buf.getvalue().encode())
    return str(path)


def test_a_worker_keeps_polling_another_merchants_charges_while_an_apply_settles_a_large_statement(
        db, db_url, pool, merchant, sandbox, spawn, tmp_path):
    from vpay.money.merchants import create_merchant
    create_merchant(db, "m_other", "Another merchant")
    adapter = MtnMomo.from_env(rail_env(sandbox))

    def pay(merchant_id: str, n: int, first_payer: int) -> list[dict]:
        return [payments.create_and_submit(pool, lambda code: adapter, merchant_id=merchant_id, amount=2500,
                                           currency="EUR", rail="mtn", payer=f"2567701{first_payer + i:05d}")["charge"]
                for i in range(n)]

    big = pay(merchant, SETTLES, 0)
    other = pay("m_other", 3, 90_000)
    _park(db, big + other)
    held, racing = big[0], big[1:]
    at = db.execute("SELECT to_char(now() AT TIME ZONE 'UTC' - interval '5 minutes', "
                    "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')").fetchone()[0]
    path = _statement(tmp_path, big, at)
    wait_until(lambda: all((sandbox.transaction(c["rail_reference"]) or {}).get("status") == "SUCCESSFUL"
                           for c in (big[-1], other[-1])), what="the rail to call the payments successful")

    worker = spawn("vpay-worker", "--idle-sleep", "0.1", "--worker-concurrency", "2",
                   env=base_env(db_url, **rail_env(sandbox)))
    worker.wait_for_log("worker started")
    with psycopg.connect(db_url) as charge_holder, psycopg.connect(db_url) as statement_holder:
        charge_holder.execute("SELECT 1 FROM charges WHERE id = %s FOR NO KEY UPDATE", (held["id"],))
        apply = subprocess.Popen([script("vpay-server"), "statements", "import", path, "--rail", "mtn",
                                  "--apply", "--json"], env=base_env(db_url), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            _due(db, racing)  # the worker and the batches race for the same charges
            statement_id = wait_until(
                lambda: (db.execute("SELECT id FROM statements").fetchone() or [None])[0],
                timeout=120, what="the statement to be recorded")
            statement_holder.execute("SELECT 1 FROM statements WHERE id = %s FOR NO KEY UPDATE", (statement_id,))
            _due(db, other)  # an unrelated merchant's polls, due while the batches run
            wait_until(lambda: db.execute("SELECT count(*) FROM charges WHERE id = ANY(%s) AND status = 'succeeded'",
                                          ([c["id"] for c in other],)).fetchone()[0] == len(other),
                       timeout=120, what="the other merchant's charges to be read and settled")
            assert apply.poll() is None, "the import was still running when the other merchant's polls were read"
            assert db.execute("SELECT completed_at FROM statements").fetchone()[0] is None
        finally:
            charge_holder.rollback()
            statement_holder.rollback()
        out, err = apply.communicate(timeout=120)
    assert apply.returncode == 0, err
    report = json.loads(out)
    outcomes = {k: v["count"] for k, v in report["summary"].items()}
    assert report["completed"] and set(outcomes) <= {"settled", "matched"}, outcomes
    assert outcomes.get("settled", 0) + outcomes.get("matched", 0) == SETTLES
    # Each charge settled exactly once, by whichever came first: one event, at most one evidence row.
    assert db.execute("SELECT count(*) FROM charges WHERE id = ANY(%s) AND status = 'succeeded'",
                      ([c["id"] for c in big],)).fetchone()[0] == SETTLES
    events = db.execute("SELECT count(*), count(DISTINCT payment_intent_id) FROM events "
                        "WHERE type = 'payment_intent.succeeded'").fetchone()
    assert events[0] == events[1] == SETTLES + len(other)
    assert db.execute("SELECT count(*) FROM settlement_evidence").fetchone()[0] == outcomes.get("settled", 0)
    # The other merchant's charges were settled by their polls before the import ended.
    completed = db.execute("SELECT completed_at FROM statements").fetchone()[0]
    assert db.execute("SELECT max(settled_at) FROM charges WHERE id = ANY(%s)",
                      ([c["id"] for c in other],)).fetchone()[0] < completed
    assert not worker.find("handler raised")
