"""Conformance: the MoMo sandbox (vpay/sandbox/mtn/) driven by a MoMo client
library that no one here wrote, PyPI ``mtn-momo-client`` (``momo_api``,
lepresk/momo-api-python), used through its documented API only.

The library hard-codes MTN's hosts. Its documented ``http_client`` option
(an ``httpx.Client``) is where we route it: the client's transport sends
requests for MTN's sandbox or production host to the sandbox rail on
127.0.0.1 and refuses every other host, so nothing here can reach the network.

Why not ``mtnmomo`` (the brief's first choice): docs/sandbox.md, "Conformance".
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from momo_api import (  # the test extra's mtn-momo-client
    Config,
    InternalServerErrorException,
    MomoApi,
    PaymentRequest,
    RefundRequest,
    ResourceNotFoundException,
)

from vpay.sandbox.mtn import DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_SUBSCRIPTION_KEY, SANDBOX_FAILURES, SandboxRail
from support import wait_until  # noqa: E402

OK_PAYER = "46700000001"
MTN_HOSTS = frozenset(httpx.URL(u).host for u in (MomoApi.SANDBOX_URL, MomoApi.PRODUCTION_URL))


class ToSandbox(httpx.BaseTransport):
    """An httpx transport that sends MTN-bound requests to the sandbox rail and
    refuses anything else (a test must never reach the network)."""

    def __init__(self, rail_url: str) -> None:
        self.rail = httpx.URL(rail_url)
        assert self.rail.host == "127.0.0.1"
        self.inner = httpx.HTTPTransport()
        self.hosts_seen: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.hosts_seen.append(request.url.host)
        if request.url.host not in MTN_HOSTS:
            raise httpx.ConnectError(f"test transport refuses {request.url.host}", request=request)
        request.url = request.url.copy_with(scheme="http", host=self.rail.host, port=self.rail.port)
        request.headers["Host"] = f"{self.rail.host}:{self.rail.port}"
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(params=["string", "object"])
def rail(request):
    """The sandbox with its default (MTN-shaped) credentials, in both reason shapes."""
    with SandboxRail(success_after_seconds=0.2, reason_shape=request.param) as r:
        yield r


@pytest.fixture
def transport(rail):
    t = ToSandbox(rail.url)
    yield t
    t.close()


@pytest.fixture
def http(transport):
    with httpx.Client(transport=transport, trust_env=False, timeout=10) as client:
        yield client


def credentials() -> dict[str, str]:
    return {"subscription_key": DEFAULT_SUBSCRIPTION_KEY, "api_user": DEFAULT_API_USER,
            "api_key": DEFAULT_API_KEY}


@pytest.fixture
def collection(http):
    return MomoApi.collection(credentials(), http_client=http)


@pytest.fixture
def disbursement(http):
    return MomoApi.disbursement(credentials(), http_client=http)


def test_token(collection, disbursement, transport):
    for product in (collection, disbursement):
        token = product.get_access_token()
        assert token.access_token and len(token.access_token) >= 20
    assert set(transport.hosts_seen) <= MTN_HOSTS  # the library asked for MTN, and got the sandbox


def test_request_to_pay_then_successful(rail, collection):
    ref = collection.request_to_pay(PaymentRequest.make("15.00", OK_PAYER, "order-1", "EUR", "Order 1", "vpay"))
    assert rail.transaction(ref)["status"] == "PENDING"  # the client saw its 202
    first = collection.get_payment_status(ref)
    assert first.is_pending() and first.reason is None
    final = wait_until(lambda: (t := collection.get_payment_status(ref)).is_successful() and t,
                       what="SUCCESSFUL")
    assert final.financial_transaction_id and final.reason is None
    assert (final.amount, final.currency, final.external_id, final.payer) == ("15.00", "EUR", "order-1", OK_PAYER)


@pytest.mark.parametrize("payer,reason", sorted(SANDBOX_FAILURES.items()))
def test_each_failure_payer_fails_with_its_reason(rail, collection, payer, reason):
    ref = collection.request_to_pay(PaymentRequest.make("5", payer, "order-2", "EUR"))
    status = collection.get_payment_status(ref)
    assert status.is_failed()
    assert status.reason is not None and status.reason.code == reason
    # the wire shape the library parsed: MTN's plain string unless asked otherwise
    assert status.raw["reason"] == (reason if rail.reason_shape == "string" else
                                    {"code": reason, "message": status.reason.message})
    assert status.financial_transaction_id is None


def test_unknown_reference_is_not_found(collection):
    with pytest.raises(ResourceNotFoundException) as exc:
        collection.get_payment_status(str(uuid.uuid4()))
    assert exc.value.status_code == 404 and exc.value.code == "RESOURCE_NOT_FOUND"


def test_balances_and_account_holder(collection, disbursement):
    before = collection.get_balance()
    assert (before.available_balance, before.currency) == ("1000.00", "EUR")
    ref = collection.request_to_pay(PaymentRequest.make("15.00", OK_PAYER, "order-3", "EUR"))
    wait_until(lambda: collection.get_payment_status(ref).is_successful(), what="SUCCESSFUL")
    assert collection.get_balance().available_balance == "1015.00"

    refund = disbursement.refund(RefundRequest.make("5.00", ref, "refund-1", "EUR"))
    done = wait_until(lambda: (t := disbursement.get_refund_status(refund)).is_successful() and t,
                      what="refund SUCCESSFUL")
    assert done.payee == OK_PAYER and done.amount == "5.00"
    assert disbursement.get_balance().available_balance == "995.00"

    assert collection.check_account_holder(OK_PAYER) is True
    assert collection.check_account_holder("46733123455") is False  # PAYER_NOT_FOUND
    assert disbursement.check_account_holder(OK_PAYER) is True


def test_a_wrong_target_environment_is_500(http, rail):
    uganda = MomoApi.collection({**credentials(), "environment": MomoApi.ENVIRONMENT_MTN_UGANDA}, http_client=http)
    with pytest.raises(InternalServerErrorException) as exc:
        uganda.request_to_pay(PaymentRequest.make("5", OK_PAYER, "order-4", "UGX"))
    assert exc.value.status_code == 500 and exc.value.code == "NOT_ALLOWED_TARGET_ENVIRONMENT"
    assert rail.transactions() == []


def test_the_transport_refuses_other_hosts(http):
    with pytest.raises(httpx.ConnectError):
        http.get("https://example.com/")
