"""Isolation (issue 11), in process: the API's database warm-up returns only
once its standing connection is in the pool. The integration half of
tests/acceptance/test_isolation.py.
"""

from __future__ import annotations



def test_warm_returns_only_once_the_standing_connection_is_ready_in_the_pool(db_url):
    # The race the spawned test above once lost in CI: a probe that arrives
    # while the standing connection is still connecting (already listed in
    # pg_stat_activity, not yet in the pool) waits, and a waiting checkout makes
    # the pool grow a second connection. warm() closes that window.
    from vpay.api.app import Database
    database = Database(db_url)
    try:
        assert database.warm() is True
        assert database.pool().get_stats()["pool_available"] == 1
        assert database.ping(timeout=2.0)
        assert database.pool().get_stats()["pool_size"] == 1  # the probe did not grow the pool
    finally:
        database.close()
