"""``vpay.base.db.answer_within``: a statement to a database that went silent
(every byte acknowledged, nothing answered) fails when its bound passes,
instead of waiting for ever; one that is answered in time is untouched. The
silence is real: tests/pg_relay.py between the client and Postgres."""

from __future__ import annotations

import psycopg
import pytest

from pg_relay import BlackholeRelay
from vpay.base.db import answer_within


def test_a_statement_to_a_silent_database_fails_when_its_bound_passes(db_url):
    relay = BlackholeRelay(db_url)
    try:
        with psycopg.connect(relay.url, autocommit=True, application_name="bounded-test") as conn:
            with answer_within(conn, 30.0) as deadline:
                assert conn.execute("SELECT 1").fetchone() == (1,)  # answered: untouched
            assert not deadline.expired
            assert relay.blackhole(b"bounded-test") == 1
            with pytest.raises(psycopg.OperationalError):
                with answer_within(conn, 0.5) as deadline:
                    conn.execute("SELECT 1")
            assert deadline.expired
            assert conn.closed or conn.broken
    finally:
        relay.close()


def test_a_closed_connection_is_left_alone(db_url):
    conn = psycopg.connect(db_url, autocommit=True)
    conn.close()
    with answer_within(conn, 0.5) as deadline:
        pass
    assert not deadline.expired
