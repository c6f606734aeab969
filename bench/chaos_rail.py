"""The chaos run's rail: vpay's MoMo sandbox (``vpay.sandbox.mtn.SandboxRail``)
in its own process, behind a fault-injecting layer, with its ledger.

``python bench/chaos_rail.py --config FILE`` serves on 127.0.0.1 and prints
one JSON line ``{"url": ...}`` on stdout when it listens. The config (JSON)
holds ``seed``, ``windows`` (the plan's rail fault windows, ``chaos_schedule.windows_of``),
``scripts`` (payer MSISDN → sandbox script) and ``success_after_seconds``.

Per MoMo request (token, request-to-pay, status, refund, refund status) the
layer asks the ``WindowDecider`` whether a window strikes it, and then:

* ``rail_429``: answers 429 ``Retry-After: n`` and does nothing else;
* ``rail_5xx``: answers the window's code, either *before* acting (the rail
  did not take the request) or *after* acting on it (it took it, and the
  caller does not hear: the request-to-pay is recorded, a read-driven
  transaction may have moved on);
* ``rail_timeout``: holds the connection past the client's read timeout and
  closes it without a byte, before or after acting;
* ``rail_trickle``: acts, then sends the answer a few bytes at a time over
  ``trickle`` seconds (each socket read stays under the read timeout; only a
  total deadline on the call bounds it).

The ledger (``GET /_chaos/ledger``) is the rail's truth: every transaction
and refund as the sandbox holds it (status, reason, amount), the faults
injected by kind, and per reference the faults that struck its requests.
``POST /_chaos/t0`` ``{"t0": epoch}`` starts the windows' clock (no window
strikes before); ``POST /_chaos/faults/off`` ends every window at once (the recovery phase).
The sandbox's own control routes (``/_sandbox/...``) are served unchanged.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_schedule import WindowDecider  # noqa: E402
from vpay.sandbox import mtn  # noqa: E402

log = logging.getLogger("chaos.rail")


class ChaosHandler(mtn._Handler):
    """The sandbox's request handler with the fault layer in front."""

    def _dispatch(self, method: str) -> None:
        rail: ChaosRail = self.server.rail  # type: ignore[assignment]
        path = urllib.parse.urlsplit(self.path).path
        if path.startswith("/_chaos"):
            body = self._read_body()
            self._send(rail.chaos_control(method, path, body if isinstance(body, bytes) else b""))
            return
        if path == "/_sandbox" or path.startswith("/_sandbox/"):
            super()._dispatch(method)
            return
        ref = self.headers.get("X-Reference-Id") or ""
        key = f"{method} {path} {ref}"
        fault = rail.decider.decide(time.time() - rail.t0, key)
        if fault is None:
            super()._dispatch(method)
            return
        kind, params, index, after_roll = fault
        after = kind in ("rail_5xx", "rail_timeout") and after_roll < params.get("after_p", 0.0)
        if kind == "rail_trickle":
            after = True
        rail.note(kind, after, path, ref)
        body = self._read_body()
        if kind == "rail_429":
            resp = mtn._error_for_http(429)
            self._send_extra(resp, {"Retry-After": str(params["retry_after"])})
            return
        if not after:
            if kind == "rail_5xx":
                self._send(mtn._error_for_http(params["code"]))
            else:  # rail_timeout: no answer at all
                self._hang(rail, params["hang"])
            return
        if isinstance(body, mtn._Resp):
            resp = body
        else:
            try:
                resp = rail._momo(method, path, self.headers, body)
            except Exception:  # a bug in the sandbox, not a client error
                log.exception("chaos rail: error handling %s %s", method, path)
                resp = mtn._error(500, "INTERNAL_PROCESSING_ERROR", "Sandbox internal error")
        if kind == "rail_5xx":
            self._send(mtn._error_for_http(params["code"]))
        elif kind == "rail_timeout":
            self._hang(rail, params["hang"])
        else:
            self._trickle(resp, params["trickle"])
        for fn in resp.after:
            fn()

    def _hang(self, rail: "ChaosRail", seconds: float) -> None:
        rail._stopping.wait(seconds)
        self.close_connection = True

    def _send_extra(self, resp, headers: dict[str, str]) -> None:
        data = json.dumps(resp.body).encode("utf-8")
        try:
            self.send_response(resp.status)
            self.send_header("Content-Type", "application/json;charset=utf-8")
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _trickle(self, resp, seconds: float) -> None:
        data = b"" if resp.body is None else json.dumps(resp.body).encode("utf-8")
        try:
            self.send_response(resp.status)
            if resp.body is not None:
                self.send_header("Content-Type", "application/json;charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.flush()
            pieces = max(1, min(len(data), 16))
            step = max(1, -(-len(data) // pieces))
            pause = seconds / pieces
            for i in range(0, len(data), step):
                time.sleep(pause)
                self.wfile.write(data[i:i + step])
                self.wfile.flush()
            if not data:
                time.sleep(seconds)
        except OSError:
            self.close_connection = True


class ChaosRail(mtn.SandboxRail):
    """``SandboxRail`` whose server runs ``ChaosHandler`` and keeps a fault
    ledger. ``decider`` decides per request; ``t0`` is epoch seconds."""

    def __init__(self, decider: WindowDecider, t0: float, **kwargs):
        super().__init__(**kwargs)
        self._server.RequestHandlerClass = ChaosHandler
        self.decider = decider
        self.t0 = t0
        self._fault_lock = threading.Lock()
        self.fault_counts: dict[str, int] = {}
        self.faults_by_ref: dict[str, list[list]] = {}

    def note(self, kind: str, after: bool, path: str, ref: str) -> None:
        label = f"{kind}{'_after' if after else ''}"
        reference = ref or path.rsplit("/", 1)[-1]
        with self._fault_lock:
            self.fault_counts[label] = self.fault_counts.get(label, 0) + 1
            self.faults_by_ref.setdefault(reference, []).append(
                [round(time.time() - self.t0, 3), label, path])

    def chaos_control(self, method: str, path: str, body: bytes):
        if path == "/_chaos/ledger" and method == "GET":
            with self._fault_lock:
                counts = dict(self.fault_counts)
                by_ref = {k: list(v) for k, v in self.faults_by_ref.items()}
            return mtn._Resp(200, {"transactions": self.transactions(), "refunds": self.refunds(),
                                   "faults": counts, "faults_by_reference": by_ref,
                                   "requests": len(self.requests_log())})
        if path == "/_chaos/t0" and method == "POST":
            self.t0 = float(json.loads(body)["t0"])  # the payment phase starts: windows count from here
            return mtn._Resp(200, {"t0": self.t0})
        if path == "/_chaos/faults/off" and method == "POST":
            self.decider.enabled = False
            return mtn._Resp(200, {"faults": "off"})
        return mtn._error(404, "RESOURCE_NOT_FOUND")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = json.loads(Path(args.config).read_text())
    windows = [tuple(w) for w in config["windows"]]
    decider = WindowDecider(config["seed"], windows)
    rail = ChaosRail(decider, float("inf"), success_after_seconds=config.get("success_after_seconds", 2.0),
                     max_log_entries=1_000_000)
    for payer, script in config.get("scripts", {}).items():
        rail.script(payer, **script)
    signal.signal(signal.SIGTERM, lambda *_: rail.stop())
    print(json.dumps({"url": rail.url}), flush=True)
    rail.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
