"""A refusal of our configuration on the retry of a request-to-pay whose
first attempt may have reached the rail does not fail the charge: that
attempt may have asked the payer (docs/flows/reconciler.md, "Configuration
is not a decline": a payment ends on a refusal only when no payer was or will
be asked). From a fresh-clone review (issue 30): a gateway in front of MoMo
passed the first request-to-pay through and answered 504, then answered the
retry with a redirect; the charge was failed as ``rail_configuration_refused``
while MoMo took the money. A 403 on the retry did the same before redirects
were read as our configuration. The sandbox rail and the gateway are real
HTTP servers on 127.0.0.1."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vpay.money import charges, payments
from vpay.rails.mtn import MtnMomo
from vpay.sandbox.mtn.codes import DEFAULT_API_KEY, DEFAULT_API_USER, DEFAULT_SUBSCRIPTION_KEY
from vpay.sandbox.mtn.rail import SandboxRail



class _Gateway(BaseHTTPRequestHandler):
    """Forwards to the sandbox. The request-to-pays are answered as
    ``server.script`` says, in turn: ``"through"`` forwards it and answers
    504 (it reached MoMo), a number answers that status without forwarding
    (a 3xx pointing nowhere)."""

    protocol_version = "HTTP/1.1"

    def _any(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        srv = self.server
        if self.command == "POST" and "/requesttopay" in self.path:
            step = srv.script.pop(0)
            srv.sent.append(step)
            if step != "through":
                return self._answer(step, b"", {"Location": "http://127.0.0.1:9" + self.path})
        status, out = self._forward(body)
        if self.command == "POST" and "/requesttopay" in self.path:
            status, out = 504, b""
        self._answer(status, out, {"Content-Type": "application/json"})

    def _forward(self, body: bytes) -> tuple[int, bytes]:
        request = urllib.request.Request(
            self.server.upstream + self.path, data=body or None, method=self.command,
            headers={k: v for k, v in self.headers.items()
                     if k.lower() not in ("host", "content-length", "connection")})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def _answer(self, status: int, out: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(out))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _any

    def log_message(self, *args):
        pass


@pytest.fixture
def gateway():
    with SandboxRail(success_after_seconds=0.0) as sandbox:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
        srv.daemon_threads = True
        srv.upstream, srv.script, srv.sent, srv.sandbox = sandbox.url, [], [], sandbox
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            yield srv
        finally:
            srv.shutdown()
            srv.server_close()


def _submit(pool, merchant, gateway) -> dict:
    momo = MtnMomo(base_url=f"http://127.0.0.1:{gateway.server_port}", subscription_key=DEFAULT_SUBSCRIPTION_KEY,
                   api_user=DEFAULT_API_USER, api_key=DEFAULT_API_KEY, sleep=lambda seconds: None)
    created = payments.create_and_submit(pool, lambda code: momo, merchant_id=merchant, amount=1500,
                                         currency="EUR", rail="mtn", payer="256770000001")
    return created["charge"]["id"]


@pytest.mark.parametrize("after", [[307], [308], [403], [400], [401, 403], [401, 307]],
                         ids=["307", "308", "403", "400", "401-then-403", "401-then-307"])
def test_a_refusal_of_the_retry_after_an_attempt_that_reached_momo_leaves_the_charge_pending(
        pool, db, merchant, gateway, after):
    """A 400 (REJECTED) proves no more than a 403; after a 401, MoMo's call
    fetches a new token and sends again in a new exchange, which must still
    know the first attempt may have got through (a second review)."""
    gateway.script = ["through", *after]
    charge = charges.load_charge(db, _submit(pool, merchant, gateway))
    assert gateway.sent == ["through", *after]
    assert gateway.sandbox.transaction(charge["rail_reference"]) is not None  # the payer was asked
    assert (charge["status"], charge["failure_code"]) == ("pending", None)
    resubmit = db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = %s",
                          (f"resubmit:{charge['id']}",)).fetchone()[0]
    assert resubmit == 1  # sent again later: a refusal then is a re-send's (pending, alerted)


@pytest.mark.parametrize("first_answer,failure_code", [(307, "rail_configuration_refused"),
                                                        (403, "rail_configuration_refused"),
                                                        (400, "BAD_REQUEST")])
def test_a_refusal_of_the_first_attempt_still_fails_the_charge(
        pool, db, merchant, gateway, first_answer, failure_code):
    gateway.script = [first_answer]
    charge = charges.load_charge(db, _submit(pool, merchant, gateway))
    assert gateway.sent == [first_answer]
    assert gateway.sandbox.transaction(charge["rail_reference"]) is None  # no payer was asked
    assert (charge["status"], charge["failure_code"]) == ("failed", failure_code)
