"""Dead workers and outcomes after an outage, with real processes (issue 25,
"Workers as rows" and "Outcomes after an outage").

* A SIGKILLed ``vpay-worker``'s job is reaped by another worker's reaper once
  the dead one's heartbeat is older than ``VPAY_WORKER_DEAD_AFTER_SECONDS``
  (3 s here), and run there, while its 600 s lease is far from expiry: only
  the heartbeat path can have freed it. ``workers list`` shows both workers
  live, then the killed one dead.
* A SIGSTOPped worker's lease is reaped the same way and the job run
  elsewhere; woken with SIGCONT, its outcome's write is fenced on its lease
  and changes nothing.
* A worker whose outcome write meets a database outage (a TCP relay between
  it and Postgres, cut by the test past the worker's 30 s of retries) keeps
  the outcome and writes it within seconds of the relay being restored,
  never leaving the job leased to itself until its 600 s lease runs out.

The jobs are ``test.hold`` (vpay/handlers/testing.py): the first attempt
waits for a file the test writes, so the test decides when a handler
returns.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
from urllib.parse import quote

import psycopg
import pytest

from support import base_env, script, wait_until
from vpay.engine import queue

pytestmark = pytest.mark.slow

LEASE = "600"  # seconds: no lease runs out during a test; only a holder's row can free it
DEAD_AFTER = "3"


def _worker(spawn, db_url: str, wid: str, **env: str):
    return spawn("vpay-worker", "--worker-id", wid, "--queues", "housekeeping", "--worker-concurrency", "2",
                 "--lease-seconds", LEASE, "--idle-sleep", "0.2",
                 env=base_env(db_url, VPAY_TEST_HANDLERS="1", **env))


def _workers_list(db_url: str) -> dict[str, dict]:
    res = subprocess.run([script("vpay-server"), "workers", "list", "--json"], env=base_env(db_url),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return {w["id"]: w for w in json.loads(res.stdout)}


def _holder(db, key: str):
    row = db.execute("SELECT locked_by FROM jobs WHERE dedupe_key = %s", (key,)).fetchone()
    return row[0] if row else None


def _handled(proc, key: str) -> list[dict]:
    return [line for line in proc.find("job handled") if line.get("dedupe_key") == key]


def test_a_sigkilled_workers_job_is_reaped_by_another_worker_within_the_heartbeat_bound(
        db, db_url, spawn, tmp_path):
    a = _worker(spawn, db_url, "A", VPAY_WORKER_DEAD_AFTER_SECONDS=DEAD_AFTER)
    a.wait_for_log("worker started", timeout=60)
    queue.enqueue(db, "test.hold", "hold:killed", {"until": str(tmp_path / "never")}, lane="housekeeping")
    wait_until(lambda: _holder(db, "hold:killed") == "A", timeout=60, what="A to hold the job")
    expires = db.execute("SELECT lease_expires_at FROM jobs WHERE dedupe_key = 'hold:killed'").fetchone()[0]
    b = _worker(spawn, db_url, "B", VPAY_WORKER_DEAD_AFTER_SECONDS=DEAD_AFTER)
    b.wait_for_log("worker started", timeout=60)
    seen = wait_until(lambda: (lambda ws: ws if {"A", "B"} <= set(ws) else None)(_workers_list(db_url)),
                      timeout=60, what="workers list to show A and B")
    assert (seen["A"]["state"], seen["A"]["leases"] >= 1, seen["B"]["state"]) == ("live", True, "live")
    assert seen["A"]["lanes"] == ["housekeeping"] and seen["A"]["pid"] == a.pid

    a.signal(signal.SIGKILL)
    a.wait(30)
    wait_until(lambda: _handled(b, "hold:killed"), timeout=60, what="B to run the killed worker's job")
    [ran] = _handled(b, "hold:killed")
    assert ran["attempts"] == 2 and ran["outcome"] == "Done"
    reaped = [line for line in b.find("lease reaped") if line.get("dedupe_key") == "hold:killed"]
    assert [line["why"] for line in reaped] == ["dead"]
    # by condition, not by the clock: the lease had most of its 600 s to run
    assert db.execute("SELECT now() < %s - interval '500 seconds'", (expires,)).fetchone()[0]
    assert db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = 'hold:killed'").fetchone()[0] == 0

    after = _workers_list(db_url)
    assert (after["A"]["state"], after["A"]["leases"]) == ("dead", 0)
    assert after["A"]["heartbeat_age"] >= float(DEAD_AFTER)
    assert after["B"]["state"] == "live"
    b.signal(signal.SIGTERM)
    assert b.wait(60) == 0, b.text()[-3000:]
    assert _workers_list(db_url)["B"]["state"] == "stopped"  # a clean exit marks the row


def test_a_frozen_worker_whose_lease_was_reaped_stays_fenced_when_it_wakes(db, db_url, spawn, tmp_path):
    release = tmp_path / "release"
    a = _worker(spawn, db_url, "A", VPAY_WORKER_DEAD_AFTER_SECONDS=DEAD_AFTER)
    a.wait_for_log("worker started", timeout=60)
    queue.enqueue(db, "test.hold", "hold:frozen", {"until": str(release), "retry_after": 3600},
                  lane="housekeeping")
    wait_until(lambda: _holder(db, "hold:frozen") == "A", timeout=60, what="A to hold the job")
    a.signal(signal.SIGSTOP)  # frozen: its heartbeat stops with it
    try:
        b = _worker(spawn, db_url, "B", VPAY_WORKER_DEAD_AFTER_SECONDS=DEAD_AFTER)
        wait_until(lambda: _handled(b, "hold:frozen"), timeout=60, what="B to run the frozen worker's job")
        [ran] = _handled(b, "hold:frozen")
        assert ran["attempts"] == 2 and ran["outcome"] == "RetryAfter"
        assert [line["why"] for line in b.find("lease reaped")
                if line.get("dedupe_key") == "hold:frozen"] == ["dead"]
        before = db.execute("SELECT locked_by, run_at, attempts, failures, ended_token, last_error "
                            "FROM jobs WHERE dedupe_key = 'hold:frozen'").fetchone()
        assert before[0] is None and before[4] is not None
    finally:
        release.write_text("go")
        a.signal(signal.SIGCONT)
    # A's handler returns and writes its RetryAfter under the lease it lost
    a.wait_for_log("lease lost: the outcome was discarded", timeout=60, dedupe_key="hold:frozen")
    after = db.execute("SELECT locked_by, run_at, attempts, failures, ended_token, last_error "
                       "FROM jobs WHERE dedupe_key = 'hold:frozen'").fetchone()
    assert after == before  # B's reschedule stands: A's write changed nothing
    wait_until(lambda: _workers_list(db_url)["A"]["state"] == "live", timeout=60,
               what="A to beat again once woken")
    assert _holder(db, "hold:frozen") is None


class Relay:
    """A TCP relay between a worker and Postgres that the test cuts (every
    connection through it is closed, and new ones are closed as soon as
    accepted: the database went away) and restores."""

    def __init__(self, url: str):
        parts = psycopg.conninfo.conninfo_to_dict(url)
        host, port = parts.get("host") or "/tmp", int(parts.get("port") or 5432)
        self.target = ((socket.AF_UNIX, f"{host}/.s.PGSQL.{port}") if host.startswith("/")
                       else (socket.AF_INET, (host, port)))
        self.listener = socket.create_server(("127.0.0.1", 0))
        user = quote(parts.get("user") or "postgres", safe="")
        password = parts.get("password")
        auth = f"{user}:{quote(password, safe='')}" if password else user
        self.url = (f"postgresql://{auth}@127.0.0.1:{self.listener.getsockname()[1]}/"
                    f"{quote(parts['dbname'], safe='')}?sslmode=disable&gssencmode=disable")
        self.up = threading.Event()
        self.up.set()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up.is_set():
                client.close()
                continue
            server = socket.socket(self.target[0], socket.SOCK_STREAM)
            try:
                server.connect(self.target[1])
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        self._close(src, dst)

    def _close(self, *socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
            with self._lock:
                self._open.discard(s)

    def cut(self) -> None:
        self.up.clear()
        with self._lock:
            socks = list(self._open)
        self._close(*socks)

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_an_outcome_whose_write_met_a_database_outage_is_handed_back_within_seconds_of_the_database_answering(
        db, db_url, spawn, tmp_path):
    relay = Relay(db_url)
    release = tmp_path / "release"
    try:
        a = spawn("vpay-worker", "--worker-id", "A", "--queues", "housekeeping", "--worker-concurrency", "1",
                  "--lease-seconds", LEASE, "--idle-sleep", "0.2",
                  env=base_env(relay.url, VPAY_TEST_HANDLERS="1"))
        a.wait_for_log("worker started", timeout=60)
        queue.enqueue(db, "test.hold", "hold:outage", {"until": str(release)}, lane="housekeeping")
        wait_until(lambda: _holder(db, "hold:outage") == "A", timeout=60, what="A to hold the job")
        relay.cut()  # the database goes away while the handler runs
        release.write_text("go")  # the handler returns: its Done cannot be written
        # past the claim loop's own retries (30 s): the outcome is kept, the job still leased to A
        a.wait_for_log("could not record the job's outcome; kept, to be written when the database answers",
                       timeout=120, dedupe_key="hold:outage")
        assert _holder(db, "hold:outage") == "A"
        relay.restore()
        # written once the database answers: the job is gone long before its 600 s lease ends
        wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = 'hold:outage'"
                                      ).fetchone()[0] == 0,
                   timeout=60, what="the kept outcome to be written")
        written = a.wait_for_log("kept outcome written: the database answers again", timeout=30,
                                 dedupe_key="hold:outage")
        assert written["kept_seconds"] > 0
        assert not a.find("could not record the job's outcome; its lease will be reaped")
        a.signal(signal.SIGTERM)
        assert a.wait(60) == 0, a.text()[-3000:]
    finally:
        relay.close()


@pytest.mark.parametrize("bad", ["0", "0.5", "3601", "nan", "soon"])
def test_a_dead_after_setting_that_cannot_be_meant_is_refused_at_boot_with_78(db, db_url, bad):
    res = subprocess.run([script("vpay-worker")], env=base_env(db_url, VPAY_WORKER_DEAD_AFTER_SECONDS=bad),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 78, res.stdout[-2000:] + res.stderr[-2000:]
    assert "VPAY_WORKER_DEAD_AFTER_SECONDS" in res.stderr and res.stderr.count("\n") == 1
    assert db.execute("SELECT count(*) FROM workers").fetchone()[0] == 0  # booted nothing


def test_a_second_process_under_a_live_workers_id_is_refused_with_78_and_a_crashed_ones_id_is_taken(
        db, db_url, spawn):
    first = _worker(spawn, db_url, "same-id")
    first.wait_for_log("worker started")
    res = subprocess.run([script("vpay-worker"), "--worker-id", "same-id", "--queues", "housekeeping"],
                         env=base_env(db_url), capture_output=True, text=True, timeout=60)
    assert res.returncode == 78, res.stdout[-2000:] + res.stderr[-2000:]
    assert "'same-id' is live in another process" in res.stderr and res.stderr.count("\n") == 1
    assert _workers_list(db_url)["same-id"]["pid"] == first.pid  # the first keeps its row
    first.signal(signal.SIGKILL)
    first.wait(30)
    again = _worker(spawn, db_url, "same-id")  # systemd's restart after a crash: same id at once
    again.wait_for_log("worker started")
    assert _workers_list(db_url)["same-id"]["pid"] == again.pid
    again.signal(signal.SIGTERM)
    assert again.wait(60) == 0, again.text()[-3000:]


def _row(db, wid: str):
    return db.execute("SELECT host, pid, state FROM worker_states WHERE id = %s", (wid,)).fetchone()


def test_a_second_process_under_the_id_of_a_frozen_worker_on_this_host_is_refused_with_78(db, db_url, spawn):
    # Frozen past its bound, the first is dead by its heartbeat, but its pid
    # still runs a vpay-worker: it comes back with SIGCONT. The second used
    # to start, and both claimed as the same id.
    first = _worker(spawn, db_url, "frozen-id", VPAY_WORKER_DEAD_AFTER_SECONDS=DEAD_AFTER)
    first.wait_for_log("worker started", timeout=60)
    first.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _row(db, "frozen-id")[2] == "dead", timeout=60,
                   what="the frozen worker to be dead by its heartbeat")
        res = subprocess.run([script("vpay-worker"), "--worker-id", "frozen-id", "--queues", "housekeeping"],
                             env=base_env(db_url, VPAY_WORKER_DEAD_AFTER_SECONDS=DEAD_AFTER),
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 78, res.stdout[-2000:] + res.stderr[-2000:]
        [line] = res.stderr.splitlines()
        assert f"'frozen-id' is held by a vpay-worker still running on this host (pid {first.pid}, " \
               f"dead by its heartbeat" in line
        assert _row(db, "frozen-id")[1] == first.pid  # the first keeps its row
    finally:
        first.signal(signal.SIGCONT)
    wait_until(lambda: _row(db, "frozen-id")[2] == "live", timeout=60, what="the first to beat again")
    first.signal(signal.SIGTERM)
    assert first.wait(60) == 0, first.text()[-3000:]
    assert not first.find("worker id taken over by another process; stopping")


def test_a_worker_whose_id_was_taken_over_while_frozen_stops_and_exits_1_when_it_wakes(db, db_url, spawn):
    # Frozen past its bound on "another host" (the row's host is changed
    # while it is stopped: the takeover refuse_shared_id allows), the id is
    # taken by a second process. Woken, the first must not beat, register or
    # claim under the id again: it used to log "this worker's row was gone:
    # registered again" once the second stopped, and carry on.
    first = _worker(spawn, db_url, "moved", VPAY_WORKER_DEAD_AFTER_SECONDS=DEAD_AFTER)
    first.wait_for_log("worker started", timeout=60)
    first.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _row(db, "moved")[2] == "dead", timeout=60, what="the first to be dead by its heartbeat")
        db.execute("UPDATE workers SET host = 'another-host' WHERE id = 'moved'")
        second = _worker(spawn, db_url, "moved", VPAY_WORKER_DEAD_AFTER_SECONDS=DEAD_AFTER)
        second.wait_for_log("worker started", timeout=60)
        assert _row(db, "moved") == (socket.gethostname(), second.pid, "live")
    finally:
        first.signal(signal.SIGCONT)
    line = first.wait_for_log("worker id taken over by another process; stopping", timeout=60)
    assert (line["level"], line["taken_over_by_pid"], line["pid"]) == ("ERROR", second.pid, first.pid)
    assert first.wait(60) == 1, first.text()[-3000:]
    assert first.find("draining", signal="taken_over")
    assert not first.find("this worker's row was gone: registered again")
    assert _row(db, "moved") == (socket.gethostname(), second.pid, "live")  # the first's exit left it be
    queue.enqueue(db, "test.count", "k:after", lane="housekeeping")
    wait_until(lambda: [l for l in second.find("job handled") if l.get("dedupe_key") == "k:after"],
               timeout=60, what="the second to run a job under the id")
    second.signal(signal.SIGTERM)
    assert second.wait(60) == 0, second.text()[-3000:]
    assert _row(db, "moved") == (socket.gethostname(), second.pid, "stopped")
