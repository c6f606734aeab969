"""`vpay-server demo --quick --console`: the demo's console answers, the
printed one-time login works, and SIGTERM ends the demo cleanly (exit 0,
the console gone). ``--quick`` (five payments) keeps it to seconds."""

from __future__ import annotations

import re
import signal
import socket

import psycopg
import pytest
import requests
from psycopg import sql

from support import Proc, base_env, script, wait_until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def demo_db(server_url, worker_id):
    name = f"vpay_demo_console_{worker_id}"
    yield name
    admin = psycopg.conninfo.make_conninfo(server_url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_demo_console_stays_up_with_a_working_login_and_sigterm_ends_it(db_url, demo_db, tmp_path):
    port = _free_port()
    env = base_env(db_url, VPAY_DATA_DIR=str(tmp_path / "data"))
    proc = Proc([script("vpay-server"), "demo", "--quick", "--console", "--console-bind", f"127.0.0.1:{port}",
                 "--database", demo_db], env, tmp_path / "demo.out")
    try:
        def said(text):
            def check():
                if proc.popen.poll() is not None and text not in proc.text():
                    raise AssertionError(f"demo exited {proc.popen.returncode}:\n{proc.text()[-3000:]}")
                return text in proc.text()
            return check
        wait_until(said("the console stays up"), 120, what="the demo's run to end")
        out = proc.text()
        assert "5/5 charges ended as the sandbox scripted them: PASS" in out, out[-3000:]
        email, password = re.search(r"sign in as (\S+) with the one-time password (\S+)", out).groups()

        base = f"http://127.0.0.1:{port}"
        s = requests.Session()
        login = s.get(f"{base}/login", timeout=10)
        token = re.search(r'name="login_token" value="([^"]+)"', login.text).group(1)
        signed = s.post(f"{base}/login", data={"email": email, "password": password, "login_token": token},
                        allow_redirects=False, timeout=10)
        assert signed.status_code == 303 and signed.headers["location"].endswith("/"), signed.text[:500]
        payments = s.get(f"{base}/payments", params={"status": "succeeded"}, timeout=10)
        assert payments.status_code == 200 and payments.text.count('<a href="/payments/ch_') == 4

        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.text()[-3000:]
        assert "stopped by SIGTERM; ending the console" in proc.text()
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{base}/login", timeout=2)
    finally:
        proc.close()
