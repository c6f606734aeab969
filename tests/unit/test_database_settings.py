"""The database settings of issue 25 at their edges: VPAY_DATABASE_PREPARED_STATEMENTS,
VPAY_SESSION_DATABASE_URL, a URL carrying psycopg's parameters or unknown ones,
and the window in which a failed statement holds vpay_database_up at 0.
No database: parsing only (the probes and the pools: tests/integration, tests/acceptance)."""

from __future__ import annotations

import pytest

from vpay.base import db, metrics


@pytest.mark.parametrize("raw", [None, "", "   ", "on", "ON", " On "])
def test_prepared_statements_are_on_by_default_and_when_said(raw):
    env = {} if raw is None else {"VPAY_DATABASE_PREPARED_STATEMENTS": raw}
    assert db.prepared_statements(env) is True
    assert db.connect_kwargs(env) == {}


@pytest.mark.parametrize("raw", ["off", "OFF", " off\t"])
def test_off_turns_psycopgs_prepare_threshold_to_none(raw):
    env = {"VPAY_DATABASE_PREPARED_STATEMENTS": raw}
    assert db.prepared_statements(env) is False
    assert db.connect_kwargs(env) == {"prepare_threshold": None}


def test_the_workers_pool_prepares_at_once_unless_prepared_statements_are_off():
    assert db.connect_kwargs({}, prepare_at_once=True) == {"prepare_threshold": db.PREPARE_AT_ONCE}
    assert db.PREPARE_AT_ONCE == 1  # psycopg: prepared on the run after one that succeeded
    off = {"VPAY_DATABASE_PREPARED_STATEMENTS": "off"}
    assert db.connect_kwargs(off, prepare_at_once=True) == {"prepare_threshold": None}


@pytest.mark.parametrize("raw", ["yes", "no", "0", "1", "false", "of", "onn", "off,on", "prepare_threshold=0"])
def test_any_other_value_is_refused_naming_the_setting(raw):
    with pytest.raises(db.ConfigError, match="VPAY_DATABASE_PREPARED_STATEMENTS must be on or off"):
        db.prepared_statements({"VPAY_DATABASE_PREPARED_STATEMENTS": raw})


def test_a_bad_value_is_refused_by_database_url_before_anything_is_contacted():
    # A URL naming no reachable server: refused on the setting, nothing tried.
    env = {"VPAY_DATABASE_URL": "postgresql://vpay@192.0.2.1/vpay", "VPAY_DATABASE_PREPARED_STATEMENTS": "maybe"}
    with pytest.raises(db.ConfigError, match="VPAY_DATABASE_PREPARED_STATEMENTS"):
        db.database_url(env)


@pytest.mark.parametrize("url", ["postgresql://vpay@db/vpay?prepare_threshold=0",
                                 "postgresql://vpay@db/vpay?sslmode=disable&prepare_threshold=",
                                 "host=db dbname=vpay prepare_threshold=0",
                                 "postgresql://vpay@db/vpay?prepared_statements=off"])
def test_a_url_with_psycopgs_prepare_parameter_is_answered_with_the_setting(url):
    with pytest.raises(db.ConfigError) as err:
        db.check_url(url)
    text = str(err.value)
    assert text.startswith("VPAY_DATABASE_URL has ") and "not a libpq parameter" in text
    assert "VPAY_DATABASE_PREPARED_STATEMENTS=off" in text


@pytest.mark.parametrize("url, param", [("postgresql://vpay@db/vpay?pool_mode=transaction", "pool_mode"),
                                        ("host=db dbname=vpay colour=blue", "colour")])
def test_a_url_with_a_parameter_libpq_does_not_know_names_it(url, param):
    with pytest.raises(db.ConfigError, match=f"VPAY_DATABASE_URL has a parameter libpq does not know: '{param}'"):
        db.check_url(url)


def test_a_libpq_parameter_passes():
    url = "postgresql://vpay@db:6432/vpay?sslmode=require&target_session_attrs=read-write&application_name=x"
    assert db.check_url(url) == url


def test_the_session_url_defaults_to_the_pools_url_when_unset_or_blank():
    assert db.session_database_url("postgresql://vpay@bouncer:6432/vpay", {}) == \
        "postgresql://vpay@bouncer:6432/vpay"
    assert db.session_database_url("postgresql://vpay@bouncer:6432/vpay",
                                   {"VPAY_SESSION_DATABASE_URL": "  "}) == "postgresql://vpay@bouncer:6432/vpay"


def test_the_session_url_is_taken_when_set():
    env = {"VPAY_SESSION_DATABASE_URL": " postgresql://vpay@db:5432/vpay "}
    assert db.session_database_url("postgresql://vpay@bouncer:6432/vpay", env) == "postgresql://vpay@db:5432/vpay"


@pytest.mark.parametrize("raw, why", [("mysql://vpay@db/vpay", "must be a postgresql:// URL"),
                                      ("postgresql://vpay@db", "names no database"),
                                      ("postgresql://vpay@db/vpay?prepare_threshold=0",
                                       "VPAY_DATABASE_PREPARED_STATEMENTS=off"),
                                      ("postgresql://vpay@db/vpay?x=1", "parameter libpq does not know")])
def test_a_session_url_that_cannot_be_meant_is_refused_under_its_own_name(raw, why):
    with pytest.raises(db.ConfigError) as err:
        db.session_database_url("postgresql://vpay@bouncer:6432/vpay", {"VPAY_SESSION_DATABASE_URL": raw})
    assert str(err.value).startswith("VPAY_SESSION_DATABASE_URL ") and why in str(err.value)


class _StoppedClock:
    """``metrics``' clock, stopped: a database error any other thread of the
    test process records meanwhile (a worker left by another test) stamps
    the same moment, so the window's edges below stay where they are (CI
    once saw the stamp move between the error and the last assertion)."""

    @staticmethod
    def monotonic() -> float:
        return 5000.0


def test_a_failed_statement_holds_database_up_at_0_for_the_window_and_not_a_moment_longer(monkeypatch):
    monkeypatch.setattr(metrics, "_last_database_error", None)
    monkeypatch.setattr(metrics, "time", _StoppedClock)
    assert not metrics.database_failed_recently(1000.0)
    before = metrics.DATABASE_ERRORS.labels("claim")._value.get()
    metrics.database_error("claim")
    assert metrics.DATABASE_ERRORS.labels("claim")._value.get() >= before + 1
    last = metrics._last_database_error
    assert last == 5000.0
    window = metrics.DATABASE_ERROR_WINDOW_SECONDS
    assert metrics.database_failed_recently(last)
    assert metrics.database_failed_recently(last + window - 0.001)
    assert not metrics.database_failed_recently(last + window)


def test_an_unknown_part_is_counted_as_other(monkeypatch):
    monkeypatch.setattr(metrics, "_last_database_error", None)
    before = metrics.DATABASE_ERRORS.labels("other")._value.get()
    metrics.database_error("made-up")
    assert metrics.DATABASE_ERRORS.labels("other")._value.get() == before + 1
