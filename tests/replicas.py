"""A primary and a streaming standby of a test's own, for failover
(tests/acceptance/test_failover.py, bench/ha.py).

Debian's PostgreSQL server binaries (``/usr/lib/postgresql/15/bin``, or
``VPAY_TEST_PG_BIN``): ``initdb`` a primary (``wal_level = replica``, a free
loopback port, its Unix socket in its own folder), ``pg_basebackup -R`` a
standby from it, start both and wait until the standby streams (and, with
``synchronous=True``, is the primary's synchronous standby). Then:

* ``url(db)``: the multi-host URL the services use,
  ``postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write``
  (libpq tries the hosts in order and keeps the first that accepts writes);
* ``cut_stream()``: the standby stops receiving WAL (its ``primary_conninfo``
  emptied and reloaded), as a standby that has fallen behind would be at
  the moment of a crash: what the primary commits from then on is the tail
  a failover loses. (``pg_wal_replay_pause()`` does not do that: what the
  standby has received is replayed at promotion all the same.);
* ``fail_over()``: the primary's postmaster and every process of it are
  SIGKILLed (its host died) and the standby is promoted (``pg_ctl promote``).

The servers run as the ``postgres`` user when the tests run as root
(PostgreSQL refuses root), in a folder of their own under the temporary
directory (a pytest folder is not traversable by another user). ``close()``
stops what is left and removes the folder, and the killed primary's System V
shared memory segment (by its id, from its ``postmaster.pid``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg

STANDBY_NAME = "vpay_standby"
"""The standby's ``application_name``: what ``synchronous_standby_names`` names."""


def pg_bin() -> Path | None:
    """The folder of ``initdb``, ``pg_ctl``, ``pg_basebackup``: ``VPAY_TEST_PG_BIN``,
    else Debian's PostgreSQL 15; None when neither has them."""
    for candidate in (os.environ.get("VPAY_TEST_PG_BIN", ""), "/usr/lib/postgresql/15/bin"):
        if candidate and (Path(candidate) / "pg_basebackup").exists() and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> str | None:
    """The user the servers run as: ``postgres`` under root, else ourselves."""
    return "postgres" if os.geteuid() == 0 else None


class Server:
    """One PostgreSQL server: its data folder, port and log."""

    def __init__(self, root: Path, name: str, bin_dir: Path, user: str | None):
        self.root, self.name, self.bin, self.user = root, name, bin_dir, user
        self.data = root / name
        self.log = root / f"{name}.log"
        self.port = free_port()

    def tool(self, name: str, *args: str, timeout: float = 120) -> str:
        done = subprocess.run([str(self.bin / name), *args], user=self.user, capture_output=True, text=True,
                              timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{name} {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
                               f"\n{self.log_tail()}")
        return done.stdout

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def configure(self, **settings: object) -> None:
        """Append ``settings`` to ``postgresql.auto.conf`` (the last line wins)."""
        lines = "".join(f"{k} = {_quote(v)}\n" for k, v in settings.items())
        with open(self.data / "postgresql.auto.conf", "a") as f:
            f.write(lines)

    def start(self) -> None:
        self.tool("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def promote(self) -> None:
        self.tool("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started, at once (the
        host is gone: no shutdown, no last WAL sent); then remove its System V
        segment, which nobody will attach again."""
        import psutil
        pid = self.pid()
        if pid is None:
            return
        try:
            post = psutil.Process(pid)
            procs = [post, *post.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=30)
        self._remove_segment()

    def _remove_segment(self) -> None:
        try:
            line = (self.data / "postmaster.pid").read_text().splitlines()[6]
            shm_id = line.split()[1]
        except (OSError, IndexError):
            return
        subprocess.run(["ipcrm", "-m", shm_id], capture_output=True)

    def stop(self) -> None:
        if self.running():
            subprocess.run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                           user=self.user, capture_output=True, timeout=60, cwd=self.root)
            if self.running():
                self.kill()

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5)


def _quote(value: object) -> str:
    if isinstance(value, (int, float)):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


class Pair:
    """A primary and its streaming standby (see the module doc). ``synchronous``:
    the primary waits for the standby's flush at every commit
    (``synchronous_standby_names`` names it, ``synchronous_commit = on``);
    otherwise it commits asynchronously (Postgres's default)."""

    def __init__(self, synchronous: bool, dbname: str = "vpay"):
        bin_dir = pg_bin()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL server binaries not found (VPAY_TEST_PG_BIN, /usr/lib/postgresql/15/bin)")
        self.synchronous, self.dbname = synchronous, dbname
        user = _run_as()
        self.root = Path(tempfile.mkdtemp(prefix="vpay-replicas-"))
        os.chmod(self.root, 0o755)
        if user:
            entry = pwd.getpwnam(user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.primary = Server(self.root, "primary", bin_dir, user)
        self.standby = Server(self.root, "standby", bin_dir, user)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        p, s = self.primary, self.standby
        p.tool("initdb", "-D", str(p.data), "-U", "postgres", "--auth=trust", "-N", "-E", "UTF8",
               "--locale=C.UTF-8")
        p.configure(listen_addresses="127.0.0.1", port=p.port, unix_socket_directories=str(self.root),
                    wal_level="replica", max_wal_senders=4, wal_keep_size="64MB", fsync="off",
                    shared_buffers="16MB", max_connections=60, synchronous_commit="on")
        p.start()
        with p.connect() as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')
        s.tool("pg_basebackup", "-D", str(s.data), "-R", "-X", "stream", "-c", "fast",
               "-d", f"host=127.0.0.1 port={p.port} user=postgres application_name={STANDBY_NAME}")
        # After a promotion the standby has no standby of its own: it must not
        # wait for one (its commits would hang), so it commits asynchronously.
        s.configure(port=s.port, primary_conninfo=self._conninfo(), synchronous_standby_names="")
        s.start()
        if self.synchronous:
            # Only now: a synchronous primary without its standby waits at
            # every commit (CREATE DATABASE above would have hung).
            with p.connect() as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = %s" % _quote(STANDBY_NAME))
                conn.execute("SELECT pg_reload_conf()")
        self.wait_streaming()

    def _conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.primary.port} user=postgres application_name={STANDBY_NAME}"

    def wait_streaming(self, timeout: float = 60) -> None:
        """Until the primary has the standby streaming (as its ``sync``
        standby when synchronous)."""
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        with self.primary.connect() as conn:
            while True:
                row = conn.execute("SELECT state, sync_state FROM pg_stat_replication "
                                   "WHERE application_name = %s", (STANDBY_NAME,)).fetchone()
                if row == ("streaming", want):
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"standby not streaming ({row}):\n{self.standby.log_tail()}")
                time.sleep(0.05)

    def url(self, dbname: str | None = None) -> str:
        """The services' URL: both servers, the writable one wins."""
        return (f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}/"
                f"{dbname or self.dbname}?target_session_attrs=read-write&connect_timeout=5")

    def caught_up(self) -> bool:
        """Whether the standby has replayed everything the primary has written."""
        with self.primary.connect() as conn:
            lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        with self.standby.connect() as conn:
            return conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(lsn),)).fetchone()[0]

    def cut_stream(self, timeout: float = 30) -> None:
        """The standby stops receiving WAL: what the primary commits from
        now on exists on the primary only."""
        with self.standby.connect() as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + timeout
            while conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone()[0]:
                if time.monotonic() > deadline:
                    raise AssertionError("the standby's WAL receiver did not stop")
                time.sleep(0.05)

    def fail_over(self) -> None:
        """The primary's host dies (SIGKILL, every process) and the standby
        is promoted."""
        self.primary.kill()
        self.standby.promote()

    def close(self) -> None:
        for server in (self.standby, self.primary):
            try:
                server.stop()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        shutil.rmtree(self.root, ignore_errors=True)


class QueueClock:
    """Moves the queue's time forward (like ``support.TimeMachine``): every
    ``interval`` seconds the unleased, not dead-lettered jobs of ``kinds``
    are made due now, through ``url`` (a multi-host URL: it follows the
    failover, reconnecting while no server accepts writes)."""

    def __init__(self, url: str, kinds=("poll", "resubmit"), interval: float = 0.2):
        self.url, self.kinds, self.interval = url, list(kinds), interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
                    while not self._stop.wait(self.interval):
                        conn.execute("UPDATE jobs SET run_at = now() WHERE kind = ANY(%s) "
                                     "AND locked_at IS NULL AND run_at > now() AND run_at <> 'infinity'",
                                     (self.kinds,))
            except psycopg.Error:
                self._stop.wait(self.interval)

    def __enter__(self) -> "QueueClock":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
