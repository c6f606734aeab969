"""``vpay-server sandbox-rail`` as a real process: its flags (``--reason-shape``,
``--target-environment``) and MTN-shaped default credentials reach the rail."""

from __future__ import annotations

import base64
import os
import signal
import uuid

import pytest
import requests

from support import wait_until
from vpay.sandbox.mtn import DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_SUBSCRIPTION_KEY


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPAY_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _url(proc) -> str:
    return wait_until(lambda: next((l["url"] for l in proc.lines() if "url" in l), None),
                      timeout=30, what="the sandbox rail's URL")


def _failed_status(base: str, target: str, currency: str, payer: str = "46733123451") -> requests.Response:
    s = requests.Session()
    s.trust_env = False
    basic = base64.b64encode(f"{DEFAULT_API_USER}:{DEFAULT_API_KEY}".encode()).decode()
    tok = s.post(f"{base}/collection/token/", timeout=5,
                 headers={"Ocp-Apim-Subscription-Key": DEFAULT_SUBSCRIPTION_KEY, "Authorization": f"Basic {basic}"})
    assert tok.status_code == 200, tok.text
    h = {"Authorization": f"Bearer {tok.json()['access_token']}", "Ocp-Apim-Subscription-Key": DEFAULT_SUBSCRIPTION_KEY,
         "X-Target-Environment": target}
    ref = str(uuid.uuid4())
    r = s.post(f"{base}/collection/v1_0/requesttopay", timeout=5, headers={**h, "X-Reference-Id": ref},
               json={"amount": "100", "currency": currency, "payer": {"partyIdType": "MSISDN", "partyId": payer}})
    assert r.status_code == 202, r.text
    return s.get(f"{base}/collection/v1_0/requesttopay/{ref}", headers=h, timeout=5)


@pytest.mark.parametrize("args,reason", [
    ([], "APPROVAL_REJECTED"),
    (["--reason-shape", "object"], {"code": "APPROVAL_REJECTED", "message": "The approval was rejected"}),
])
def test_reason_shape_flag(spawn, args, reason):
    proc = spawn("vpay-server", "sandbox-rail", "--port", "0", *args, env=_env())
    body = _failed_status(_url(proc), "sandbox", "EUR").json()
    assert (body["status"], body["reason"]) == ("FAILED", reason)
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_target_environment_flag_and_env(spawn):
    proc = spawn("vpay-server", "sandbox-rail", "--port", "0", "--target-environment", "mtnuganda", env=_env())
    assert _failed_status(_url(proc), "mtnuganda", "UGX").json()["reason"] == "APPROVAL_REJECTED"
    env = {**_env(), "VPAY_MTN_TARGET_ENVIRONMENT": "mtnghana"}
    proc = spawn("vpay-server", "sandbox-rail", "--port", "0", env=env)
    assert _failed_status(_url(proc), "mtnghana", "GHS").json()["status"] == "FAILED"


@pytest.mark.parametrize("rail", ["mpesa", "pawapay"])
def test_rail_flag_serves_the_new_rails_with_their_default_credentials(spawn, rail):
    """``--rail mpesa|pawapay``: vpay's own adapter, given the sandbox's
    default credentials, settles a payment against the process."""
    from vpay.rails.mpesa import MpesaDaraja
    from vpay.rails.pawapay import PawaPay
    from vpay.rails.port import ChargeRequest, StatusKind, SubmitKind
    from vpay.sandbox import mpesa as m, pawapay as p
    proc = spawn("vpay-server", "sandbox-rail", "--port", "0", "--rail", rail, env=_env())
    url = _url(proc)
    if rail == "mpesa":
        adapter = MpesaDaraja(url, m.DEFAULT_CONSUMER_KEY, m.DEFAULT_CONSUMER_SECRET, m.DEFAULT_SHORTCODE,
                              m.DEFAULT_PASSKEY, "http://127.0.0.1:9/cb")
        charge = ChargeRequest("ch_cli", str(uuid.uuid4()), 100_00, "KES", "254708374149")
    else:
        adapter = PawaPay(url, p.DEFAULT_TOKEN, "260=MTN_MOMO_ZMB:ZMW")
        charge = ChargeRequest("ch_cli", str(uuid.uuid4()), 100, "ZMW", "260763456789")
    sent = adapter.request_to_pay(charge)
    assert sent.kind is SubmitKind.ACCEPTED
    charge = ChargeRequest(**{**charge.__dict__, "rail_data": dict(sent.rail_data)})
    assert adapter.status(charge).kind is StatusKind.SUCCEEDED
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
