"""The chaos run's webhook receivers: real HTTP servers on loopback that
verify every delivery with the ``standardwebhooks`` library and record the
event ids they accepted; inside their fault windows they answer 500 or hang.
Used by ``bench/chaos.py``."""

from __future__ import annotations

import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from chaos_schedule import RECEIVER_WINDOW_KINDS, Plan, WindowDecider, windows_of


class Receiver:
    """A merchant's webhook endpoint: a real HTTP server on loopback that
    verifies each POST with ``standardwebhooks.Webhook`` on its raw bytes
    and records the event ids it accepted (2xx answered). Inside one of its
    fault windows it answers 500, or holds the request past vpay's timeout
    and drops it, per request as the seed decides."""

    def __init__(self, name: str, seed: int, plan: Plan, t0_ref: list[float]):
        self.name = name
        self.secret: str | None = None
        self.endpoint_id: str | None = None
        self.delivered: set[str] = set()
        self.received = 0
        self.duplicates = 0
        self.bad: list[dict] = []
        self.faults: Counter = Counter()
        self.lock = threading.Lock()
        self.decider = WindowDecider(seed, windows_of(plan, RECEIVER_WINDOW_KINDS, name))
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                from standardwebhooks import Webhook
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                event_id = self.headers.get("webhook-id", "")
                fault = receiver.decider.decide(time.time() - t0_ref[0], f"{event_id}")
                if fault is not None:
                    kind, params = fault[0], fault[1]
                    with receiver.lock:
                        receiver.faults[kind] += 1
                    if kind == "receiver_hang":
                        time.sleep(params["hang"])
                        self.close_connection = True
                        return
                    self._answer(500, b'{"error":"chaos"}')
                    return
                try:
                    event = Webhook(receiver.secret).verify(body, dict(self.headers))
                except Exception as exc:  # noqa: BLE001 - any failure is a bad delivery
                    with receiver.lock:
                        receiver.bad.append({"endpoint_id": receiver.endpoint_id, "event_id": event_id,
                                             "error": f"{type(exc).__name__}: {exc}"})
                    self._answer(400, b'{"error":"bad signature"}')
                    return
                with receiver.lock:
                    receiver.received += 1
                    if event["id"] in receiver.delivered:
                        receiver.duplicates += 1
                    receiver.delivered.add(event["id"])
                self._answer(200, b'{"ok":true}')

            def _answer(self, code: int, data: bytes):
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True, name=f"receiver-{name}").start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{self.name}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
