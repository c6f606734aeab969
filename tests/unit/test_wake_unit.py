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


def test_a_pending_notification_older_than_the_loops_last_claim_does_not_make_it_claim_again():
    # Issue 30: a loop busy with a job is notified of the next; the claim
    # written with its outcome (after the notification, so after the commit)
    # takes it or finds it taken. Going idle, it must not claim once more.
    waker = Waker([("webhooks",)])
    waker.notify("webhooks")             # the loop is busy: pending
    waker.claiming(0)                    # its finish-and-claim: sees that job
    assert waker.sleep(0, 0.01) is False  # sleeps: nothing new since
    waker.notify("webhooks")             # busy again (no loop idle): pending, newer
    assert waker.sleep(0, 30) is True     # claims again at once
    assert waker.sleep(0, 0.01) is False  # consumed once


def test_a_claim_before_the_notification_leaves_it_pending_for_the_loop():
    waker = Waker([("mtn",), ("mtn",)])
    waker.claiming(0)                    # loop 0 claims: nothing notified yet
    waker.notify("mtn")                  # both busy: pending
    waker.claiming(1)                    # loop 1 claims after it: saw the job
    assert waker.sleep(0, 30) is True     # loop 0's claim was older: it claims again


def test_a_borrowers_stale_pending_lane_does_not_make_it_claim_and_a_newer_one_does():
    waker = Waker([("mtn",), ("webhooks",)], lendable=lambda lanes: frozenset({"mtn"}) - set(lanes))
    waker.notify("mtn")                  # nobody idle: pending for mtn
    waker.claiming(1)                    # the webhooks loop claims (mtn lent to it)
    assert waker.sleep(1, 0.01) is False
    waker.notify("mtn")
    assert waker.sleep(1, 30) is True
    waker.claiming(1)                    # it claims
    assert waker.sleep(1, 0.01) is False  # once


# A borrower's claim skips the parties it may not take (vpay/engine/timeshare.py:
# a party with a slow job remembered, one at its share). So a borrower that
# claimed after a lane's notification did not necessarily see its job: the
# lane must stay pending for its own loops, one of which may be in a claim
# whose snapshot is older than the job (fresh-clone review of issue 30, a
# lost wake-up: the job waited for the own loop's idle sleep).
LENDS_MTN_TO_WEBHOOKS = dict(lendable=lambda lanes: frozenset({"webhooks"}) - set(lanes))


def test_a_borrower_going_idle_leaves_a_lent_lanes_notification_to_the_lanes_own_loop():
    waker = Waker([("mtn",), ("webhooks",)], **LENDS_MTN_TO_WEBHOOKS)
    waker.claiming(1)                    # the webhooks loop's claim: its snapshot predates job X
    waker.notify("webhooks")             # X commits; nobody idle: pending
    waker.claiming(0)                    # the mtn loop finishes and claims, webhooks lent, X's party skipped
    assert waker.sleep(0, 0.01) is False  # it saw the notification's moment: no claim again
    assert waker.sleep(1, 30) is True     # the own loop's claim was older: it claims again at once
    waker.claiming(1)
    assert waker.sleep(1, 0.01) is False  # and that consumed it


def test_a_borrower_the_listener_claimed_for_leaves_the_lane_pending_for_its_own_loop():
    waker = Waker([("mtn",), ("webhooks",)], **LENDS_MTN_TO_WEBHOOKS)
    sleeper = threading.Thread(target=lambda: waker.sleep(0, 30))
    sleeper.start()                      # the mtn loop idle, the webhooks loop busy
    wait_until(lambda: waker._idle == [0], timeout=10, what="the mtn loop asleep")
    waker.claiming(1)                    # the webhooks loop's claim, older than X
    seen: list = []
    # X commits: the listener claims for the idle borrower, whose claim skips X's party
    assert waker.claim_for("webhooks", lambda lanes: seen.append(lanes)) is True
    sleeper.join(10)
    assert seen == [("mtn",)] and waker.take(0) is None
    assert waker.sleep(0, 0.01) is False  # the borrower: its claim came after, no claim again
    assert waker.sleep(1, 30) is True     # the webhooks loop: claims again at once


def test_a_borrower_woken_by_a_notification_leaves_the_lane_pending_for_its_own_loop():
    waker = Waker([("mtn",), ("webhooks",)], **LENDS_MTN_TO_WEBHOOKS)
    sleeper = threading.Thread(target=lambda: waker.sleep(0, 30))
    sleeper.start()
    wait_until(lambda: waker._idle == [0], timeout=10, what="the mtn loop asleep")
    waker.claiming(1)                    # the webhooks loop's claim, older than X
    waker.notify("webhooks")             # wakes the borrower (no listener claim)
    sleeper.join(10)
    waker.claiming(0)                    # the borrower claims: X's party skipped
    assert waker.sleep(0, 0.01) is False
    assert waker.sleep(1, 30) is True


def test_a_lanes_own_idle_loop_is_woken_without_leaving_the_lane_pending():
    waker = Waker([("mtn",), ("webhooks",)], **LENDS_MTN_TO_WEBHOOKS)
    sleeper = threading.Thread(target=lambda: waker.sleep(1, 30))
    sleeper.start()
    wait_until(lambda: waker._idle == [1], timeout=10, what="the webhooks loop asleep")
    waker.notify("webhooks")             # its own loop: no pending kept
    sleeper.join(10)
    waker.claiming(1)
    assert waker._pending == {}
    assert waker.sleep(1, 0.01) is False


def test_the_listeners_claim_for_a_loop_counts_as_that_loops_claim():
    waker = Waker([("mtn",)])
    sleeper = threading.Thread(target=lambda: waker.sleep(0, 30))
    sleeper.start()
    wait_until(lambda: waker._idle == [0], timeout=10, what="the loop asleep")
    seen: list = []

    def claim(lanes):
        waker.notify("mtn")              # committed meanwhile: no loop idle, pending
        seen.append(lanes)
        return ("job", None)

    assert waker.claim_for("mtn", claim) is True
    sleeper.join(10)
    assert seen == [("mtn",)] and waker.take(0) == ("job", None)
    # the notification came during the listener's claim, after it began: newer
    assert waker.sleep(0, 30) is True
