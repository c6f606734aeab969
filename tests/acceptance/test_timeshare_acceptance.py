"""A fair share in time with real processes (issue 30): the installed
``vpay-worker`` at its defaults, a MoMo stub whose answers for one merchant's
charges trickle, and another merchant who must be served meanwhile; the
settings refused at boot. The integration half:
tests/integration/test_timeshare.py.

No timing assertions beyond "read before the trickles end": the test waits on
conditions and reads what happened from the stub's log.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from rail_stub import MomoStub
from support import ConnCounter, base_env, script, wait_until
from vpay.money import charges
from vpay.money.merchants import create_merchant


def _charge(db, merchant: str, payer: str) -> dict:
    """A submitted MoMo charge of 10.00 EUR whose poll job is parked an hour out."""
    created = charges.create_payment(db, merchant_id=merchant, amount=1000, currency="EUR", rail="mtn",
                                     payer=payer)
    charges.mark_submitted(db, created.charge["id"])
    db.execute("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE dedupe_key = %s",
               (f"poll:{created.charge['id']}",))
    return created.charge


def _due(db, made: list[dict], ago: float) -> None:
    db.execute("UPDATE jobs SET run_at = now() - make_interval(secs => %s) WHERE dedupe_key = ANY(%s)",
               (ago, [f"poll:{c['id']}" for c in made]))


@pytest.mark.slow
def test_ten_trickling_charges_hold_one_mtn_loop_and_another_merchant_is_read_before_they_end(
        db, db_url, spawn):
    # The input: ten status reads of one merchant trickle until their
    # deadline; before, they held both mtn loops (and, lent, every idle one)
    # and the other merchant's reads waited for them to end.
    create_merchant(db, "m_trickle")
    create_merchant(db, "m_calm")
    stub = MomoStub(default_outcome=("10.00", "EUR"))
    try:
        slow = [_charge(db, "m_trickle", f"2567700002{i:02d}") for i in range(10)]
        calm = [_charge(db, "m_calm", f"2567700003{i:02d}") for i in range(5)]
        for c in slow:
            stub.trickle(c["rail_reference"])
        _due(db, slow, ago=2.0)  # first in line
        _due(db, calm, ago=1.0)
        # Default flags: 4 loops, only MoMo configured (mtn 2, webhooks 1,
        # housekeeping 1). A deadline long enough that the first trickling
        # reads are still going when the calm merchant has been served.
        worker = spawn("vpay-worker", "--idle-sleep", "0.1", "--shutdown-grace-seconds", "1",
                       env=base_env(db_url, **stub.env(VPAY_MTN_TOTAL_TIMEOUT_SECONDS="120")))
        started = worker.wait_for_log("worker started")
        assert started["loops"]["mtn"] == 2 and started["party_share"] == 0.5 and started["lend"] is True
        wait_until(lambda: db.execute("SELECT count(*) FROM charges WHERE id = ANY(%s) AND status = 'succeeded'",
                                      ([c["id"] for c in calm],)).fetchone()[0] == len(calm),
                   timeout=100, what="the calm merchant's charges to settle")
        # Read before the trickles end: every trickling read begun is still going...
        begun = [t for c in slow for t in stub.trickles.get(c["rail_reference"], [])]
        assert begun and not any(t.finished or t.gave_up for t in begun)
        # ...and the trickling merchant held one mtn loop: its share of the two
        # (no idle loop borrowed another of its reads either)
        assert len(begun) == 1
        assert all(len(stub.requests("/collection/v1_0/requesttopay/", c["rail_reference"])) == 1 for c in calm)
        assert db.execute("SELECT count(*) FROM charges WHERE id = ANY(%s) AND status = 'pending'",
                          ([c["id"] for c in slow],)).fetchone()[0] == len(slow)
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 1  # the trickling read outlives the 1 s grace: released
    finally:
        stub.close()


@pytest.mark.parametrize("args, env, says", [
    (("--party-share", "0"), {}, "--party-share must be a fraction above 0 and at most 1"),
    (("--party-share", "1.5"), {}, "got '1.5'"),
    (("--party-share", "half"), {}, "got 'half'"),
    ((), {"VPAY_WORKER_PARTY_SHARE": "-1"},
     "VPAY_WORKER_PARTY_SHARE (env, for --party-share) must be a fraction above 0"),
    ((), {"VPAY_WORKER_LEND": "maybe"}, "VPAY_WORKER_LEND (env, for --lend) must be on or off, got 'maybe'"),
])
def test_a_bad_party_share_or_lending_setting_is_refused_with_78_and_one_line_before_any_connection(
        args, env, says):
    counter = ConnCounter()
    try:
        full = base_env(f"postgresql://nobody@127.0.0.1:{counter.port}/x?connect_timeout=2", **env)
        res = subprocess.run([script("vpay-worker"), *args], env=full, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 78, res.stderr
        assert says in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert counter.accepted == 0
    finally:
        counter.close()


def test_the_lend_flag_wins_over_the_environment(db, db_url, spawn):
    worker = spawn("vpay-worker", "--no-lend", "--party-share", "1",
                   env=base_env(db_url, VPAY_WORKER_LEND="on", VPAY_WORKER_PARTY_SHARE="0.25"))
    started = worker.wait_for_log("worker started")
    assert started["lend"] is False and started["party_share"] == 1.0
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0
