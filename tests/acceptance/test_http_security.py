"""The API exposed bare (issue #27): real sockets against a real `vpay-server
api` (gunicorn's arbiter, waitress in each worker).

* slow-header connections hold no thread: with 64 of them open, /healthz and
  an intent read still answer, and the 64 are still open afterwards;
* the header and body deadlines close a connection that trickles;
* one address gets at most its share of connections, others are served;
* no label of /metrics grows with made-up methods, paths and ids;
* /metrics on its own bind, behind a bearer token.

No timing assertion: every wait is a condition with a deadline. The slow
clients connect from other loopback addresses (127.0.0.0/8 is all loopback
on Linux) so the per-address limit sees them as the many clients they are.
"""

from __future__ import annotations

import random
import re
import socket
import string

import pytest
import requests

from api_support import MERCHANT, free_port, make_payment, new_key, start_api, stop_api
from support import wait_until

TOKEN = "scrape-token-" + "".join(random.choices(string.ascii_letters, k=16))


def _slow(port: int, source: str, sent: bytes = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ") -> socket.socket:
    """A connection from ``source`` that sent part of a request and stops."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    sock.sendall(sent)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (EOF or reset); never blocks."""
    sock.settimeout(0)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True


def _close_all(socks) -> None:
    for s in socks:
        s.close()


def _series(text: str) -> list[str]:
    return [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def held_api(db_url, tmp_path_factory):
    """Deadlines long enough that nothing is cut while the test holds its
    slow connections; 8 connections per address and worker."""
    stack = start_api(db_url, tmp_path_factory.mktemp("held"), VPAY_HTTP_HEADER_TIMEOUT_SECONDS="120",
                      VPAY_HTTP_MAX_CONNECTIONS_PER_ADDRESS="8")
    yield stack
    stop_api(stack)


@pytest.fixture(scope="module")
def strict_api(db_url, tmp_path_factory):
    """1 s deadlines, /metrics on its own bind behind a token."""
    metrics_port = free_port()
    stack = start_api(db_url, tmp_path_factory.mktemp("strict"), VPAY_HTTP_HEADER_TIMEOUT_SECONDS="1",
                      VPAY_HTTP_BODY_TIMEOUT_SECONDS="1", VPAY_API_METRICS_TOKEN=TOKEN,
                      VPAY_API_METRICS_BIND=f"127.0.0.1:{metrics_port}")
    stack.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    yield stack
    stop_api(stack)


def _scrape(stack) -> str:
    resp = requests.get(stack.metrics_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert resp.status_code == 200
    return resp.text


def test_64_slow_header_connections_leave_healthz_and_an_intent_read_answering(held_api, db):
    key = new_key(db)
    intent_id = make_payment(db, MERCHANT)["payment_intent_id"]
    # 16 addresses x 4: under the limit of 8 per address and worker, however
    # the kernel spreads them over the two workers.
    slow = [_slow(held_api.port, f"127.0.0.{2 + i % 16}") for i in range(64)]
    try:
        # Every one of them reached a worker (none is waiting in the backlog):
        # a request sent on a fresh connection after them is answered.
        for _ in range(3):
            health = requests.get(f"{held_api.url}/healthz", timeout=10)
            assert health.status_code == 200
            read = requests.get(f"{held_api.url}/v1/payment_intents/{intent_id}",
                                headers={"Authorization": f"Bearer {key}"}, timeout=10)
            assert read.status_code == 200 and read.json()["id"] == intent_id
        # ... while all 64 are still held open, not cut to make room.
        assert not any(_closed_by_server(s) for s in slow)
    finally:
        _close_all(slow)


def test_one_address_gets_its_share_and_the_others_are_still_served(held_api):
    # 8 per address in each of the 2 workers: at most 16 of 30 stay open.
    crowd = []
    try:
        for _ in range(30):
            try:
                crowd.append(_slow(held_api.port, "127.0.0.99"))
            except (ConnectionResetError, BrokenPipeError):
                pass  # refused already while sending
        wait_until(lambda: sum(not _closed_by_server(s) for s in crowd) <= 16, timeout=15,
                   what="the address's connections past its share to be closed")
        assert requests.get(f"{held_api.url}/healthz", timeout=10).status_code == 200
        assert held_api.proc.popen.poll() is None
        refused = re.search(r'vpay_http_connections_closed_total\{reason="address_limit"\} ([0-9.]+)',
                            requests.get(f"{held_api.url}/metrics", timeout=10).text)
        assert refused and float(refused.group(1)) >= 14
    finally:
        _close_all(crowd)


def test_the_header_and_body_deadlines_close_a_trickling_connection(strict_api):
    header = _slow(strict_api.port, "127.0.0.3")
    body = _slow(strict_api.port, "127.0.0.4", b"POST /provider/mtn/callback?ref=x HTTP/1.1\r\nHost: x\r\n"
                                               b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    try:
        wait_until(lambda: _closed_by_server(header) and _closed_by_server(body), timeout=15,
                   what="both connections to be closed at their deadline")
        text = _scrape(strict_api)
        assert re.search(r'vpay_http_connections_closed_total\{reason="header_timeout"\} [1-9]', text)
        assert re.search(r'vpay_http_connections_closed_total\{reason="body_timeout"\} [1-9]', text)
    finally:
        _close_all([header, body])


def _noise(url: str, rng: random.Random, rounds: int) -> None:
    """Requests of fixed shapes with random methods, paths and ids."""
    def word(n=8):
        return "".join(rng.choices(string.ascii_uppercase, k=n))
    with requests.Session() as http:
        for _ in range(rounds):
            http.request(word(), f"{url}/{word().lower()}/{word().lower()}", timeout=10)
            http.request(word(), f"{url}/healthz", timeout=10)
            http.get(f"{url}/{word().lower()}?{word().lower()}={word()}", timeout=10)
            http.get(f"{url}/v1/payment_intents/pi_{word(20)}", timeout=10)
            http.get(f"{url}/v1/payment_intents/pi_{word(20)}",
                     headers={"Authorization": f"Bearer sk_{word(30)}"}, timeout=10)
            http.post(f"{url}/provider/{word().lower()}/callback?ref={word()}", data=b"{}", timeout=10)
            http.request(word(), f"{url}/provider/mtn/callback", timeout=10)


def test_the_metrics_series_do_not_grow_with_made_up_methods_paths_and_ids(strict_api):
    from vpay.base.metrics import HTTP_METHODS, HTTP_STATUSES
    rng = random.Random(27)
    _noise(strict_api.url, rng, 20)
    before = _series(_scrape(strict_api))
    _noise(strict_api.url, rng, 40)  # new methods, paths and ids; the same shapes
    after = _series(_scrape(strict_api))
    assert len(after) == len(before), sorted(set(after) - set(before))
    methods = {m for line in after for m in re.findall(r'method="([^"]*)"', line)}
    statuses = {s for line in after for s in re.findall(r'status="([^"]*)"', line)}
    routes = {r for line in after for r in re.findall(r'route="([^"]*)"', line)}
    assert methods <= HTTP_METHODS | {"other"} and "other" in methods
    assert statuses <= {str(s) for s in HTTP_STATUSES} | {"other"}
    assert routes <= {"/provider/{code}/callback", "/v1/payment_intents", "/v1/payment_intents/{intent_id}",
                      "/healthz", "/openapi.json", "(no route)", "other"}


def test_metrics_on_their_own_bind_behind_a_token(strict_api):
    metrics = strict_api.metrics_url
    assert requests.get(f"{strict_api.url}/metrics", timeout=10).status_code == 404  # not on the API's bind
    refused = requests.get(metrics, timeout=10)
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
    wrong = requests.get(metrics, headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401 and "vpay_" not in wrong.text
    assert "vpay_api_requests_total" in _scrape(strict_api)
    base = metrics.rsplit("/", 1)[0]
    assert requests.get(f"{base}/healthz", timeout=10).status_code == 404  # it serves nothing else
