"""An Orange Money statement names its charges by order id, against a real
Postgres. The integration half of tests/acceptance/test_statements.py
(statement reconciliation end to end).
"""

from __future__ import annotations



def test_an_orange_statement_names_charges_by_order_id(db, merchant):
    """Orange's statement carries the order_id we sent (the first 30 hex
    digits of the charge's reference), in whole XOF: matched and settled by it."""
    from vpay.money import charges
    from vpay.rails.orange import order_id_for
    from vpay.statements import importer, profiles
    created = charges.create_payment(db, merchant_id=merchant, amount=1500, currency="XOF", rail="orange",
                                   payer="2250700000001")
    charge = created.charge
    order_id = order_id_for(charge["rail_reference"])
    # another order id: change the last hex digit (to one it is not: the id is random)
    other_id = order_id[:-1] + ("0" if order_id[-1] != "0" else "1")
    data = ("reference,rail_transaction_id,amount,currency,status,time\r\n"
            f"{order_id},MP2611.3000.A12345,1500,XOF,SUCCESS,2026-11-30T10:00:00Z\r\n"
            f"{other_id},MP2611.3000.A12346,1500.5,XOF,SUCCESS,2026-11-30T10:01:00Z\r\n").encode()
    report = importer.run(db, data, rail="orange", profile=profiles.PROFILES["default"], file_name="om.csv",
                          apply=True)
    assert {k: v["count"] for k, v in report["summary"].items()} == {"settled": 1, "error": 1}
    assert db.execute("SELECT status, rail_transaction_id FROM charges WHERE id = %s",
                      (charge["id"],)).fetchone() == ("succeeded", "MP2611.3000.A12345")
    # a later export naming it only by the rail's transaction id
    later = importer.run(db, b"reference,rail_transaction_id,amount,currency,status,time\r\n"
                             b"whatever,MP2611.3000.A12345,1500,XOF,SUCCESS,2026-11-30T10:00:00Z\r\n",
                         rail="orange", profile=profiles.PROFILES["default"], file_name="om2.csv")
    assert {k: v["count"] for k, v in later["summary"].items()} == {"matched": 1}
    # the same file under the other rail is another statement, naming nothing of that rail's
    other = importer.run(db, data, rail="mtn", profile=profiles.PROFILES["default"], file_name="om.csv")
    assert {k: v["count"] for k, v in other["summary"].items()} == {"unknown_rail_transaction": 1, "error": 1}
