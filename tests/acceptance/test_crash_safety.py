"""Crash safety under a real kill -9, and the three lease reapers.

Design page, "Leases and crash recovery", and docs/flows/crash-safety.md
(the table these tests prove). Every test runs the installed console
scripts as real processes against a real Postgres and the sandbox rail:

* a kill point is reached with ``VPAY_TEST_PAUSE_AT=<point>`` (the process
  logs ``test pause`` and blocks there), the test SIGKILLs the process, and a
  fresh worker with a short lease recovers the payment;
* the boot reaper, the timer reaper and ``sweep:expired`` each free a
  stranded lease when nothing else could;
* a job that kills its process on every run is parked, not crash-looped.
"""

from __future__ import annotations

import signal
import threading

import psycopg
import pytest
from psycopg.types.json import Jsonb

from support import TimeMachine, base_env, rail_env, wait_until
from vpay.money import payments
from vpay.engine import queue
from vpay.engine.lanes import lane_for
from vpay.rails.mtn import MtnMomo

pytestmark = pytest.mark.slow

SUCCESS, DECLINE = "256770000001", "46733123451"
RAIL_TO_CHARGE = {"SUCCESSFUL": "succeeded", "FAILED": "failed"}
TERMINAL_EVENT = {"succeeded": "payment_intent.succeeded", "failed": "payment_intent.payment_failed"}
RTP_PATH = "/collection/v1_0/requesttopay"


# ---- helpers ---------------------------------------------------------------


def _create(pool, rail, merchant, payer):
    adapter = MtnMomo.from_env(rail_env(rail))
    return payments.create_and_submit(pool, lambda code: adapter, merchant_id=merchant, amount=1500,
                                      currency="EUR", rail="mtn", payer=payer)


def _charge(db, charge_id=None) -> dict:
    where, args = ("WHERE id = %s", (charge_id,)) if charge_id else ("", ())
    rows = db.execute("SELECT id, payment_intent_id, status, rail_reference, submitted_at "
                      f"FROM charges {where}", args).fetchall()
    assert len(rows) == 1, rows
    keys = ("id", "intent", "status", "ref", "submitted_at")
    return dict(zip(keys, rows[0]))


def _events(db, intent_id) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT type FROM events WHERE payment_intent_id = %s ORDER BY created_at, id", (intent_id,))]


def _job(db, dedupe_key):
    row = db.execute("SELECT locked_by, locked_at IS NOT NULL, attempts, failures, "
                     "run_at = 'infinity', last_error FROM jobs WHERE dedupe_key = %s",
                     (dedupe_key,)).fetchone()
    if row is None:
        return None
    return dict(zip(("locked_by", "leased", "attempts", "failures", "parked", "last_error"), row))


def _kill(proc) -> None:
    """SIGKILL the real process and reap it."""
    proc.signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL


def _stop_cleanly(worker) -> None:
    """SIGTERM; a clean drain (exit 0) means every job this worker held was finished."""
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.text()[-3000:]


def _assert_nothing_stranded(db) -> None:
    """No lease left held, nothing dead-lettered, no poll or resubmit left
    behind for a settled charge."""
    assert db.execute("SELECT dedupe_key, locked_by FROM jobs WHERE locked_at IS NOT NULL").fetchall() == []
    assert db.execute("SELECT dedupe_key, last_error FROM jobs WHERE run_at = 'infinity'").fetchall() == []
    assert db.execute("SELECT dedupe_key FROM jobs WHERE kind IN ('poll', 'resubmit')").fetchall() == []
    assert db.execute("SELECT kind, details FROM alerts").fetchall() == []


def _assert_matches_the_rail(db, sandbox, charge_id) -> dict:
    """The charge ended as the rail holds it, with one event per transition."""
    charge = _charge(db, charge_id)
    held = sandbox.transaction(charge["ref"])
    assert held is not None and held["status"] in RAIL_TO_CHARGE, held
    assert charge["status"] == RAIL_TO_CHARGE[held["status"]]
    assert charge["submitted_at"] is not None
    assert _events(db, charge["intent"]) == ["payment_intent.processing", TERMINAL_EVENT[charge["status"]]]
    intent_status = db.execute("SELECT status FROM payment_intents WHERE id = %s",
                               (charge["intent"],)).fetchone()[0]
    assert intent_status == ("succeeded" if charge["status"] == "succeeded" else "requires_payment_method")
    return charge


def _rescuer(spawn, env):
    """The worker that recovers: a 2 s lease, so its reaper (every 1 s) frees
    the dead process's lease quickly."""
    return spawn("vpay-worker", "--lease-seconds", "2", "--idle-sleep", "0.1",
                 "--worker-id", "rescuer", env=env)


# ---- kill points in the create path (vpay-server payments create) ----------


@pytest.mark.parametrize("payer", [SUCCESS, DECLINE], ids=["success", "decline"])
@pytest.mark.parametrize("point", ["after_charge_commit", "after_rail_accepted"])
def test_kill_in_the_create_path_is_recovered_by_the_poll_job(point, payer, db, db_url, sandbox,
                                                              merchant, spawn):
    env = base_env(db_url, **rail_env(sandbox))
    create = spawn("vpay-server", "--log-level", "INFO", "payments", "create", "--merchant", merchant, "--amount", "1500",
                   "--currency", "EUR", "--rail", "mtn", "--payer", payer,
                   env={**env, "VPAY_TEST_PAUSE_AT": point})
    create.wait_for_log("test pause", point=point)
    _kill(create)

    # What the kill left: a committed pending charge with its poll job, not submitted.
    charge = _charge(db)
    assert charge["status"] == "pending" and charge["submitted_at"] is None
    assert _events(db, charge["intent"]) == ["payment_intent.processing"]
    assert _job(db, f"poll:{charge['id']}")["leased"] is False
    if point == "after_charge_commit":
        assert sandbox.count(method="POST", path_prefix=RTP_PATH) == 0  # the rail never heard
    else:
        assert sandbox.transaction(charge["ref"]) is not None  # the rail holds it; we never wrote that

    worker = _rescuer(spawn, env)
    with TimeMachine(db_url):
        wait_until(lambda: _charge(db, charge["id"])["status"] != "pending"
                   and _job(db, f"poll:{charge['id']}") is None,
                   timeout=60, what="the charge to settle and its poll to finish")
    _assert_matches_the_rail(db, sandbox, charge["id"])
    # one request-to-pay in all: sent by the resubmit job when the dead process
    # never sent it, never re-sent when the rail already held it
    assert sandbox.count(method="POST", path_prefix=RTP_PATH, reference=charge["ref"]) == 1
    _stop_cleanly(worker)
    _assert_nothing_stranded(db)


# ---- kill points in the worker (the poll handler) ---------------------------


@pytest.mark.parametrize("payer", [SUCCESS, DECLINE], ids=["success", "decline"])
@pytest.mark.parametrize("point", ["before_settle_commit", "after_settle_commit"])
def test_kill_in_the_poll_is_recovered_after_the_lease_is_reaped(point, payer, db, db_url, pool,
                                                                 sandbox, merchant, spawn):
    created = _create(pool, sandbox, merchant, payer)
    charge_id = created["charge"]["id"]
    poll_key = f"poll:{charge_id}"
    env = base_env(db_url, **rail_env(sandbox))
    # A lease is judged by its own expiry, so the doomed worker's lease is the
    # one that must run out (5 s) before the rescuer may take the job.
    doomed = spawn("vpay-worker", "--idle-sleep", "0.1", "--worker-id", "doomed", "--lease-seconds", "5",
                   env={**env, "VPAY_TEST_PAUSE_AT": point})
    with TimeMachine(db_url):
        doomed.wait_for_log("test pause", point=point)
    _kill(doomed)

    # What the kill left: the rail's terminal answer was read; the poll job is
    # still leased by the dead process; the settle is either not committed or
    # committed with its one event.
    job = _job(db, poll_key)
    assert job["locked_by"] == "doomed" and job["leased"]
    charge = _charge(db, charge_id)
    events = _events(db, charge["intent"])
    if point == "before_settle_commit":
        assert charge["status"] == "pending" and events == ["payment_intent.processing"]
    else:
        assert charge["status"] in ("succeeded", "failed")
        assert events == ["payment_intent.processing", TERMINAL_EVENT[charge["status"]]]
    reads_before = sandbox.count(method="GET", reference=charge["ref"])

    rescuer = _rescuer(spawn, env)
    with TimeMachine(db_url):
        wait_until(lambda: _job(db, poll_key) is None, timeout=60,
                   what="the stranded poll to be reaped, re-run and finished")
    # the rescuer's reaper (at boot or on its timer) freed the dead lease
    assert [l for l in rescuer.find("lease reaped") if l["dedupe_key"] == poll_key]
    _assert_matches_the_rail(db, sandbox, charge_id)
    # the re-run asked the rail once more: to settle, or to verify the settled charge
    assert sandbox.count(method="GET", reference=charge["ref"]) == reads_before + 1
    _stop_cleanly(rescuer)
    _assert_nothing_stranded(db)


# ---- the three lease reapers ------------------------------------------------


def _executions_table(db) -> None:
    db.execute("CREATE TABLE test_executions (job_key text NOT NULL, worker text NOT NULL)")


def _executed(db, key) -> int:
    return db.execute("SELECT count(*) FROM test_executions WHERE job_key = %s", (key,)).fetchone()[0]


def _strand(db, kind, key, age_seconds, by="dead-worker", lease=300) -> None:
    """A job leased ``age_seconds`` ago, for ``lease`` seconds, by a process
    that no longer exists."""
    db.execute("INSERT INTO jobs (kind, lane, dedupe_key, payload, attempts, locked_by, locked_at, "
               "lease_expires_at, lease_token) VALUES (%s, %s, %s, %s, 1, %s, now() - make_interval(secs => %s), "
               "now() - make_interval(secs => %s) + make_interval(secs => %s), gen_random_uuid())",
               (kind, lane_for(kind), key, Jsonb({}), by, age_seconds, age_seconds, lease))


def _schedule_later(db, *keys) -> None:
    """Scheduled jobs an hour out: nothing but the reaper under test runs."""
    for key, kind in (("sweep:expired", "sweep"), ("scan:live", "scan")):
        if key in keys:
            db.execute("INSERT INTO jobs (kind, lane, dedupe_key, run_at) "
                       "VALUES (%s, 'housekeeping', %s, now() + interval '1 hour')", (kind, key))


def test_boot_reaps_before_claiming_even_when_the_dead_worker_held_the_sweep(db, db_url, spawn):
    _executions_table(db)
    # The dead worker held sweep:expired (the job that also reaps) and another job.
    _strand(db, "sweep", "sweep:expired", 3600)
    _strand(db, "test.count", "count:stranded", 3600)
    _schedule_later(db, "scan:live")
    # A 300 s lease: the timer's first reap is 150 s away, and the sweep is stranded.
    worker = spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, VPAY_TEST_HANDLERS="1"))
    wait_until(lambda: _executed(db, "count:stranded") == 1, timeout=30,
               what="the stranded job to run")
    started = worker.find("worker started")[0]
    assert started["reaped_at_boot"] == 2
    lines = worker.lines()
    reaped = [i for i, l in enumerate(lines) if l.get("message") == "lease reaped"]
    assert {lines[i]["dedupe_key"] for i in reaped} == {"sweep:expired", "count:stranded"}
    assert max(reaped) < lines.index(started)  # before the claim loops started
    # the sweep itself ran again and rescheduled itself an hour out
    wait_until(lambda: (_job(db, "sweep:expired") or {}).get("leased") is False
               and db.execute("SELECT run_at > now() + interval '50 minutes' FROM jobs "
                              "WHERE dedupe_key = 'sweep:expired'").fetchone()[0],
               timeout=30, what="sweep:expired to run and reschedule itself")
    _stop_cleanly(worker)


def test_timer_reaper_frees_a_strand_with_no_queue_job_involved(db, db_url, spawn):
    _executions_table(db)
    _schedule_later(db, "sweep:expired", "scan:live")
    worker = spawn("vpay-worker", "--lease-seconds", "2", "--idle-sleep", "0.1",
                   env=base_env(db_url, VPAY_TEST_HANDLERS="1"))
    assert worker.wait_for_log("worker started")["reaped_at_boot"] == 0
    # A process died holding a job after this worker booted: only the timer can see it.
    _strand(db, "test.count", "count:stranded", 0, lease=2)
    wait_until(lambda: _executed(db, "count:stranded") == 1, timeout=30,
               what="the timer reaper to free the strand")
    [line] = [l for l in worker.find("lease reaped") if l["dedupe_key"] == "count:stranded"]
    assert line["logger"] == "vpay.worker" and line["parked"] is False
    # no queue job did it: the sweep never ran
    assert worker.find("sweep") == []
    assert _job(db, "sweep:expired")["attempts"] == 0
    _stop_cleanly(worker)


def test_sweep_expired_reaps_a_strand(db, db_url, spawn):
    _executions_table(db)
    _schedule_later(db, "sweep:expired", "scan:live")
    # A 300 s lease: the timer reaper's first round is 150 s away.
    worker = spawn("vpay-worker", "--idle-sleep", "0.1", env=base_env(db_url, VPAY_TEST_HANDLERS="1"))
    assert worker.wait_for_log("worker started")["reaped_at_boot"] == 0
    _strand(db, "test.count", "count:stranded", 3600)
    db.execute("UPDATE jobs SET run_at = now() WHERE dedupe_key = 'sweep:expired'")
    wait_until(lambda: _executed(db, "count:stranded") == 1, timeout=30,
               what="sweep:expired to free the strand")
    # The freed job can run on another loop before the sweep's own log line
    # is written: wait for the line rather than read it at once.
    sweeps = wait_until(lambda: worker.find("sweep"), timeout=30, what="the sweep's log line")
    assert [s["reaped"] for s in sweeps] == [1]
    assert [l["dedupe_key"] for l in worker.find("lease reaped")] == []  # not the boot or timer reaper
    row = db.execute("SELECT locked_at IS NULL, run_at > now() + interval '50 minutes', attempts "
                     "FROM jobs WHERE dedupe_key = 'sweep:expired'").fetchone()
    assert row == (True, True, 1)  # ran once, rescheduled itself an hour out
    _stop_cleanly(worker)


# ---- poison jobs -------------------------------------------------------------


def test_a_job_that_kills_its_worker_every_time_is_parked_with_an_alert(db, db_url, spawn):
    db.execute("INSERT INTO jobs (kind, lane, dedupe_key) VALUES ('test.exit', 'housekeeping', 'poison')")
    env = base_env(db_url, VPAY_TEST_HANDLERS="1")

    def start():
        return spawn("vpay-worker", "--lease-seconds", "1", "--idle-sleep", "0.1",
                     "--worker-concurrency", "1", env=env)

    for run in range(1, queue.MAX_FAILURES + 1):
        worker = start()
        assert worker.wait(60) == 3, worker.text()[-3000:]  # died inside the poison job
        job = _job(db, "poison")
        assert job["attempts"] == run  # counted at the claim, before the handler ran
        assert job["leased"] and not job["parked"]
    # The next worker's reaper finds the fifth dead lease and parks the job.
    survivor = start()
    wait_until(lambda: _job(db, "poison")["parked"], timeout=30, what="the poison job to be parked")
    job = _job(db, "poison")
    assert job["attempts"] == queue.MAX_FAILURES and not job["leased"]
    assert job["last_error"].startswith(f"dead-lettered: lease expired {queue.MAX_FAILURES} times")
    [(kind, details)] = db.execute("SELECT kind, details FROM alerts").fetchall()
    assert kind == "job_dead_lettered"
    assert details["dedupe_key"] == "poison" and details["kind"] == "test.exit"
    assert details["attempts"] == queue.MAX_FAILURES
    # The reaper commits, then logs: wait for the line rather than read it at once.
    survivor.wait_for_log("lease reaped", dedupe_key="poison")
    assert [l["parked"] for l in survivor.find("lease reaped") if l["dedupe_key"] == "poison"] == [True]
    # the survivor keeps working and never claims it again
    _stop_cleanly(survivor)
    assert _job(db, "poison")["attempts"] == queue.MAX_FAILURES


def test_another_replicas_reaper_never_reaps_a_live_long_lease(db, db_url, pool, sandbox, merchant, spawn):
    # Found by review: each worker judged every lease by its own --lease-seconds,
    # so a replica run with a 2 s lease reaped a 300 s replica's 4 s rail read,
    # again and again, until the poll was dead-lettered and its charge stranded.
    # Here the 300 s worker polls a slow rail while a reaper runs every 0.5 s,
    # as a short-lease replica's timer would.
    sandbox.script(SUCCESS, outcome="PENDING", status_delay_seconds=4)
    created = _create(pool, sandbox, merchant, SUCCESS)
    poll_key = f"poll:{created['charge']['id']}"
    patient = spawn("vpay-worker", "--idle-sleep", "0.1", "--worker-id", "patient",
                    env=base_env(db_url, **rail_env(sandbox)))
    patient.wait_for_log("worker started")
    stop = threading.Event()
    reaped: list = []

    def hasty_reaper():
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not stop.wait(0.5):
                reaped.extend(queue.reap_expired_leases(conn))

    thread = threading.Thread(target=hasty_reaper, daemon=True)
    thread.start()
    try:
        with TimeMachine(db_url):
            wait_until(lambda: _job(db, poll_key)["attempts"] >= 3, timeout=90, what="three slow polls")
            # Ended: unleased, or already claimed again (a wake-up claims the
            # rescheduled poll within milliseconds, too fast to see it unleased).
            wait_until(lambda: not _job(db, poll_key)["leased"] or _job(db, poll_key)["attempts"] >= 4,
                       timeout=30, what="the third poll to end")
    finally:
        stop.set()
        thread.join(5)
    assert reaped == []
    assert not _job(db, poll_key)["parked"]
    assert db.execute("SELECT failures FROM jobs WHERE dedupe_key = %s", (poll_key,)).fetchone() == (0,)
    _stop_cleanly(patient)
    assert patient.find("gauge", final=True)[0]["lost"] == 0


def test_a_live_worker_renews_its_leases_so_a_slow_handler_on_a_short_lease_is_never_reaped(
        db, db_url, pool, sandbox, merchant, spawn):
    # Found by review: a worker run with --lease-seconds 2 against 4 s rail
    # reads had its own live claims reaped five times in a row and parked.
    sandbox.script(SUCCESS, outcome="PENDING", status_delay_seconds=4)
    created = _create(pool, sandbox, merchant, SUCCESS)
    poll_key = f"poll:{created['charge']['id']}"
    short = spawn("vpay-worker", "--idle-sleep", "0.1", "--lease-seconds", "2", "--worker-id", "short",
                  env=base_env(db_url, **rail_env(sandbox)))
    short.wait_for_log("worker started")
    with TimeMachine(db_url):
        wait_until(lambda: _job(db, poll_key)["attempts"] >= 3, timeout=90, what="three slow polls")
    # Outside the time machine the ladder parks the poll after its read: while
    # it runs, a woken loop re-claims a due poll within milliseconds.
    wait_until(lambda: not _job(db, poll_key)["leased"], timeout=30, what="the last poll to end")
    assert short.find("lease reaped") == []
    assert not _job(db, poll_key)["parked"]
    assert db.execute("SELECT failures FROM jobs WHERE dedupe_key = %s", (poll_key,)).fetchone() == (0,)
    # One read per claim. Counted after the clean drain: a claim raises
    # attempts before its GET reaches the rail, and the time machine may have
    # made the poll due again just before it stopped, so a fourth claim can be
    # between the two while the worker runs (seen once under load: 3 GETs, 4
    # attempts). Once drained, every claim has finished its read.
    _stop_cleanly(short)
    assert sandbox.count(method="GET", reference=created["charge"]["rail_reference"]) == \
        _job(db, poll_key)["attempts"]
    assert short.find("gauge", final=True)[0]["lost"] == 0
