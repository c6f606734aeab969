"""Where the MoMo sandbox (vpay/sandbox/mtn/) follows MTN's published API
(issue 17; sources in docs/sandbox.md): reason shape, balance and
account-holder endpoints, EUR only in the ``sandbox`` target environment,
the common-errors table's HTTP statuses, an optional ``externalId``, and
MTN-shaped default credentials. Driven over real HTTP with plain
``requests``; no database."""

from __future__ import annotations

import base64
import re
import uuid

import pytest
import requests

from vpay.sandbox.mtn import DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_SUBSCRIPTION_KEY, SandboxRail
from support import wait_until  # noqa: E402

OK_PAYER = "46700000001"
NOT_FOUND_PAYER = "46733123455"  # MTN's PAYER_NOT_FOUND sandbox number


class Client:
    """Both MoMo products over ``requests``, with the sandbox's default credentials."""

    def __init__(self, rail: SandboxRail, target: str = "sandbox") -> None:
        self.base = rail.url
        self.target = target
        self.s = requests.Session()
        self.s.trust_env = False  # never route loopback through a proxy
        self._tokens: dict[str, str] = {}

    def token(self, product: str) -> str:
        if product not in self._tokens:
            basic = base64.b64encode(f"{DEFAULT_API_USER}:{DEFAULT_API_KEY}".encode()).decode()
            r = self.s.post(f"{self.base}/{product}/token/", timeout=5,
                            headers={"Ocp-Apim-Subscription-Key": DEFAULT_SUBSCRIPTION_KEY,
                                     "Authorization": f"Basic {basic}"})
            assert r.status_code == 200, r.text
            self._tokens[product] = r.json()["access_token"]
        return self._tokens[product]

    def headers(self, product: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(product)}",
                "Ocp-Apim-Subscription-Key": DEFAULT_SUBSCRIPTION_KEY,
                "X-Target-Environment": self.target, **extra}

    def get(self, product: str, path: str, **extra: str) -> requests.Response:
        return self.s.get(f"{self.base}/{product}/v1_0/{path}", headers=self.headers(product, **extra),
                          timeout=5)

    def rtp(self, body: dict, ref: str | None = None) -> tuple[str, requests.Response]:
        ref = ref or str(uuid.uuid4())
        r = self.s.post(f"{self.base}/collection/v1_0/requesttopay", json=body, timeout=5,
                        headers=self.headers("collection", **{"X-Reference-Id": ref}))
        return ref, r

    def refund(self, body: dict) -> tuple[str, requests.Response]:
        ref = str(uuid.uuid4())
        r = self.s.post(f"{self.base}/disbursement/v1_0/refund", json=body, timeout=5,
                        headers=self.headers("disbursement", **{"X-Reference-Id": ref}))
        return ref, r


def rtp_body(payer: str = OK_PAYER, amount: str = "15.00", currency: str = "EUR", **over) -> dict:
    body = {"amount": amount, "currency": currency, "externalId": "ch_1",
            "payer": {"partyIdType": "MSISDN", "partyId": payer}}
    body.update(over)
    return {k: v for k, v in body.items() if v is not None}


@pytest.fixture
def rail():
    with SandboxRail(success_after_seconds=0.1) as r:
        yield r


@pytest.fixture
def momo(rail):
    c = Client(rail)
    yield c
    c.s.close()


# --------------------------------------------------------------------------- credentials


def test_default_credentials_are_mtn_shaped():
    assert re.fullmatch(r"[0-9a-f]{32}", DEFAULT_SUBSCRIPTION_KEY)
    assert re.fullmatch(r"[0-9a-f]{32}", DEFAULT_API_KEY)
    # mtnmomo 3.0.1 checks a subscription key with uuid.UUID(key, version=4)
    # before it sends anything (issue 17, point 6); "sandbox-key" failed it
    uuid.UUID(DEFAULT_SUBSCRIPTION_KEY, version=4)
    assert uuid.UUID(DEFAULT_API_USER).version == 4 and str(uuid.UUID(DEFAULT_API_USER)) == DEFAULT_API_USER


# --------------------------------------------------------------------------- reason shape


def test_failed_reason_is_a_plain_string_by_default_and_an_object_on_request(momo):
    ref, r = momo.rtp(rtp_body(payer="46733123451"))
    assert r.status_code == 202
    assert momo.get("collection", f"requesttopay/{ref}").json()["reason"] == "APPROVAL_REJECTED"
    with SandboxRail(reason_shape="object") as other:
        c = Client(other)
        ref, _ = c.rtp(rtp_body(payer="46733123451"))
        reason = c.get("collection", f"requesttopay/{ref}").json()["reason"]
        assert reason["code"] == "APPROVAL_REJECTED" and reason["message"]
        c.s.close()
    with pytest.raises(ValueError):
        SandboxRail(reason_shape="list")


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("path", ["requesttopay/{ref}", "account/balance",
                                  f"accountholder/msisdn/{OK_PAYER}/active"])
def test_a_wrong_target_environment_is_500_not_allowed_target_environment(momo, path):
    ref, _ = momo.rtp(rtp_body())
    r = momo.get("collection", path.format(ref=ref), **{"X-Target-Environment": "mtnuganda"})
    assert (r.status_code, r.json()["code"]) == (500, "NOT_ALLOWED_TARGET_ENVIRONMENT")


# --------------------------------------------------------------------------- currency


def test_the_sandbox_target_takes_eur_only_and_records_nothing_else(rail, momo):
    ref, r = momo.rtp(rtp_body(currency="UGX", amount="5000"))
    assert (r.status_code, r.json()["code"]) == (500, "INVALID_CURRENCY")
    assert momo.get("collection", f"requesttopay/{ref}").status_code == 404
    assert rail.transactions() == []
    ok, r = momo.rtp(rtp_body(currency="EUR"))
    assert r.status_code == 202
    # refunds too (Disbursement product)
    wait_until(lambda: momo.get("collection", f"requesttopay/{ok}").json()["status"] == "SUCCESSFUL",
               what="SUCCESSFUL")
    _, r = momo.refund({"amount": "1", "currency": "XAF", "referenceIdToRefund": ok})
    assert (r.status_code, r.json()["code"]) == (500, "INVALID_CURRENCY")
    assert rail.refunds() == []


def test_another_target_environment_takes_any_currency():
    with SandboxRail(target_environment="mtnuganda", account_currency="UGX",
                     success_after_seconds=0.0) as rail:
        c = Client(rail, target="mtnuganda")
        ref, r = c.rtp(rtp_body(currency="UGX", amount="5000"))
        assert r.status_code == 202
        assert wait_until(lambda: c.get("collection", f"requesttopay/{ref}").json()["status"] == "SUCCESSFUL",
                          what="SUCCESSFUL")
        c.s.close()
    with pytest.raises(ValueError):
        SandboxRail(account_currency="UGX")  # the sandbox target has EUR accounts only


# --------------------------------------------------------------------------- externalId


def test_external_id_is_optional(momo):
    ref, r = momo.rtp(rtp_body(externalId=None))
    assert r.status_code == 202
    body = momo.get("collection", f"requesttopay/{ref}").json()
    assert "externalId" not in body and body["status"] in ("PENDING", "SUCCESSFUL")
    _, r = momo.rtp(rtp_body(externalId=42))  # present, so it must be a string
    assert r.status_code == 400


# --------------------------------------------------------------------------- balance


def test_balance_counts_successful_collections_and_refunds(rail, momo):
    for product in ("collection", "disbursement"):
        r = momo.get(product, "account/balance")
        assert r.status_code == 200 and r.json() == {"availableBalance": "1000.00", "currency": "EUR"}
    paid, _ = momo.rtp(rtp_body(amount="15.50"))
    momo.rtp(rtp_body(payer="46733123451", amount="99"))  # FAILED: not counted
    wait_until(lambda: momo.get("collection", "account/balance").json()["availableBalance"] == "1015.50",
               what="collection balance")
    _, r = momo.refund({"amount": "5.25", "currency": "EUR", "referenceIdToRefund": paid})
    assert r.status_code == 202
    wait_until(lambda: momo.get("disbursement", "account/balance").json()["availableBalance"] == "994.75",
               what="disbursement balance")
    assert rail.balance("collection") == "1015.50" and rail.balance("disbursement") == "994.75"
    # the currency form of the endpoint
    assert momo.get("collection", "account/balance/EUR").json()["availableBalance"] == "1015.50"
    r = momo.get("collection", "account/balance/UGX")
    assert (r.status_code, r.json()["code"]) == (500, "INVALID_CURRENCY")


def test_balance_needs_that_products_token(momo):
    r = momo.s.get(f"{momo.base}/disbursement/v1_0/account/balance", timeout=5,
                   headers={**momo.headers("collection")})  # a Collection token
    assert r.status_code == 401
    r = momo.s.get(f"{momo.base}/collection/v1_0/account/balance", timeout=5,
                   headers={"Ocp-Apim-Subscription-Key": DEFAULT_SUBSCRIPTION_KEY,
                            "X-Target-Environment": "sandbox"})
    assert r.status_code == 401
    assert momo.s.post(f"{momo.base}/collection/v1_0/account/balance", headers=momo.headers("collection"),
                       timeout=5).status_code == 405


# --------------------------------------------------------------------------- account holder


@pytest.mark.parametrize("product", ["collection", "disbursement"])
def test_account_holder_active(rail, momo, product):
    def active(kind, ident):
        r = momo.get(product, f"accountholder/{kind}/{ident}/active")
        assert r.status_code == 200, r.text
        return r.json()

    assert active("msisdn", OK_PAYER) == {"result": True}
    assert active("msisdn", NOT_FOUND_PAYER) == {"result": False}
    assert active("email", "payer@example.com") == {"result": True}
    rail.script(OK_PAYER, active=False)
    assert active("msisdn", OK_PAYER) == {"result": False}
    rail.script(NOT_FOUND_PAYER, active=True)
    assert active("msisdn", NOT_FOUND_PAYER) == {"result": True}
    for kind, ident in (("MSISDN", OK_PAYER), ("party_code", OK_PAYER), ("msisdn", "not-a-number"),
                        ("msisdn", "1" * 16), ("email", "nobody")):
        r = momo.get(product, f"accountholder/{kind}/{ident}/active")
        assert (r.status_code, r.json()["code"]) == (400, "BAD_REQUEST"), (kind, ident)
    with pytest.raises(ValueError):
        rail.script(OK_PAYER, active="yes")
