"""Workers as rows without a database: the VPAY_WORKER_DEAD_AFTER_SECONDS
setting at its edges, the heartbeat's and the reaper's pace, the
steadiness a reaper needs before it judges others by their heartbeats, and
the kept-outcome counter's labels. The database half:
tests/integration/test_workers_table.py; the processes:
tests/acceptance/test_dead_workers.py."""

from __future__ import annotations

import threading

import pytest

from vpay.base import metrics
from vpay.base.db import ConfigError
from vpay.engine import workers
from vpay.worker import maintenance
from vpay.worker.presence import Presence

NAME = "VPAY_WORKER_DEAD_AFTER_SECONDS"


def test_the_default_bound_is_at_most_30_seconds():
    assert workers.dead_after_from_env({}) == workers.DEAD_AFTER_SECONDS == 30.0
    assert workers.dead_after_from_env({NAME: "  "}) == 30.0


@pytest.mark.parametrize("raw, value", [("1", 1.0), ("3", 3.0), ("2.5", 2.5), ("3600", 3600.0),
                                        (" 30 ", 30.0)])
def test_the_bound_is_read_to_its_edges(raw, value):
    assert workers.dead_after_from_env({NAME: raw}) == value


@pytest.mark.parametrize("raw", ["0.999", "0", "-5", "3600.001", "nan", "inf", "-inf", "30s", "many"])
def test_a_bound_that_cannot_be_meant_is_refused_naming_the_variable(raw):
    with pytest.raises(ConfigError, match=NAME):
        workers.dead_after_from_env({NAME: raw})


@pytest.mark.parametrize("wid", ["w1", "host:3", "a" * workers.MAX_WORKER_ID_CHARS, "é:ü", "a b"])
def test_a_worker_id_is_taken_up_to_its_bound(wid):
    assert workers.worker_id_problem(wid) is None


@pytest.mark.parametrize("wid, says", [
    ("", "blank"), ("   ", "blank"), ("\t", "blank"), ("\n", "blank"),
    ("a\nb", "control"), ("a\rb", "control"), ("a\x1bb", "control"), ("a\x7f", "control"),
    ("a\u200bb", "control"), ("a\u2028b", "control"),
    (" a", "whitespace"), ("a ", "whitespace"),
    ("a" * (workers.MAX_WORKER_ID_CHARS + 1), f"201 characters long; at most {workers.MAX_WORKER_ID_CHARS}"),
], ids=repr)
def test_a_worker_id_that_cannot_be_meant_is_refused_in_one_line(wid, says):
    problem = workers.worker_id_problem(wid)
    assert problem is not None and says in problem and "\n" not in problem
    assert problem.startswith("--worker-id ")


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _presence(dead_after: float, clock) -> Presence:
    return Presence(None, "w1", ("mtn",), dead_after, "0.0-test", clock=clock)


def test_a_reaper_judges_heartbeats_only_after_a_bound_without_trouble():
    clock = _Clock()
    presence = _presence(30.0, clock)
    assert not presence.steady()  # just started: the others may not have beaten yet
    clock.now += 29.9
    assert not presence.steady()
    clock.now += 0.1
    assert presence.steady()  # the edge: exactly the bound
    presence.trouble()  # a beat or a reap that could not reach the database
    clock.now += 29.9
    assert not presence.steady()
    clock.now += 0.1
    assert presence.steady()


@pytest.mark.parametrize("lease, dead_after, heartbeat, reaper", [
    (300.0, 30.0, 7.5, 7.5),     # the defaults: the bound sets the pace, four beats in it
    (300.0, 3.0, 0.75, 0.75),
    (5.0, 30.0, 5 / 3, 2.5),     # a short lease sets it (renewals every lease / 3)
    (0.5, 1.0, 0.3, 0.5),        # floors: 0.3 s and 0.5 s
])
def test_the_heartbeat_and_the_reaper_come_round_within_the_bound(lease, dead_after, heartbeat, reaper):
    halt = threading.Event()
    presence = _presence(dead_after, _Clock())
    beat = maintenance.Heartbeat(None, presence, lease, halt)
    reap = maintenance.Reaper(None, "w1", None, lease, halt, presence)
    assert beat.interval == pytest.approx(heartbeat)
    assert reap.interval == pytest.approx(reaper)
    assert beat.interval <= dead_after / workers.BEATS_PER_BOUND or beat.interval == 0.3


def test_the_kept_outcome_counter_has_a_fixed_set_of_labels():
    before = metrics.OUTCOME_HANDBACKS.labels("other")._value.get()
    metrics.outcome_handback("made-up")
    assert metrics.OUTCOME_HANDBACKS.labels("other")._value.get() == before + 1
    for result in ("kept", "written", "lost", "released", "abandoned"):
        metrics.outcome_handback(result)
        assert metrics.OUTCOME_HANDBACKS.labels(result)._value.get() >= 1
