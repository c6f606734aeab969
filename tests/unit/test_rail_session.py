"""The rail adapters' session reads the environment once per origin and
never reads ``~/.netrc`` (``vpay.base.http_deadline.RailSession``; issue 30:
``requests`` scanned the whole environment three times per status read).
Real HTTP servers on 127.0.0.1: one plays the rail, one an HTTP proxy."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from vpay.base import http_deadline
from vpay.base.http_deadline import new_session


class _Recorder(BaseHTTPRequestHandler):
    """Answers 200 to any GET and keeps its request line and Authorization."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.seen.append((self.path, self.headers.get("authorization")))
        body = b"{}"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    started = []

    def start() -> ThreadingHTTPServer:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        srv.seen = []
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
                 "NO_PROXY", "no_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_an_environment_proxy_is_used_as_requests_would(server, clean_env):
    proxy = server()
    clean_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_port}")
    answer = new_session().get("http://rail.example.invalid/status/1", timeout=5)
    assert answer.status_code == 200
    # a proxy gets the absolute form of the target
    assert proxy.seen == [("http://rail.example.invalid/status/1", None)]


def test_no_proxy_sends_the_request_straight_to_the_rail(server, clean_env):
    proxy, rail = server(), server()
    clean_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_port}")
    clean_env.setenv("NO_PROXY", "127.0.0.1")
    assert new_session().get(f"http://127.0.0.1:{rail.server_port}/status/2", timeout=5).ok
    assert rail.seen == [("/status/2", None)]
    assert proxy.seen == []


def test_the_environment_is_read_once_per_origin_not_per_request(server, clean_env):
    proxy, rail = server(), server()
    session = new_session()
    url = f"http://127.0.0.1:{rail.server_port}/status/3"
    assert session.get(url, timeout=5).ok
    clean_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_port}")
    assert session.get(url, timeout=5).ok  # this session answered for the origin already
    assert len(rail.seen) == 2 and proxy.seen == []
    assert new_session().get(url, timeout=5).ok  # a new adapter's session reads it again
    assert proxy.seen == [(url, None)]


def test_the_kept_origins_are_bounded(server, clean_env):
    session = new_session()
    for port in range(1, http_deadline.MAX_ENVIRONMENT_ORIGINS + 6):
        session._from_environment(f"http://127.0.0.1:{port}/x")
    assert len(session._environment) <= http_deadline.MAX_ENVIRONMENT_ORIGINS


def test_a_netrc_entry_never_replaces_the_calls_own_authorization(server, clean_env, tmp_path):
    rail = server()
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine 127.0.0.1 login someone password leaked\n")
    netrc.chmod(0o600)
    clean_env.setenv("NETRC", str(netrc))
    clean_env.setenv("HOME", str(tmp_path))
    url = f"http://127.0.0.1:{rail.server_port}/status/4"
    # what a plain requests session does: the .netrc login replaces the header
    requests.Session().get(url, headers={"Authorization": "Bearer token-1"}, timeout=5)
    assert rail.seen[-1][1].startswith("Basic ")
    new_session().get(url, headers={"Authorization": "Bearer token-1"}, timeout=5)
    assert rail.seen[-1][1] == "Bearer token-1"


def test_a_ca_bundle_named_by_the_environment_is_the_trust_store(server, clean_env, tmp_path):
    rail = server()
    clean_env.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "no-such-bundle.pem"))
    with pytest.raises(OSError, match="no-such-bundle"):
        new_session().get(f"https://127.0.0.1:{rail.server_port}/status/5", timeout=5)


class _Mover(BaseHTTPRequestHandler):
    """Plays a rail whose answers point elsewhere: a token to any POST, a 302
    to ``server.target`` for any GET."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'{"access_token": "token-1", "token_type": "access_token", "expires_in": 3600}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(302)
        self.send_header("location", self.server.target + self.path)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def mover():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Mover)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _headers_seen(srv) -> list[dict[str, str]]:
    return [dict(h) for h in srv.seen_headers]


class _HeaderRecorder(_Recorder):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.seen_headers.append(self.headers)
        super().do_GET()


@pytest.fixture
def recorder():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _HeaderRecorder)
    srv.seen, srv.seen_headers = [], []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_redirect_is_the_answer_never_followed(mover, recorder, clean_env):
    mover.target = f"http://127.0.0.1:{recorder.server_port}"
    answer = new_session().get(f"http://127.0.0.1:{mover.server_port}/status/6",
                               headers={"Ocp-Apim-Subscription-Key": "key-1"}, timeout=5)
    assert answer.status_code == 302
    assert recorder.seen == []  # requests would have sent the key on to the other host


def test_an_mtn_status_read_redirected_elsewhere_is_misconfigured_and_sends_no_key_there(mover, recorder, clean_env):
    """A redirect is our configuration (the base URL is not the API's own),
    said at once as MISCONFIGURED (an alert), never followed."""
    from vpay.rails.mtn import MtnMomo
    from vpay.rails.port import ChargeRequest, StatusKind, SubmitKind
    mover.target = f"http://127.0.0.1:{recorder.server_port}"
    adapter = MtnMomo(base_url=f"http://127.0.0.1:{mover.server_port}", subscription_key="key-1",
                      api_user="user-1", api_key="secret-1")
    charge = ChargeRequest(charge_id="ch_1", rail_reference="3f0c3c1e-0000-4000-8000-000000000001",
                           amount=100, currency="EUR", payer="46700000001")
    status = adapter.status(charge)
    assert (status.kind, status.reason, status.http_status) == (StatusKind.MISCONFIGURED, "HTTP_302", 302)
    assert recorder.seen == []


@pytest.mark.parametrize("call_headers", [None, {}])
def test_a_session_header_set_to_none_is_not_sent_even_without_the_calls_own(recorder, clean_env, call_headers):
    """From a fresh-clone review: the short way dropped a None-valued header
    only when the call had headers of its own; requests always drops it."""
    session = new_session()
    session.headers["X-Dropped"] = None
    url = f"http://127.0.0.1:{recorder.server_port}/status/9"
    assert session.get(url, headers=call_headers, timeout=5).status_code == 200
    assert "X-Dropped" not in _headers_seen(recorder)[-1]
