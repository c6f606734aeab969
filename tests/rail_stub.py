"""Misbehaving MoMo-shaped rails for the isolation tests: real HTTP servers on
127.0.0.1, in the test process.

``MomoStub`` speaks just enough of MoMo Collection (token, request-to-pay,
status) for ``vpay.rails.mtn.MtnMomo`` and the worker, and misbehaves per
reference as scripted:

* ``trickle(ref)``: the status answer's headers at once, then its body one
  byte per second (``Trickle.finished`` says whether it ever got to the end);
* ``throttle(ref, retry_after)``: the next status read of ``ref`` answers 429
  with that ``Retry-After`` (seconds or an HTTP date), once;
* ``revoke_on_read(ref)``: the next status read of ``ref`` revokes every
  token issued so far and answers 401 (a token revoked before its
  ``expires_in``), once;
* otherwise ``SUCCESSFUL`` for the amount and currency given to ``succeed``
  (default: PENDING);
* ``read_delay``: every status answer waits this many seconds first (a rail
  that takes 150 ms per read, for the benches).

Every handler sets ``TCP_NODELAY`` (``disable_nagle_algorithm``): an answer
goes out as two writes (headers, then body), and with Nagle's algorithm the
second waited for the client's delayed ACK of the first, about 40 ms per
answer on loopback, which the benches measured as the rail's own latency.

Every request is logged with the monotonic time it arrived (``at``) and the
time its answer started going out (``answered_at``, taken before the first
byte is written: no client can have the answer earlier, so a pause it caused
starts no earlier).

``HangingRail``: accepts connections and never answers (a stopped rail).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SUBSCRIPTION_KEY = "stub-key"
API_USER = "stub-user"
API_KEY = "stub-api-key"


@dataclass
class Logged:
    method: str
    path: str
    reference: str | None
    at: float
    status: int | None = None
    answered_at: float | None = None


@dataclass
class Trickle:
    body: bytes
    sent: int = 0
    finished: bool = False
    gave_up: bool = False


@dataclass
class _Script:
    outcome: tuple[str, str] | None = None  # (amount major units, currency)
    trickle: bool = False
    throttle: list[str] = field(default_factory=list)
    revoke: int = 0


class MomoStub:
    """``default_outcome``: ``(amount, currency)`` every unscripted
    reference succeeds with (None: PENDING). ``read_delay``: seconds each
    status answer waits before it is sent (0: at once)."""

    def __init__(self, default_outcome: tuple[str, str] | None = None, read_delay: float = 0.0):
        self.default_outcome = default_outcome
        self.read_delay = read_delay
        self._lock = threading.Lock()
        self.log: list[Logged] = []
        self.trickles: dict[str, list[Trickle]] = {}
        self._scripts: dict[str, _Script] = {}
        self._tokens: set[str] = set()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # module docstring

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0) or 0))
                stub._handle(self, "POST")

            def do_GET(self):  # noqa: N802
                stub._handle(self, "GET")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    # --- scripting ---------------------------------------------------------

    def _script(self, ref: str) -> _Script:
        return self._scripts.setdefault(ref, _Script())

    def succeed(self, ref: str, amount: str, currency: str) -> None:
        with self._lock:
            self._script(ref).outcome = (amount, currency)

    def trickle(self, ref: str) -> None:
        with self._lock:
            self._script(ref).trickle = True

    def throttle(self, ref: str, retry_after: str) -> None:
        with self._lock:
            self._script(ref).throttle.append(retry_after)

    def revoke_on_read(self, ref: str) -> None:
        with self._lock:
            self._script(ref).revoke += 1

    # --- reading -----------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def env(self, **extra: str) -> dict[str, str]:
        return {"VPAY_MTN_BASE_URL": self.url, "VPAY_MTN_SUBSCRIPTION_KEY": SUBSCRIPTION_KEY,
                "VPAY_MTN_API_USER": API_USER, "VPAY_MTN_API_KEY": API_KEY, **extra}

    def requests(self, path_prefix: str = "", reference: str | None = None) -> list[Logged]:
        with self._lock:
            return [e for e in self.log if e.path.startswith(path_prefix)
                    and (reference is None or e.reference == reference)]

    def tokens_issued(self) -> int:
        return len([e for e in self.requests("/collection/token/") if e.status == 200])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- serving -----------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = h.path.split("?")[0]
        ref = path.rsplit("/", 1)[-1] if path.startswith("/collection/v1_0/requesttopay/") else None
        entry = Logged(method, path, ref, time.monotonic())
        with self._lock:
            self.log.append(entry)
        if path == "/collection/token/" and method == "POST":
            token = uuid.uuid4().hex
            with self._lock:
                self._tokens.add(token)
            return self._send(h, entry, 200, {"access_token": token, "token_type": "access_token",
                                              "expires_in": 3600})
        token = h.headers.get("authorization", "").removeprefix("Bearer ")
        with self._lock:
            known = token in self._tokens
        if not known:
            return self._send(h, entry, 401, {"code": "UNAUTHORIZED", "message": "invalid token"})
        if path == "/collection/v1_0/requesttopay" and method == "POST":
            return self._send(h, entry, 202, None)
        if ref is None or method != "GET":
            return self._send(h, entry, 404, {"code": "RESOURCE_NOT_FOUND", "message": "no"})
        with self._lock:
            script = self._script(ref)
            throttled = script.throttle.pop(0) if script.throttle else None
            revoke = script.revoke > 0
            if revoke:
                script.revoke -= 1
                self._tokens.clear()
            outcome, trickle = script.outcome or self.default_outcome, script.trickle
        if throttled is not None:
            return self._send(h, entry, 429, {"code": "RATE_LIMIT_EXCEEDED", "message": "slow down"},
                              {"Retry-After": throttled})
        if revoke:
            return self._send(h, entry, 401, {"code": "UNAUTHORIZED", "message": "token revoked"})
        if outcome is None:
            body = {"status": "PENDING", "externalId": "x"}
        else:
            body = {"status": "SUCCESSFUL", "amount": outcome[0], "currency": outcome[1],
                    "financialTransactionId": "9" * 9, "externalId": "x"}
        if trickle:
            return self._trickle(h, entry, ref, body)
        if self.read_delay:
            time.sleep(self.read_delay)
        return self._send(h, entry, 200, body)

    def _send(self, h, entry: Logged, status: int, body, headers: dict | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        entry.answered_at = time.monotonic()
        try:
            h.send_response(status)
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            h.wfile.flush()
        except OSError:
            pass
        entry.status = status

    def _trickle(self, h, entry: Logged, ref: str, body: dict) -> None:
        # Padding keeps the body long: at a byte a second it would take minutes.
        data = json.dumps({**body, "payeeNote": "x" * 200}).encode()
        state = Trickle(data)
        with self._lock:
            self.trickles.setdefault(ref, []).append(state)
        entry.status = 200
        try:
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.flush()
            for i in range(len(data)):
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
                state.sent += 1
                time.sleep(1.0)
            state.finished = True
        except OSError:
            state.gave_up = True  # the client went away
        h.close_connection = True


class HangingRail:
    """A TCP listener that accepts every connection and never answers: a
    rail whose process is stopped, or an endpoint that hangs. ``accepted``
    counts connections."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.settimeout(0.2)
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self._held.append(conn)
            self.accepted += 1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self):
        self._stop.set()
        self.thread.join(2)
        for conn in self._held:
            conn.close()
        self.sock.close()


class OrangeTrickle:
    """An Orange Money Web Payment API whose token endpoint answers at once
    and whose every ``transactionstatus`` answer trickles (headers at once,
    then the body one byte a second). ``reads`` counts status reads."""

    def __init__(self):
        self.reads = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as MomoStub's

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0) or 0))
                if self.path.startswith("/oauth/v3/token"):
                    data = json.dumps({"token_type": "Bearer", "access_token": uuid.uuid4().hex,
                                       "expires_in": 3600}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                stub.reads += 1
                data = json.dumps({"status": "INITIATED", "order_id": "x" * 30, "txnid": None,
                                   "message": "y" * 200}).encode()
                try:
                    self.send_response(201)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.flush()
                    for i in range(len(data)):
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        time.sleep(1.0)
                except OSError:
                    pass
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def env(self) -> dict[str, str]:
        return {"VPAY_ORANGE_BASE_URL": self.url, "VPAY_ORANGE_CLIENT_ID": "c",
                "VPAY_ORANGE_CLIENT_SECRET": "s", "VPAY_ORANGE_MERCHANT_KEY": "mk",
                "VPAY_ORANGE_COUNTRY": "dev",
                "VPAY_ORANGE_NOTIF_URL": "http://127.0.0.1:9/provider/orange/callback",
                "VPAY_ORANGE_RETURN_URL": "http://127.0.0.1:9/return",
                "VPAY_ORANGE_CANCEL_URL": "http://127.0.0.1:9/cancel"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
