"""One watchdog thread per process expires every ``Deadline`` (issue 30;
``vpay.base.http_deadline``): not a thread per rail call or webhook attempt.
The deadline's effect on a trickling peer: tests/unit/test_isolation_unit.py."""

from __future__ import annotations

import socket
import threading
import time

from support import wait_until
from vpay.base import http_deadline
from vpay.base.http_deadline import Deadline


def _watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "http-deadline"]


def test_many_deadlines_share_one_thread_and_the_heap_forgets_those_left():
    with Deadline(60.0):
        pass
    before = threading.active_count()
    for _ in range(2000):
        with Deadline(60.0):
            pass
    assert threading.active_count() <= before  # no thread per deadline (another may end meanwhile)
    assert http_deadline._watchdog._thread in _watchdogs()
    # left before their time: skipped, and dropped once they are most of the heap
    assert len(http_deadline._watchdog._heap) <= 128


def test_a_sooner_deadline_set_later_expires_first_and_shuts_its_socket():
    a, b = socket.socketpair()
    try:
        with Deadline(600.0) as outer:
            with Deadline(0.05) as inner:
                inner.attach(a)
                # the thread waits for the sooner one, not the outer's 600 s
                wait_until(lambda: inner.expired, timeout=10, what="the inner deadline")
                assert a.recv(1) == b""  # shut: a blocked read wakes with EOF
            assert not outer.expired
    finally:
        a.close()
        b.close()


def test_a_deadline_left_in_time_never_expires_and_shuts_nothing():
    a, b = socket.socketpair()
    try:
        with Deadline(0.2) as left:
            left.attach(a)
        later = Deadline(0.3)  # due after the one left: the watchdog passed that one first
        with later:
            wait_until(lambda: later.expired, timeout=10, what="a later deadline")  # its time has come too
        assert not left.expired
        b.sendall(b"x")
        assert a.recv(1) == b"x"  # still open both ways
    finally:
        a.close()
        b.close()


def test_a_socket_attached_after_the_block_was_left_is_not_kept():
    a, b = socket.socketpair()
    try:
        d = Deadline(60.0)
        with d:
            pass
        d.attach(a)
        assert d._socks == []
    finally:
        a.close()
        b.close()


def test_a_busy_process_wakes_the_watchdog_about_once_a_tick_not_once_a_call():
    # Deadlines entered while the thread already plans to look sooner than
    # they are due do not wake it.
    dog = http_deadline._Watchdog()
    wakes = []
    original = dog._cond.notify
    dog._cond.notify = lambda n=1: (wakes.append(1), original(n))[1]
    first = Deadline(60.0)
    dog.watch(first, time.monotonic() + 60.0)  # idle thread: woken (it looks at most a tick ahead)
    wait_until(lambda: dog._next_look < float("inf"), timeout=10, what="the watchdog's next look")
    for _ in range(500):
        d = Deadline(60.0)
        dog.watch(d, time.monotonic() + 60.0)
        d.done = True
        dog.left()
    assert len(wakes) == 1
    soon = Deadline(0.01)
    dog.watch(soon, time.monotonic() + 0.01)  # due before its next look: woken
    assert len(wakes) == 2
    wait_until(lambda: soon.expired, timeout=10, what="the soon deadline")
