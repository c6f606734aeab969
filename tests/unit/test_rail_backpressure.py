"""Rail backpressure and the per-call deadline settings, on the adapters alone
(``responses`` stands in for the rail; the end-to-end proof with a real stub
and the worker is tests/acceptance/test_isolation.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
import responses

from test_mtn_adapter import CHARGE, STATUS_URL, TOKEN_URL, add_token, calls_to
from test_orange_adapter import ENV as ORANGE_ENV, STATUS_URL as ORANGE_STATUS_URL, SUBMITTED, token_ok
from vpay.rails.gate import RailGate
from vpay.rails.mtn import MtnMomo
from vpay.rails.orange import OrangeMoney
from vpay.rails.port import RailError, RailPaused, StatusKind

MTN_ENV = {"VPAY_MTN_BASE_URL": "https://momo.test", "VPAY_MTN_SUBSCRIPTION_KEY": "k",
           "VPAY_MTN_API_USER": "u", "VPAY_MTN_API_KEY": "p"}


@pytest.fixture
def rsps():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def mtn(**kwargs) -> MtnMomo:
    return MtnMomo.from_env(MTN_ENV, sleep=lambda s: None, **kwargs)


def test_a_429_with_retry_after_pauses_the_rail_and_later_calls_send_nothing(rsps):
    adapter = mtn()
    add_token(rsps)
    rsps.add(responses.GET, STATUS_URL, status=429, headers={"Retry-After": "15"},
             json={"code": "RATE_LIMIT_EXCEEDED"})
    with pytest.raises(RailPaused) as first:
        adapter.status(CHARGE)
    assert first.value.rail == "mtn" and 14 < first.value.seconds <= 15
    sent = len(rsps.calls)
    with pytest.raises(RailPaused) as second:
        adapter.status(CHARGE)
    assert 0 < second.value.seconds <= 15
    assert len(rsps.calls) == sent  # nothing sent while paused
    assert adapter.gate.paused_until() is not None


def test_a_503_with_an_http_date_retry_after_is_not_retried_and_pauses(rsps):
    adapter = mtn()
    add_token(rsps)
    when = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=40), usegmt=True)
    rsps.add(responses.GET, STATUS_URL, status=503, headers={"Retry-After": when},
             json={"code": "SERVICE_UNAVAILABLE"})
    with pytest.raises(RailPaused) as paused:
        adapter.status(CHARGE)
    assert 30 < paused.value.seconds <= 40
    assert len(calls_to(rsps, STATUS_URL)) == 1


def test_a_503_without_retry_after_is_retried_and_is_no_answer(rsps):
    adapter = mtn()
    add_token(rsps)
    rsps.add(responses.GET, STATUS_URL, status=503, json={"code": "SERVICE_UNAVAILABLE"})
    assert adapter.status(CHARGE).kind is StatusKind.NO_ANSWER
    assert len(calls_to(rsps, STATUS_URL)) == 3
    adapter.gate.check()  # not paused


def test_a_pause_is_capped_by_max_pause(rsps):
    adapter = mtn(max_pause=60)
    add_token(rsps)
    rsps.add(responses.GET, STATUS_URL, status=429, headers={"Retry-After": "86400"})
    with pytest.raises(RailPaused) as paused:
        adapter.status(CHARGE)
    assert paused.value.seconds <= 60


def test_a_token_endpoint_asking_for_less_traffic_pauses_the_rail_too(rsps):
    adapter = mtn()
    rsps.add(responses.POST, TOKEN_URL, status=429, headers={"Retry-After": "5"})
    with pytest.raises(RailPaused):
        adapter.status(CHARGE)
    assert calls_to(rsps, STATUS_URL) == []


def test_the_gate_opens_when_the_pause_is_over():
    now = [100.0]
    gate = RailGate("mtn", max_pause=300, clock=lambda: now[0])
    gate.pause(10, "HTTP 429")
    gate.pause(3, "a shorter ask does not shorten it")
    with pytest.raises(RailPaused) as paused:
        gate.check()
    assert paused.value.seconds == 10
    now[0] += 10
    gate.check()
    assert gate.paused_until() is None


def test_orange_429_with_retry_after_pauses_the_rail(rsps):
    adapter = OrangeMoney.from_env(ORANGE_ENV, sleep=lambda s: None)
    token_ok(rsps)
    rsps.add(responses.POST, ORANGE_STATUS_URL, status=429, headers={"Retry-After": "7"})
    with pytest.raises(RailPaused) as paused:
        adapter.status(SUBMITTED)
    assert paused.value.rail == "orange"
    with pytest.raises(RailPaused):
        adapter.status(SUBMITTED)
    assert len(rsps.calls) == 2  # token and the one status read


@pytest.mark.parametrize("name, value", [
    ("VPAY_MTN_TOTAL_TIMEOUT_SECONDS", "0"), ("VPAY_MTN_TOTAL_TIMEOUT_SECONDS", "abc"),
    ("VPAY_MTN_TOTAL_TIMEOUT_SECONDS", "601"), ("VPAY_MTN_TOTAL_TIMEOUT_SECONDS", "nan"),
    ("VPAY_MTN_MAX_PAUSE_SECONDS", "0"), ("VPAY_MTN_MAX_PAUSE_SECONDS", "3601"),
])
def test_mtn_deadline_and_pause_settings_are_checked(name, value):
    with pytest.raises(RailError, match=name):
        MtnMomo.from_env({**MTN_ENV, name: value})


@pytest.mark.parametrize("name, value", [
    ("VPAY_ORANGE_TOTAL_TIMEOUT_SECONDS", "-1"), ("VPAY_ORANGE_MAX_PAUSE_SECONDS", "inf"),
])
def test_orange_deadline_and_pause_settings_are_checked(name, value):
    with pytest.raises(RailError, match=name):
        OrangeMoney.from_env({**ORANGE_ENV, name: value})


def test_settings_are_read():
    adapter = MtnMomo.from_env({**MTN_ENV, "VPAY_MTN_TOTAL_TIMEOUT_SECONDS": "7.5",
                                "VPAY_MTN_MAX_PAUSE_SECONDS": "90"})
    assert adapter.total_timeout == 7.5 and adapter.gate.max_pause == 90
    assert mtn().total_timeout == 20.0 and mtn().gate.max_pause == 300.0


# --- fleet-wide: the pause board (issue 25; the database side is
# tests/integration/test_rail_pauses.py, two real workers test_isolation.py) --


class Board:
    """A ``PauseBoard`` in memory: what the gates published, and a pause to answer."""

    def __init__(self, pause=None):
        self.published: list[tuple[str, float, str]] = []
        self.pause = pause

    def publish(self, rail, seconds, reason):
        self.published.append((rail, seconds, reason))

    def in_force(self, rail):
        return self.pause if self.pause is not None and self.pause.rail == rail else None


@pytest.fixture
def board():
    from vpay.rails.gate import share_pauses
    shared = Board()
    share_pauses(shared)
    yield shared
    share_pauses(None)


def _shared(seconds: float, set_by: str = "replica-a:1", rail: str = "mtn"):
    from vpay.rails.gate import SharedPause
    return SharedPause(rail, seconds, datetime.now(timezone.utc) + timedelta(seconds=seconds),
                       "HTTP 429 Retry-After 30", set_by)


def test_a_pause_this_process_gets_is_published_to_the_board_and_a_shorter_ask_is_not(board, rsps):
    adapter = mtn(max_pause=60)
    add_token(rsps)
    rsps.add(responses.GET, STATUS_URL, status=429, headers={"Retry-After": "86400"})
    with pytest.raises(RailPaused):
        adapter.status(CHARGE)
    assert board.published == [("mtn", 60.0, "HTTP 429 Retry-After 86400")]  # capped at max_pause
    adapter.gate.pause(5, "a shorter ask")
    assert len(board.published) == 1


def test_the_boards_pause_holds_every_call_before_anything_is_sent(board, rsps, caplog):
    board.pause = _shared(30)
    adapter = mtn()
    add_token(rsps)
    rsps.add(responses.GET, STATUS_URL, status=200, json={"status": "PENDING"})
    for _ in range(3):
        with pytest.raises(RailPaused) as paused:
            adapter.status(CHARGE)
    assert 29 < paused.value.seconds <= 30 and "set by replica-a:1" in paused.value.reason
    assert len(rsps.calls) == 0 and board.published == []  # nothing sent, nothing echoed back
    adopted = [r for r in caplog.records if r.getMessage() == "rail paused by another process"]
    assert len(adopted) == 1 and adopted[0].set_by == "replica-a:1"  # once per pause, not per call
    assert adapter.gate.paused_until() is not None


def test_the_boards_pause_is_capped_by_this_processs_max_pause(board):
    board.pause = _shared(3000)
    now = [0.0]
    gate = RailGate("mtn", max_pause=90, clock=lambda: now[0])
    with pytest.raises(RailPaused) as paused:
        gate.check()
    assert paused.value.seconds == 90
    now[0] += 90
    gate.check()  # the same row, looked at already: not adopted again


def test_a_boards_pause_of_another_rail_or_one_this_gate_holds_already_changes_nothing(board, caplog):
    board.pause = _shared(30, rail="orange")
    now = [0.0]
    gate = RailGate("mtn", clock=lambda: now[0])
    gate.check()  # orange's pause is orange's
    gate.pause(30, "HTTP 429 Retry-After 30")
    board.pause = _shared(30.3)  # our own pause read back (a round trip later)
    with pytest.raises(RailPaused) as paused:
        gate.check()
    assert paused.value.reason == "HTTP 429 Retry-After 30"
    assert not [r for r in caplog.records if r.getMessage() == "rail paused by another process"]
    board.pause = _shared(45, set_by="replica-b:2")  # another process extended it
    with pytest.raises(RailPaused) as paused:
        gate.check()
    assert paused.value.seconds == 45 and "replica-b:2" in paused.value.reason
