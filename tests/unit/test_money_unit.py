"""The poll ladder (``poll_delay``): its table and that it never goes down.
The unit half of tests/integration/test_money.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from vpay.handlers.poll import poll_delay


def test_poll_delay_matches_the_ladder_table():
    assert [poll_delay(a) for a in range(6)] == [10, 20, 30, 45, 60, 90]
    assert {poll_delay(a) for a in range(6, 20)} == {120}
    assert {poll_delay(a) for a in (20, 21, 100, 10_000)} == {900}
    with pytest.raises(ValueError):
        poll_delay(-1)


@given(st.integers(min_value=0, max_value=100_000), st.integers(min_value=0, max_value=100_000))
def test_poll_delay_is_monotonic_non_decreasing(a, b):
    lo, hi = sorted((a, b))
    assert poll_delay(lo) <= poll_delay(hi)
