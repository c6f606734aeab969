"""Fairness rules without a database: when a lane is rebalanced, and a share
below one refused. The unit half of tests/integration/test_fairness.py.
"""

from __future__ import annotations

import pytest

from vpay.engine import fairness


# --- when a worker rebalances ------------------------------------------------


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_lane_is_rebalanced_only_when_behind_and_at_most_once_per_interval():
    clock = _Clock()
    r = fairness.Rebalancer(behind=0.25, interval=0.5, clock=clock)
    assert not r.take_turn("mtn", 0.25)      # at the threshold: keeping up
    assert r.take_turn("mtn", 0.2501)
    assert not r.take_turn("mtn", 30.0)      # the turn was just taken
    assert r.take_turn("orange", 1.0)        # lanes take turns apart
    clock.now += 0.4999
    assert not r.take_turn("mtn", 1.0)
    clock.now += 0.0001
    assert r.take_turn("mtn", 1.0)
    assert not r.take_turn("housekeeping", 60.0)  # no merchants there


def test_a_share_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        fairness.Rebalancer(share=0)
