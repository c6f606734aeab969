"""The runbooks, followed as written against a live deployment.

Every fenced ``sh`` and ``sql`` block of ``docs/runbooks/*.md`` is run as it
stands (``sh`` with bash, ``sql`` with ``psql "$VPAY_DATABASE_URL"``) against
a real Postgres, the real ``vpay-server api``, the sandbox MoMo rail and the
real ``vpay-worker``, after the situation its section treats was produced
the way production would produce it: a webhook delivery that gave up (a real
dead letter), a worker killed with SIGKILL while it held a lease, a charge
pending past the 24-hour horizon, a rail that contradicts a settled charge.
Each test then checks the block found the situation, or fixed it.

Time is moved the way the other tests move it (``run_at`` made due,
``created_at`` aged), never by sleeping.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from api_support import api_stack, new_key, stack  # noqa: F401  (fixtures)
from support import TimeMachine, script, wait_until
from vpay import webhooks

pytestmark = pytest.mark.slow

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
FENCE = re.compile(r"^```(sh|sql)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def runbook_blocks() -> list[tuple[str, str, str, str]]:
    """``[(file, section, lang, text)]`` of every fenced sh/sql block; the
    section is the ``## `` heading above it ("" before the first)."""
    found = []
    for path in sorted(RUNBOOKS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            before = text[:match.start()]
            headings = re.findall(r"^## (.+)$", before, re.MULTILINE)
            found.append((path.name, headings[-1].strip() if headings else "", match.group(1),
                          match.group(2)))
    return found


def section(name: str, heading: str) -> list[tuple[str, str]]:
    blocks = [(lang, text) for f, h, lang, text in runbook_blocks() if (f, h) == (name, heading)]
    assert blocks, f"{name} has no block under {heading!r}"
    return blocks


def run_block(lang: str, text: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """One block as an operator runs it (in ``cwd``, where the files it names
    are); it must succeed."""
    if lang == "sh":
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", text], env=env, capture_output=True,
                             text=True, timeout=120, cwd=cwd)
    else:
        res = subprocess.run(["psql", env["VPAY_DATABASE_URL"], "-X", "-v", "ON_ERROR_STOP=1",
                              "-P", "pager=off", "-f", "-"], input=text, env=env, capture_output=True,
                             text=True, timeout=120)
    assert res.returncode == 0, f"{lang} block failed ({res.returncode}):\n{text}\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr
    return res


def operator_env(stack) -> dict[str, str]:
    """The operator's shell: the deployment's environment, the installed
    scripts and psql (the system's, else the embedded Postgres's) on PATH."""
    import pgserver
    env = stack.env()
    bin_dir = str(Path(script("vpay-server")).parent)
    pg_bin = str(Path(pgserver.__file__).parent / "pginstall" / "bin")
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}:{pg_bin}"
    return env


def start_worker(spawn, stack, *args: str, **env: str):
    worker = spawn("vpay-worker", "--idle-sleep", "0.1", *args, env={**stack.env(), **env})
    worker.wait_for_log("worker started", timeout=60)
    return worker


def pay(db, stack, payer: str) -> dict:
    """A payment made through the API, as a merchant makes one: its charge row."""
    resp = stack.create(new_key(db), payer=payer)
    assert resp.status_code == 201, resp.text
    row = db.execute("SELECT id, rail_reference, payment_intent_id FROM charges "
                     "WHERE payment_intent_id = %s", (resp.json()["id"],)).fetchone()
    return dict(zip(("id", "rail_reference", "intent"), row))


def status(db, charge_id: str) -> str:
    return db.execute("SELECT status FROM charges WHERE id = %s", (charge_id,)).fetchone()[0]


# ---- each situation, produced for real, then the runbook's blocks ---------

def test_fleet_health(db, stack, spawn):
    env = operator_env(stack)
    charge = pay(db, stack, "46733123453")  # ONGOING for ever: its poll stays queued
    start_worker(spawn, stack)
    wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE kind IN ('scan', 'sweep')").fetchone()[0] == 2,
               timeout=60, what="the worker's hourly jobs")
    [(_, text)] = section("worker-queue.md", "Is the fleet healthy?")
    out = run_block("sql", text, env).stdout
    cells = [[c.strip() for c in line.split("|")] for line in out.splitlines() if line.count("|") == 5]
    rows = {(lane, kind): counts for lane, kind, *counts in cells}
    assert rows[("lane", "kind")] == ["due", "leased", "stranded", "dead"]
    assert {("mtn", "poll"), ("housekeeping", "scan"), ("housekeeping", "sweep")} <= set(rows)
    assert charge


def test_a_dead_lettered_delivery_is_found_and_retried(db, stack, spawn):
    from test_webhooks import Receiver, Reply
    env = operator_env(stack)
    receiver = Receiver()
    try:
        # the endpoint first: an event is sent to the endpoints enabled when it
        # is written (docs/webhooks.md, "Who gets an event")
        from api_support import MERCHANT
        new_key(db)  # creates the API's merchant
        endpoint = webhooks.add_endpoint(db, MERCHANT, receiver.url("/hooks"), permit_private=True)
        charge = pay(db, stack, "256770000001")
        assert db.execute("SELECT merchant_id FROM payment_intents WHERE id = %s",
                          (charge["intent"],)).fetchone()[0] == MERCHANT
        # the receiver is broken for every attempt of the schedule, then fixed
        receiver.script("/hooks", *[Reply(500) for _ in range(2 * webhooks.MAX_ATTEMPTS)])
        start_worker(spawn, stack, VPAY_WEBHOOKS_ALLOW_PRIVATE="1")
        with TimeMachine(stack.db_url, kinds=("poll", "deliver")):
            wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE run_at = 'infinity'").fetchone()[0] == 2,
                       timeout=120, what="both deliveries to give up")
        dead = {r[0] for r in db.execute("SELECT dedupe_key FROM jobs WHERE run_at = 'infinity'")}
        assert all(k.startswith("deliver:") and k.endswith(endpoint["id"]) for k in dead)
        receiver.script("/hooks")  # the cause is fixed: it answers 200 again

        find, retry = section("worker-queue.md", "A dead-lettered job")
        listed = run_block(*find, env).stdout
        assert all(k in listed for k in dead) and "gave up after 10 attempts" in listed
        assert listed.count("job_dead_lettered") == 2  # their alerts
        done = run_block(*retry, env)
        assert done.stderr.count("operator retried a dead letter") == 2
        wait_until(lambda: db.execute("SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'")
                   .fetchone()[0] == 2, timeout=60, what="both events delivered after the retry")
        assert db.execute("SELECT count(*) FROM jobs WHERE run_at = 'infinity'").fetchone() == (0,)
        assert db.execute("SELECT count(*), count(*) FILTER (WHERE note LIKE 'cause fixed%%') FROM alerts "
                          "WHERE kind = 'job_dead_lettered' AND acknowledged_at IS NOT NULL").fetchone() == (2, 2)
    finally:
        receiver.close()


def test_a_killed_workers_stranded_lease_is_found_and_released(db, stack, spawn):
    env = operator_env(stack)
    stack.rail.script("256770000301", status_delay_seconds=8, outcome="SUCCESSFUL")
    charge = pay(db, stack, "256770000301")
    key = f"poll:{charge['id']}"
    worker = start_worker(spawn, stack, "--lease-seconds", "2")

    def read_in_flight():
        return any(e["method"] == "GET" and e["status_code"] is None and e["reference"] == charge["rail_reference"]
                   for e in stack.rail.requests_log())
    with TimeMachine(stack.db_url, kinds=("poll",)):
        wait_until(read_in_flight, timeout=60, what="a status read inside the rail")
    worker.signal(signal.SIGKILL)
    assert worker.wait(10) == -signal.SIGKILL
    wait_until(lambda: db.execute("SELECT lease_expires_at < now() FROM jobs WHERE dedupe_key = %s",
                                  (key,)).fetchone()[0], timeout=30, what="the dead worker's lease to expire")

    find_cmd, find_sql, release = section("worker-queue.md", "A stranded lease")
    assert key in run_block(*find_cmd, env).stdout
    assert key in run_block(*find_sql, env).stdout
    assert key in run_block(*release, env).stdout
    row = db.execute("SELECT locked_by, lease_expires_at, failures, run_at <= now() FROM jobs "
                     "WHERE dedupe_key = %s", (key,)).fetchone()
    assert row == (None, None, 1, True)
    # the next worker takes it at once, and the charge ends as the rail holds it
    stack.rail.set_status(charge["rail_reference"], "SUCCESSFUL")
    start_worker(spawn, stack)
    wait_until(lambda: status(db, charge["id"]) == "succeeded", timeout=60, what="the charge to settle")


def test_a_dead_worker_is_found_and_its_lease_freed(db, stack, spawn):
    # A worker killed while its status read is inside the rail, its lease
    # (600 s) far from expiry and no other worker live to reap it: the
    # runbook finds the worker dead by its heartbeat and frees its lease.
    env = operator_env(stack)
    stack.rail.script("256770000302", status_delay_seconds=8, outcome="SUCCESSFUL")
    charge = pay(db, stack, "256770000302")
    key = f"poll:{charge['id']}"
    worker = start_worker(spawn, stack, "--lease-seconds", "600", "--worker-id", "runbook:dead",
                          VPAY_WORKER_DEAD_AFTER_SECONDS="2")

    def read_in_flight():
        return any(e["method"] == "GET" and e["status_code"] is None and e["reference"] == charge["rail_reference"]
                   for e in stack.rail.requests_log())
    with TimeMachine(stack.db_url, kinds=("poll",)):
        wait_until(read_in_flight, timeout=60, what="a status read inside the rail")
    worker.signal(signal.SIGKILL)
    assert worker.wait(10) == -signal.SIGKILL
    wait_until(lambda: db.execute("SELECT state = 'dead' FROM worker_states WHERE id = 'runbook:dead'"
                                  ).fetchone()[0], timeout=30, what="the killed worker's heartbeat to age")
    assert db.execute("SELECT lease_expires_at > now() + interval '500 seconds' FROM jobs WHERE dedupe_key = %s",
                      (key,)).fetchone()[0]

    listed, stranded, query = section("dead-worker.md", "Is a worker dead?")
    out = run_block(*listed, env).stdout
    assert [line.split()[-2:] for line in out.splitlines() if line.startswith("runbook:dead")] == [["dead", "1"]]
    out = run_block(*stranded, env).stdout
    assert key in out and "stranded" in out and "dead" in out
    assert "runbook:dead" in run_block(*query, env).stdout
    [release] = section("dead-worker.md", "Its leases")
    assert key in run_block(*release, env).stdout
    row = db.execute("SELECT locked_by, failures, run_at <= now() FROM jobs WHERE dedupe_key = %s",
                     (key,)).fetchone()
    assert row == (None, 1, True)
    stack.rail.set_status(charge["rail_reference"], "SUCCESSFUL")
    start_worker(spawn, stack)
    wait_until(lambda: status(db, charge["id"]) == "succeeded", timeout=60, what="the charge to settle")


def test_an_unresolved_charge_is_found_reconciled_against_the_statement_and_acknowledged(db, stack, spawn,
                                                                                          tmp_path):
    env = operator_env(stack)
    charge = pay(db, stack, "46733123453")  # MoMo answers ONGOING for ever
    paid = pay(db, stack, "46733123454")    # PAYER_DELAYED for ever: until the rail settles it behind our back
    db.execute("UPDATE charges SET created_at = created_at - interval '25 hours' WHERE id = ANY(%s)",
               ([charge["id"], paid["id"]],))
    worker = start_worker(spawn, stack)
    with TimeMachine(stack.db_url, kinds=("poll",)):
        # escalated (by the sweep or the poll), then read again by the poll
        wait_until(lambda: db.execute(
            "SELECT bool_and(c.status = 'unresolved' AND j.last_error LIKE 'rail:%%') FROM charges c "
            "JOIN jobs j ON j.dedupe_key = 'poll:' || c.id WHERE c.id = ANY(%s)",
            ([charge["id"], paid["id"]],)).fetchone()[0],
            timeout=60, what="the escalations and a poll after them")
    # The time machine may have left a poll due: stop the worker, so that only
    # the statement (not a read racing the runbook) can settle the paid charge.
    worker.signal()
    assert worker.wait(60) == 0
    # The payer approved after our last read and the callback was lost; the
    # next read is an hour away. The rail's statement already says so.
    stack.rail.set_status(paid["rail_reference"], "SUCCESSFUL")
    (tmp_path / "statement.csv").write_bytes(_default_statement(stack.rail))

    find_alerts, find_charges, dry_run, apply, ack = section("unresolved-charges.md", "")
    assert charge["id"] in run_block(*find_alerts, env).stdout
    found = run_block(*find_charges, env).stdout
    assert charge["id"] in found and charge["rail_reference"] in found and "rail: pending" in found
    dry = run_block(*dry_run, env, cwd=tmp_path).stdout
    assert "would_settle" in dry and "still_pending" in dry and status(db, paid["id"]) == "unresolved"
    run_block(*apply, env, cwd=tmp_path)
    assert status(db, paid["id"]) == "succeeded"
    assert db.execute("SELECT source FROM settlement_evidence WHERE charge_id = %s", (paid["id"],)).fetchall() == \
        [("statement",)]
    assert (tmp_path / "exceptions.csv").exists()
    run_block(*ack, env)
    assert db.execute("SELECT acknowledged_at IS NOT NULL, note FROM alerts WHERE kind = 'charge_unresolved' "
                      "AND charge_id = %s", (charge["id"],)).fetchone() == \
        (True, "owned by the on-call; reconciling against the rail statement")
    assert status(db, charge["id"]) == "unresolved"  # without evidence the runbook forces nothing


def _default_statement(rail) -> bytes:
    """The sandbox rail's ledger as a statement in vpay's default columns."""
    import csv
    import io

    from vpay.sandbox import statement
    names = {"reference": "Reference ID", "rail_transaction_id": "Financial Transaction ID", "msisdn": "MSISDN",
             "amount": "Amount", "currency": "Currency", "status": "Status", "time": "Date (UTC)",
             "reason": "Reason"}
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(names)
    writer.writerows([row[col] for col in names.values()] for row in statement.rows(rail))
    return buf.getvalue().encode()


def test_a_contradiction_is_found_and_acknowledged(db, stack, spawn):
    env = operator_env(stack)
    charge = pay(db, stack, "256770000001")
    start_worker(spawn, stack)
    with TimeMachine(stack.db_url, kinds=("poll",)):
        wait_until(lambda: status(db, charge["id"]) == "succeeded", timeout=60, what="the charge to settle")
    # the rail now says the opposite; its callback asks for a verification read
    stack.rail.set_status(charge["rail_reference"], "FAILED", "APPROVAL_REJECTED")
    db.execute("UPDATE charges SET last_polled_at = now() - interval '1 minute' WHERE id = %s", (charge["id"],))
    assert stack.callback(charge["rail_reference"], {}).status_code == 202
    wait_until(lambda: db.execute("SELECT count(*) FROM alerts WHERE kind = 'rail_contradiction'").fetchone()[0],
               timeout=60, what="the contradiction alert")

    find_sql, ack = section("worker-queue.md", "A rail contradicting a settled charge")
    found = run_block(*find_sql, env).stdout
    assert charge["id"] in found and '"rail_says": "failed"' in found and "succeeded" in found
    run_block(*ack, env)
    assert db.execute("SELECT acknowledged_at IS NOT NULL, note LIKE 'reconciled%%' FROM alerts "
                      "WHERE kind = 'rail_contradiction'").fetchall() == [(True, True)]
    assert status(db, charge["id"]) == "succeeded"  # vpay changed nothing


def test_the_retention_dry_run_counts_what_would_go(db, stack, spawn):
    env = operator_env(stack)
    charge = pay(db, stack, "256770000001")
    start_worker(spawn, stack)
    with TimeMachine(stack.db_url, kinds=("poll",)):
        wait_until(lambda: status(db, charge["id"]) == "succeeded"
                   and db.execute("SELECT count(*) FROM jobs WHERE kind = 'fanout'").fetchone()[0] == 0,
                   timeout=60, what="the charge to settle and its events to fan out")
    db.execute("UPDATE events SET created_at = created_at - interval '100 days'")
    [dry_run] = section("worker-queue.md", "What is kept, and for how long")
    table = [line.split() for line in run_block(*dry_run, env).stdout.splitlines()]
    assert table == [["TABLE", "WOULD_DELETE"], ["webhook_deliveries", "0"], ["events", "2"], ["alerts", "0"],
                     ["dead_letters", "0"]]
    assert db.execute("SELECT count(*) FROM events").fetchone() == (2,)


def test_a_rail_paused_by_a_429_is_shown_with_why_and_by_whom(db, stack, spawn):
    # The rail answers a status read 429 with Retry-After (a MoMo-shaped stub
    # that throttles: tests/rail_stub.py); the worker reads it.
    from api_support import make_payment
    from rail_stub import MomoStub
    from vpay.money import charges
    env = operator_env(stack)
    rail = MomoStub()
    try:
        charge = make_payment(db, payer="256770000401")
        charges.mark_submitted(db, charge["id"])
        rail.throttle(charge["rail_reference"], "120")
        worker = start_worker(spawn, stack, "--worker-id", "replica-1", **rail.env())
        worker.wait_for_log("rail paused", rail="mtn", timeout=60)
        wait_until(lambda: db.execute("SELECT count(*) FROM rail_calls WHERE answer = 'paused'").fetchone()[0],
                   what="the answer recorded")
        listed, answers = section("worker-queue.md", "A paused rail")
        rows = {line.split()[0]: line.split() for line in run_block(*listed, env).stdout.splitlines()[1:]}
        assert rows["mtn"][1:3] == ["yes", "yes"] and "replica-1" in rows["mtn"]
        assert rows["orange"][2] == "no"
        out = run_block(*answers, env).stdout
        assert "429" in out and "HTTP 429 with Retry-After" in out
    finally:
        rail.close()
