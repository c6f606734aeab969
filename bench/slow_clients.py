"""Slow clients against the bare API (issue #27; never run as a test).

    python bench/slow_clients.py                  # embedded Postgres under ./.vpay-bench
    VPAY_DATABASE_URL=... python bench/slow_clients.py [--connections 256] [--seconds 20]

What runs (all on loopback): ``vpay-server api`` with its defaults (2
workers x 4 threads, ``VPAY_HTTP_*`` defaults: headers within 10 s, 32
connections per address and worker), and an attacker that keeps
``--connections`` slow-header connections open for the whole window: each
sends a request line and part of a header, then one more header byte every
``--trickle`` seconds, never the blank line; the ones the header deadline
closes are opened again at once, so the count stays at ``--connections``.
They come from 16 loopback addresses (127.0.0.2 to 127.0.0.17), each under
the per-address share, so the limit does not simply refuse them: what is
measured is that held connections cost no thread.

Meanwhile one prober alternates ``GET /healthz`` and ``GET
/v1/payment_intents/{id}`` (a merchant's read, authenticated, from the
database) every ``--probe-interval`` seconds. Printed: p50/p99/max of each,
failures, how many slow connections were open at each probe (min, median), how many
the deadline closed and were reopened, and the load average. Goal (issue
#27): both p99 <= 100 ms with 256 held.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import requests

import benchdb  # noqa: E402 (bench/ is the script's folder)
from benchdb import fresh  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from rail_stub import MomoStub  # noqa: E402

ADDRESSES = [f"127.0.0.{n}" for n in range(2, 18)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Attacker:
    """Keeps ``count`` slow-header connections open until ``stop()``."""

    def __init__(self, port: int, count: int, trickle: float):
        self.port, self.count, self.trickle = port, count, trickle
        self.socks: list[socket.socket | None] = [None] * count
        self.reopened = 0
        self.failed_opens = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, i: int) -> socket.socket | None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5,
                                         source_address=(ADDRESSES[i % len(ADDRESSES)], 0))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: bench\r\nX-Slow: ")
            s.setblocking(False)
            return s
        except OSError:
            self.failed_opens += 1
            return None

    @staticmethod
    def _closed(s: socket.socket) -> bool:
        try:
            return s.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def open_all(self) -> None:
        for i in range(self.count):
            self.socks[i] = self._open(i)

    def open_now(self) -> int:
        return sum(1 for s in self.socks if s is not None and not self._closed(s))

    def _run(self) -> None:
        # Reopen what the deadline closed within 0.1 s; trickle every ``trickle`` s.
        next_byte = time.monotonic() + self.trickle
        while not self._stop.wait(0.1):
            trickle = time.monotonic() >= next_byte
            if trickle:
                next_byte += self.trickle
            for i, s in enumerate(self.socks):
                if s is None or self._closed(s):
                    if s is not None:
                        s.close()
                        self.reopened += 1
                    self.socks[i] = self._open(i)
                elif trickle:
                    try:
                        s.send(b"a")
                    except OSError:
                        pass  # closed: reopened on the next pass

    def start(self) -> "Attacker":
        self.open_all()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for s in self.socks:
            if s is not None:
                s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=20.0, help="the probing window")
    ap.add_argument("--trickle", type=float, default=1.0, help="seconds between two header bytes")
    ap.add_argument("--probe-interval", type=float, default=0.05)
    ap.add_argument("--json", default=None, help="write the figures to this file too")
    args = ap.parse_args()

    from vpay.money import charges, merchants

    url = fresh(benchdb.server(), "vpay_bench_slow_clients")
    momo = MomoStub(default_outcome=("10.00", "EUR"))
    with psycopg.connect(url, autocommit=True) as conn:
        merchants.create_merchant(conn, "m", "m")
        key = merchants.create_api_key(conn, "m")[1]
        intent_id = charges.create_payment(conn, merchant_id="m", amount=1000, currency="EUR", rail="mtn",
                                           payer="256770000001").charge["payment_intent_id"]
    log_dir = HERE.parent / ".vpay-bench"
    log_dir.mkdir(exist_ok=True)
    port = _free_port()
    env = {**os.environ, "VPAY_DATABASE_URL": url, "VPAY_LOG_LEVEL": "WARNING", **momo.env()}
    exe = Path(sys.executable).parent
    api = subprocess.Popen([str(exe / "vpay-server"), "api", "--bind", f"127.0.0.1:{port}"], env=env,
                           stdout=open(log_dir / "slow-clients-api.log", "wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    attacker = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the API did not come up")
            time.sleep(0.2)
        load_start = os.getloadavg()[0]
        attacker = Attacker(port, args.connections, args.trickle).start()
        latencies: dict[str, list[float]] = {"healthz": [], "intent": []}
        failures = {"healthz": 0, "intent": 0}
        held: list[int] = []
        end = time.monotonic() + args.seconds
        turn = 0
        while time.monotonic() < end:
            kind = ("healthz", "intent")[turn % 2]
            turn += 1
            target = f"{base}/healthz" if kind == "healthz" else f"{base}/v1/payment_intents/{intent_id}"
            began = time.monotonic()
            try:
                # A new connection per probe, as a load balancer's health check makes.
                r = requests.get(target, headers={"Authorization": f"Bearer {key}"}, timeout=10)
                ok = r.status_code == 200
            except requests.RequestException:
                ok = False
            took = time.monotonic() - began
            if ok:
                latencies[kind].append(took)
            else:
                failures[kind] += 1
            held.append(attacker.open_now())
            time.sleep(max(0.0, args.probe_interval - took))
        figures = {
            "connections": args.connections, "seconds": args.seconds,
            "held_min": min(held), "held_median": sorted(held)[len(held) // 2],
            "reopened_after_deadline": attacker.reopened,
            "failed_opens": attacker.failed_opens,
            "load_average_start": round(load_start, 2), "load_average_end": round(os.getloadavg()[0], 2),
        }
        for kind, values in latencies.items():
            figures[kind] = {"probes": len(values), "failures": failures[kind],
                             "p50_ms": round(_percentile(values, 0.5) * 1000, 1) if values else None,
                             "p99_ms": round(_percentile(values, 0.99) * 1000, 1) if values else None,
                             "max_ms": round(max(values) * 1000, 1) if values else None}
        print(json.dumps(figures, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        if attacker is not None:
            attacker.stop()
        api.terminate()
        try:
            api.wait(timeout=40)
        except subprocess.TimeoutExpired:
            api.kill()
        momo.close()


if __name__ == "__main__":
    main()
