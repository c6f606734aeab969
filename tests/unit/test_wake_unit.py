"""The waker and the listener's hand-over to idle loops, without a database
(issue #15). The unit half of tests/integration/test_wake.py.
"""

from __future__ import annotations

import threading

from support import wait_until
from vpay.engine.wake import Waker


def test_waker_keeps_a_notification_that_found_no_idle_loop_for_the_next_to_sleep():
    waker = Waker([("mtn",), ("mtn", "orange")])
    waker.notify("orange")              # nobody idle: pending for orange
    waker.notify("webhooks")            # no loop serves it: dropped
    assert waker.sleep(0, 0.01) is False  # loop 0 does not serve orange: sleeps its full timeout
    assert waker.sleep(1, 30) is True     # loop 1 claims again at once
    assert waker.sleep(1, 0.01) is False  # consumed once


def test_a_loop_whose_sleep_ends_while_the_listener_claims_for_it_waits_for_that_claim():
    # The drain (or the loop's own timeout) must not leave a job the listener
    # is claiming for it without an owner: the loop takes the answer.
    waker = Waker([("mtn",)])
    in_claim, release = threading.Event(), threading.Event()
    released = [False]
    seen: list = []

    def slow_claim(lanes):
        in_claim.set()
        release.wait(30)
        released[0] = True
        return ("job", None)

    sleeper = threading.Thread(target=lambda: seen.append((waker.sleep(0, 30), released[0])))
    sleeper.start()
    wait_until(lambda: waker._idle == [0], timeout=10, what="the loop asleep")
    claimer = threading.Thread(target=lambda: waker.claim_for("mtn", slow_claim))
    claimer.start()
    assert in_claim.wait(10)
    waker.stop()                  # the drain wakes every loop...
    release.set()
    sleeper.join(10)
    claimer.join(10)
    assert seen == [(True, True)]  # ...but this one returned only after the claim
    assert waker.take(0) == ("job", None)


def test_a_listener_claim_that_finds_no_idle_loop_claims_nothing_and_keeps_the_lane_pending():
    waker = Waker([("mtn",)])
    calls: list = []
    assert waker.claim_for("mtn", calls.append) is False      # the loop is busy
    assert waker.claim_for("webhooks", calls.append) is False  # no loop serves it
    assert calls == []
    assert waker.sleep(0, 30) is True  # the busy loop claims again before sleeping
    assert waker.take(0) is None
