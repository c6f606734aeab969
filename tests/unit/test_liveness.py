"""The wake-up listener's bound (vpay/engine/liveness.py; issue 25): the
setting at its edges, and every check derived from it fitting inside it.
The behaviour against a silent connection: tests/integration/test_wake.py and
tests/acceptance/test_wake_acceptance.py."""

from __future__ import annotations

import pytest

from vpay.base.settings import ConfigError
from vpay.engine.liveness import (DEAD_AFTER_SECONDS, MAX_DEAD_AFTER_SECONDS, MIN_DEAD_AFTER_SECONDS,
                                  Liveness, dead_after_from_env)

NAME = "VPAY_LISTENER_DEAD_AFTER_SECONDS"


def test_the_bound_is_30_seconds_unless_set():
    assert dead_after_from_env({}) == DEAD_AFTER_SECONDS == 30.0
    assert dead_after_from_env({NAME: " "}) == 30.0


@pytest.mark.parametrize("raw, value", [("6", 6.0), ("12.5", 12.5), ("300", 300.0)])
def test_the_bound_is_read_at_its_edges(raw, value):
    assert dead_after_from_env({NAME: raw}) == value


@pytest.mark.parametrize("raw", ["5.9", "0", "-1", "300.1", "nan", "inf", "30s", "abc"])
def test_a_bound_outside_6_to_300_seconds_is_refused_naming_the_variable(raw):
    with pytest.raises(ConfigError, match=NAME) as refused:
        dead_after_from_env({NAME: raw})
    # one message, the real range, whatever was wrong ("0" and "abc" said "above 0")
    assert str(refused.value) == f"{NAME} must be a number of seconds from 6 to 300, got {raw!r}"


@pytest.mark.parametrize("dead_after", [MIN_DEAD_AFTER_SECONDS, 10.0, DEAD_AFTER_SECONDS, MAX_DEAD_AFTER_SECONDS])
def test_silence_to_listening_again_fits_in_the_bound(dead_after):
    # ping after ping_every of silence, give up after ping_timeout, the first
    # back-off (0.5 s, vpay/engine/wake.py), a connection within connect_timeout
    live = Liveness(dead_after)
    assert live.ping_every + live.ping_timeout + 0.5 + live.connect_timeout <= dead_after
    assert live.connect_timeout >= 2  # libpq takes 1 as 2


def test_keepalives_are_set_and_what_the_url_sets_wins_but_a_longer_connect_timeout():
    live = Liveness(30.0)
    assert live.params("postgresql://u@db.example/vpay") == {
        "keepalives": 1, "keepalives_idle": 7, "keepalives_interval": 2, "keepalives_count": 3,
        "tcp_user_timeout": 15000, "connect_timeout": 8}
    theirs = live.params("postgresql://u@db.example/vpay?keepalives_idle=60&tcp_user_timeout=0&connect_timeout=60")
    assert "keepalives_idle" not in theirs and "tcp_user_timeout" not in theirs
    assert theirs["connect_timeout"] == 8
    assert live.params("host=db.example dbname=vpay connect_timeout=3")["connect_timeout"] == 3
