"""Workers as rows (issue 25; vpay/engine/workers.py, sql/0024_workers.sql):
the table's life cycle, reaping a lease by its holder's row before the
lease's expiry, the fence that keeps a holder judged dead from writing, the
retention, and the operator's view (``jobs list --stranded``, ``jobs
release``, ``workers list``), against a real Postgres."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from vpay.cli import main
from vpay.engine import queue, workers
from vpay.money import operator as op

LONG_LEASE = 600.0  # no lease here runs out during a test: only the holder's row can free it


def _register(db, wid: str, dead_after: float = 30.0, lanes=("housekeeping",)):
    return workers.register(db, wid, host="host", pid=1, lanes=lanes, version="0.0-test",
                            dead_after=dead_after)


def _beat(db, wid: str, host: str = "host", pid: int = 1) -> str:
    return workers.beat(db, wid, host=host, pid=pid).found


def _stop(db, wid: str, host: str = "host", pid: int = 1) -> bool:
    return workers.stop(db, wid, host=host, pid=pid)


def _age_heartbeat(db, wid: str, seconds: float = 120.0) -> None:
    db.execute("UPDATE workers SET heartbeat_at = now() - make_interval(secs => %s) WHERE id = %s",
               (seconds, wid))


def _claim(db, wid: str) -> queue.Job:
    job = queue.claim(db, wid, LONG_LEASE)
    assert job is not None
    return job


def _state(db, wid: str) -> str:
    return db.execute("SELECT state FROM worker_states WHERE id = %s", (wid,)).fetchone()[0]


def test_a_worker_registers_beats_and_stops_and_its_state_follows(db):
    started = _register(db, "w1", dead_after=30)
    assert _state(db, "w1") == "live" and workers.live_count(db) == 1
    _age_heartbeat(db, "w1", 31)
    assert _state(db, "w1") == "dead" and workers.live_count(db) == 0
    assert _beat(db, "w1") == workers.BEATEN
    assert _state(db, "w1") == "live"
    assert _stop(db, "w1") is True
    assert _state(db, "w1") == "stopped" and _beat(db, "w1") == workers.GONE  # a stopped row is not beaten
    assert _stop(db, "w1") is False
    # registering again (a restart under the same id) takes the row over: live, started anew
    again = _register(db, "w1")
    assert _state(db, "w1") == "live" and again > started
    assert workers.beat(db, "nobody", host="host", pid=1) == (workers.GONE, None, None)


def test_a_lease_whose_holder_is_dead_by_heartbeat_is_reaped_before_its_expiry(db):
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    _register(db, "w1", dead_after=5)
    _register(db, "w2", dead_after=5)
    job = _claim(db, "w1")
    assert queue.reap_expired_leases(db, by_heartbeat=True, reaper="w2") == []  # w1 is live
    _age_heartbeat(db, "w1", 6)
    # not judged by heartbeat unless the caller may (its own worker steady)
    assert queue.reap_expired_leases(db, by_heartbeat=False, reaper="w2") == []
    # never the reaper's own worker by its heartbeat: it is running the reap
    assert queue.reap_expired_leases(db, by_heartbeat=True, reaper="w1") == []
    [reaped] = queue.reap_expired_leases(db, by_heartbeat=True, reaper="w2")
    assert (reaped["id"], reaped["why"], reaped["parked"]) == (job.id, "dead", False)
    row = db.execute("SELECT locked_by, lease_token, failures, run_at <= now(), last_error FROM jobs").fetchone()
    assert row[:4] == (None, None, 1, True)
    assert row[4].startswith("lease reaped: holder dead (held by w1 since")


def test_a_holder_with_no_row_is_judged_by_the_lease_expiry_alone(db):
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    job = _claim(db, "rowless")
    assert queue.reap_expired_leases(db, by_heartbeat=True, reaper="w2") == []
    db.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second'")
    [reaped] = queue.reap_expired_leases(db, by_heartbeat=True, reaper="w2")
    assert (reaped["id"], reaped["why"]) == (job.id, "expired")


def test_the_leases_of_a_stopped_holder_and_of_an_earlier_process_under_the_same_id_are_reaped(db):
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    queue.enqueue(db, "test.count", "k:2", lane="housekeeping")
    _register(db, "w1")
    first = _claim(db, "w1")
    _register(db, "w1")  # the process restarted under the same id: it holds nothing from before
    second = _claim(db, "w1")  # claimed by the new process: its own
    [reaped] = queue.reap_expired_leases(db)  # facts, not heartbeats: the boot reap and the sweep see them
    assert (reaped["id"], reaped["why"]) == (first.id, "restarted")
    _stop(db, "w1")
    [reaped] = queue.reap_expired_leases(db)
    assert (reaped["id"], reaped["why"]) == (second.id, "stopped")


def test_after_a_database_restart_no_holder_is_judged_dead_until_it_could_have_beaten(db):
    # lease_holder_gone judges "dead" only once the database has been up
    # longer than the holder's bound: here the bound is made longer than the
    # server's uptime, as if it had just restarted.
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    _register(db, "w1")
    _claim(db, "w1")
    uptime = db.execute("SELECT extract(epoch FROM now() - pg_postmaster_start_time())").fetchone()[0]
    db.execute("UPDATE workers SET dead_after_seconds = %s, heartbeat_at = now() - make_interval(secs => %s)",
               (float(uptime) + 60, float(uptime) + 120))
    assert _state(db, "w1") == "dead"  # the row says so ...
    assert queue.reap_expired_leases(db, by_heartbeat=True, reaper="w2") == []  # ... but it is not reaped
    db.execute("UPDATE workers SET dead_after_seconds = 5")
    assert [r["why"] for r in queue.reap_expired_leases(db, by_heartbeat=True, reaper="w2")] == ["dead"]


@pytest.mark.parametrize("write", ["finish", "reschedule", "park", "retry_failed", "renew"])
def test_a_holder_judged_dead_stays_fenced_when_it_wakes(db, write):
    # A frozen worker (SIGSTOP) misses its heartbeats; its lease is reaped and
    # another worker claims the job. When it wakes, every write it makes with
    # its old lease matches nothing, and its heartbeat does not revive it.
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    _register(db, "frozen", dead_after=5)
    _register(db, "w2", dead_after=5)
    old = _claim(db, "frozen")
    _age_heartbeat(db, "frozen", 60)
    assert [r["why"] for r in queue.reap_expired_leases(db, by_heartbeat=True, reaper="w2")] == ["dead"]
    new = _claim(db, "w2")
    assert new.id == old.id
    assert _beat(db, "frozen") == workers.BEATEN  # it wakes: live again, but holds nothing
    ops = {"finish": lambda j: queue.finish(db, j),
           "reschedule": lambda j: queue.reschedule(db, j, 60),
           "park": lambda j: queue.park(db, j, "x"),
           "retry_failed": lambda j: queue.retry_failed(db, j, 60, "boom"),
           "renew": lambda j: queue.renew(db, j.worker, [j.lease_token], 600) == 1}
    assert ops[write](old) is False
    row = db.execute("SELECT locked_by, lease_token, run_at <> 'infinity' FROM jobs").fetchone()
    assert row == ("w2", new.lease_token, True)
    assert db.execute("SELECT count(*) FROM alerts").fetchone()[0] == 0
    assert ops[write](new) is True


def test_rows_of_workers_dead_past_the_retention_are_pruned_unless_they_hold_a_lease(db):
    bound = workers.DEAD_WORKER_RETENTION_SECONDS
    for wid in ("live", "dead-recent", "dead-old", "stopped-old", "dead-old-holding"):
        _register(db, wid)
    _age_heartbeat(db, "dead-recent", bound - 3600)
    _age_heartbeat(db, "dead-old", bound + 60)
    _age_heartbeat(db, "dead-old-holding", bound + 60)
    _stop(db, "stopped-old")
    db.execute("UPDATE workers SET stopped_at = now() - make_interval(secs => %s) WHERE id = 'stopped-old'",
               (bound + 60,))
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    db.execute("UPDATE jobs SET locked_by = 'dead-old-holding', locked_at = now(), lease_token = gen_random_uuid(), "
               "lease_expires_at = now() + interval '10 minutes'")
    assert workers.prune(db) == 2
    left = {r[0] for r in db.execute("SELECT id FROM workers")}
    assert left == {"live", "dead-recent", "dead-old-holding"}
    # the edge: just inside the retention is kept, just past it goes
    _age_heartbeat(db, "dead-recent", bound - 5)
    assert workers.prune(db) == 0
    _age_heartbeat(db, "dead-recent", bound + 5)
    assert workers.prune(db) == 1


def test_the_hourly_sweep_prunes_worker_rows(db, pool):
    from vpay import handlers
    from vpay.handlers.sweep import sweep
    _register(db, "dead-old")
    _age_heartbeat(db, "dead-old", workers.DEAD_WORKER_RETENTION_SECONDS + 60)
    queue.enqueue(db, "sweep", "sweep:expired", lane="housekeeping")
    job = queue.claim(db, "w1")
    sweep(job, handlers.Context(pool=pool, worker_id="w1"))
    assert db.execute("SELECT count(*) FROM workers").fetchone()[0] == 0


def test_jobs_list_shows_the_holders_heartbeat_and_stranded_includes_a_dead_holders_lease(db):
    queue.enqueue(db, "test.count", "k:dead", lane="housekeeping")
    queue.enqueue(db, "test.count", "k:live", lane="housekeeping")
    _register(db, "w-dead", dead_after=5)
    _register(db, "w-live", dead_after=5)
    dead_job = _claim(db, "w-dead")
    live_job = _claim(db, "w-live")
    _age_heartbeat(db, "w-dead", 42)
    rows = {r["id"]: r for r in op.list_jobs(db)}
    assert (rows[dead_job.id]["state"], rows[dead_job.id]["holder_state"]) == ("stranded", "dead")
    assert 41 <= rows[dead_job.id]["heartbeat_age"] <= 60
    assert (rows[live_job.id]["state"], rows[live_job.id]["holder_state"]) == ("leased", "live")
    assert rows[live_job.id]["heartbeat_age"] < 30
    assert [r["id"] for r in op.list_jobs(db, stranded=True)] == [dead_job.id]
    # release accepts the dead holder's lease (its expiry is 10 minutes away) and refuses the live one
    with pytest.raises(op.Refused):
        op.release(db, [dead_job.id, live_job.id], "tester")
    assert db.execute("SELECT count(*) FROM jobs WHERE locked_at IS NOT NULL").fetchone()[0] == 2
    [released] = op.release(db, [dead_job.id], "tester")
    assert released["id"] == dead_job.id and "holder dead" in released["last_error"]
    assert db.execute("SELECT locked_by FROM jobs WHERE id = %s", (dead_job.id,)).fetchone() == (None,)


def _invoke(db_url, *args):
    import logging
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return CliRunner().invoke(main, list(args), env={"VPAY_DATABASE_URL": db_url})
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_workers_list_shows_each_worker_its_heartbeat_age_state_and_leases(db, db_url):
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    _register(db, "w-live", lanes=("mtn", "housekeeping"))
    _register(db, "w-dead", dead_after=5)
    _register(db, "w-stopped")
    _stop(db, "w-stopped")
    _claim(db, "w-dead")
    _age_heartbeat(db, "w-dead", 90)
    res = _invoke(db_url, "workers", "list", "--json")
    assert res.exit_code == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["id"] for r in rows] == ["w-live", "w-dead", "w-stopped"]  # live first
    by_id = {r["id"]: r for r in rows}
    assert (by_id["w-live"]["state"], by_id["w-live"]["lanes"], by_id["w-live"]["leases"]) == \
        ("live", ["mtn", "housekeeping"], 0)
    assert (by_id["w-dead"]["state"], by_id["w-dead"]["leases"]) == ("dead", 1)
    assert 89 <= by_id["w-dead"]["heartbeat_age"] <= 120
    assert by_id["w-stopped"]["state"] == "stopped" and by_id["w-live"]["host"] == "host"
    assert {"pid", "version", "started_at"} <= set(by_id["w-live"])
    table = _invoke(db_url, "workers", "list", "--state", "dead")
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["ID", "HOST", "PID", "LANES", "VERSION", "STARTED_AT", "HEARTBEAT_AGE",
                                "STATE", "LEASES"]
    assert len(lines) == 2 and lines[1].split()[0] == "w-dead" and lines[1].split()[-2:] == ["dead", "1"]


def test_jobs_list_prints_the_holders_state_and_heartbeat_age(db, db_url):
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    _register(db, "w-dead", dead_after=5)
    job = _claim(db, "w-dead")
    _age_heartbeat(db, "w-dead", 90)
    res = _invoke(db_url, "jobs", "list", "--stranded", "--json")
    assert res.exit_code == 0, res.stderr
    [row] = json.loads(res.stdout)
    assert (row["id"], row["state"], row["holder_state"]) == (job.id, "stranded", "dead")
    res = _invoke(db_url, "jobs", "release", str(job.id), "--json")
    assert res.exit_code == 0, res.stderr
    assert db.execute("SELECT locked_by FROM jobs").fetchone() == (None,)


def test_the_metrics_report_live_workers(db, pool):
    from vpay.money.gauges import DatabaseCollector
    _register(db, "a")
    _register(db, "b")
    _register(db, "c")
    _age_heartbeat(db, "c", 300)
    families = {f.name: f for f in DatabaseCollector(pool).collect()}
    assert [s.value for s in families["vpay_workers_live"].samples] == [2]


def test_a_worker_id_live_in_another_process_is_refused_and_a_gone_ones_taken_over(db):
    # Two processes under one id would take each other's leases for a
    # restart's; the second is refused (78 at boot) while the first runs.
    workers.register(db, "shared", host="host-a", pid=4242, lanes=("mtn",), version="t", dead_after=30.0)
    with pytest.raises(workers.ConfigError, match="live in another process"):
        workers.refuse_shared_id(db, "shared", host="host-b", pid=7, runs_worker=lambda pid: True)
    with pytest.raises(workers.ConfigError, match="host-a pid 4242"):
        workers.refuse_shared_id(db, "shared", host="host-a", pid=7, runs_worker=lambda pid: pid == 4242)
    # Its own row (a registration again) and a crashed process on this host
    # (or its pid reused by another program): taken over.
    workers.refuse_shared_id(db, "shared", host="host-a", pid=4242, runs_worker=lambda pid: True)
    workers.refuse_shared_id(db, "shared", host="host-a", pid=7, runs_worker=lambda pid: False)
    # Dead by its heartbeat: from another host, taken over (its processes cannot be seen) ...
    _age_heartbeat(db, "shared", 31.0)
    workers.refuse_shared_id(db, "shared", host="host-b", pid=7, runs_worker=lambda pid: True)
    # ... but on its own host, a vpay-worker still at that pid is only frozen: refused
    with pytest.raises(workers.ConfigError, match="still running on this host .pid 4242, dead"):
        workers.refuse_shared_id(db, "shared", host="host-a", pid=7, runs_worker=lambda pid: pid == 4242)
    workers.refuse_shared_id(db, "shared", host="host-a", pid=7, runs_worker=lambda pid: False)
    # Stopped: taken over from anywhere.
    workers.register(db, "shared", host="host-a", pid=4242, lanes=("mtn",), version="t", dead_after=30.0)
    workers.stop(db, "shared", host="host-a", pid=4242)
    workers.refuse_shared_id(db, "shared", host="host-a", pid=7, runs_worker=lambda pid: True)
    workers.refuse_shared_id(db, "shared", host="host-b", pid=7, runs_worker=lambda pid: True)
    workers.refuse_shared_id(db, "unknown", host="host-b", pid=7)


def test_a_beat_tells_a_row_taken_over_from_a_row_gone_and_never_writes_the_others(db):
    # The first process (host-a pid 1) froze past its bound; a second took the
    # id over (another host: its heartbeat was dead). The first wakes and beats.
    workers.register(db, "w", host="host-a", pid=1, lanes=("mtn",), version="t", dead_after=5.0)
    _age_heartbeat(db, "w", 60)
    workers.refuse_shared_id(db, "w", host="host-b", pid=2)
    second = workers.register(db, "w", host="host-b", pid=2, lanes=("mtn",), version="t", dead_after=5.0)
    _age_heartbeat(db, "w", 3)
    before = db.execute("SELECT host, pid, heartbeat_at, started_at, stopped_at FROM workers").fetchone()
    assert workers.beat(db, "w", host="host-a", pid=1) == (workers.TAKEN_OVER, "host-b", 2)
    assert workers.stop(db, "w", host="host-a", pid=1) is False  # its exit leaves the other's row live
    # it may not register over it either
    assert workers.register_again(db, "w", host="host-a", pid=1, lanes=("mtn",), version="t",
                                  dead_after=5.0, started_at=None) is None
    assert db.execute("SELECT host, pid, heartbeat_at, started_at, stopped_at FROM workers").fetchone() == before
    assert workers.claimant(db, "w") == (workers.TAKEN_OVER, "host-b", 2)
    # the second beats its own row; its clean exit marks it stopped; the first
    # still finds it the other's (it was "registered again" over it before)
    assert workers.beat(db, "w", host="host-b", pid=2).found == workers.BEATEN
    assert workers.stop(db, "w", host="host-b", pid=2) is True
    assert workers.beat(db, "w", host="host-a", pid=1) == (workers.TAKEN_OVER, "host-b", 2)
    assert _state(db, "w") == "stopped"
    # same host, another pid: taken over too (host and pid, not host alone)
    workers.register(db, "w", host="host-a", pid=3, lanes=("mtn",), version="t", dead_after=5.0)
    assert workers.beat(db, "w", host="host-a", pid=1) == (workers.TAKEN_OVER, "host-a", 3)
    # its own row stopped, or pruned: gone, and registered again by the same process
    workers.stop(db, "w", host="host-a", pid=3)
    assert workers.beat(db, "w", host="host-a", pid=3) == (workers.GONE, "host-a", 3)
    again = workers.register_again(db, "w", host="host-a", pid=3, lanes=("mtn",), version="t",
                                   dead_after=5.0, started_at=second)
    assert again == second and _state(db, "w") == "live"  # its first started_at kept
    db.execute("DELETE FROM workers")
    assert workers.beat(db, "w", host="host-a", pid=3) == (workers.GONE, None, None)
    assert workers.register_again(db, "w", host="host-a", pid=3, lanes=("mtn",), version="t",
                                  dead_after=5.0, started_at=second) == second
    assert workers.beat(db, "w", host="host-a", pid=3).found == workers.BEATEN


def test_a_presence_taken_over_stops_beating_and_asks_for_a_drain_once(db, pool, caplog):
    from vpay.worker.presence import Presence
    asked = []
    presence = Presence(pool, "w-presence", ("housekeeping",), 5.0, "t", on_taken_over=lambda: asked.append(1))
    presence.register()
    assert presence.beat() is True and not presence.taken_over
    db.execute("DELETE FROM workers")  # pruned under it: registered again
    assert presence.beat() is True
    assert db.execute("SELECT host, pid FROM workers").fetchone() == (presence.host, presence.pid)
    workers.register(db, "w-presence", host="elsewhere", pid=99, lanes=("mtn",), version="t", dead_after=5.0)
    with caplog.at_level("ERROR", logger="vpay.worker"):
        assert presence.beat() is False
        assert presence.beat() is False  # no second statement, no second line
    assert presence.taken_over and presence.taken_over_by == ("elsewhere", 99) and asked == [1]
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == \
        ["worker id taken over by another process; stopping"]
    presence.stop()  # the exit leaves the other's row as it is
    assert db.execute("SELECT host, pid, stopped_at FROM workers").fetchone() == ("elsewhere", 99, None)


def test_pid_running_tells_a_live_process_from_a_gone_or_zombie_one():
    import os
    import subprocess
    import sys

    from support import wait_until
    assert workers.pid_running(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Exited but not yet waited for: a zombie, which runs nothing.
        wait_until(lambda: open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z",
                   what="the child to exit")
        assert not workers.pid_running(child.pid)
    finally:
        child.wait()
    assert not workers.pid_running(child.pid)


def test_runs_vpay_worker_tells_a_worker_from_a_pid_reused_by_another_program(tmp_path):
    import os
    import subprocess
    import sys

    assert not workers.runs_vpay_worker(os.getpid())  # pytest: running, but not a worker
    sleeper = "import time; time.sleep(60)"
    named = {"script": [sys.executable, "-c", sleeper, "/usr/bin/vpay-worker", "--worker-id", "x"],
             "server": [sys.executable, "-c", sleeper, "/opt/venv/bin/vpay-server", "worker"],
             "other": [sys.executable, "-c", sleeper, "less", "vpay-worker.log", "vpay-server", "jobs"]}
    procs = {name: subprocess.Popen(argv) for name, argv in named.items()}
    try:
        from support import wait_until
        for proc in procs.values():  # each one's own command line, once the kernel shows it
            wait_until(lambda: b"time.sleep(60)" in open(f"/proc/{proc.pid}/cmdline", "rb").read(),
                       what="the sleeper's command line")
        assert workers.runs_vpay_worker(procs["script"].pid)
        assert workers.runs_vpay_worker(procs["server"].pid)
        assert not workers.runs_vpay_worker(procs["other"].pid)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    assert not workers.runs_vpay_worker(procs["script"].pid)  # gone
