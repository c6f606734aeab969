"""How long a claim loop sleeps after a claim that found nothing (vpay/worker/loop.py,
``idle_timeout``)."""

from __future__ import annotations

import pytest

from vpay.worker.loop import SKIPPED_RETRY_SECONDS, idle_timeout


@pytest.mark.parametrize("trial", range(50))
def test_nothing_scheduled_sleeps_a_jittered_idle_sleep(trial):
    assert 0.5 <= idle_timeout(1.0, None) <= 1.0


def test_a_job_due_sooner_than_the_idle_sleep_is_waited_for_exactly():
    assert all(idle_timeout(1.0, 0.2) <= 0.2 for _ in range(50))
    assert all(idle_timeout(10.0, 0.2) == 0.2 for _ in range(50))


@pytest.mark.parametrize("next_due", [0.0, -0.001, -600.0])
def test_a_due_job_that_was_locked_is_claimed_again_soon_not_after_the_idle_sleep(next_due):
    # Found in review: a claim across a lane rebalance's commit found nothing
    # with thousands due (next_due_in -600) and the loop slept its idle sleep.
    assert all(idle_timeout(30.0, next_due) == SKIPPED_RETRY_SECONDS for _ in range(50))


def test_the_retry_never_exceeds_the_idle_sleep():
    assert all(idle_timeout(0.01, -1.0) <= 0.01 for _ in range(50))
