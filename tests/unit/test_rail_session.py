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
