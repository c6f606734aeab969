"""A fair share in time and lending idle loops, without a database (issue 30;
vpay/engine/timeshare.py). Every bound at its edge, on a clock the test moves.
The integration half: tests/integration/test_timeshare.py; with real
processes: tests/acceptance/test_timeshare_acceptance.py.
"""

from __future__ import annotations

import pytest

import vpay.money  # noqa: F401  (registers the rail lanes and webhooks)
from vpay.engine import lanes
from vpay.engine.timeshare import (LANE_COOLDOWN_SECONDS, PARTY_MEMORY_SECONDS, PARTY_SHARE,
                                   SLOW_CALL_SECONDS, TimeShare, TimeShareError, parse_lend,
                                   parse_party_share, share_cap)
from vpay.engine.wake import Waker

DEFAULT_LOOPS = [("mtn",), ("mtn",), ("orange", "mpesa", "pawapay", "housekeeping"), ("webhooks",)]
"""The split of 4 loops with only MoMo configured (lanes.split)."""
PASSIVE = ("orange", "mpesa", "pawapay")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _share(loops=DEFAULT_LOOPS, **kw) -> tuple[TimeShare, Clock]:
    clock = Clock()
    return TimeShare(loops, passive=kw.pop("passive", PASSIVE), clock=clock, **kw), clock


# --- the settings ---------------------------------------------------------------


def test_the_default_split_is_the_one_these_tests_assume():
    assert lanes.split(4, lanes.LANES, None, PASSIVE) == DEFAULT_LOOPS


@pytest.mark.parametrize("text, value", [(None, PARTY_SHARE), ("", PARTY_SHARE), ("  ", PARTY_SHARE),
                                         ("0.5", 0.5), ("1", 1.0), ("0.001", 0.001), (" 0.25 ", 0.25)])
def test_a_party_share_is_a_fraction_above_0_and_at_most_1(text, value):
    assert parse_party_share(text) == value


@pytest.mark.parametrize("text", ["0", "0.0", "-0.5", "1.0001", "2", "nan", "inf", "half", "50%"])
def test_a_party_share_outside_0_to_1_is_refused_naming_where_it_came_from(text):
    with pytest.raises(TimeShareError, match=r"^VPAY_WORKER_PARTY_SHARE must be a fraction above 0 and at most 1"):
        parse_party_share(text, "VPAY_WORKER_PARTY_SHARE")
    with pytest.raises(TimeShareError):
        TimeShare(DEFAULT_LOOPS, share=float("nan") if text == "nan" else 0.0)


@pytest.mark.parametrize("text, value", [(None, True), ("", True), ("on", True), ("ON", True), ("1", True),
                                         ("true", True), ("yes", True), ("off", False), ("Off", False),
                                         ("0", False), ("false", False), ("no", False)])
def test_lending_is_on_or_off(text, value):
    assert parse_lend(text) is value


@pytest.mark.parametrize("text", ["of", "2", "enabled", "-"])
def test_a_lending_setting_that_is_neither_on_nor_off_is_refused(text):
    with pytest.raises(TimeShareError, match="VPAY_WORKER_LEND must be on or off"):
        parse_lend(text)


@pytest.mark.parametrize("share, loops, cap", [(0.5, 1, 1), (0.5, 2, 1), (0.5, 3, 1), (0.5, 4, 2),
                                               (0.5, 5, 2), (0.001, 5, 1), (1.0, 2, 2), (0.6, 5, 3),
                                               (0.2, 5, 1), (0.4, 5, 2)])
def test_the_cap_is_the_share_of_the_lanes_own_loops_rounded_down_and_never_0(share, loops, cap):
    assert share_cap(share, loops) == cap


def test_the_caps_count_each_lanes_own_loops():
    ts, _ = _share()
    assert ts.caps == {"mtn": 1, "orange": 1, "mpesa": 1, "pawapay": 1, "housekeeping": 1, "webhooks": 1}
    ts, _ = _share([("mtn",)] * 4 + [("webhooks", "housekeeping")])
    assert ts.caps["mtn"] == 2 and ts.caps["webhooks"] == 1


# --- the party share ------------------------------------------------------------


def test_a_party_not_seen_yet_holds_at_most_its_share():
    ts, _ = _share()
    assert ts.admit(1, "mtn", "poll/m_t")
    assert not ts.admit(2, "mtn", "poll/m_t")             # a sibling raced past the share: hand it back
    assert ts.unclaimed == 1
    assert ts.plan(("mtn",)) == (("webhooks", "housekeeping"), ("mtn/poll/m_t",))
    assert ts.admit(3, "mtn", "poll/m_c")                 # another party is not held
    assert ts.plan(("mtn",))[1] == ("mtn/poll/m_t", "mtn/poll/m_c")
    ts.done(1, "mtn", "poll/m_t", 0.2)
    assert "mtn/poll/m_t" not in ts.plan(("mtn",))[1]


def test_the_party_share_is_per_lane():
    ts, _ = _share()
    assert ts.admit(1, "mtn", "poll/m_t")
    assert ts.admit(2, "webhooks", "poll/m_t")            # its deliveries are another lane
    assert sorted(ts.plan(("webhooks",))[1]) == ["mtn/poll/m_t", "webhooks/poll/m_t"]  # mtn: lent to webhooks
    assert ts.plan(("webhooks",))[0] == ("mtn", "housekeeping")


def test_jobs_without_a_party_or_outside_the_fair_lanes_are_never_capped():
    ts, _ = _share()
    assert all(ts.admit(i, "housekeeping", None) for i in range(5))
    assert all(ts.admit(10 + i, "housekeeping", "poll/m_x") for i in range(5))  # not a fair lane
    assert ts.plan(("housekeeping",))[1] == ()
    assert ts.running() == 10


def test_a_party_whose_last_job_ended_fast_may_use_every_loop_free():
    ts, clock = _share()
    assert ts.admit(1, "mtn", "poll/m_s")
    clock.now += SLOW_CALL_SECONDS - 0.001
    ts.done(1, "mtn", "poll/m_s", SLOW_CALL_SECONDS - 0.001)  # just under the bound: fast
    assert all(ts.admit(i, "mtn", "poll/m_s") for i in range(2, 6))
    assert ts.plan(("mtn",))[1] == ()


def test_a_job_at_the_slow_bound_makes_its_party_capped_again():
    ts, clock = _share()
    ts.admit(1, "mtn", "poll/m_s")
    ts.done(1, "mtn", "poll/m_s", 0.1)
    ts.admit(2, "mtn", "poll/m_s")
    ts.done(2, "mtn", "poll/m_s", SLOW_CALL_SECONDS)     # exactly the bound: slow
    ts.admit(3, "mtn", "poll/m_s")
    assert not ts.admit(4, "mtn", "poll/m_s")
    ts.done(3, "mtn", "poll/m_s", 0.1)                    # a fast one since does not clear it...
    ts.admit(5, "mtn", "poll/m_s")
    assert not ts.admit(6, "mtn", "poll/m_s")
    clock.now += PARTY_MEMORY_SECONDS - 0.001        # ...for the party memory
    assert not ts.admit(7, "mtn", "poll/m_s")
    ts.done(5, "mtn", "poll/m_s", 0.1)
    ts.admit(8, "mtn", "poll/m_s")
    clock.now += 0.001                               # the slow job is forgotten at the bound
    assert ts.admit(9, "mtn", "poll/m_s")


def test_a_fast_party_whose_job_runs_past_the_slow_bound_is_capped_at_once():
    ts, clock = _share()
    ts.admit(1, "mtn", "poll/m_s")
    ts.done(1, "mtn", "poll/m_s", 0.1)
    ts.admit(2, "mtn", "poll/m_s")
    clock.now += SLOW_CALL_SECONDS - 0.001
    assert ts.admit(3, "mtn", "poll/m_s")                 # still fast: job 2 is young
    clock.now += 0.001                               # job 2 at the bound, still running
    assert not ts.admit(4, "mtn", "poll/m_s")
    assert ts.plan(("mtn",))[1] == ("mtn/poll/m_s",)


def test_a_fast_job_vouches_for_its_party_for_the_memory_only():
    ts, clock = _share()
    ts.admit(1, "mtn", "poll/m_s")
    ts.done(1, "mtn", "poll/m_s", 0.1)
    clock.now += PARTY_MEMORY_SECONDS - 0.001
    ts.admit(2, "mtn", "poll/m_s")
    assert ts.admit(3, "mtn", "poll/m_s")
    ts.done(2, "mtn", "poll/m_s", 0.1)
    ts.done(3, "mtn", "poll/m_s", 0.1)
    clock.now += PARTY_MEMORY_SECONDS             # the last fast job is as old as the memory
    ts.admit(4, "mtn", "poll/m_s")
    assert not ts.admit(5, "mtn", "poll/m_s")


def test_parties_not_seen_for_the_memory_are_forgotten():
    ts, clock = _share()
    for i in range(100):
        ts.admit(i, "mtn", f"m_{i}")
        ts.done(i, "mtn", f"m_{i}", 0.1)
    assert ts.remembered() == 100
    clock.now += PARTY_MEMORY_SECONDS
    ts.admit(1000, "mtn", "m_new")
    ts.done(1000, "mtn", "m_new", 0.1)
    assert ts.remembered() == 1


def test_a_share_of_1_lets_one_party_hold_every_own_loop_and_no_more():
    ts, _ = _share(share=1.0)
    assert ts.admit(1, "mtn", "poll/m_t") and ts.admit(2, "mtn", "poll/m_t")
    assert not ts.admit(3, "mtn", "poll/m_t")


def test_a_forced_admission_counts_past_the_share():
    ts, _ = _share()
    ts.admit(1, "mtn", "poll/m_t")
    assert ts.admit(2, "mtn", "poll/m_t", force=True)
    assert ts.running() == 2
    ts.done(1, "mtn", "poll/m_t", 30)
    ts.done(2, "mtn", "poll/m_t", 30)
    assert ts.running() == 0 and ts.plan(("mtn",))[1] == ()


# --- lending --------------------------------------------------------------------


def test_a_loop_may_borrow_from_every_other_active_lane_it_does_not_serve():
    ts, _ = _share()
    assert ts.plan(("webhooks",))[0] == ("mtn", "housekeeping")
    assert ts.plan(("orange", "mpesa", "pawapay", "housekeeping"))[0] == ("mtn", "webhooks")
    assert ts.plan(("mtn",))[0] == ("webhooks", "housekeeping")  # unconfigured rails: never


def test_lending_off_lends_nothing():
    ts, _ = _share(lend=False)
    assert ts.plan(("webhooks",)) == ((), ())
    assert ts.lendable(("webhooks",)) == frozenset()


def test_a_lane_is_not_lent_to_while_a_job_runs_past_the_slow_bound_and_for_the_cooldown_after():
    ts, clock = _share()
    ts.admit(1, "mtn", "poll/m_t")
    clock.now += SLOW_CALL_SECONDS - 0.001
    assert "mtn" in ts.lendable(("webhooks",))
    clock.now += 0.001
    assert ts.lendable(("webhooks",)) == frozenset({"housekeeping"})  # running past it: slow
    clock.now += 19
    ts.done(1, "mtn", "poll/m_t", 20.0)                  # cut at its deadline
    clock.now += LANE_COOLDOWN_SECONDS - 0.001
    assert "mtn" not in ts.lendable(("webhooks",))
    clock.now += 0.001
    assert "mtn" in ts.lendable(("webhooks",))


def test_a_lanes_own_loops_are_never_told_to_borrow_their_own_lane():
    ts, _ = _share([("mtn",), ("mtn", "webhooks")], passive=())
    assert ts.plan(("mtn", "webhooks"))[0] == ()
    assert ts.plan(("mtn",))[0] == ("webhooks",)


def test_skips_name_only_the_lanes_a_claim_reads():
    ts, _ = _share()
    ts.admit(1, "webhooks", "poll/m_t")                   # at its share in webhooks
    assert ts.plan(("mtn",)) == (("webhooks", "housekeeping"), ("webhooks/poll/m_t",))
    ts2, _ = _share(lend=False)
    ts2.admit(1, "webhooks", "poll/m_t")
    assert ts2.plan(("mtn",)) == ((), ())


# --- the waker's borrowers --------------------------------------------------------


def test_a_notification_wakes_an_idle_borrower_only_when_no_loop_of_its_lane_is_idle():
    ts, _ = _share()
    waker = Waker(DEFAULT_LOOPS, ts.lendable)
    import threading
    woke: dict[int, bool] = {}
    sleepers = {slot: threading.Thread(target=lambda s=slot: woke.__setitem__(s, waker.sleep(s, 30)))
                for slot in (1, 3)}
    for t in sleepers.values():
        t.start()
    from support import wait_until
    wait_until(lambda: sorted(waker._idle) == [1, 3], timeout=10, what="loops 1 and 3 asleep")
    waker.notify("mtn")                              # loop 1 is mtn's own: it, not the borrower
    sleepers[1].join(10)
    assert woke == {1: True} and waker._idle == [3]
    waker.notify("mtn")                              # no mtn loop idle: the webhooks loop borrows
    sleepers[3].join(10)
    assert woke == {1: True, 3: True}
    waker.stop()


def test_a_notification_of_a_slow_lane_wakes_no_borrower_and_stays_pending():
    ts, clock = _share()
    ts.admit(1, "mtn", "poll/m_t")
    clock.now += SLOW_CALL_SECONDS
    waker = Waker(DEFAULT_LOOPS, ts.lendable)
    assert waker.claim_for("mtn", lambda lanes: ("job", None)) is False  # only a borrower is idle: not lent to
    assert waker.sleep(3, 0.01) is False              # the borrower does not take the pending lane
    assert waker.sleep(0, 30) is True                 # mtn's own loop does


def test_a_borrower_claims_for_a_pending_lane_it_may_borrow_from_and_leaves_it_to_the_lanes_loops():
    ts, _ = _share()
    waker = Waker(DEFAULT_LOOPS, ts.lendable)
    waker.notify("mtn")                               # nobody idle: pending
    assert waker.sleep(3, 30) is True                 # the webhooks loop claims at once
    waker.claiming(3)
    assert waker.sleep(3, 0.01) is False              # once
    assert "mtn" in waker._pending                    # its claim may have skipped the job's party
    waker.claiming(0)                                 # mtn's own loop claims after it (its finish)
    assert waker.sleep(0, 0.01) is False and waker._pending == {}  # consumed there, no claim again


def test_spread_wakes_an_idle_loop_of_the_claimed_jobs_lane_or_a_borrower_of_it():
    ts, _ = _share()
    waker = Waker(DEFAULT_LOOPS, ts.lendable)
    waker._idle[:] = [3]                              # only the webhooks loop idle (a white-box setup)
    waker.spread(0, "mtn")
    assert waker.wakeups[3] == 1
    waker._idle[:] = [3]
    waker.spread(0, "orange")                         # passive: nobody borrows it
    assert waker.wakeups[3] == 1


# --- what borrowers may take -------------------------------------------------------


def test_a_borrower_takes_no_job_of_a_party_not_known_fast_with_a_job_running():
    # The hanging endpoint: its first delivery runs on the webhooks loop; the
    # idle mtn loops must not each take another of its deliveries before the
    # first is known to hang.
    ts, _ = _share()
    assert ts.admit(1, "webhooks", "deliver/s_hanging")
    assert ts.plan(("mtn",)) == (("webhooks", "housekeeping"), ("webhooks/deliver/s_hanging",))
    assert not ts.admit(2, "webhooks", "deliver/s_hanging", borrowed=True)
    assert ts.admit(3, "webhooks", "deliver/c_calm", borrowed=True)   # another merchant's delivery: yes


def test_a_borrower_takes_no_job_of_a_party_with_a_slow_job_remembered():
    ts, clock = _share()
    ts.admit(1, "mtn", "poll/m_t")
    ts.done(1, "mtn", "poll/m_t", 20.0)
    clock.now += LANE_COOLDOWN_SECONDS                # the lane is lent to again...
    assert ts.plan(("webhooks",)) == (("mtn", "housekeeping"), ("mtn/poll/m_t",))  # ...but not m_t's jobs
    assert not ts.admit(2, "mtn", "poll/m_t", borrowed=True)
    clock.now += PARTY_MEMORY_SECONDS - LANE_COOLDOWN_SECONDS
    assert ts.plan(("webhooks",)) == (("mtn", "housekeeping"), ())
    assert ts.admit(3, "mtn", "poll/m_t", borrowed=True)


def test_a_borrower_takes_jobs_of_a_party_known_fast_whatever_it_runs():
    ts, _ = _share()
    ts.admit(1, "mtn", "poll/s_burst")
    ts.done(1, "mtn", "poll/s_burst", 0.15)
    assert ts.admit(2, "mtn", "poll/s_burst") and ts.admit(3, "mtn", "poll/s_burst")
    assert ts.admit(4, "mtn", "poll/s_burst", borrowed=True)
    assert ts.plan(("webhooks",)) == (("mtn", "housekeeping"), ())


def test_a_party_is_one_kind_of_work_for_one_merchant():
    from vpay.engine.timeshare import party_of
    assert party_of("deliver", "m_shop") == "deliver/m_shop"
    assert party_of("scan", None) is None
    # Found with a real worker: a merchant's fan-outs (fast) made it "known
    # fast", and borrowers took its deliveries to an endpoint that hangs.
    ts, _ = _share()
    ts.admit(1, "webhooks", party_of("fanout", "m_hook"))
    ts.done(1, "webhooks", party_of("fanout", "m_hook"), 0.01)
    assert ts.admit(2, "webhooks", party_of("deliver", "m_hook"))
    assert not ts.admit(3, "webhooks", party_of("deliver", "m_hook"), borrowed=True)
    assert ts.admit(4, "webhooks", party_of("fanout", "m_hook"), borrowed=True)


def test_a_lane_given_an_exact_count_of_loops_is_not_lent_to_but_its_loops_may_borrow():
    # --lane-concurrency mtn=1 is how an operator limits the calls a worker
    # makes to a rail (the runbook's "A paused rail"): borrowers would exceed it.
    loops = lanes.split(4, lanes.LANES, {"mtn": 1}, PASSIVE)
    ts, _ = _share(loops, fixed=("mtn",))
    assert ts.plan(("webhooks",))[0] == ("housekeeping",)
    assert ts.plan(("mtn",))[0] == ("webhooks", "housekeeping")
