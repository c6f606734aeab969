"""Statements II (issue 26): the files operators really get. One test (or
a pair) per numbered input of the issue and a sibling of each, against a real
Postgres, with the installed ``vpay-server`` where the command's own
behaviour (exit code, stderr, the terminal table) is what is judged.

Charges are made by ``charges.create_payment`` (pending, a fresh UUIDv4
reference); no rail is needed to judge a statement against them."""

from __future__ import annotations

import csv
import io
import json
import logging
import subprocess
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from support import base_env, script
from vpay.money import charges
from vpay.statements import importer, profiles, reader

pytestmark = pytest.mark.slow

COLUMNS = ("reference", "rail_transaction_id", "amount", "currency", "status", "time")
NOW = datetime.now(timezone.utc).replace(microsecond=0)
T = (NOW - timedelta(hours=3)).isoformat()


def _pending(db, merchant, n=1, amount=2500) -> list[dict]:
    return [charges.create_payment(db, merchant_id=merchant, amount=amount, currency="EUR", rail="mtn",
                                 payer="256770000001").charge for _ in range(n)]


def _csv(tmp_path, rows, name="statement.csv", columns=COLUMNS) -> Path:
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([row.get(c, "") for c in columns])
    path = tmp_path / name
    path.write_bytes(buf.getvalue().encode())
    return path


def _line(charge=None, *, ref=None, txid="", amount="25.00", status="SUCCESSFUL", time=T, **more) -> dict:
    return {"reference": ref if ref is not None else charge["rail_reference"], "rail_transaction_id": txid,
            "amount": amount, "currency": "EUR", "status": status, "time": time, **more}


def _cli(db_url, *args) -> subprocess.CompletedProcess:
    return subprocess.run([script("vpay-server"), *args], env=base_env(db_url, VPAY_LOG_LEVEL="INFO"),
                          capture_output=True, text=True, timeout=120)


def _import(db_url, path, *args) -> subprocess.CompletedProcess:
    return _cli(db_url, "statements", "import", str(path), "--rail", "mtn", *args)


def _said(out) -> list[str]:
    assert "Traceback" not in out.stderr, out.stderr
    return [line for line in out.stderr.splitlines() if not line.startswith("{")]


def _report(out) -> dict:
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _status(db, charge) -> str:
    return db.execute("SELECT status FROM charges WHERE id = %s", (charge["id"],)).fetchone()[0]


def _alerts(db, kind) -> list[dict]:
    return [r[0] for r in db.execute("SELECT details FROM alerts WHERE kind = %s ORDER BY id", (kind,))]


def _outcomes(report) -> dict:
    return {k: v["count"] for k, v in report["summary"].items()}


# ---- 1. a statement that contradicts itself moves no money ---------------------------


def test_one_charge_named_by_reference_and_by_our_id_disagreeing_is_one_contradiction_and_settles_nothing(
        db, db_url, merchant, tmp_path):
    charge, other = _pending(db, merchant, 2)
    path = _csv(tmp_path, [_line(charge, status="FAILED"), _line(ref=charge["id"]), _line(other)])
    report = _report(_import(db_url, path, "--apply", "--json"))
    assert _outcomes(report) == {"settled": 1, "contradiction": 2}
    assert _status(db, charge) == "pending" and _status(db, other) == "succeeded"
    rows = [r for r in report["exceptions"] if r["outcome"] == "contradiction"]
    assert [r["line_no"] for r in rows] == [2, 3] and all(r["charge_id"] == charge["id"] for r in rows)
    assert "lines 2, 3 disagree" in rows[0]["detail"]
    alerts = _alerts(db, "rail_contradiction")
    assert len(alerts) == 1 and alerts[0]["finding"] == "statement_disagrees" and alerts[0]["lines"] == [2, 3]
    assert db.execute("SELECT count(*) FROM settlement_evidence WHERE charge_id = %s",
                      (charge["id"],)).fetchone()[0] == 0


def test_one_charge_named_by_rail_transaction_id_and_by_reference(db, db_url, merchant, tmp_path):
    # sibling: the rail's own id on one line, our reference (upper-cased) on the other
    disagree, agree = _pending(db, merchant, 2)
    db.execute("UPDATE charges SET rail_transaction_id = 'MP' || right(id, 6) WHERE id = ANY(%s)",
               ([disagree["id"], agree["id"]],))
    tx = {c["id"]: db.execute("SELECT rail_transaction_id FROM charges WHERE id = %s", (c["id"],)).fetchone()[0]
          for c in (disagree, agree)}
    path = _csv(tmp_path, [
        _line(disagree, ref=disagree["rail_reference"].upper()), _line(ref="", txid=tx[disagree["id"]],
                                                                       amount="99.00"),
        _line(agree, ref=agree["rail_reference"].upper()), _line(ref="", txid=tx[agree["id"]])])
    report = _report(_import(db_url, path, "--apply", "--json"))
    assert _outcomes(report) == {"settled": 1, "contradiction": 2, "error": 1}
    assert _status(db, disagree) == "pending" and _status(db, agree) == "succeeded"
    repeat = next(r for r in report["exceptions"] if r["outcome"] == "error")
    assert repeat["line_no"] == 5 and "repeats line 4" in repeat["detail"]
    assert db.execute("SELECT count(*) FROM events e JOIN charges c ON c.payment_intent_id = e.payment_intent_id "
                      "WHERE c.id = %s AND e.type = 'payment_intent.succeeded'", (agree["id"],)).fetchone()[0] == 1


# ---- 8. a re-export in another case raises nothing new -------------------------------------


def test_an_upper_cased_re_export_raises_no_second_unknown_rail_transaction_alert(db, db_url, merchant, tmp_path):
    stranger = "6f1c2a9e-3b4d-4e5f-8a7b-9c0d1e2f3a4b"
    first = _csv(tmp_path, [_line(ref=stranger)], "a.csv")
    again = _csv(tmp_path, [_line(ref=stranger.upper()), _line(ref=stranger)], "b.csv")
    assert _outcomes(_report(_import(db_url, first, "--apply", "--json"))) == {"unknown_rail_transaction": 1}
    report = _report(_import(db_url, again, "--apply", "--json"))
    # the two lines are one transaction: counted once, the repeat an error
    assert _outcomes(report) == {"unknown_rail_transaction": 1, "error": 1}
    alerts = _alerts(db, "unknown_rail_transaction")
    assert [a["finding"] for a in alerts] == [f"unknown:mtn:{stranger}"]


# ---- 2. every line judged alone ----------------------------------------------------------------


@pytest.mark.parametrize("field, value, says", [
    ("amount", "12345678901234567890", "unreadable amount"),
    ("reference", "bad\x00ref", "reference holds a NUL byte"),
    ("time", "9999-12-31T23:59:59", "is outside"),
    ("time", "2026-11-30T10:00:00-23:59", "offset beyond"),
    ("currency", "E\u20acR", "unreadable currency"),  # sibling: a bad currency field
])
def test_one_unreadable_field_is_that_lines_error_and_the_rest_is_applied(db, db_url, merchant, tmp_path,
                                                                           field, value, says):
    good, spoilt = _pending(db, merchant, 2)
    path = _csv(tmp_path, [_line(good), {**_line(spoilt), field: value}])
    out = _import(db_url, path, "--apply", "--json")
    report = _report(out)
    assert _outcomes(report) == {"settled": 1, "error": 1}
    error = report["exceptions"][0]
    assert error["line_no"] == 3 and says in error["detail"] and "\n" not in error["detail"]
    assert _status(db, good) == "succeeded" and _status(db, spoilt) == "pending"
    assert db.execute("SELECT outcome FROM statement_lines WHERE line_no = 3").fetchone()[0] == "error"


def test_no_settled_line_is_logged_for_a_settlement_that_rolled_back(db, merchant, caplog):
    from vpay.base.logs import committed
    charge = _pending(db, merchant)[0]
    caplog.set_level(logging.INFO)
    with pytest.raises(RuntimeError):
        with committed(db):
            result = charges.settle_with_evidence(db, charge["id"], "succeeded", charges.Evidence("operator", "x"))
            assert result.transitioned
            raise RuntimeError("the enclosing transaction fails after the settle")
    assert _status(db, charge) == "pending"
    assert not [r for r in caplog.records if r.getMessage() == "charge settled"]
    with committed(db):
        charges.settle_with_evidence(db, charge["id"], "succeeded", charges.Evidence("operator", "x"))
        assert not [r for r in caplog.records if r.getMessage() == "charge settled"]  # not yet committed
    assert [r.charge_id for r in caplog.records if r.getMessage() == "charge settled"] == [charge["id"]]


# ---- 3. the period --------------------------------------------------------------------------------


def _settled(db, merchant, n, created) -> list[dict]:
    charges = _pending(db, merchant, n)
    db.execute("UPDATE charges SET status = 'succeeded', settled_at = now(), created_at = %s WHERE id = ANY(%s)",
               (created, [c["id"] for c in charges]))
    return charges


def test_one_line_dated_2099_is_its_own_error_and_floods_nothing(db, db_url, merchant, tmp_path):
    listed = _settled(db, merchant, 3, NOW - timedelta(hours=3))
    _settled(db, merchant, 40, NOW - timedelta(days=30))  # earlier, outside this statement
    path = _csv(tmp_path, [_line(c) for c in listed] + [_line(ref="stray", time="2099-01-01T00:00:00Z")])
    report = _report(_import(db_url, path, "--apply", "--json"))
    assert _outcomes(report) == {"matched": 3, "error": 1}
    assert report["period"]["source"] == "lines" and report["period"]["start"].startswith(T[:10])
    assert _alerts(db, "missing_from_statement") == []


def test_a_stray_old_line_or_an_over_long_period_is_refused_in_one_line(db, db_url, merchant, tmp_path):
    listed = _settled(db, merchant, 200, NOW - timedelta(hours=3))
    stray = _csv(tmp_path, [_line(c) for c in listed] + [_line(ref="old", time="2019-03-01T00:00:00Z")])
    out = _import(db_url, stray, "--apply")
    assert out.returncode == 1 and _said(out)[0].startswith("vpay: statement.csv: line 202's time 2019-03-01")
    assert "--period-start/--period-end" in _said(out)[0] and len(_said(out)) == 1
    good = _csv(tmp_path, [_line(c) for c in listed], "good.csv")
    out = _import(db_url, good, "--apply", "--period-start", "2020-01-01", "--period-end", NOW.date().isoformat())
    assert out.returncode == 1 and "longer than 93 days" in _said(out)[0]
    assert db.execute("SELECT count(*) FROM statements").fetchone()[0] == 0
    assert _alerts(db, "missing_from_statement") == []


def test_a_period_column_or_the_operators_period_is_the_statements_period(db, db_url, merchant, tmp_path):
    # sibling: the file declares its period (period_start/period_end columns)
    listed = _settled(db, merchant, 2, NOW - timedelta(hours=5))
    absent = _settled(db, merchant, 1, NOW - timedelta(hours=30))  # inside the declared day, not listed
    start, end = (NOW - timedelta(days=2)).date().isoformat(), NOW.date().isoformat()
    cols = COLUMNS + ("period_start", "period_end")
    path = _csv(tmp_path, [{**_line(c), "period_start": start, "period_end": end} for c in listed], columns=cols)
    report = _report(_import(db_url, path, "--json"))
    assert report["period"]["source"] == "declared" and report["period"]["start"].startswith(start)
    assert [r["charge_id"] for r in report["exceptions"]] == [absent[0]["id"]]
    # without the columns the lines span five hours ago only: the older success is outside
    plain = _csv(tmp_path, [_line(c) for c in listed], "plain.csv")
    assert _outcomes(_report(_import(db_url, plain, "--json"))) == {"matched": 2}
    given = _report(_import(db_url, plain, "--json", "--period-start", start, "--period-end", end))
    assert given["period"]["source"] == "given" and _outcomes(given)["missing_from_statement"] == 1



def test_a_completed_import_given_another_period_is_refused_not_silently_ignored(db, db_url, merchant, tmp_path):
    listed = _settled(db, merchant, 1, NOW - timedelta(hours=5))
    path = _csv(tmp_path, [_line(c) for c in listed])
    start, end = (NOW - timedelta(days=1)).date().isoformat(), NOW.date().isoformat()
    first = _report(_import(db_url, path, "--apply", "--json", "--period-start", start, "--period-end", end))
    assert first["period"]["source"] == "given"
    same = _report(_import(db_url, path, "--apply", "--json", "--period-start", start, "--period-end", end))
    assert same["already_imported"] is True
    assert _report(_import(db_url, path, "--apply", "--json"))["already_imported"] is True  # no period: the stored one
    other = _import(db_url, path, "--apply", "--period-start", (NOW - timedelta(days=2)).date().isoformat(),
                    "--period-end", end)
    assert other.returncode == 1 and len(_said(other)) == 1
    assert "imported already" in _said(other)[0] and "nothing done" in _said(other)[0]


# ---- 6. concurrent imports, truthful database errors -----------------------------------------------


def test_a_second_apply_on_the_same_rail_is_refused_in_one_line_while_one_runs(db, db_url, merchant, tmp_path):
    charge = _pending(db, merchant)[0]
    path = _csv(tmp_path, [_line(charge)])
    with psycopg.connect(db_url, autocommit=True) as other:  # an import holding the rail's lock
        other.execute("SELECT pg_advisory_lock(hashtext('vpay.statements.apply'), hashtext('mtn'))")
        out = _import(db_url, path, "--apply")
        assert out.returncode == 1, out.stderr
        assert _said(out) == ["vpay: another statements import --apply for rail mtn is running: nothing done; "
                              "run this one again when it has finished"]
        assert _report(_import(db_url, path, "--json"))["applied"] is False  # a dry run needs no lock
    assert _status(db, charge) == "pending"
    assert _outcomes(_report(_import(db_url, path, "--apply", "--json"))) == {"settled": 1}


def test_a_deadlock_or_a_lock_timeout_is_named_as_such_never_as_an_unreachable_database():
    from vpay.cli.errors import translate
    for exc in (psycopg.errors.DeadlockDetected("deadlock detected DETAIL: while locking tuple in relation "
                                                "\"charges\""),
                psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")):
        line, code = translate(exc)
        assert line.startswith("database refused the transaction") and "migrate" not in line
        assert "unavailable" not in line and code == 69
    line, _ = translate(psycopg.errors.UndefinedTable('relation "statements" does not exist'))
    assert line.endswith("(run vpay-server migrate)")


# ---- 5. batches: a poll never waits on the import; a kill between batches -------------------------


def test_a_kill_between_batches_leaves_each_applied_or_not_and_a_re_run_finishes(db, db_url, merchant, tmp_path,
                                                                                  monkeypatch):
    charges = _pending(db, merchant, 7)
    path = _csv(tmp_path, [_line(c) for c in charges])
    monkeypatch.setattr(importer, "BATCH_SETTLES", 3)
    real, calls = importer._settle_batch, []

    def killed_after_two(conn, statement_id, batch):
        if len(calls) == 2:
            raise KeyboardInterrupt  # as a kill: nothing after the second batch's commit
        calls.append(len(batch))
        return real(conn, statement_id, batch)
    monkeypatch.setattr(importer, "_settle_batch", killed_after_two)
    with psycopg.connect(db_url, autocommit=True) as conn, pytest.raises(KeyboardInterrupt):
        importer.run(conn, reader.read_path(path), rail="mtn", profile=profiles.PROFILES["default"],
                     file_name=path.name, apply=True)
    assert calls == [3, 3]
    assert sorted(_status(db, c) for c in charges).count("succeeded") == 6
    assert db.execute("SELECT completed_at FROM statements").fetchone()[0] is None
    monkeypatch.setattr(importer, "_settle_batch", real)
    report = _report(_import(db_url, path, "--apply", "--json"))  # the same file: resumed by its sha256
    assert _outcomes(report) == {"settled": 7} and report["completed"]
    assert [_status(db, c) for c in charges] == ["succeeded"] * 7
    assert db.execute("SELECT count(*) FROM statements").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM events WHERE type = 'payment_intent.succeeded'").fetchone()[0] == 7
    again = _report(_import(db_url, path, "--apply", "--json"))
    assert again["already_imported"] is True


def test_a_charge_a_poll_holds_is_skipped_not_waited_for_and_left_to_a_re_run(db, db_url, merchant, tmp_path,
                                                                              monkeypatch):
    held, free = _pending(db, merchant, 2)
    path = _csv(tmp_path, [_line(held), _line(free)])
    monkeypatch.setattr(importer, "RETRY_SECONDS", 0.2)
    with psycopg.connect(db_url) as poll:  # a poll's transaction holding the row
        # what a poll's settle UPDATE takes (FOR NO KEY UPDATE: it does not block the FKs of the record)
        poll.execute("SELECT 1 FROM charges WHERE id = %s FOR NO KEY UPDATE", (held["id"],))
        with psycopg.connect(db_url, autocommit=True) as conn:
            report = importer.run(conn, reader.read_path(path), rail="mtn", profile=profiles.PROFILES["default"],
                                  file_name=path.name, apply=True)
        poll.rollback()
    assert report["unfinished"] == 1 and report["completed"] is None
    assert _status(db, free) == "succeeded" and _status(db, held) == "pending"
    report = _report(_import(db_url, path, "--apply", "--json"))
    assert _outcomes(report) == {"settled": 2} and _status(db, held) == "succeeded"


# ---- 7. terminal escapes ---------------------------------------------------------------------------


def test_control_characters_in_statement_text_are_escaped_in_the_table(db, db_url, merchant, tmp_path):
    path = _csv(tmp_path, [_line(ref="evil\x1b[2J\x1b]0;pwned\x07", status="SUCCESSFUL"),
                           _line(ref="x\u202eyz", amount="1\x1b[31m")])
    out = _import(db_url, path)
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\u202e" not in out.stdout
    assert "evil\\x1b[2J\\x1b]0;pwned\\x07" in out.stdout and "x\\u202eyz" in out.stdout


def test_safe_text_escapes_what_drives_a_terminal_and_keeps_the_rest():
    from vpay.cli.output import safe_text
    assert safe_text("Café 10.50 EUR") == "Café 10.50 EUR"
    assert safe_text("a\x1b[0mb\x9bc\x00d") == "a\\x1b[0mb\\x9bc\\x00d"
    assert safe_text("two\nlines\tx") == "two\\x0alines\\x09x"
    assert safe_text("two\nlines", one_line=False) == "two\nlines" and safe_text(None) == ""


# ---- 4. size: streaming, and a ZIP bomb refused before it is inflated --------------------------------


def _bomb(path: Path, declared: int) -> None:
    """A workbook whose sheet declares ``declared`` bytes expanded (as a
    real bomb's directory does), patched in: nothing that large is made."""
    import openpyxl
    book = openpyxl.Workbook()
    book.active.append(list(COLUMNS))
    book.save(path)
    data = bytearray(path.read_bytes())
    name = b"xl/worksheets/sheet1.xml"
    at = 0
    while (at := data.find(b"PK\x01\x02", at)) != -1:  # the central directory's entries
        name_len = int.from_bytes(data[at + 28:at + 30], "little")
        if bytes(data[at + 46:at + 46 + name_len]) == name:
            data[at + 24:at + 28] = declared.to_bytes(4, "little")
        at += 4
    path.write_bytes(bytes(data))


def test_a_two_gigabyte_expansion_bomb_is_refused_before_it_is_inflated(db, db_url, tmp_path):
    path = tmp_path / "bomb.xlsx"
    _bomb(path, 2 * 1024 ** 3 - 1)
    with zipfile.ZipFile(path) as z:
        assert sum(i.file_size for i in z.infolist()) > 2 * 1000 ** 3
    out = _import(db_url, path, "--apply")
    assert out.returncode == 1
    assert _said(out) == ["vpay: bomb.xlsx: the workbook expands to 2048 MiB, more than 1024 MiB "
                          "(MAX_XLSX_EXPANDED_BYTES): export the statement as CSV, or split it by period"]


def test_a_workbook_with_the_wrong_header_is_refused_before_its_rows_are_read(tmp_path):
    import openpyxl
    book = openpyxl.Workbook(write_only=True)
    sheet = book.create_sheet()
    sheet.append(["Ref", "Amt"])
    for i in range(2000):
        sheet.append([f"r{i}", i])
    sheet.append(["r", 1, "a value beyond the header"])  # would refuse the file if it were read
    path = tmp_path / "wrong.xlsx"
    book.save(path)
    raw = reader.read_path(path)
    prof = profiles.PROFILES["default"]
    with pytest.raises(reader.BadFile, match="missing column"):
        profiles.resolve(prof, raw.header)
