"""Isolation (issue 11) without a database: a trickling status answer ends
within the total deadline (a rail stub in process), and the API's warm-up
gives up on a database that is down. The unit half of
tests/acceptance/test_isolation.py, which keeps the ``stub`` fixture.
"""

from __future__ import annotations

from api_support import free_port
from vpay.rails.mtn import MtnMomo
from vpay.rails.port import ChargeRequest, StatusKind
from test_isolation import stub  # helpers kept in tests/acceptance/test_isolation.py


# --- 1. one total deadline per rail call -------------------------------------


def test_a_trickling_status_answer_ends_within_the_total_deadline(stub):
    # Input 2 of the issue: headers at once, then the body one byte a second.
    # requests' read timeout restarts with every byte; the call's deadline does not.
    ref = "0b5b1f4e-2f6a-4c51-9a59-3f8e6d7c2a10"
    stub.trickle(ref)
    stub.succeed(ref, "10.00", "EUR")
    adapter = MtnMomo.from_env(stub.env(VPAY_MTN_TOTAL_TIMEOUT_SECONDS="2"))
    result = adapter.status(ChargeRequest("ch_trickle", ref, 1000, "EUR", "256770000001"))
    assert result.kind is StatusKind.NO_ANSWER
    assert result.reason == "TIMEOUT"
    [trickle] = stub.trickles[ref]
    assert trickle.sent > 0 and not trickle.finished  # it returned while the stub was still trickling


def test_warm_gives_up_after_its_wait_and_keeps_the_pool_when_the_database_is_down():
    from vpay.api.app import Database
    database = Database(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing", timeout=0.2)
    try:
        assert database.warm(wait=0.2) is False
        assert not database.pool().closed  # pool.wait() would have closed it: no recovery
        assert database.ping(timeout=0.2) is False
    finally:
        database.close()
