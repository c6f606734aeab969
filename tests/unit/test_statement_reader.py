"""The statement reader, line parser and column maps, without a database."""

from __future__ import annotations

import pytest

from vpay.statements import lines, profiles, reader
from vpay.statements.reader import BadFile

HEADER = "reference,amount,currency,status,time\r\n"


def _read(text: str | bytes):
    return reader.read(text.encode() if isinstance(text, str) else text)


def test_amounts_are_exact_minor_units_by_the_currency_exponent():
    assert lines.parse_amount("10.50", "EUR") == 1050
    assert lines.parse_amount("10.5", "EUR") == 1050
    assert lines.parse_amount("5000", "XAF") == 5000
    assert lines.parse_amount("1.234", "TND") == 1234
    assert lines.parse_amount("0.10", "EUR") + lines.parse_amount("0.20", "EUR") == 30  # never a float
    for bad, cur in (("10.505", "EUR"), ("10.5", "XAF"), ("1,500.00", "EUR"), ("25,00", "EUR"), ("1e3", "EUR"),
                     ("", "EUR"), ("NaN", "EUR"), ("Infinity", "EUR"), (" 10", "EUR")):
        assert lines.parse_amount(bad, cur) is None, bad


def test_an_unreadable_field_is_an_error_for_that_line_only():
    raw = _read(HEADER + "a,10.00,EUR,SUCCESSFUL,2026-11-30T10:00:00Z\r\n"
                         "b,10.00,EUR,MAYBE,2026-11-30T10:00:00Z\r\n"
                         "c,ten,EUR,SUCCESSFUL,2026-11-30T10:00:00Z\r\n"
                         "d,10.00,EUR,FAILED,yesterday\r\n"
                         "e,,EUR,FAILED,2026-11-30 10:00:00\r\n")
    prof = profiles.PROFILES["default"]
    got = list(lines.typed(raw, prof, profiles.resolve(prof, raw.header)))
    assert [(l.reference, l.error) for l in got] == [
        ("a", None), ("b", "unknown status 'MAYBE'"), ("c", "unreadable amount 'ten' for EUR"),
        ("d", "unreadable time 'yesterday'"), ("e", None)]
    assert got[0].amount == 1000 and got[0].status == "succeeded"
    assert got[4].time.tzinfo is not None and got[4].amount is None  # no offset = UTC; a failure may omit money


def test_bad_files_are_refused_in_one_line():
    cases = {
        b"": "empty",
        b"\xff\xfer\x00e\x00": "UTF-16",
        (HEADER + "a,10.00,EUR,SUCCESSFUL,2026-11-30T10:00:00Z").encode(): "no line ending",
        HEADER.encode(): "no lines after the header",
        (HEADER + "a,10.00,EUR\r\n").encode(): "line 2 has 3 fields, the header has 5",
        ("reference,amount,amount,status,time\r\nx,1,1,S,t\r\n").encode(): "repeats column 'amount'",
        (HEADER + "a,10.00,EUR,R\xe9fus\xe9,2026\r\n").encode("latin-1"): "line 2 is not UTF-8",
    }
    for data, says in cases.items():
        with pytest.raises(BadFile, match=says):
            reader.read(data)
        assert "\n" not in str(pytest.raises(BadFile, reader.read, data).value)


def test_a_utf8_bom_and_semicolons_are_read():
    raw = _read(b"\xef\xbb\xbfreference;amount;currency;status;time\r\na;1,5;EUR;FAILED;2026-11-30\r\n")
    assert raw.header[0] == "reference" and raw.rows == [(2, ["a", "1,5", "EUR", "FAILED", "2026-11-30"])]


def test_column_maps():
    prof = profiles.parse_map("reference=Ref, amount=Amt,currency=Cur,status=St,time=When")
    assert prof.columns["reference"] == "Ref" and prof.name == "map"
    for bad, says in (("amount", "KEY=COLUMN"), ("colour=Red", "unknown key"), ("amount=A,amount=B", "twice"),
                      ("amount=A,currency=C,time=T,status=S", "reference or rail_transaction_id")):
        with pytest.raises(profiles.BadMap, match=says):
            profiles.parse_map(bad)
    with pytest.raises(profiles.BadMap, match="not both"):
        profiles.choose("default", "amount=A")
    with pytest.raises(BadFile, match="missing column"):
        profiles.resolve(profiles.PROFILES["pawapay-deposits"], ["Transaction ID", "Amount"])
    # a wallet statement has no status column: every line moved money
    pawapay = profiles.PROFILES["pawapay"]
    header = ["Creation Date (UTC)", "MSISDN", "Transaction ID", "Amount", "Currency", "Country", "MNO", "Type"]
    raw = reader.read((",".join(header) + "\r\n2026-11-30 10:00:00,2567,ref-1,1500,XAF,CMR,MTN,DEPOSIT\r\n").encode())
    [line] = lines.typed(raw, pawapay, profiles.resolve(pawapay, raw.header))
    assert (line.kind, line.status, line.amount, line.error) == ("charge", "succeeded", 1500, None)


def test_identifiers_are_compared_case_insensitively_only_where_their_spec_says_so():
    # RFC 4122 §3: a UUID is case-insensitive on input; hex order ids likewise; our base62 ids are not
    ref = "3F2504E0-4F89-41D3-9A0C-0305E82C3301"
    assert lines.canonical(ref) == lines.canonical(ref.lower()) == ref.lower()
    assert lines.canonical("3F2504E04F8941D39A0C0305E82C33") == "3f2504e04f8941d39a0c0305e82c33"
    assert lines.canonical("ch_AbC") != lines.canonical("ch_abc")
    assert lines.canonical("8712345") == "8712345" and lines.canonical(None) is None


def test_two_lines_for_one_transaction_are_both_read_for_the_matcher_to_group():
    raw = _read(HEADER + "a,1.00,EUR,SUCCESSFUL,2026-11-30\r\na,1.00,EUR,FAILED,2026-11-30\r\n")
    prof = profiles.PROFILES["default"]
    got = list(lines.typed(raw, prof, profiles.resolve(prof, raw.header)))
    assert [(l.line_no, l.status, l.error) for l in got] == [(2, "succeeded", None), (3, "failed", None)]


@pytest.mark.parametrize("field, value, says", [
    ("amount", "12345678901234567890", "unreadable amount '12345678901234567890' for EUR"),
    ("amount", "1" * 5000, "amount is longer than 1000 characters"),
    ("reference", "a\x00b", "reference holds a NUL byte"),
    ("time", "9999-12-31T23:59:59", "time '9999-12-31T23:59:59' is outside"),
    ("time", "2026-11-30T10:00:00-23:59", "has an offset beyond"),
    ("time", "2099-01-01T00:00:00Z", "is outside 2000-01-01"),
    ("currency", "EURO", "unreadable currency 'EURO'"),
    ("currency", "€", "unreadable currency '€'"),
])
def test_one_unreadable_field_is_that_lines_error_and_never_an_exception(field, value, says):
    good = {"reference": "a", "amount": "10.00", "currency": "EUR", "status": "SUCCESSFUL",
            "time": "2026-11-30T10:00:00Z"}
    bad = {**good, "reference": "b", field: value}
    import csv
    import io
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(list(good))
    writer.writerow(list(good.values()))
    writer.writerow(list(bad.values()))
    raw = _read(buf.getvalue())
    prof = profiles.PROFILES["default"]
    got = list(lines.typed(raw, prof, profiles.resolve(prof, raw.header)))
    assert got[0].error is None and got[0].amount == 1000
    assert says in got[1].error and "\n" not in got[1].error
    assert "\x00" not in (got[1].reference or "")  # storable: written as \\x00


def test_a_period_runs_to_the_end_of_its_last_lines_unit():
    from datetime import datetime, timedelta, timezone

    from vpay.statements.matcher import resolution

    def at(*args):
        return datetime(*args, tzinfo=timezone.utc)
    assert resolution([at(2026, 11, 30), at(2026, 11, 29)]) == timedelta(days=1)
    assert resolution([at(2026, 11, 30, 10, 5), at(2026, 11, 30)]) == timedelta(minutes=1)
    assert resolution([at(2026, 11, 30, 10, 5, 7), at(2026, 11, 30, 10, 5)]) == timedelta(seconds=1)
    assert resolution([at(2026, 11, 30, 10, 5, 7, 250_000)]) == timedelta(microseconds=1)


def test_an_excel_workbook_is_read_like_its_csv(tmp_path):
    from datetime import datetime

    import openpyxl
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["reference", "amount", "currency", "status", "time", None])
    sheet.append(["a", 10.5, "EUR", "SUCCESSFUL", datetime(2026, 11, 30, 10, 5)])
    sheet.append([None, None, None])
    sheet.append(["b", 1500, "XAF", "FAILED", "2026-11-30T10:06:00Z"])
    sheet.append(["c", 10.499999999, "EUR", "SUCCESSFUL", "2026-11-30T10:07:00Z"])
    path = tmp_path / "statement.xlsx"
    book.save(path)
    raw = reader.read(path.read_bytes())
    assert raw.header == ["reference", "amount", "currency", "status", "time"]
    assert raw.rows == [(2, ["a", "10.5", "EUR", "SUCCESSFUL", "2026-11-30T10:05:00"]),
                        (4, ["b", "1500", "XAF", "FAILED", "2026-11-30T10:06:00Z"]),
                        (5, ["c", "10.499999999", "EUR", "SUCCESSFUL", "2026-11-30T10:07:00Z"])]
    prof = profiles.PROFILES["default"]
    got = list(lines.typed(raw, prof, profiles.resolve(prof, raw.header)))
    assert [(l.amount, l.error) for l in got] == [
        (1050, None), (1500, None), (None, "unreadable amount '10.499999999' for EUR")]
    with pytest.raises(BadFile, match="not a readable .xlsx"):
        reader.read(path.read_bytes()[:2000])  # a truncated download


def test_the_imports_table_prints_its_period_as_every_table_prints_times():
    # found by the fresh-clone review: the period printed microseconds and an offset
    from vpay.statements.report import render
    text = render({"statement": "st_1", "rail": "mtn", "lines": 1, "summary": {}, "exceptions": [],
                   "period": {"start": "2026-12-04T17:00:02+00:00", "end": "2026-12-04T19:00:02.999999+02:00",
                              "source": "lines"}})
    assert "period 2026-12-04T17:00:02Z .. 2026-12-04T17:00:02Z (lines)" in text
