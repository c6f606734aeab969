"""The console's display filters (vpay/console/render.py)."""

from vpay.console.render import COUNT_CAP, capped


def test_a_count_read_past_its_cap_says_so():
    # the overview's counts are read up to COUNT_CAP + 1 (sql/queries/console.sql)
    assert capped(None) == "-"
    assert capped(0) == "0"
    assert capped(COUNT_CAP) == "10,000"
    assert capped(COUNT_CAP + 1) == "over 10,000"
