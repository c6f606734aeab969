"""The rail pause board in Postgres (vpay/rails/pauses.py, table
``rail_pauses``; issue 25, "Rail backpressure fleet-wide"), against a real
database: a pause only extends, a copy is read again at its refresh bound
and not before, a gate honours what another process wrote, a board that
cannot be reached changes nothing, and ``vpay-server rails list`` shows it.
Two real workers: tests/acceptance/test_isolation.py."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import pytest
from click.testing import CliRunner

from vpay.base import db as vdb
from vpay.cli import main
from vpay.rails.gate import RailGate, share_pauses
from vpay.rails.pauses import REFRESH_SECONDS, DatabasePauses
from vpay.rails.port import RailPaused
from support import wait_until


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _row(db, rail="mtn"):
    """``(seconds paused for, reason, set_by)``: the length as written
    (``paused_until - set_at``, one statement's ``now()``), so it does not
    shrink while a loaded machine runs the test."""
    return db.execute("SELECT extract(epoch FROM paused_until - set_at)::float8, reason, set_by "
                      "FROM rail_pauses WHERE rail = %s", (rail,)).fetchone()


def _left(db, rail="mtn") -> float:
    """Seconds left of ``rail``'s pause on the database's clock, now: no
    more than any copy read earlier says."""
    return db.execute("SELECT extract(epoch FROM paused_until - now())::float8 FROM rail_pauses "
                      "WHERE rail = %s", (rail,)).fetchone()[0]


def test_a_pause_only_extends(db, pool):
    a, b = DatabasePauses(pool, "replica-a:1"), DatabasePauses(pool, "replica-b:2")
    a.publish("mtn", 30, "HTTP 429 Retry-After 30")
    assert _row(db) == (30, "HTTP 429 Retry-After 30", "replica-a:1")
    b.publish("mtn", 5, "HTTP 429 Retry-After 5")  # shorter: the longer pause stays, and whose it is
    assert _row(db) == (30, "HTTP 429 Retry-After 30", "replica-a:1")
    b.publish("mtn", 60, "HTTP 503 Retry-After 60")
    assert _row(db) == (60, "HTTP 503 Retry-After 60", "replica-b:2")
    assert db.execute("SELECT count(*) FROM rail_pauses").fetchone()[0] == 1  # one row per rail


def test_a_pause_that_is_over_is_replaced_by_a_new_shorter_one(db, pool):
    db.execute("INSERT INTO rail_pauses (rail, paused_until, reason, set_by) "
               "VALUES ('mtn', now() - interval '1 second', 'old', 'w:0')")
    DatabasePauses(pool, "w:1").publish("mtn", 5, "HTTP 429 Retry-After 5")
    assert _row(db) == (5, "HTTP 429 Retry-After 5", "w:1")


def test_the_copy_is_read_again_at_its_refresh_bound_and_not_before(db, pool):
    clock = Clock()
    board = DatabasePauses(pool, "replica-b:2", clock=clock)
    assert board.in_force("mtn") is None  # read: nothing paused
    DatabasePauses(pool, "replica-a:1").publish("mtn", 30, "HTTP 429 Retry-After 30")
    clock.now += REFRESH_SECONDS - 0.01
    assert board.in_force("mtn") is None  # the copy, not yet stale
    clock.now += 0.01
    pause = board.in_force("mtn")
    assert pause is not None and pause.set_by == "replica-a:1" and _left(db) <= pause.seconds_left <= 30
    clock.now += REFRESH_SECONDS / 2  # the copy ages on this process's clock until read again
    assert board.in_force("mtn").seconds_left == pytest.approx(pause.seconds_left - REFRESH_SECONDS / 2)
    assert board.in_force("orange") is None


class HeldPool:
    """The real pool, whose first checkout waits until the test lets it go:
    a board read on its way, as a loaded database keeps it."""

    def __init__(self, pool):
        self.pool = pool
        self.entered = threading.Event()
        self.go = threading.Event()
        self._held = False

    @contextmanager
    def connection(self, timeout=None):
        if not self._held:
            self._held = True
            self.entered.set()
            assert self.go.wait(30), "the test never let the read go"
        with self.pool.connection(timeout=timeout) as conn:
            yield conn


class CountedLock:
    """A lock that counts the threads that came to it, waiting or not."""

    def __init__(self):
        self._lock = threading.Lock()
        self.arrivals = 0

    def __enter__(self):
        self.arrivals += 1
        self._lock.acquire()

    def __exit__(self, *exc):
        self._lock.release()


def test_a_thread_that_finds_the_board_being_read_waits_for_that_read(db, pool):
    # Two claim loops of a process that had never read the board: the first
    # one's read is on its way when the second checks. The copy was marked
    # fresh when the read began, so the second took the empty copy and sent
    # a read to a rail another replica had paused (two real workers under
    # load: test_isolation.py).
    DatabasePauses(pool, "replica-a:1").publish("mtn", 30, "HTTP 429 Retry-After 30")
    held = HeldPool(pool)
    board = DatabasePauses(held, "replica-b:2")
    board._reading = reading = CountedLock()
    answers = {}

    def check(name):
        answers[name] = board.in_force("mtn")

    first = threading.Thread(target=check, args=("first",))
    first.start()
    assert held.entered.wait(30)
    second = threading.Thread(target=check, args=("second",))
    second.start()
    # Either it answered from the copy already (the bug), or it waits for the read.
    wait_until(lambda: "second" in answers or reading.arrivals == 2, what="the second check")
    held.go.set()
    for t in (first, second):
        t.join(30)
        assert not t.is_alive()
    for name in ("first", "second"):
        assert answers[name] is not None and answers[name].set_by == "replica-a:1", name


def test_a_gate_honours_a_pause_another_process_wrote_without_calling_the_rail(db, pool):
    DatabasePauses(pool, "replica-a:1").publish("mtn", 30, "HTTP 429 Retry-After 30")
    share_pauses(DatabasePauses(pool, "replica-b:2"))
    try:
        with pytest.raises(RailPaused) as paused:
            RailGate("mtn").check()
        RailGate("orange").check()  # another rail: open
    finally:
        share_pauses(None)
    assert _left(db) <= paused.value.seconds <= 30 and "replica-a:1" in paused.value.reason


def test_a_board_that_cannot_be_reached_neither_raises_nor_forgets_its_copy(db, db_url, pool):
    DatabasePauses(pool, "replica-a:1").publish("mtn", 30, "HTTP 429 Retry-After 30")
    clock = Clock()
    mine = vdb.make_pool(db_url, max_size=1, name="vpay-test-board")
    board = DatabasePauses(mine, "replica-b:2", clock=clock)
    assert board.in_force("mtn") is not None
    mine.close()  # every checkout now fails at once
    clock.now += REFRESH_SECONDS
    assert board.in_force("mtn") is not None  # the last copy, aged
    board.publish("orange", 10, "HTTP 503 Retry-After 10")  # logged, not raised
    assert _row(db, "orange") is None


def test_rails_list_shows_every_rail_configured_and_its_pause(db, db_url, pool, monkeypatch):
    monkeypatch.setenv("VPAY_DATABASE_URL", db_url)
    for k in ("VPAY_MTN_BASE_URL", "VPAY_ORANGE_BASE_URL", "VPAY_MPESA_BASE_URL", "VPAY_PAWAPAY_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("VPAY_MTN_BASE_URL", "http://127.0.0.1:9")
    for k, v in (("VPAY_MTN_SUBSCRIPTION_KEY", "k"), ("VPAY_MTN_API_USER", "u"), ("VPAY_MTN_API_KEY", "p")):
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("VPAY_ORANGE_BASE_URL", "http://127.0.0.1:9")  # half configured
    DatabasePauses(pool, "replica-a:1").publish("mtn", 30, "HTTP 429 Retry-After 30")
    db.execute("INSERT INTO rail_pauses (rail, paused_until, reason, set_by) "
               "VALUES ('pawapay', now() - interval '1 minute', 'HTTP 503 Retry-After 5', 'w:0')")
    out = CliRunner().invoke(main, ["rails", "list", "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["rail"]: r for r in json.loads(out.stdout)}
    assert list(rows) == ["mtn", "orange", "mpesa", "pawapay"]
    mtn = rows["mtn"]
    assert mtn["configured"] is True and mtn["paused"] is True and 25 < mtn["seconds_left"] <= 30
    assert (mtn["reason"], mtn["set_by"]) == ("HTTP 429 Retry-After 30", "replica-a:1") and mtn["paused_until"]
    assert rows["orange"]["configured"] is False and "VPAY_ORANGE" in rows["orange"]["configuration_error"]
    assert rows["mpesa"] == {**rows["mpesa"], "configured": False, "paused": False, "paused_until": None}
    assert rows["pawapay"]["paused"] is False and rows["pawapay"]["seconds_left"] == 0  # the last pause, over
    table = CliRunner().invoke(main, ["rails", "list"])
    assert table.exit_code == 0
    header, *lines = table.stdout.splitlines()
    assert header.split()[:5] == ["RAIL", "CONFIGURED", "PAUSED", "PAUSED_UNTIL", "SECONDS_LEFT"]
    assert lines[0].split()[:3] == ["mtn", "yes", "yes"] and "replica-a:1" in lines[0]
