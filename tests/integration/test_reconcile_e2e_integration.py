"""The request-to-pay as the sandbox rail (a real HTTP server) receives it:
MoMo headers and body, against a real Postgres. The integration half of
tests/acceptance/test_reconcile_e2e.py.
"""

from __future__ import annotations

from test_reconcile_e2e import _create  # helpers kept in tests/acceptance/test_reconcile_e2e.py


SUCCESS, DECLINE, SLOW, FLAKY = "256770000001", "46733123451", "256770000003", "256770000004"


def test_request_to_pay_sends_momo_headers_and_body(db, pool, sandbox, merchant):
    created = _create(pool, sandbox, merchant, SUCCESS, amount=1050)
    [txn] = sandbox.transactions()
    assert txn["reference"] == created["charge"]["rail_reference"]
    assert txn["amount"] == "10.50" and txn["currency"] == "EUR"
    assert txn["externalId"] == created["charge"]["id"]
