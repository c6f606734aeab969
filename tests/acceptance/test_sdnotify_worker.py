"""sd_notify from the installed vpay-worker, read off a real AF_UNIX datagram
socket standing in for systemd's NOTIFY_SOCKET (design/rails.md, "Operations").

The socket has SO_TIMESTAMP on, so every datagram carries the kernel's time of
its send; orderings are checked against that, not against when this test got
round to reading it.
"""

from __future__ import annotations

import signal
import socket
import struct
import time

import pytest

from support import base_env, rail_env, wait_until
from vpay.money import payments
from vpay.rails.mtn import MtnMomo

pytestmark = pytest.mark.slow

SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29)
_TIMEVAL = struct.Struct("@ll")
WITHHELD = "watchdog withheld: a claim loop has not come round"


class NotifySocket:
    """The service manager's end: collects ``(sent_at, {KEY: VALUE})``."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
        self.sock.setblocking(False)
        self.received: list[tuple[float, dict[str, str]]] = []

    def pump(self) -> list[tuple[float, dict[str, str]]]:
        """Read every datagram queued so far."""
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(_TIMEVAL.size))
            except BlockingIOError:
                return self.received
            sent_at = time.time()
            for level, kind, raw in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP:
                    sec, usec = _TIMEVAL.unpack(raw[:_TIMEVAL.size])
                    sent_at = sec + usec / 1e6
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if line)
            self.received.append((sent_at, fields))

    def with_key(self, key: str) -> list[tuple[float, dict[str, str]]]:
        return [(t, f) for t, f in self.pump() if key in f]

    def wait_for(self, key: str, timeout: float = 30.0) -> tuple[float, dict[str, str]]:
        return wait_until(lambda: (self.with_key(key) or [None])[0], timeout, what=f"{key}= on NOTIFY_SOCKET")

    def close(self):
        self.sock.close()


@pytest.fixture
def notify(tmp_path):
    s = NotifySocket(tmp_path / "notify.sock")
    yield s
    s.close()


def test_ready_before_any_job_status_and_stopping_after_the_signal(db, db_url, pool, sandbox, merchant,
                                                                  spawn, notify):
    adapter = MtnMomo.from_env(rail_env(sandbox))
    charge = payments.create_and_submit(pool, lambda code: adapter, merchant_id=merchant, amount=500,
                                        currency="EUR", rail="mtn", payer="256770000031")["charge"]
    db.execute("UPDATE jobs SET run_at = now() WHERE kind = 'poll'")  # due the moment claiming starts
    env = base_env(db_url, **rail_env(sandbox), NOTIFY_SOCKET=notify.path)
    worker = spawn("vpay-worker", "--idle-sleep", "0.1", env=env)

    ready_at, ready = notify.wait_for("READY")
    assert ready == {"READY": "1", "STATUS": "claiming with 4 loops"}
    assert notify.received[0][1] == ready  # the first thing the worker says
    # The poll is handled after READY=1 was sent: its status read reached the
    # rail (this process's clock, like the kernel's send stamp) later.
    wait_until(lambda: sandbox.count(method="GET", reference=charge["rail_reference"]) >= 1,
               timeout=30, what="the poll's status read")
    [first_read] = [e["at"] for e in sandbox.requests_log()
                    if e["method"] == "GET" and e["reference"] == charge["rail_reference"]][:1]
    assert ready_at < first_read
    assert notify.with_key("STOPPING") == []

    signalled_at = time.time()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    [(stopping_at, stopping)] = notify.with_key("STOPPING")
    assert stopping["STOPPING"] == "1" and stopping_at > signalled_at
    [(_, extend)] = notify.with_key("EXTEND_TIMEOUT_USEC")
    assert int(extend["EXTEND_TIMEOUT_USEC"]) > 30_000_000  # the grace (30 s) and a margin
    # the final gauge is published as STATUS=, after STOPPING=1
    final = [(t, f) for t, f in notify.with_key("STATUS") if t > stopping_at]
    assert final and "done=" in final[-1][1]["STATUS"]
    # no WATCHDOG_USEC in the environment: no keep-alives
    assert notify.with_key("WATCHDOG") == []


def test_watchdog_pings_and_is_withheld_while_a_claim_loop_is_stuck(db, db_url, spawn, notify):
    db.execute("CREATE TABLE test_executions (job_key text NOT NULL, worker text NOT NULL)")
    env = base_env(db_url, VPAY_TEST_HANDLERS="1", NOTIFY_SOCKET=notify.path, WATCHDOG_USEC="1000000")
    worker = spawn("vpay-worker", "--worker-concurrency", "1", "--idle-sleep", "0.1",
                   "--shutdown-grace-seconds", "1", env=env)
    notify.wait_for("READY")
    # healthy and idle: a ping every half WATCHDOG_USEC
    wait_until(lambda: len(notify.with_key("WATCHDOG")) >= 3, timeout=30, what="three WATCHDOG=1")
    assert worker.find(WITHHELD) == []

    # The only claim loop takes a job that sleeps for 8 s: it does not come round.
    db.execute("""INSERT INTO jobs (kind, lane, dedupe_key, payload)
                  VALUES ('test.count', 'housekeeping', 'stuck', '{"sleep": 8}')""")
    worker.wait_for_log(WITHHELD)
    stuck_from = time.time()
    seen = len(worker.find(WITHHELD))
    wait_until(lambda: len(worker.find(WITHHELD)) >= seen + 2, timeout=30,
               what="two more withheld rounds")
    stuck_until = time.time()
    # still inside the handler at stuck_until, so the loop was stuck all along
    assert db.execute("SELECT count(*) FROM test_executions").fetchone()[0] == 0
    pings = [t for t, _ in notify.with_key("WATCHDOG")]
    assert [t for t in pings if stuck_from <= t <= stuck_until] == []

    # The handler returns, the loop comes round, the pings resume.
    wait_until(lambda: db.execute("SELECT count(*) FROM test_executions").fetchone()[0] == 1,
               timeout=30, what="the sleeping job to finish")
    finished_at = time.time()
    wait_until(lambda: any(t > finished_at for t, _ in notify.with_key("WATCHDOG")), timeout=30,
               what="WATCHDOG=1 again")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0


def test_an_idle_sleep_longer_than_the_ping_interval_is_not_taken_for_a_stuck_loop(db_url, db, spawn, notify):
    # pings every 0.5 s; an idle loop comes round only every 1.5 s
    env = base_env(db_url, NOTIFY_SOCKET=notify.path, WATCHDOG_USEC="1000000")
    worker = spawn("vpay-worker", "--worker-concurrency", "1", "--idle-sleep", "1.5", env=env)
    notify.wait_for("READY")
    wait_until(lambda: len(notify.with_key("WATCHDOG")) >= 8, timeout=30, what="eight WATCHDOG=1")
    assert worker.find(WITHHELD) == []
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
