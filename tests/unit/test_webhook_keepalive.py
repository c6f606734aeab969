"""Webhook deliveries reuse a receiver's connection (issue 30,
vpay/webhooks/transport.py "Keep-alive"), within their bounds: the pools
kept, their idle time, an answer not read whole, a receiver that closes, a
deadline that cuts an attempt. Real HTTP(S) receivers on 127.0.0.1 that count
the connections they accept."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vpay import webhooks
from vpay.webhooks import transport
from test_webhooks import _resolver  # noqa: F401 - kept in tests/integration/test_webhooks.py
from test_webhooks_unit import _openssl_certs


class CountingReceiver:
    """HTTP/1.1, keep-alive unless told: counts the TCP connections it
    accepts. ``body_bytes`` answers that many bytes; ``close_after`` closes
    every connection after its answer without saying so."""

    def __init__(self, body_bytes: int = 2, close_after: bool = False, dribble: float = 0.0):
        """``dribble``: the first answer's body comes a byte per that many seconds."""
        self.connections = 0
        self.posts = 0
        rx = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                rx.connections += 1

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0)))
                rx.posts += 1
                self.send_response(200)
                self.send_header("content-length", str(body_bytes))
                self.end_headers()
                if dribble and rx.posts == 1:
                    for _ in range(body_bytes):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(dribble)
                else:
                    self.wfile.write(b"x" * body_bytes)
                if close_after:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.server.server_address[1]}/hook"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _fresh_pools():
    transport.KEPT.clear()
    yield
    transport.KEPT.clear()


def _post(url: str, **kw):
    kw.setdefault("connect_timeout", 2)
    kw.setdefault("read_timeout", 2)
    return webhooks.post(url, b'{"id":"evt_1"}', {"content-type": "application/json"},
                         allow_private=True, **kw)


def test_deliveries_to_one_receiver_reuse_its_connection():
    rx = CountingReceiver()
    try:
        assert [_post(rx.url()).status_code for _ in range(5)] == [200] * 5
        assert (rx.posts, rx.connections) == (5, 1)
    finally:
        rx.close()


def test_https_deliveries_make_one_tls_handshake_and_a_name_verified_apart(tmp_path, monkeypatch):
    ca, cert, key = _openssl_certs(tmp_path, "hooks.example.test")
    handshakes: list[str | None] = []
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    ctx.sni_callback = lambda sock, name, _ctx: handshakes.append(name)
    rx = CountingReceiver()
    rx.server.socket = ctx.wrap_socket(rx.server.socket, server_side=True)
    try:
        _resolver(monkeypatch, "127.0.0.1")
        ok = [_post(rx.url("https", "hooks.example.test"), verify=ca).status_code for _ in range(3)]
        assert ok == [200] * 3 and handshakes == ["hooks.example.test"]
        # the same address under another name is another pool: verified, and refused
        wrong = _post(rx.url("https", "other.example.test"), verify=ca)
        assert wrong.status_code is None and "tls error" in wrong.error
        assert rx.posts == 3
    finally:
        rx.close()


def test_a_pool_idle_past_its_bound_is_closed_not_reused(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(transport, "KEPT", transport._KeptPools(clock=lambda: now[0]))
    rx = CountingReceiver()
    try:
        _post(rx.url())
        now[0] += transport.KEPT_IDLE_SECONDS - 0.01
        _post(rx.url())
        assert rx.connections == 1           # just inside the bound: reused
        now[0] += transport.KEPT_IDLE_SECONDS
        _post(rx.url())
        assert rx.connections == 2           # at the bound: a new connection
    finally:
        transport.KEPT.clear()
        rx.close()


def test_at_most_the_bound_of_pools_is_kept_the_least_recently_used_closed(monkeypatch):
    monkeypatch.setattr(transport, "KEPT_POOLS", 2)
    rxs = [CountingReceiver() for _ in range(3)]
    try:
        for rx in rxs:
            assert _post(rx.url()).status_code == 200
        assert len(transport.KEPT) == 2
        _post(rxs[0].url())                  # its pool was the one closed
        _post(rxs[2].url())                  # still kept
        assert [rx.connections for rx in rxs] == [2, 1, 1]
    finally:
        for rx in rxs:
            rx.close()


@pytest.mark.parametrize("size, reused", [(transport.MAX_RESPONSE_BYTES, True),
                                          # read to the bound and one byte more, the rest left
                                          (transport.MAX_RESPONSE_BYTES + 100, False)])
def test_an_answer_over_the_read_bound_closes_its_connection(size, reused):
    rx = CountingReceiver(body_bytes=size)
    try:
        assert _post(rx.url()).status_code == 200
        assert _post(rx.url()).status_code == 200
        assert rx.connections == (1 if reused else 2)
    finally:
        rx.close()


def test_a_receiver_that_closes_after_answering_is_reconnected_to():
    rx = CountingReceiver(close_after=True)
    try:
        assert [_post(rx.url()).status_code for _ in range(3)] == [200] * 3
        assert rx.connections == 3
    finally:
        rx.close()


def test_an_attempt_cut_by_its_deadline_leaves_no_connection_to_reuse():
    # The first answer's body dribbles past the attempt's deadline (1 + 2 x 1 s):
    # its status came, its body did not come whole, and its socket was shut.
    rx = CountingReceiver(body_bytes=50, dribble=0.1)
    try:
        cut = _post(rx.url(), connect_timeout=1, read_timeout=1)
        assert cut.status_code == 200 and len(cut.body_excerpt) < 50
        assert _post(rx.url()).status_code == 200
        assert rx.connections == 2
    finally:
        rx.close()
