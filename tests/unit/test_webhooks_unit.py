"""Webhook delivery rules without a database: the status rules, Retry-After,
the retry schedule, timeouts from the environment, a dribbling receiver cut
at the attempt deadline, pinned HTTPS with SNI (certificates from
``openssl``). The unit half of tests/integration/test_webhooks.py, which
keeps ``Receiver``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from vpay import webhooks
from vpay.base.db import ConfigError
from test_webhooks import Receiver, _resolver  # helpers kept in tests/integration/test_webhooks.py


def _openssl_certs(tmp: Path, name: str) -> tuple[str, str, str]:
    """A throwaway CA and a server certificate for ``name``: (ca, cert, key) paths."""
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=vpay test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("req", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", f"/CN={name}")
    (tmp / "ext.cnf").write_text(f"subjectAltName=DNS:{name}\nbasicConstraints=CA:FALSE\n"
                                 "extendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "leaf.pem", "-days", "2", "-extfile", "ext.cnf")
    return str(tmp / "ca.pem"), str(tmp / "leaf.pem"), str(tmp / "leaf.key")


def serve_tls(server, tmp: Path, name: str) -> tuple[str, list[str | None]]:
    """Wrap ``server`` (an http.server) in TLS with a leaf for ``name`` from
    a test CA; answers the CA's path and the list the SNI names each
    handshake sent are appended to."""
    import ssl
    ca, cert, key = _openssl_certs(tmp, name)
    sni: list[str | None] = []
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    ctx.sni_callback = lambda sock, sent, _ctx: sni.append(sent)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    return ca, sni


def test_pinned_https_still_sends_sni_and_verifies_the_hostname(tmp_path, monkeypatch):
    rx = Receiver()
    ca, sni = serve_tls(rx.server, tmp_path, "hooks.example.test")
    try:
        _resolver(monkeypatch, "127.0.0.1")
        body = b'{"id":"evt_1"}'
        headers = webhooks.signed_headers("evt_1", int(time.time()), body, [webhooks.new_secret()])
        ok = webhooks.post(f"https://hooks.example.test:{rx.port}/tls", body, headers,
                           connect_timeout=2, read_timeout=2, allow_private=True, verify=ca)
        assert ok.status_code == 200, ok
        assert sni == ["hooks.example.test"]
        assert rx.posts("/tls")[0].headers["host"] == f"hooks.example.test:{rx.port}"
        wrong = webhooks.post(f"https://other.example.test:{rx.port}/tls", body, headers,
                              connect_timeout=2, read_timeout=2, allow_private=True, verify=ca)
        assert wrong.status_code is None and "tls error" in wrong.error
        assert len(rx.posts("/tls")) == 1
    finally:
        rx.close()


def test_each_way_an_attempt_can_fail_says_so_in_its_error():
    # The transport speaks to urllib3 directly (issue 30): its errors are
    # told apart as they were through requests.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    refused = webhooks.post(f"http://127.0.0.1:{port}/", b"{}", {}, connect_timeout=1, read_timeout=1,
                            allow_private=True)
    assert refused.status_code is None and refused.error.startswith("connect error: ")
    assert "refused" in refused.error.lower() and refused.address == "127.0.0.1"

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        got = webhooks.post(f"http://127.0.0.1:{silent.getsockname()[1]}/", b"{}", {},
                            connect_timeout=1, read_timeout=0.3, allow_private=True)
        assert got.status_code is None and got.error == "timeout: no response within 0.3 s"
    finally:
        silent.close()


def test_an_answer_is_read_with_its_retry_after_and_a_bounded_excerpt():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer():
        conn, _ = listener.accept()
        conn.recv(65536)
        body = b"busy " + b"x" * 100_000
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        conn.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        got = webhooks.post(f"http://127.0.0.1:{listener.getsockname()[1]}/", b"{}", {},
                            connect_timeout=1, read_timeout=2, allow_private=True)
    finally:
        listener.close()
    assert (got.status_code, got.retry_after, got.error) == (503, 7.0, None)
    assert got.body_excerpt.startswith("busy xxx") and len(got.body_excerpt) == 300


def test_a_dribbling_receiver_is_cut_at_the_attempt_deadline():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop_ = threading.Event()

    def dribble():
        conn, _ = listener.accept()
        conn.recv(65536)
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 12:  # 30 bytes: about 9 s
            if stop_.wait(0.3):
                break
            try:
                conn.send(bytes([byte]))
            except OSError:
                break
        conn.close()

    t = threading.Thread(target=dribble, daemon=True)
    t.start()
    try:
        started = time.monotonic()
        got = webhooks.post(f"http://127.0.0.1:{listener.getsockname()[1]}/", b"{}", {},
                            connect_timeout=1, read_timeout=1, allow_private=True)
        took = time.monotonic() - started
        # each byte came well within the 1 s read timeout; the whole attempt is cut at 1 + 2 x 1 s
        assert got.status_code is None and "deadline" in got.error
        assert 2.5 < took < 5.0
    finally:
        stop_.set()
        listener.close()


def test_a_receiver_dribbling_its_headers_after_a_200_status_line_is_not_a_delivery():
    # The status line arrives whole, then header lines trickle in, each well
    # within the read timeout, and the blank line ending them never comes. The
    # deadline shuts the socket; that EOF must not pass for the end of the
    # headers and turn the half-sent answer into a 200 (event "delivered").
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop_ = threading.Event()

    def dribble():
        conn, _ = listener.accept()
        conn.recv(65536)
        try:
            conn.send(b"HTTP/1.1 200 OK\r\n")
            while not stop_.wait(0.3):
                conn.send(b"X-Slow: a\r\n")
        except OSError:
            pass
        conn.close()

    t = threading.Thread(target=dribble, daemon=True)
    t.start()
    try:
        got = webhooks.post(f"http://127.0.0.1:{listener.getsockname()[1]}/", b"{}", {},
                            connect_timeout=1, read_timeout=1, allow_private=True)
        assert got.status_code is None, got
        assert "deadline" in got.error
    finally:
        stop_.set()
        listener.close()


# ---- pure rules -----------------------------------------------------------

def test_retry_schedule_spans_about_three_days_with_jitter():
    import random
    assert webhooks.MAX_ATTEMPTS == 10
    base = webhooks.RETRY_SCHEDULE
    assert list(base) == sorted(base) and base[0] == 5 and base[-1] == 86400
    assert 2.5 * 86400 < sum(base) < 3.5 * 86400
    rng = random.Random(7)
    for attempt in range(1, 10):
        delays = [webhooks.retry_delay(attempt, rng) for _ in range(200)]
        assert all(0.9 * base[attempt - 1] <= d <= 1.1 * base[attempt - 1] for d in delays)
        assert len(set(delays)) > 100  # jittered
    assert webhooks.retry_delay(10) is None
    with pytest.raises(ValueError):
        webhooks.retry_delay(0)


def test_decide_follows_the_status_rules():
    A = webhooks.Attempt
    assert webhooks.decide(A(204), 1).action == "delivered"
    assert webhooks.decide(A(410), 3).action == "gone"
    assert webhooks.decide(A(None, error="refused: x", permanent=True), 1).action == "give_up"
    assert webhooks.decide(A(None, error="timeout: no response within 15 s"), 1).action == "retry"
    assert webhooks.decide(A(301), 1).action == "retry"
    assert webhooks.decide(A(429, retry_after=1.0), 9).delay >= 0.9 * 86400  # never below the rung
    assert webhooks.decide(A(503, retry_after=1.0), 10).action == "give_up"


def test_parse_retry_after():
    p = webhooks.parse_retry_after
    assert p("120") == 120.0 and p(None) is None and p("soon") is None and p("-5") is None
    assert p("Wed, 21 Oct 2015 07:28:30 GMT", "Wed, 21 Oct 2015 07:28:00 GMT") == 30.0
    assert p("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past


def test_timeouts_come_from_the_environment():
    assert webhooks.timeouts({}) == (5.0, 15.0)
    assert webhooks.timeouts({"VPAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS": "2",
                              "VPAY_WEBHOOK_READ_TIMEOUT_SECONDS": "0.5"}) == (2.0, 0.5)
    with pytest.raises(ConfigError):
        webhooks.timeouts({"VPAY_WEBHOOK_READ_TIMEOUT_SECONDS": "fast"})
    with pytest.raises(ConfigError):
        webhooks.timeouts({"VPAY_WEBHOOK_READ_TIMEOUT_SECONDS": "0"})


def test_a_url_checked_again_is_resolved_again_though_its_parse_is_kept():
    # The URL's static checks are kept per process (issue 30: a tenth of an
    # attempt's CPU); its DNS answer never is, so a name that turns private
    # between two attempts is refused at the second (rebinding).
    from vpay.webhooks import policy
    answers = [["93.184.216.34"], ["10.0.0.7"]]
    resolve = lambda host, port: answers.pop(0)  # noqa: E731
    url = "https://receiver.example.com/hooks/kept"
    first = policy.check_url(url, allow_private=False, resolver=resolve)
    assert first.addresses == ("93.184.216.34",) and first.host == "receiver.example.com"
    with pytest.raises(policy.UrlRefused, match="10.0.0.7, a private address") as refused:
        policy.check_url(url, allow_private=False, resolver=resolve)
    assert refused.value.permanent is False
    assert policy._static_target.cache_info().maxsize == policy.MAX_PARSED_URLS
    # a refusal is not kept as an answer: the same text refused every time
    for _ in range(2):
        with pytest.raises(policy.UrlRefused, match="scheme must be https"):
            policy.check_url("http://receiver.example.com/x", allow_private=False, resolver=resolve)
