"""The operator's commands as an operator runs them: the installed
``vpay-server`` against a real Postgres (jobs, alerts, prune), and the
sweep's retention."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import base_env, script
from vpay.money import charges
from vpay.engine import queue


def run(db_url: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([script("vpay-server"), *args], env=base_env(db_url, **env),
                          capture_output=True, text=True, timeout=60)


def ok_json(db_url: str, *args: str):
    res = run(db_url, *args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def failure_line(res: subprocess.CompletedProcess) -> str:
    """The one ``vpay:`` line a failing command prints (JSON log lines aside)."""
    assert "Traceback" not in res.stderr, res.stderr
    lines = [l for l in res.stderr.splitlines() if l.startswith("vpay:")]
    assert len(lines) == 1, res.stderr
    return lines[0]


def _dead_letter(db, key: str, charge_id: str | None = None) -> int:
    """A job parked the way the loop parks one (claim, then a fenced park with its alert)."""
    payload = {"charge_id": charge_id} if charge_id else {}
    queue.enqueue(db, "test.count", key, payload)
    job = queue.claim(db, "w-test")
    assert job.dedupe_key == key and queue.park(db, job, "test: broken for good")
    return job.id


def _stranded(db, key: str) -> int:
    """A lease whose own expiry has passed (a dead worker's), claimed for real."""
    queue.enqueue(db, "test.count", key)
    job = queue.claim(db, "dead-worker:1", lease=0.001)
    assert job.dedupe_key == key
    db.execute("SELECT pg_sleep(0.01)")
    return job.id


def test_jobs_list_filters_dead_stranded_kind_and_says_the_state(db, db_url):
    dead = _dead_letter(db, "k:dead")
    stranded = _stranded(db, "k:stranded")
    queue.enqueue(db, "deliver", "k:due")
    live = queue.claim(db, "live-worker:1", lease=300)
    queue.enqueue(db, "deliver", "k:later", delay=3600)

    states = {r["dedupe_key"]: r["state"] for r in ok_json(db_url, "jobs", "list")}
    assert states == {"k:dead": "dead", "k:stranded": "stranded", "k:due": "leased", "k:later": "scheduled"}
    assert live.dedupe_key == "k:due"
    assert [r["id"] for r in ok_json(db_url, "jobs", "list", "--dead")] == [dead]
    assert [r["id"] for r in ok_json(db_url, "jobs", "list", "--stranded")] == [stranded]
    assert {r["dedupe_key"] for r in ok_json(db_url, "jobs", "list", "--kind", "deliver")} == {"k:due", "k:later"}
    assert ok_json(db_url, "jobs", "list", "--dead")[0]["run_at"] is None  # infinity, not a date
    table = run(db_url, "jobs", "list", "--dead")
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:4] == ["ID", "KIND", "LANE", "STATE"]
    assert "k:dead" in table.stdout and "test: broken for good" in table.stdout


@pytest.mark.parametrize("args, named", [
    (("jobs", "list", "--kind", "bogus"), "deliver"),
    (("jobs", "list", "--lane", "bogus"), "mtn,orange,mpesa,pawapay,webhooks,housekeeping"),
    (("jobs", "retry", "--all-dead", "--lane", "bogus"), "mtn,orange,mpesa,pawapay,webhooks,housekeeping"),
    (("alerts", "list", "--kind", "bogus"), "charge_unresolved"),
    (("alerts", "ack", "--all-open", "--kind", "bogus", "--note", "x"), "unknown_rail_transaction"),
])
def test_an_unknown_kind_or_lane_is_a_usage_error_naming_the_known_ones(db_url, args, named):
    res = run(db_url, *args)
    assert res.returncode == 2, res.stdout + res.stderr
    line = failure_line(res)
    assert "'bogus'" in line and named in line, line
    assert res.stdout == ""


def test_jobs_retry_requeues_a_dead_letter_and_acknowledges_its_alert_with_one_audit_line(db, db_url):
    job_id = _dead_letter(db, "k:dead")
    db.execute("UPDATE jobs SET failures = 4 WHERE id = %s", (job_id,))
    res = run(db_url, "jobs", "retry", str(job_id), "--note", "fixed the handler", "--json")
    assert res.returncode == 0, res.stderr
    row = db.execute("SELECT run_at <= now(), failures, locked_at, dead_since FROM jobs WHERE id = %s",
                     (job_id,)).fetchone()
    assert row == (True, 0, None, None)
    assert db.execute("SELECT acknowledged_at IS NOT NULL, note FROM alerts "
                      "WHERE kind = 'job_dead_lettered'").fetchall() == [(True, "fixed the handler")]
    audit = [json.loads(l) for l in res.stderr.splitlines() if l.startswith("{") and '"audit"' in l]
    assert [(a["message"], a["job_id"]) for a in audit] == [("operator retried a dead letter", job_id)]
    assert queue.claim(db, "w2").id == job_id  # a worker takes it at once


def test_jobs_retry_refuses_a_job_that_is_not_dead_and_changes_nothing(db, db_url):
    dead = _dead_letter(db, "k:dead")
    queue.enqueue(db, "test.count", "k:live", delay=60)
    live = db.execute("SELECT id FROM jobs WHERE dedupe_key = 'k:live'").fetchone()[0]
    res = run(db_url, "jobs", "retry", str(dead), str(live))
    assert res.returncode == 1
    assert f"job {live} (k:live) is scheduled, not a dead letter" in failure_line(res)
    assert db.execute("SELECT run_at = 'infinity' FROM jobs WHERE id = %s", (dead,)).fetchone() == (True,)
    assert run(db_url, "jobs", "retry", "999999").returncode == 1
    assert run(db_url, "jobs", "retry").returncode == 2  # neither ids nor --all-dead


def test_jobs_retry_all_dead_of_one_kind(db, db_url):
    a = _dead_letter(db, "k:a")
    db.execute("UPDATE jobs SET kind = 'deliver', attempts = 10 WHERE id = %s", (a,))
    b = _dead_letter(db, "k:b")
    assert [r["id"] for r in ok_json(db_url, "jobs", "retry", "--all-dead", "--kind", "deliver")] == [a]
    # a deliver job starts its webhook schedule again; the other stays dead
    assert db.execute("SELECT attempts FROM jobs WHERE id = %s", (a,)).fetchone() == (0,)
    assert db.execute("SELECT run_at = 'infinity' FROM jobs WHERE id = %s", (b,)).fetchone() == (True,)


def test_jobs_release_frees_only_a_lease_past_its_own_expiry(db, db_url):
    stranded = _stranded(db, "k:stranded")
    queue.enqueue(db, "test.count", "k:live")
    live = queue.claim(db, "live-worker:1", lease=300)
    res = run(db_url, "jobs", "release", str(live.id))
    assert res.returncode == 1
    assert "not a stranded lease" in failure_line(res)
    assert db.execute("SELECT locked_by FROM jobs WHERE id = %s", (live.id,)).fetchone() == ("live-worker:1",)

    assert [r["id"] for r in ok_json(db_url, "jobs", "release", "--all-stranded")] == [stranded]
    row = db.execute("SELECT locked_by, locked_at, lease_token, lease_expires_at, failures, run_at <= now() "
                     "FROM jobs WHERE id = %s", (stranded,)).fetchone()
    assert row == (None, None, None, None, 1, True)
    assert queue.claim(db, "w2").id == stranded


def test_alerts_list_and_ack_store_the_note_and_refuse_a_second_ack(db, db_url):
    first = _dead_letter(db, "k:a")
    _dead_letter(db, "k:b")
    alerts = ok_json(db_url, "alerts", "list", "--open", "--kind", "job_dead_lettered")
    assert [a["details"]["job_id"] for a in alerts] == [first, first + 1]
    res = run(db_url, "alerts", "ack", str(alerts[0]["id"]), "--note", "ops: on it (ticket 12)")
    assert res.returncode == 0, res.stderr
    assert db.execute("SELECT note FROM alerts WHERE id = %s", (alerts[0]["id"],)).fetchone() == \
        ("ops: on it (ticket 12)",)
    assert [a["id"] for a in ok_json(db_url, "alerts", "list", "--open")] == [alerts[1]["id"]]
    again = run(db_url, "alerts", "ack", str(alerts[0]["id"]), "--note", "again")
    assert again.returncode == 1 and "was acknowledged at" in failure_line(again)
    assert run(db_url, "alerts", "ack", str(alerts[1]["id"])).returncode == 2  # --note is required
    assert run(db_url, "alerts", "ack", str(alerts[1]["id"]), "--note", " ").returncode == 2


def _payment(db, merchant: str, status: str) -> dict:
    created = charges.create_payment(db, merchant_id=merchant, amount=500, currency="EUR", rail="mtn",
                                   payer="256770000001")
    if status != "pending":
        from vpay.rails.port import StatusKind
        kind = StatusKind.SUCCEEDED if status == "succeeded" else StatusKind.FAILED
        charges.settle(db, created.charge["id"], kind, failure_code=None if status == "succeeded" else "X")
    return created.charge


def _age_everything(db, days: int) -> None:
    for table, column in (("events", "created_at"), ("webhook_deliveries", "updated_at"),
                          ("alerts", "acknowledged_at"), ("jobs", "dead_since")):
        db.execute(f"UPDATE {table} SET {column} = {column} - make_interval(days => %s) "
                   f"WHERE {column} IS NOT NULL", (days,))


def test_prune_deletes_only_what_finished_long_ago_and_nothing_a_live_charge_needs(db, db_url, merchant):
    done = _payment(db, merchant, "succeeded")
    live = _payment(db, merchant, "pending")
    # their fan-outs ran (no endpoint) and the settled charge's poll ended
    db.execute("DELETE FROM jobs WHERE kind = 'fanout' OR dedupe_key = %s", (f"poll:{done['id']}",))
    _dead_letter(db, "k:done", done["id"])
    _dead_letter(db, "k:live", live["id"])
    db.execute("UPDATE alerts SET acknowledged_at = now(), note = 'seen'")
    _age_everything(db, 40)
    fresh = _dead_letter(db, "k:fresh")  # dead-lettered today

    dry = ok_json(db_url, "prune", "--older-than", "30d", "--dry-run")
    assert (dry["events"], dry["alerts"], dry["dead_letters"]) == (2, 1, 1)
    assert db.execute("SELECT count(*) FROM events").fetchone() == (3,)  # a dry run deletes nothing

    res = ok_json(db_url, "prune", "--older-than", "30d")
    assert (res["events"], res["alerts"], res["dead_letters"]) == (2, 1, 1)
    kept_events = {r[0] for r in db.execute("SELECT payment_intent_id FROM events")}
    assert kept_events == {live["payment_intent_id"]}  # the live charge keeps its history
    assert {r[0] for r in db.execute("SELECT dedupe_key FROM jobs")} == \
        {"k:live", "k:fresh", f"poll:{live['id']}"}
    assert [r[0] for r in db.execute("SELECT details ->> 'dedupe_key' FROM alerts")] == ["k:live", "k:fresh"]
    assert fresh  # dead-lettered today: kept whatever its job's age
    assert ok_json(db_url, "prune", "--older-than", "30d")["events"] == 0
    assert run(db_url, "prune", "--older-than", "0d").returncode == 2


def test_prune_keeps_an_event_whose_delivery_is_still_pending(db, db_url, merchant):
    charge = _payment(db, merchant, "succeeded")
    db.execute("INSERT INTO webhook_endpoints (id, merchant_id, url, secret) "
               "VALUES ('we_t', %s, 'https://example.com/h', 'whsec_x')", (merchant,))
    events = [r[0] for r in db.execute("SELECT id FROM events ORDER BY created_at")]
    db.execute("DELETE FROM jobs")
    db.execute("INSERT INTO webhook_deliveries (event_id, endpoint_id, status) VALUES "
               "(%s, 'we_t', 'delivered'), (%s, 'we_t', 'pending')", events)
    _age_everything(db, 40)
    assert ok_json(db_url, "prune", "--older-than", "30d")["events"] == 1
    assert [r[0] for r in db.execute("SELECT id FROM events")] == [events[1]]
    assert charge


@pytest.mark.parametrize("value", ["-1", "ninety", "1.5", "999999"])
def test_a_bad_retention_setting_refuses_the_worker(db_url, value):
    res = subprocess.run([script("vpay-worker")], env=base_env(db_url, VPAY_RETENTION_DAYS=value),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 78
    assert "VPAY_RETENTION_DAYS" in failure_line(res)


@pytest.mark.parametrize("amount", ["1_000", " 100", "\u0661\u0660\u0660", "1500\n"],
                         ids=["underscore", "leading-blank", "arabic-indic-digits", "trailing-newline"])
def test_payments_create_takes_an_amount_only_as_ascii_digits(db, db_url, merchant, sandbox, amount):
    # Python's int() reads all of these as a number; as an amount of money
    # each is a typo or a paste, and must be a usage error that charges nobody.
    from support import rail_env
    res = run(db_url, "payments", "create", "--merchant", merchant, "--amount", amount,
              "--currency", "EUR", "--payer", "256770000001", **rail_env(sandbox))
    assert res.returncode == 2, res.stderr
    assert "minor units" in failure_line(res)
    assert db.execute("SELECT count(*) FROM charges").fetchone()[0] == 0


def test_payments_create_and_show_agree_on_keys_and_show_the_poll_and_open_alerts(db, db_url, merchant, sandbox):
    from support import rail_env
    created = run(db_url, "payments", "create", "--merchant", merchant, "--amount", "1500",
                  "--currency", "EUR", "--payer", "256770000001", "--json", **rail_env(sandbox))
    assert created.returncode == 0, created.stderr
    created = json.loads(created.stdout)
    charge_id = created["charge"]["id"]
    assert [c["id"] for c in created["charges"]] == [charge_id]
    db.execute("UPDATE jobs SET last_error = 'rail: pending' WHERE dedupe_key = %s", (f"poll:{charge_id}",))
    db.execute("INSERT INTO alerts (kind, charge_id, details) VALUES ('rail_contradiction', %s, '{}'), "
               "('charge_unresolved', %s, '{}')", (charge_id, charge_id))
    db.execute("UPDATE alerts SET acknowledged_at = now() WHERE kind = 'charge_unresolved'")

    for some_id in (created["payment_intent"]["id"], charge_id):
        res = run(db_url, "payments", "show", some_id, "--json")
        assert res.returncode == 0, res.stderr
        shown = json.loads(res.stdout)
        assert shown["charge"]["id"] == charge_id and [c["id"] for c in shown["charges"]] == [charge_id]
        poll = shown["charge"]["poll"]
        assert poll["dedupe_key"] == f"poll:{charge_id}" and poll["state"] == "scheduled"
        assert poll["next_read_at"] and poll["attempts"] == 0 and poll["last_error"] == "rail: pending"
        assert "lane" in poll
        assert [a["kind"] for a in shown["charge"]["open_alerts"]] == ["rail_contradiction"]
    assert run(db_url, "payments", "show", "pi_nothing").returncode == 1
