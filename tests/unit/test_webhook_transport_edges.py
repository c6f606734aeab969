"""The webhook transport's edges (vpay/webhooks/transport.py), over HTTP and
HTTPS, from a fresh-clone review of issue 30's keep-alive (its probes kept as
tests; each failed before its fix): one attempt POSTs at most twice, the
second only after a kept connection ended with no byte of an answer; a new
connection that ends unanswered, a write timeout or a bad answer moves to
no other address; a receiver's Retry-After never makes ``post`` raise; a
kept pool is never closed under an attempt that uses it, and its in-use
count always returns to 0; headers the receiver cuts short are not a
delivery; bytes a TLS receiver sent after its answer are never read as the
next delivery's answer. Receivers are raw sockets on 127.0.0.1 (and
127.0.0.2 for a host's second address)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from contextlib import contextmanager

import pytest

from raw_receiver import ConnReceiver
from vpay import webhooks
from vpay.webhooks import transport
from test_webhooks import _resolver  # noqa: F401
from test_webhooks_unit import _openssl_certs
from test_webhook_keepalive import OK, ScriptedReceiver, _reset, _post


@pytest.fixture(autouse=True)
def _fresh_pools():
    transport.KEPT.clear()
    yield
    transport.KEPT.clear()


def _in_use():
    return [entry[2] for entry in transport.KEPT._pools.values()]


class TLSScriptedReceiver(ScriptedReceiver):
    """ScriptedReceiver over TLS (a leaf for hooks.example.test)."""

    def __init__(self, answer, tmp_path):
        ca, cert, key = _openssl_certs(tmp_path, "hooks.example.test")
        self.ca = ca
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        super().__init__(answer, tls_ctx=ctx)

    def url(self) -> str:
        return super().url("https", "hooks.example.test")


# ---------------------------------------------------------------- Retry-After

@pytest.mark.parametrize("value", [b"\xb2", b"1" * 400], ids=["superscript-two", "400-digits"])
def test_a_receivers_retry_after_header_never_makes_post_raise(value):
    # post "never raises for network trouble": a 200 answer with an odd
    # Retry-After must still come back as an Attempt (here: delivered).
    def answer(number, count, sock):
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nretry-after: " + value + b"\r\n\r\n")

    rx = ScriptedReceiver(answer)
    try:
        try:
            got = _post(rx.url())
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"post raised {type(exc).__name__}: {exc} (receiver got {rx.requests})")
        assert got.status_code == 200
    finally:
        assert _in_use() in ([], [0])
        rx.close()


# ------------------------------------------------ two addresses, "connect"

def _two_addresses():
    first = socket.create_server(("127.0.0.1", 0))
    port = first.getsockname()[1]
    try:
        second = socket.create_server(("127.0.0.2", port))
    except OSError:
        first.close()
        pytest.skip("127.0.0.2 cannot be bound here")
    return first, second, port


def _serve_raw(listener, name, seen, behave):
    def one(sock):
        with sock:
            count = 0
            while True:
                head = b""
                while b"\r\n\r\n" not in head:
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    head += data
                count += 1
                seen.append((name, count))
                if behave(name, count, sock) is False:
                    return

    def loop():
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(sock,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


@contextmanager
def _two_hosts(monkeypatch, behave, serve_first=True):
    """``hooks.example.test`` resolving to 127.0.0.1 then 127.0.0.2, on one
    port, each served by ``_serve_raw`` with ``behave`` (the first left to
    the caller when not ``serve_first``); yields ``(port, seen, first)``."""
    first, second, port = _two_addresses()
    seen = []
    if serve_first:
        _serve_raw(first, "first", seen, behave)
    _serve_raw(second, "second", seen, behave)
    try:
        _resolver(monkeypatch, "127.0.0.1", "127.0.0.2")
        yield port, seen, first
    finally:
        first.close()
        second.close()


def test_a_new_connection_that_ends_unanswered_is_not_sent_to_the_second_address(monkeypatch):
    # Doc: "A new connection that ends so is a failed attempt"; the next
    # address is tried "only when the connection could not be made".
    def behave(name, count, sock):
        if name == "first":
            return False  # read the request, close without answering (it may have been acted on)
        sock.sendall(OK)

    with _two_hosts(monkeypatch, behave) as (port, seen, _):
        got = _post(f"http://hooks.example.test:{port}/hook")
        assert seen == [("first", 1)], (seen, got)


def test_one_attempt_never_posts_three_times(monkeypatch):
    # address 1: a kept connection, then every request closed unanswered;
    # address 2 healthy. Kept send (1), send again on a new connection (2),
    # then the loop goes on to address 2 (3).
    failing = threading.Event()

    def behave(name, count, sock):
        if name == "first" and failing.is_set():
            return False
        sock.sendall(OK)

    with _two_hosts(monkeypatch, behave) as (port, seen, _):
        assert _post(f"http://hooks.example.test:{port}/hook").status_code == 200  # kept on address 1
        failing.set()
        seen.clear()
        got = _post(f"http://hooks.example.test:{port}/hook")
        assert len(seen) <= 2, (seen, got)


def test_a_write_timeout_is_not_followed_by_a_post_to_the_second_address(monkeypatch):
    # address 1 accepts and never reads: the 8 MB body's write times out
    # ("never after a timeout"); address 2 must not get the request.
    stalled = []

    def behave(name, count, sock):
        sock.sendall(OK)
        return False

    with _two_hosts(monkeypatch, behave, serve_first=False) as (port, seen, first):
        def stall():
            while True:
                try:
                    sock, _ = first.accept()
                except OSError:
                    return
                stalled.append(sock)  # never read

        first.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        threading.Thread(target=stall, daemon=True).start()
        try:
            got = webhooks.post(f"http://hooks.example.test:{port}/hook", b"x" * (8 * 1024 * 1024),
                                {"content-type": "application/json"}, allow_private=True,
                                connect_timeout=1, read_timeout=2)
            assert seen == [], (seen, got)
        finally:
            for s in stalled:
                s.close()


# -------------------------------------------------------------------- HTTPS

def test_https_kept_connection_the_receiver_closes_as_the_next_request_comes_is_sent_again(tmp_path, monkeypatch):
    # The HTTP test of the same name, over TLS (the receiver closes without
    # a close_notify, as Python's ssl does on close()).
    def answer(number, count, sock):
        if number == 1 and count == 2:
            return False
        sock.sendall(OK)

    rx = TLSScriptedReceiver(answer, tmp_path)
    try:
        _resolver(monkeypatch, "127.0.0.1")
        assert _post(rx.url(), verify=rx.ca).status_code == 200
        again = _post(rx.url(), verify=rx.ca)
        assert (again.status_code, again.error) == (200, None), (again, rx.requests)
        assert rx.requests == [(1, 1), (1, 2), (2, 1)]
    finally:
        assert _in_use() in ([], [0])
        rx.close()


# ------------------------------------------------------------- concurrency

class TaggedReceiver(ConnReceiver):
    """A receiver (tests/raw_receiver.py) recording ``seen``, (connection_no,
    x-t header) per request; ``behave(conn_no, count, sock)`` returns False
    to close."""

    def __init__(self, behave, host="127.0.0.1"):
        self.behave = behave
        self.seen: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        super().__init__(self._tag_each, host=host)

    def _tag_each(self, number, sock, rx):
        buffer, count = b"", 0
        with sock:
            while True:
                head, buffer = self.read(sock, number, buffer)
                if head is None:
                    return
                tag = next((x.split(b":")[1].strip().decode() for x in head.split(b"\r\n")
                            if x.lower().startswith(b"x-t:")), "")
                count += 1
                with self.lock:
                    self.seen.append((number, tag))
                if self.behave(number, count, sock) is False:
                    return


def _tagged_post(url, tag):
    return webhooks.post(url, b'{"id":"evt_1"}', {"content-type": "application/json", "x-t": tag},
                         allow_private=True, connect_timeout=2, read_timeout=2)


def _run_threads(n, target):
    results = [None] * n
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        results[i] = target(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


@pytest.mark.parametrize("round_", range(5))  # a race: a few rounds of it
def test_concurrent_attempts_whose_kept_connections_all_close_at_once_are_each_delivered(round_):
    # 8 kept connections to one receiver; the receiver then closes each of
    # them as the next request comes, unanswered (its idle timeout firing on
    # all at once). Each attempt: the kept send, then one on a new connection:
    # expected 8 x 200, each attempt sent twice at most.
    old = threading.Event()
    n = transport.KEPT_CONNECTIONS
    together = threading.Barrier(n, timeout=20)  # the first n answered at once: n connections

    def behave(number, count, sock):
        if old.is_set() and number <= n:
            return False
        if not old.is_set():
            together.wait()
        sock.sendall(OK)

    rx = TaggedReceiver(behave)
    try:
        first = _run_threads(n, lambda i: _tagged_post(rx.url(), f"a{i}"))
        assert [a.status_code for a in first] == [200] * n and rx.connections == n
        old.set()
        got = _run_threads(n, lambda i: _tagged_post(rx.url(), f"b{i}"))
        per_attempt = {f"b{i}": sum(1 for _, tag in rx.seen if tag == f"b{i}") for i in range(n)}
        assert all(v <= 2 for v in per_attempt.values()), per_attempt
        assert _in_use() in ([], [0]), _in_use()
        summary = [(a.status_code, a.error) for a in got]
        bad = [(f"b{i}", s, per_attempt[f"b{i}"]) for i, s in enumerate(summary) if s[0] != 200]
        assert not bad, (bad, "old connections:", n, "all seen:", rx.seen[n:])
    finally:
        rx.close()


def test_bounded_pools_under_many_threads_lose_no_delivery_and_leak_no_in_use_count(monkeypatch):
    monkeypatch.setattr(transport, "KEPT_POOLS", 1)
    rxs = [TaggedReceiver(lambda number, count, sock: sock.sendall(OK)) for _ in range(3)]
    try:
        def work(i):
            out = []
            for j in range(30):
                out.append(_tagged_post(rxs[(i + j) % 3].url(), f"{i}-{j}"))
            return out

        results = _run_threads(12, work)
        tags = {tag for rx in rxs for _, tag in rx.seen}
        flat = [(f"{i}-{j}", a) for i, r in enumerate(results) for j, a in enumerate(r)]
        failed = [(t, a.error) for t, a in flat if a.status_code != 200]
        never_sent = [t for t, a in flat if a.status_code != 200 and t not in tags]
        counts = _in_use()
        assert counts in ([], [0]), counts
        assert not failed, (len(failed), failed[:5], "never sent:", len(never_sent))
    finally:
        for rx in rxs:
            rx.close()


# ------------------------------------------------- scripted per connection

def _serve_ok_forever(rx, number, sock, buf=b""):
    while True:
        head, buf = rx.read(sock, number, buf)
        if head is None:
            return
        sock.sendall(OK)


@pytest.fixture
def tls(tmp_path, monkeypatch):
    ca, cert, key = _openssl_certs(tmp_path, "hooks.example.test")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    _resolver(monkeypatch, "127.0.0.1")
    return ca, ctx


def _both(scheme, tls_pair):
    """(receiver kwargs, url maker, post kwargs) for http or https."""
    if scheme == "http":
        return {}, (lambda rx: rx.url()), {}
    ca, ctx = tls_pair
    return {"tls_ctx": ctx}, (lambda rx: rx.url("https", "hooks.example.test")), {"verify": ca}


BIG = b"x" * (1 << 20)


def _big_post(url, **kw):
    return webhooks.post(url, BIG, {"content-type": "application/json"}, allow_private=True,
                         connect_timeout=2, read_timeout=2, **kw)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_kept_connection_reset_as_a_large_body_is_written_is_sent_again_once(scheme, tls):
    def script(number, sock, rx):
        if number != 1:
            return _serve_ok_forever(rx, number, sock)
        head, buf = rx.read(sock, number)
        sock.sendall(OK)
        head, buf = rx.read_head(sock, buf)  # the second request's head: its body is on its way
        rx.requests.append((1, 2))
        _reset(sock)

    kw, url, post_kw = _both(scheme, tls)
    rx = ConnReceiver(script, **kw)
    try:
        assert _big_post(url(rx), **post_kw).status_code == 200
        again = _big_post(url(rx), **post_kw)
        assert (again.status_code, again.error) == (200, None), (again, rx.requests)
        assert rx.requests == [(1, 1), (1, 2), (2, 1)]
        assert _in_use() == [0]
    finally:
        rx.close()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_413_answered_while_a_large_body_is_written_is_not_sent_again(scheme, tls):
    # The receiver answers 413 after the head and closes with the body
    # unread (its kernel resets): an answer was sent; never sent again.
    def script(number, sock, rx):
        if number != 1:
            return _serve_ok_forever(rx, number, sock)
        head, buf = rx.read(sock, number)
        sock.sendall(OK)
        head, buf = rx.read_head(sock, buf)
        rx.requests.append((1, 2))
        sock.sendall(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        time.sleep(0.05)
        sock.close()

    kw, url, post_kw = _both(scheme, tls)
    rx = ConnReceiver(script, **kw)
    try:
        assert _big_post(url(rx), **post_kw).status_code == 200
        got = _big_post(url(rx), **post_kw)
        assert rx.requests == [(1, 1), (1, 2)], (got, rx.requests)
        assert _in_use() == [0]
    finally:
        rx.close()


@pytest.mark.parametrize("begun", [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-", b"H"],
                         ids=["100", "partial-status", "one-byte"])
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_kept_connection_that_began_an_answer_then_reset_is_not_sent_again(scheme, begun, tls):
    def script(number, sock, rx):
        if number != 1:
            return _serve_ok_forever(rx, number, sock)
        head, buf = rx.read(sock, number)
        sock.sendall(OK)
        head, buf = rx.read(sock, number, buf)
        sock.sendall(begun)
        time.sleep(0.1)
        _reset(sock)

    kw, url, post_kw = _both(scheme, tls)
    rx = ConnReceiver(script, **kw)
    try:
        assert _post(url(rx), **post_kw).status_code == 200
        failed = _post(url(rx), **post_kw)
        assert failed.status_code is None, failed
        assert rx.requests == [(1, 1), (1, 2)], (failed, rx.requests)
        assert _in_use() == [0]
    finally:
        rx.close()


BAD_ANSWERS = {
    "invalid-status": b"HTTP/1.1 2OO OK\r\ncontent-length: 0\r\n\r\n",
    "garbage-status": b"SSH-2.0-OpenSSH\r\n\r\n",
    "long-status": b"HTTP/1.1 200 " + b"O" * 70000 + b"\r\n\r\n",
    "long-header": b"HTTP/1.1 200 OK\r\nx-a: " + b"a" * 70000 + b"\r\ncontent-length: 0\r\n\r\n",
    "101-headers": b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(101)) + b"content-length: 0\r\n\r\n",
    "20000-headers": b"HTTP/1.1 200 OK\r\n" + b"x: 1\r\n" * 20000 + b"content-length: 0\r\n\r\n",
    "bad-length": b"HTTP/1.1 200 OK\r\ncontent-length: abc\r\n\r\n",
    "two-lengths": b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nxx",
    "bad-chunk": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    "http09": b"hello",
}


@pytest.mark.parametrize("name", list(BAD_ANSWERS))
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_bad_answer_on_a_kept_connection_is_an_attempt_sent_once_and_closes_it(scheme, name, tls):
    def script(number, sock, rx):
        if number != 1:
            return _serve_ok_forever(rx, number, sock)
        head, buf = rx.read(sock, number)
        sock.sendall(OK)
        head, buf = rx.read(sock, number, buf)
        sock.sendall(BAD_ANSWERS[name])
        time.sleep(0.2)
        sock.close()

    kw, url, post_kw = _both(scheme, tls)
    rx = ConnReceiver(script, **kw)
    try:
        assert _post(url(rx), **post_kw).status_code == 200
        try:
            got = _post(url(rx), **post_kw)
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"post raised {type(exc).__name__}: {exc}")
        assert rx.requests == [(1, 1), (1, 2)], (got, rx.requests)
        assert _in_use() == [0]
        assert _post(url(rx), **post_kw).status_code == 200
        assert rx.connections == 2
    finally:
        rx.close()


CHUNKED = {
    "simple": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "trailer": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\n",
    "extension": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2;a=b\r\nok\r\n0\r\n\r\n",
    "extra-after": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                   b"HTTP/1.1 500 Stale\r\ncontent-length: 0\r\n\r\n",
    "length-extra-after": b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                          b"HTTP/1.1 500 Stale\r\ncontent-length: 0\r\n\r\n",
    "length-extra-after-big": b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok" + b" " * 9000 +
                              b"HTTP/1.1 500 Stale\r\ncontent-length: 0\r\n\r\n",
}


@pytest.mark.parametrize("name", list(CHUNKED))
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_chunked_and_extra_bytes_never_give_a_delivery_another_answer(scheme, name, tls):
    def script(number, sock, rx):
        buf = b""
        while True:
            head, buf = rx.read(sock, number, buf)
            if head is None:
                return
            if number == 1 and len(rx.requests) == 1:
                sock.sendall(CHUNKED[name])
            else:
                sock.sendall(OK)

    kw, url, post_kw = _both(scheme, tls)
    rx = ConnReceiver(script, **kw)
    try:
        statuses = [_post(url(rx), **post_kw).status_code for _ in range(3)]
        assert statuses == [200, 200, 200], (statuses, rx.requests)
        assert _in_use() == [0]
    finally:
        rx.close()


def test_chunked_over_the_bound_closes_and_whole_is_reused():
    big = b"%x\r\n" % 70000 + b"a" * 70000 + b"\r\n0\r\n\r\n"

    def script(number, sock, rx):
        buf = b""
        while True:
            head, buf = rx.read(sock, number, buf)
            if head is None:
                return
            sock.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" +
                         (big if len(rx.requests) == 1 else b"2\r\nok\r\n0\r\n\r\n"))

    rx = ConnReceiver(script)
    try:
        assert [_post(rx.url()).status_code for _ in range(3)] == [200] * 3
        assert rx.connections == 2, rx.requests
        assert _in_use() == [0]
    finally:
        rx.close()


@pytest.mark.parametrize("end", ["reset", "fin"])
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_headers_cut_by_the_receiver_are_not_a_delivery(scheme, end, tls):
    # The status line came, the headers did not end (no blank line): the
    # module treats the same cut by its deadline as "not a delivery".
    def script(number, sock, rx):
        head, buf = rx.read(sock, number)
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-")
        time.sleep(0.1)
        if end == "reset":
            _reset(sock)
        else:
            sock.close()

    kw, url, post_kw = _both(scheme, tls)
    rx = ConnReceiver(script, **kw)
    try:
        got = _post(url(rx), **post_kw)
        assert got.status_code is None, got
        assert _in_use() == [0]
    finally:
        rx.close()
