"""The sandbox rail's Disbursement refunds (vpay/sandbox/mtn/), driven over
real HTTP with plain ``requests``, the way a MoMo client would. No database."""

from __future__ import annotations

import base64
import uuid

import pytest
import requests

from vpay.sandbox.mtn import DEFAULT_API_KEY, DEFAULT_API_USER, REFUND_TARGET_NOT_FOUND, REFUND_TARGET_NOT_SUCCESSFUL, SandboxRail
from support import wait_until  # noqa: E402

SUB_KEY = "test-sub-key"
OK_PAYER = "46700000001"
DECLINED_PAYER = "46733123451"  # MTN's sandbox APPROVAL_REJECTED number
RTP = "/collection/v1_0/requesttopay"
REFUND = "/disbursement/v1_0/refund"


class Client:
    """A minimal MoMo client for both products over requests."""

    def __init__(self, rail: SandboxRail, sub_key: str = SUB_KEY, user: str = DEFAULT_API_USER,
                 key: str = DEFAULT_API_KEY) -> None:
        self.base = rail.url
        self.s = requests.Session()
        self.s.trust_env = False
        self.creds = {"collection": (sub_key, user, key), "disbursement": (sub_key, user, key)}
        self._tokens: dict[str, str] = {}

    def token_response(self, product: str, sub_key=None, user=None, key=None):
        d_sub, d_user, d_key = self.creds[product]
        basic = base64.b64encode(f"{user or d_user}:{key or d_key}".encode()).decode()
        return self.s.post(f"{self.base}/{product}/token/", timeout=5,
                           headers={"Ocp-Apim-Subscription-Key": sub_key or d_sub,
                                    "Authorization": f"Basic {basic}"})

    def token(self, product: str) -> str:
        if product not in self._tokens:
            r = self.token_response(product)
            assert r.status_code == 200, r.text
            self._tokens[product] = r.json()["access_token"]
        return self._tokens[product]

    def headers(self, product: str, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token(product)}",
                "Ocp-Apim-Subscription-Key": self.creds[product][0],
                "X-Target-Environment": "sandbox"}

    def rtp(self, payer=OK_PAYER, amount="15.00"):
        ref = str(uuid.uuid4())
        r = self.s.post(f"{self.base}{RTP}", timeout=5,
                        headers={**self.headers("collection"), "X-Reference-Id": ref},
                        json={"amount": amount, "currency": "EUR", "externalId": "ch_1",
                              "payer": {"partyIdType": "MSISDN", "partyId": payer}})
        assert r.status_code == 202, r.text
        return ref

    def collection_status(self, ref):
        return self.s.get(f"{self.base}{RTP}/{ref}", headers=self.headers("collection"), timeout=5)

    def refund(self, target, ref=None, amount="5.00", body=None, token=None, timeout=5):
        ref = ref or str(uuid.uuid4())
        if body is None:
            body = {"amount": amount, "currency": "EUR", "externalId": "re_1",
                    "payerMessage": "Refund re_1", "payeeNote": "re_1",
                    "referenceIdToRefund": target}
        r = self.s.post(f"{self.base}{REFUND}", json=body, timeout=timeout,
                        headers={**self.headers("disbursement", token), "X-Reference-Id": ref})
        return ref, r

    def refund_status(self, ref, timeout=5, token=None):
        return self.s.get(f"{self.base}{REFUND}/{ref}", timeout=timeout,
                          headers=self.headers("disbursement", token))


@pytest.fixture
def rail():
    with SandboxRail(subscription_key=SUB_KEY, success_after_seconds=0.2) as r:
        yield r


@pytest.fixture
def momo(rail):
    c = Client(rail)
    yield c
    c.s.close()


def _succeeded_collection(momo, payer=OK_PAYER):
    ref = momo.rtp(payer)
    wait_until(lambda: momo.collection_status(ref).json()["status"] == "SUCCESSFUL",
               what="the collection to succeed")
    return ref


# --------------------------------------------------------------------------- tokens


def test_disbursement_token_is_its_own_product(rail, momo):
    assert momo.token_response("disbursement").status_code == 200
    assert momo.token_response("disbursement", key="wrong").status_code == 401
    assert momo.token_response("disbursement", sub_key="wrong").status_code == 401
    target = _succeeded_collection(momo)
    # a Collection token does not open Disbursement endpoints
    _, r = momo.refund(target, token=momo.token("collection"))
    assert r.status_code == 401
    assert momo.refund_status(str(uuid.uuid4()), token=momo.token("collection")).status_code == 401


def test_distinct_disbursement_credentials():
    with SandboxRail(subscription_key=SUB_KEY, disbursement_subscription_key="disb-key",
                     disbursement_api_user="disb-user", disbursement_api_key="disb-secret") as rail:
        client = Client(rail)
        client.creds["disbursement"] = ("disb-key", "disb-user", "disb-secret")
        assert client.token_response("disbursement").status_code == 200
        assert client.token_response("disbursement", sub_key=SUB_KEY).status_code == 401
        assert client.token_response("disbursement", user=DEFAULT_API_USER,
                                     key=DEFAULT_API_KEY).status_code == 401
        assert client.token_response("collection").status_code == 200
        client.s.close()


# --------------------------------------------------------------------------- default behaviour


def test_refund_of_a_successful_collection_succeeds_after_the_timer(rail, momo):
    target = _succeeded_collection(momo)
    ref, r = momo.refund(target)
    assert r.status_code == 202 and r.content == b""
    first = momo.refund_status(ref).json()
    assert first["status"] in ("PENDING", "SUCCESSFUL")
    done = wait_until(lambda: (b := momo.refund_status(ref).json())["status"] == "SUCCESSFUL" and b,
                      what="the refund to succeed")
    assert done["amount"] == "5.00" and done["currency"] == "EUR"
    assert done["externalId"] == "re_1"
    assert done["payee"] == {"partyIdType": "MSISDN", "partyId": OK_PAYER}
    assert done["financialTransactionId"]
    assert "payer" not in done and "reason" not in done
    assert rail.refund(ref)["referenceIdToRefund"] == target
    assert rail.count(method="POST", path_prefix=REFUND, reference=ref) == 1
    assert rail.count(method="GET", path_prefix=REFUND, reference=ref) >= 2
    assert rail.count(method="POST", path_prefix="/disbursement/token") == 1


@pytest.mark.parametrize("case", ["unknown", "declined", "pending"])
def test_refund_of_an_unknown_or_unsuccessful_collection_fails_with_a_reason(rail, momo, case):
    if case == "unknown":
        target, reason = str(uuid.uuid4()), REFUND_TARGET_NOT_FOUND
    elif case == "declined":
        target, reason = momo.rtp(DECLINED_PAYER), REFUND_TARGET_NOT_SUCCESSFUL
    else:
        rail.script(OK_PAYER, outcome="PENDING")
        target, reason = momo.rtp(OK_PAYER), REFUND_TARGET_NOT_SUCCESSFUL
    ref, r = momo.refund(target)
    assert r.status_code == 202  # accepted, then FAILED on the status read
    body = momo.refund_status(ref).json()
    assert body["status"] == "FAILED"
    assert body["reason"] == reason


def test_duplicate_reference_is_409_and_bad_requests_are_400(rail, momo):
    target = _succeeded_collection(momo)
    ref, r = momo.refund(target)
    assert r.status_code == 202
    _, again = momo.refund(target, ref=ref)
    assert again.status_code == 409 and again.json()["code"] == "RESOURCE_ALREADY_EXIST"
    _, bad_ref = momo.refund(target, ref="not-a-uuid")
    assert bad_ref.status_code == 400
    for body in ({"amount": "5", "currency": "EUR", "externalId": "x"},          # no target
                 {"amount": 5, "currency": "EUR", "externalId": "x", "referenceIdToRefund": target},
                 {"amount": "5", "currency": "eur", "externalId": "x", "referenceIdToRefund": target},
                 {"amount": "5", "currency": "EUR", "externalId": "x", "referenceIdToRefund": "abc"}):
        _, r = momo.refund(target, body=body)
        assert r.status_code == 400, body
    assert len(rail.refunds()) == 1


def test_unknown_refund_status_is_404(momo):
    r = momo.refund_status(str(uuid.uuid4()))
    assert r.status_code == 404 and r.json()["code"] == "RESOURCE_NOT_FOUND"


# --------------------------------------------------------------------------- scripting


def test_scripted_refund_pending_reads_then_failed(rail, momo):
    target = _succeeded_collection(momo)
    rail.script(OK_PAYER, refund_pending_reads=2, refund_outcome="FAILED", refund_reason="NOT_ENOUGH_FUNDS")
    ref, _ = momo.refund(target)
    assert [momo.refund_status(ref).json()["status"] for _ in range(4)] == \
        ["PENDING", "PENDING", "FAILED", "FAILED"]
    assert momo.refund_status(ref).json()["reason"] == "NOT_ENOUGH_FUNDS"


def test_scripted_refund_status_errors_come_first(rail, momo):
    target = _succeeded_collection(momo)
    rail.script(OK_PAYER, refund_status_errors=[500, 503], refund_pending_reads=0,
                refund_outcome="SUCCESSFUL")
    ref, _ = momo.refund(target)
    assert [momo.refund_status(ref).status_code for _ in range(3)] == [500, 503, 200]
    assert momo.refund_status(ref).json()["status"] == "SUCCESSFUL"


def test_scripted_refund_errors_do_not_record_and_record_then_error_does(rail, momo):
    target = _succeeded_collection(momo)
    rail.script(OK_PAYER, refund_errors=[500], refund_record_then_error=[503])
    lost, r = momo.refund(target)
    assert r.status_code == 500
    assert momo.refund_status(lost).status_code == 404      # the rail never took it
    _, r = momo.refund(target, ref=lost)                    # the resend is taken, but we hear 503
    assert r.status_code == 503
    assert momo.refund_status(lost).status_code == 200
    _, r = momo.refund(target, ref=lost)                    # and a resend after that is 409
    assert r.status_code == 409
    assert rail.count(method="POST", path_prefix=REFUND, reference=lost) == 3


def test_scripted_refund_status_delay_exceeds_a_client_timeout(rail, momo):
    target = _succeeded_collection(momo)
    rail.script(OK_PAYER, refund_status_delay_seconds=0.5)
    ref, _ = momo.refund(target)
    with pytest.raises(requests.Timeout):
        momo.refund_status(ref, timeout=0.1)


def test_refund_script_options_are_checked(rail):
    with pytest.raises(ValueError):
        rail.script(OK_PAYER, refund_reason="X")              # needs refund_outcome FAILED
    with pytest.raises(ValueError):
        rail.script(OK_PAYER, refund_outcome="DONE")
    with pytest.raises(ValueError):
        rail.script(OK_PAYER, refund_errors=[200])
    assert rail.script(OK_PAYER, refund_pending_reads=1)["refund_pending_reads"] == 1


# --------------------------------------------------------------------------- control


def test_force_forget_list_and_reset_refunds(rail, momo):
    target = _succeeded_collection(momo)
    rail.script(OK_PAYER, refund_outcome="PENDING")
    ref, _ = momo.refund(target)
    state = rail.set_refund_status(ref, "FAILED")
    assert state["status"] == "FAILED" and state["reason"] == "INTERNAL_PROCESSING_ERROR"
    assert momo.refund_status(ref).json()["status"] == "FAILED"
    listed = momo.s.get(f"{rail.url}/_sandbox/refunds", timeout=5).json()
    assert [x["reference"] for x in listed] == [ref]
    put = momo.s.put(f"{rail.url}/_sandbox/refunds/{ref}", json={"status": "SUCCESSFUL"}, timeout=5)
    assert put.status_code == 200 and put.json()["status"] == "SUCCESSFUL"
    assert rail.forget_refund(ref) is True
    assert momo.refund_status(ref).status_code == 404
    with pytest.raises(KeyError):
        rail.set_refund_status(ref, "FAILED")
    again, _ = momo.refund(target)
    rail.reset()
    assert rail.refunds() == [] and rail.refund(again) is None
