"""The MoMo sandbox's control endpoints (``/_sandbox/*``) answer loopback
clients only, whatever it is bound to (docs/sandbox.md). No test traffic
leaves loopback: the predicate is checked on addresses, and the route's use
of it by making 127.0.0.1 count as foreign."""

from __future__ import annotations

import pytest
import requests

from vpay.sandbox import server
from vpay.sandbox.mtn import SandboxRail


@pytest.mark.parametrize("address, loopback", [
    (("127.0.0.1", 5000), True), (("127.0.0.2", 5000), True), (("::1", 5000, 0, 0), True),
    (("::ffff:127.0.0.1", 5000, 0, 0), True),
    (("10.0.0.5", 5000), False), (("192.168.1.20", 5000), False), (("0.0.0.0", 5000), False),
    (("::ffff:10.0.0.5", 5000, 0, 0), False), (("2001:db8::1", 5000, 0, 0), False),
    (("localhost", 5000), False),  # a peer is an address, never a name
    ((), False), ("", False),
])
def test_a_control_client_must_have_a_loopback_address(address, loopback):
    assert server.is_loopback_client(address) is loopback


def test_a_control_request_from_a_foreign_address_is_403_and_changes_nothing(monkeypatch):
    with SandboxRail(subscription_key="k") as rail:
        assert requests.get(rail.url + "/_sandbox/transactions", timeout=10).status_code == 200
        seen = []

        def foreign(client_address):
            seen.append(client_address[0])
            return False
        monkeypatch.setattr(server, "is_loopback_client", foreign)
        for method, path in (("GET", "/_sandbox/transactions"), ("POST", "/_sandbox/reset"),
                             ("PUT", "/_sandbox/payers/46700000001")):
            res = requests.request(method, rail.url + path, json={"outcome": "FAILED"}, timeout=10)
            assert res.status_code == 403, (method, path, res.text)
            assert res.json()["code"] == "NOT_ALLOWED"
        assert seen == ["127.0.0.1"] * 3  # the peer's address is what is checked
        monkeypatch.undo()
        payers = requests.get(rail.url + "/_sandbox/payers", timeout=10)
        assert payers.status_code == 200 and "46700000001" not in payers.text  # the PUT scripted nothing
