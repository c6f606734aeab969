"""The chaos run's processes: its own embedded Postgres (restartable), a
reconnecting harness connection, child processes with their logs, and the
``vpay-server`` command line. Used by ``bench/chaos.py``."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import os
import threading
import time
from pathlib import Path
from typing import Any


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def script_path(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"chaos: {name} is not installed (pip install -e .)")
    return found


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- Postgres


class Postgres:
    """The run's own embedded Postgres (pgserver) with pg_ctl at hand."""

    def __init__(self, root: Path):
        import logging

        import pgserver
        logging.getLogger("pgserver").setLevel(logging.WARNING)
        self.server = pgserver.get_server(root, cleanup_mode="stop")
        self.socket_dir = str(self.server.get_postmaster_info().socket_dir)
        self.lock = threading.Lock()

    def url(self, dbname: str, app: str | None = None) -> str:
        from psycopg.conninfo import make_conninfo
        url = self.server.get_uri(dbname)
        return make_conninfo(url, application_name=app) if app else url

    def _pg_ctl(self, *args: str) -> None:
        from pgserver._commands import pg_ctl
        pg_ctl(["-w", *args], pgdata=self.server.pgdata, user=self.server.system_user, timeout=120)

    def restart(self, mode: str) -> None:
        with self.lock:
            self._pg_ctl("-m", mode, "-l", str(self.server.log), "restart")
            from pgserver.utils import PostmasterInfo
            self.server._postmaster_info = PostmasterInfo.read_from_pgdata(self.server.pgdata)

    def stop(self) -> None:
        with self.lock:
            self.server.cleanup()  # pg_ctl stop of the postmaster restart() told it about


class Db:
    """A reconnecting autocommit connection of the harness (application_name
    ``chaos-harness``): Postgres restarts under it."""

    def __init__(self, url: str):
        self.url = url
        self.conn = None
        self.lock = threading.Lock()

    def run(self, fn, timeout: float = 120.0):
        import psycopg
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                try:
                    if self.conn is None or self.conn.closed:
                        self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=3)
                    return fn(self.conn)
                except (psycopg.OperationalError, psycopg.InterfaceError):
                    try:
                        if self.conn is not None:
                            self.conn.close()
                    except Exception:  # noqa: BLE001
                        pass
                    self.conn = None
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)

    def all(self, sql: str, params: Any = None) -> list[dict]:
        from psycopg.rows import dict_row

        def q(conn):
            with conn.cursor(row_factory=dict_row) as cur:
                return cur.execute(sql, params).fetchall()
        return self.run(q)

    def exec(self, sql: str, params: Any = None) -> int:
        return self.run(lambda conn: conn.execute(sql, params).rowcount)


# --------------------------------------------------------------------------- processes


class Proc:
    """A child process with its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path):
        self.name, self.args, self.env, self.log_path = name, args, env, log_path
        self._out = open(log_path, "ab")
        self.popen = subprocess.Popen(args, env=env, stdout=self._out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
        self.expected_exit = False
        self.stopped = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, sig: int) -> bool:
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def terminate(self, timeout: float = 20.0) -> int | None:
        self.expected_exit = True
        if self.alive():
            self.send(signal.SIGCONT)
            self.send(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._out.close()
        return self.popen.returncode


def run_cli(env: dict[str, str], *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run([script_path("vpay-server"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
