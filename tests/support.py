"""Helpers for tests that run the installed console scripts as real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05,
               what: str = "condition"):
    """Poll ``predicate`` until it answers something truthy; fail after
    ``timeout`` seconds. Answers the truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def script(name: str) -> str:
    """Path of an installed console script (``vpay-worker``, ``vpay-server``).
    Raises RuntimeError when called from a unit or integration test: only
    the acceptance ring runs our console scripts (docs/testing.md)."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    if current.startswith(("tests/unit/", "tests/integration/")):
        raise RuntimeError(f"{current.split(' ')[0]} runs {name}: console scripts run only in tests/acceptance")
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is not installed: pip install -e '.[test]'")
    return found


class Proc:
    """A console script running as a child process, its stdout (JSON log
    lines) captured to a file the test can search."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path):
        self.log_path = log_path
        self._out = open(log_path, "wb")
        self.popen = subprocess.Popen(args, env=env, stdout=self._out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def lines(self) -> list[dict]:
        out = []
        for raw in self.log_path.read_bytes().splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:
                out.append({"message": raw.decode(errors="replace"), "raw": True})
        return out

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def find(self, message: str, **fields) -> list[dict]:
        return [l for l in self.lines() if l.get("message") == message
                and all(l.get(k) == v for k, v in fields.items())]

    def wait_for_log(self, message: str, timeout: float = 30.0, **fields) -> dict:
        def seen():
            if self.popen.poll() is not None and not self.find(message, **fields):
                raise AssertionError(f"process exited ({self.popen.returncode}) before logging "
                                     f"{message!r}:\n{self.text()[-4000:]}")
            found = self.find(message, **fields)
            return found[0] if found else None
        return wait_until(seen, timeout, what=f"log {message!r} {fields or ''}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.popen.send_signal(sig)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)

    def wait(self, timeout: float = 60.0) -> int:
        return self.popen.wait(timeout)

    def close(self) -> None:
        self.kill()
        self._out.close()


def base_env(db_url: str, **extra: str) -> dict[str, str]:
    """The environment for a child process: the test's database, the run's
    secret key, no other inherited VPAY_ settings, unbuffered output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPAY_") and k != "NOTIFY_SOCKET"}
    env.update({"VPAY_DATABASE_URL": db_url, "PYTHONUNBUFFERED": "1",
                # the run's own key (tests/conftest.py): children open what the test sealed
                "VPAY_SECRET_KEYS": os.environ["VPAY_SECRET_KEYS"]})
    env.update(extra)
    return env


def rail_env(rail, **extra: str) -> dict[str, str]:
    """``VPAY_MTN_*`` pointing the MTN adapter at a ``SandboxRail``."""
    return {"VPAY_MTN_BASE_URL": rail.url, "VPAY_MTN_SUBSCRIPTION_KEY": rail.subscription_key,
            "VPAY_MTN_API_USER": rail.api_user, "VPAY_MTN_API_KEY": rail.api_key,
            "VPAY_MTN_TARGET_ENVIRONMENT": rail.target_environment, **extra}


class TimeMachine:
    """Moves the queue's time forward the way the tests may: by writing
    ``run_at`` (never by sleeping for real minutes). ``start()`` runs a
    thread that makes every unleased, not dead-lettered job of ``kinds`` due
    now, every ``interval`` seconds."""

    def __init__(self, db_url: str, kinds=("poll", "resubmit"), interval: float = 0.2):
        import threading
        self.db_url, self.kinds, self.interval = db_url, list(kinds), interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import psycopg
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while not self._stop.wait(self.interval):
                conn.execute("UPDATE jobs SET run_at = now() WHERE kind = ANY(%s) "
                             "AND locked_at IS NULL AND run_at > now() AND run_at <> 'infinity'",
                             (self.kinds,))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


class ConnCounter:
    """A TCP listener on 127.0.0.1 that counts accepted connections and
    answers nothing: proof that a process did (or did not) connect."""

    def __init__(self):
        import socket
        import threading
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.accepted = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()
            except OSError:
                pass

    @property
    def port(self):
        return self.sock.getsockname()[1]

    def close(self):
        self._stop.set()
        self.thread.join(2)
        self.sock.close()
