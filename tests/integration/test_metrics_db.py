"""The gauges read from the database at scrape (vpay.money.gauges.DatabaseCollector,
``metrics_snapshot``), against a real Postgres: exact counts, zeros for what
is absent, the short cache, and the bound (a blocked query reports
``vpay_database_up 0`` instead of hanging the scrape)."""

from __future__ import annotations

import threading

import psycopg

from vpay.money import merchants, charges
from vpay.money import gauges
from vpay.engine import lanes


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _values(collector) -> dict[tuple, float]:
    out = {}
    for family in collector.collect():
        for sample in family.samples:
            out[(sample.name, *sample.labels.values())] = sample.value
    return out


def test_the_gauges_count_what_the_tables_hold(db, pool):
    merchants.create_merchant(db, "m1", "m1")
    # before the payments: an event gets its delivery (and deliver job) only
    # for an enabled endpoint (docs/webhooks.md, "Who gets an event")
    db.execute("INSERT INTO webhook_endpoints (id, merchant_id, url, secret, enabled) VALUES "
               "('we_a', 'm1', 'https://a.example/h', 'whsec_x', false), "
               "('we_b', 'm1', 'https://b.example/h', 'whsec_y', true)")
    made_charges = [charges.create_payment(db, merchant_id="m1", amount=1000, currency="EUR", rail="mtn",
                                    payer="256770000001").charge for _ in range(3)]
    db.execute("UPDATE charges SET status = 'unresolved' WHERE id = %s", (made_charges[0]["id"],))
    db.execute("UPDATE charges SET status = 'succeeded', settled_at = now() WHERE id = %s",
               (made_charges[1]["id"],))
    # lanes: three polls (mtn) and three deliveries (webhooks, we_b) were born with the payments
    db.execute("UPDATE jobs SET run_at = 'infinity' WHERE dedupe_key = %s", (f"poll:{made_charges[0]['id']}",))
    db.execute("UPDATE jobs SET run_at = now() - interval '1 second' WHERE dedupe_key = %s",
               (f"poll:{made_charges[1]['id']}",))
    db.execute("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE dedupe_key = %s",
               (f"poll:{made_charges[2]['id']}",))
    db.execute("UPDATE jobs SET locked_by = 'w', locked_at = now(), lease_token = gen_random_uuid(), "
               "lease_expires_at = now() + interval '5 minutes', run_at = now() WHERE kind = 'deliver'")
    db.execute("INSERT INTO alerts (kind, charge_id) VALUES ('charge_unresolved', %s), "
               "('rail_contradiction', %s)", (made_charges[0]["id"], made_charges[1]["id"]))
    db.execute("INSERT INTO alerts (kind, acknowledged_at) VALUES ('job_dead_lettered', now())")
    # a rail paused fleet-wide for a minute, and one whose pause is over
    db.execute("INSERT INTO rail_pauses (rail, paused_until, reason, set_by) VALUES "
               "('orange', now() + interval '60 seconds', 'HTTP 429', 'w:1'), "
               "('mpesa', now() - interval '1 second', 'HTTP 503', 'w:2')")

    values = _values(gauges.DatabaseCollector(pool, lanes=lanes.LANES))
    assert values[("vpay_database_up",)] == 1
    assert values[("vpay_queue_jobs", "mtn", "dead")] == 1
    assert values[("vpay_queue_jobs", "mtn", "due")] == 1
    assert values[("vpay_queue_jobs", "mtn", "leased")] == 0
    assert values[("vpay_queue_jobs", "webhooks", "leased")] == 3
    assert values[("vpay_queue_jobs", "webhooks", "due")] == 0
    assert values[("vpay_queue_jobs", "orange", "due")] == 0       # a lane with no job: 0
    assert values[("vpay_charges", "pending")] == 1
    assert values[("vpay_charges", "unresolved")] == 1
    assert values[("vpay_charges", "succeeded")] == 1
    assert values[("vpay_charges", "failed")] == 0
    assert values[("vpay_alerts_open", "charge_unresolved")] == 1
    assert values[("vpay_alerts_open", "rail_contradiction")] == 1
    assert values[("vpay_alerts_open", "job_dead_lettered")] == 0  # acknowledged
    assert values[("vpay_webhook_endpoints_disabled",)] == 1
    assert 50 < values[("vpay_rail_paused_seconds", "orange")] <= 60
    assert values[("vpay_rail_paused_seconds", "mpesa")] == 0   # over
    assert values[("vpay_rail_paused_seconds", "mtn")] == 0     # never paused: 0, not absent


def test_one_snapshot_serves_scrapes_for_a_few_seconds(db, pool):
    clock = Clock()
    collector = gauges.DatabaseCollector(pool, lanes=lanes.LANES, clock=clock)
    assert _values(collector)[("vpay_webhook_endpoints_disabled",)] == 0
    merchants.create_merchant(db, "m1", "m1")
    db.execute("INSERT INTO webhook_endpoints (id, merchant_id, url, secret, enabled) VALUES "
               "('we_a', 'm1', 'https://a.example/h', 'whsec_x', false)")
    clock.now += gauges.CACHE_SECONDS / 2
    assert _values(collector)[("vpay_webhook_endpoints_disabled",)] == 0
    clock.now += gauges.CACHE_SECONDS
    assert _values(collector)[("vpay_webhook_endpoints_disabled",)] == 1


def test_a_blocked_snapshot_gives_up_at_its_bound_and_reports_the_database_down(db, db_url, pool):
    locked, release = threading.Event(), threading.Event()

    def hold_lock():
        with psycopg.connect(db_url) as conn:
            conn.execute("LOCK TABLE charges IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(30)
            conn.rollback()

    t = threading.Thread(target=hold_lock)
    t.start()
    try:
        assert locked.wait(10)
        values = _values(gauges.DatabaseCollector(pool, lanes=lanes.LANES))
    finally:
        release.set()
        t.join(30)
    assert values == {("vpay_database_up",): 0}
