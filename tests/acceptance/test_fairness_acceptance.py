"""Fairness at the worker (issue #11: a burst holds up nobody else): a real
``vpay-worker``, a real rail stub, one merchant's burst. The acceptance half
of tests/integration/test_fairness.py, whose helpers it uses.
"""

from __future__ import annotations

import pytest
from test_fairness import _merchants, _poll  # helpers kept in tests/integration/test_fairness.py


# --- a real worker -------------------------------------------------------------


@pytest.mark.slow
def test_a_burst_on_a_rail_does_not_hold_up_other_merchants_reads(db, db_url, spawn):
    """One merchant's 60 charges fall due together, 5 s before two calm
    merchants' next reads; one claim loop serves the lane. Oldest first, the
    calm merchants' reads would come 61st and later; with fairness they come
    right after the burst's first read, one burst read per round between."""
    from rail_stub import MomoStub
    from support import base_env, wait_until

    _merchants(db, "m_burst", "m_calm", "m_other")
    burst = [_poll(db, "m_burst", ago=8 - i * 0.01) for i in range(60)]
    calm = _poll(db, "m_calm", ago=3)
    other = [_poll(db, "m_other", ago=2 - i * 0.1) for i in range(2)]
    charges = dict(db.execute("SELECT id, rail_reference FROM charges"))
    ref = {key: charges[key.split(":", 1)[1]] for key in burst + [calm] + other}
    stub = MomoStub(default_outcome=("10.00", "EUR"))
    try:
        spawn("vpay-worker", "--queues", "mtn", "--worker-concurrency", "1", "--idle-sleep", "0.1",
              env=base_env(db_url, **stub.env()))
        wait_until(lambda: db.execute("SELECT count(*) FROM charges WHERE status = 'succeeded'"
                                      ).fetchone()[0] == 63, timeout=120, what="every charge settled")
        reads = [e.reference for e in stub.requests("/collection/v1_0/requesttopay/")
                 if e.method == "GET"]
    finally:
        stub.close()
    assert sorted(reads) == sorted(ref.values())  # each charge read once
    assert reads[:5] == [ref[burst[0]], ref[calm], ref[other[0]], ref[burst[1]], ref[other[1]]]
    assert reads[5:] == [ref[k] for k in burst[2:]]
    assert db.execute("SELECT count(*) FROM jobs WHERE lane = 'mtn'").fetchone()[0] == 0
