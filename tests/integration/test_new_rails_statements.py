"""Statement profiles of the new rails against a real Postgres: M-Pesa's
organisation statement (``mpesa``: KES only, Kenya time, charges named by
the 12-hex AccountReference we sent) and pawaPay's deposits export
(``pawapay-deposits``: our depositId), with the lag rule judged on the real
instant."""

from __future__ import annotations

import datetime as dt

from vpay.money import charges
from vpay.rails.mpesa import account_reference
from vpay.statements import importer, profiles

HEADER = "Receipt No.,Completion Time,Initiation Time,Details,Transaction Status,Paid In,Withdrawn,Balance,Reason Type,A/C No.\r\n"


def _kenya(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone(dt.timedelta(hours=3))).strftime("%Y-%m-%d %H:%M:%S")


def test_an_mpesa_statement_names_charges_by_account_reference_in_kenya_time(db, merchant):
    paid = charges.create_payment(db, merchant_id=merchant, amount=150_00, currency="KES", rail="mpesa",
                                  payer="254708374149").charge
    declined = charges.create_payment(db, merchant_id=merchant, amount=20_00, currency="KES", rail="mpesa",
                                      payer="254708374149").charge
    recent = charges.create_payment(db, merchant_id=merchant, amount=30_00, currency="KES", rail="mpesa",
                                    payer="254708374149").charge
    db.execute("UPDATE charges SET created_at = now() - interval '3 hours' WHERE id = ANY(%s)",
               ([paid["id"], declined["id"]],))
    db.execute("UPDATE charges SET status = 'succeeded', settled_at = now() WHERE id = %s", (recent["id"],))
    now = dt.datetime.now(dt.timezone.utc)
    data = (HEADER
            + f"SKL1ABC,{_kenya(now - dt.timedelta(hours=2))},,Pay Bill,Completed,150.00,,,Pay Bill Online,"
              f"{account_reference(paid['rail_reference'])}\r\n"
            + f"SKL1ABD,{_kenya(now - dt.timedelta(hours=2))},,Pay Bill,Failed,,,,Request cancelled by user,"
              f"{account_reference(declined['rail_reference'])}\r\n").encode()
    report = importer.run(db, data, rail="mpesa", profile=profiles.PROFILES["mpesa"], file_name="org.csv",
                          apply=True)
    counts = {k: v["count"] for k, v in report["summary"].items()}
    assert counts.get("settled") == 2, report
    assert db.execute("SELECT status, rail_transaction_id FROM charges WHERE id = %s",
                      (paid["id"],)).fetchone() == ("succeeded", "SKL1ABC")
    assert db.execute("SELECT status FROM charges WHERE id = %s", (declined["id"],)).fetchone()[0] == "failed"
    # our success made after the statement's last line (read as Kenya time, so 2 h ago, not 1 h ahead):
    # within the lag, left to the next statement; not alerted as missing
    assert db.execute("SELECT count(*) FROM alerts WHERE kind = 'missing_from_statement'").fetchone()[0] == 0


def test_a_pawapay_deposits_export_names_charges_by_deposit_id(db, merchant):
    charge = charges.create_payment(db, merchant_id=merchant, amount=15_00, currency="ZMW", rail="pawapay",
                                    payer="260763456789").charge
    data = ("Creation Date (UTC),MSISDN,Transaction ID,Financial Transaction ID,Deposited amount,Currency,Status,Reason\r\n"
            f"2026-12-01T10:00:00Z,260763456789,{charge['rail_reference']},MP1234,15.00,ZMW,COMPLETED,\r\n").encode()
    report = importer.run(db, data, rail="pawapay", profile=profiles.PROFILES["pawapay-deposits"],
                          file_name="deposits.csv", apply=True)
    assert {k: v["count"] for k, v in report["summary"].items()} == {"settled": 1}
    assert db.execute("SELECT status, rail_transaction_id FROM charges WHERE id = %s",
                      (charge["id"],)).fetchone() == ("succeeded", "MP1234")
