"""A real pgbouncer (Debian's ``/usr/sbin/pgbouncer``) in front of the test's
database, for the acceptance tests of docs/deployment.md, "pgbouncer".

``Bouncer(db_url, mode, folder).start()`` writes its own ini, listens on a
free loopback port, forwards to the test database (TCP or the embedded
server's Unix socket, whichever ``db_url`` names) with ``auth_type = any``
(it logs in as the URL's user; the test servers trust it), and answers
``url``: the same database through the bouncer. ``pool_mode`` is ``mode``
(``transaction`` or ``session``). Its log goes to ``folder/pgbouncer.log``.

``pgbouncer_or_skip()`` skips a test with one line when the binary is
missing, or fails it under ``VPAY_REQUIRE_PGBOUNCER=1`` (``.ci/run``), as
``VPAY_REQUIRE_BROWSER`` does for chromium.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

from support import wait_until

PGBOUNCER = "/usr/sbin/pgbouncer"

POOL_SIZES = {"transaction": 4, "session": 60}
"""Server connections per database and user, by mode. Transaction mode: fewer
than the worker's pool (10) plus the API's, so transaction pooling really
shares them. Session mode gives each client connection a server connection
for its whole life, so it needs one per client connection (the pools at
their largest, the listener, the vacuum), or clients queue for ever
(docs/deployment.md, "pgbouncer")."""


def pgbouncer_or_skip() -> str:
    """The binary's path; skip (or fail under ``VPAY_REQUIRE_PGBOUNCER=1``) without it."""
    if not Path(PGBOUNCER).exists():
        if os.environ.get("VPAY_REQUIRE_PGBOUNCER") == "1":
            pytest.fail(f"VPAY_REQUIRE_PGBOUNCER=1 but {PGBOUNCER} is missing (apt-get install pgbouncer)")
        pytest.skip(f"no {PGBOUNCER}: apt-get install -y pgbouncer to run the pgbouncer tests")
    return PGBOUNCER


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bouncer:
    """One pgbouncer process (see the module docstring). ``url``: the test
    database through it; ``stop()`` ends it (also at the end of a ``with``)."""

    def __init__(self, db_url: str, mode: str, folder: Path):
        self.binary = pgbouncer_or_skip()
        self.mode = mode
        self.parts = psycopg.conninfo.conninfo_to_dict(db_url)
        self.dbname = self.parts["dbname"]
        self.port = _free_port()
        self.url = psycopg.conninfo.make_conninfo(db_url, host="127.0.0.1", port=str(self.port),
                                                  sslmode="disable", gssencmode="disable")
        self.log_path = Path(folder) / f"pgbouncer-{mode}.log"
        self.proc: subprocess.Popen | None = None
        self._out = None

    def _upstream(self) -> str:
        host = self.parts.get("host") or "/var/run/postgresql"
        fields = {"host": host, "port": self.parts.get("port") or "5432", "dbname": self.dbname,
                  "user": self.parts.get("user") or "postgres"}
        if self.parts.get("password"):
            fields["password"] = self.parts["password"]
        return " ".join(f"{k}={v}" for k, v in fields.items())

    def _run_as(self) -> list[str]:
        """pgbouncer refuses to run as root: then ``-u`` a user who can reach
        the server (the owner of its socket folder, else nobody)."""
        if os.geteuid() != 0:
            return []
        host = self.parts.get("host") or ""
        user = "nobody"
        if host.startswith("/"):
            owner = pwd.getpwuid(os.stat(host).st_uid).pw_name
            if owner != "root":
                user = owner
        return ["-u", user]

    def start(self) -> "Bouncer":
        # A folder every user can read: under root pgbouncer runs as another user.
        folder = Path(tempfile.mkdtemp(prefix="vpay-pgbouncer-"))
        folder.chmod(0o755)
        ini = folder / "pgbouncer.ini"
        ini.write_text(f"""[databases]
{self.dbname} = {self._upstream()}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = any
pool_mode = {self.mode}
default_pool_size = {POOL_SIZES[self.mode]}
max_client_conn = 200
server_reset_query = DISCARD ALL
ignore_startup_parameters = extra_float_digits
server_login_retry = 1
""")
        ini.chmod(0o644)
        self._folder = folder
        self._out = open(self.log_path, "wb")
        self.proc = subprocess.Popen([self.binary, *self._run_as(), str(ini)], stdout=self._out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def accepting():
            if self.proc.poll() is not None:
                raise AssertionError(f"pgbouncer exited {self.proc.returncode}:\n{self.text()[-3000:]}")
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
                    return conn.execute("SELECT 1").fetchone() == (1,)
            except psycopg.OperationalError:
                return False

        try:
            wait_until(accepting, timeout=30, interval=0.1, what=f"pgbouncer ({self.mode}) to accept")
        except BaseException:
            self.stop()
            raise
        return self

    def text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._out is not None:
            self._out.close()
            self._out = None
        import shutil
        shutil.rmtree(getattr(self, "_folder", ""), ignore_errors=True)

    def __enter__(self) -> "Bouncer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
