"""vpay's MTN adapter (vpay/rails/mtn.py) against the MoMo sandbox over real
HTTP, in both of the sandbox's reason shapes: a plain string (MTN's published
shape, the default) and ``{code, message}``. The adapter must read the same
outcome from either. Its ``responses``-based twins are in test_mtn_adapter.py
(``test_status_failed_with_reason_in_both_shapes``) and test_mtn_refund.py."""

from __future__ import annotations

import uuid

import pytest

from vpay.rails.mtn import MtnMomo
from vpay.rails.port import ChargeRequest, RefundRequest, StatusKind, SubmitKind
from vpay.sandbox.mtn import SANDBOX_FAILURES, SandboxRail

OK_PAYER = "46700000001"


@pytest.fixture(params=["string", "object"])
def rail(request):
    with SandboxRail(success_after_seconds=0.0, reason_shape=request.param) as r:
        yield r


@pytest.fixture
def adapter(rail):
    return MtnMomo(base_url=rail.url, subscription_key=rail.subscription_key, api_user=rail.api_user,
                   api_key=rail.api_key, target_environment=rail.target_environment)


def charge(payer: str, currency: str = "EUR") -> ChargeRequest:
    return ChargeRequest(charge_id="ch_1", rail_reference=str(uuid.uuid4()), amount=1050,
                         currency=currency, payer=payer)


@pytest.mark.parametrize("payer,reason", [(p, r) for p, r in sorted(SANDBOX_FAILURES.items())
                                          if r not in ("ONGOING", "PAYER_DELAYED")])
def test_failed_reason_reads_the_same_in_both_shapes(rail, adapter, payer, reason):
    c = charge(payer)
    assert adapter.request_to_pay(c).kind is SubmitKind.ACCEPTED
    status = adapter.status(c)
    assert (status.kind, status.reason) == (StatusKind.FAILED, reason)


@pytest.mark.parametrize("payer,reason", [("46733123453", "ONGOING"), ("46733123454", "PAYER_DELAYED")])
def test_not_final_failures_stay_pending_in_both_shapes(adapter, payer, reason):
    c = charge(payer)
    adapter.request_to_pay(c)
    status = adapter.status(c)
    assert (status.kind, status.reason) == (StatusKind.PENDING, reason)


def test_refund_failure_reason_reads_the_same_in_both_shapes(adapter):
    refund = RefundRequest(refund_id="re_1", rail_reference=str(uuid.uuid4()),
                           charge_rail_reference=str(uuid.uuid4()), amount=100, currency="EUR", payer=OK_PAYER)
    assert adapter.refund(refund).kind is SubmitKind.ACCEPTED
    status = adapter.refund_status(refund)
    assert (status.kind, status.reason) == (StatusKind.FAILED, "REFUND_TARGET_NOT_FOUND")


def test_a_currency_the_sandbox_refuses_is_refused_not_unanswered(rail, adapter):
    # issue 12: INVALID_CURRENCY is the account's configuration (design/rails.md), so MISCONFIGURED
    # (the charge then fails as rail_configuration_refused), never NO_ANSWER
    submit = adapter.request_to_pay(charge(OK_PAYER, currency="UGX"))
    assert (submit.kind, submit.reason, submit.http_status) == (SubmitKind.MISCONFIGURED, "INVALID_CURRENCY", 500)
    assert rail.transactions() == []
