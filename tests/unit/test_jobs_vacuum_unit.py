"""The worker's vacuum setting and pacing without a database. The unit half of
tests/acceptance/test_jobs_vacuum.py.
"""

from __future__ import annotations

import threading

import pytest

from vpay.engine import vacuum
from vpay.base.db import ConfigError


def test_the_setting_is_read_to_its_bounds():
    assert vacuum.every_from_env({}) == vacuum.VACUUM_EVERY == 5000
    assert vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": " "}) == vacuum.VACUUM_EVERY
    assert vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": "0"}) == 0
    assert vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": "1"}) == 1
    top = str(vacuum.MAX_VACUUM_EVERY)
    assert vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": top}) == vacuum.MAX_VACUUM_EVERY
    with pytest.raises(ConfigError):
        vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": str(vacuum.MAX_VACUUM_EVERY + 1)})
    with pytest.raises(ConfigError):
        vacuum.every_from_env({"VPAY_JOBS_VACUUM_EVERY": "-1"})


def test_two_vacuums_of_one_process_begin_at_least_the_minimum_interval_apart():
    thread = vacuum.JobsVacuum("postgresql://unused/x", 1, threading.Event())
    assert thread.min_interval == vacuum.MIN_INTERVAL_SECONDS == 1.0
    assert thread.pause_before(0.0) == 0.0  # no vacuum yet: at once
    thread._last_start = 100.0
    assert thread.pause_before(100.0) == 1.0
    assert 0 < thread.pause_before(100.999) <= 0.001 + 1e-9
    assert thread.pause_before(101.0) == 0.0
    assert thread.pause_before(250.0) == 0.0
