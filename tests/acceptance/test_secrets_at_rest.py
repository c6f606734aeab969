"""Secrets at rest and credentials through the real commands (issue #27): a
``pg_dump`` of the database holds no webhook secret; the worker refuses to
boot without keys or with a wrong key (exit 78, one line); ``secrets
rotate`` with two keys; rail credentials and the keys read from a systemd
credentials directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from api_support import free_port, mtn_env
from support import base_env, script, wait_until
from vpay.base.secretbox import SecretBox, new_key
from vpay.money import merchants
from vpay import webhooks


def _pg_dump_for(db) -> str | None:
    """A pg_dump at least as new as the server (pg_dump refuses an older
    one): pgserver's own, then the system's."""
    server_major = int(db.execute("SHOW server_version_num").fetchone()[0]) // 10000
    candidates = []
    try:
        import pgserver
        candidates.append(Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_dump")
    except ImportError:
        pass
    if shutil.which("pg_dump"):
        candidates.append(Path(shutil.which("pg_dump")))
    for path in candidates:
        if not os.access(path, os.X_OK):
            continue
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout
        found = re.search(r"(\d+)\.", out)
        if found and int(found.group(1)) >= server_major:
            return str(path)
    return None


def test_a_pg_dump_of_the_database_holds_no_webhook_secret(db, db_url):
    pg_dump = _pg_dump_for(db)
    if pg_dump is None:
        pytest.skip("no pg_dump at least as new as the test server (pgserver's pginstall/bin, or "
                    "apt-get install postgresql-client)")
    merchants.create_merchant(db, "m1")
    shown = []
    for i in range(3):
        ep = webhooks.add_endpoint(db, "m1", f"http://127.0.0.1:9/h{i}", permit_private=True)
        shown.append(ep["secret"])
        shown.append(webhooks.rotate_secret(db, ep["id"])["secret"])  # current and previous stored
    dump = subprocess.run([pg_dump, "--data-only", "--table=webhook_endpoints", "--dbname", db_url],
                          capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0, dump.stderr
    assert "we_" in dump.stdout and "fernet:" in dump.stdout  # the rows are there, sealed
    for secret in shown:
        assert secret not in dump.stdout and secret.removeprefix("whsec_") not in dump.stdout
    assert "whsec_" not in dump.stdout
    assert os.environ["VPAY_SECRET_KEYS"] not in dump.stdout


def _worker(db_url: str, **env: str) -> subprocess.CompletedProcess:
    environment = base_env(db_url, **env)
    for name in [k for k, v in env.items() if v is None]:
        environment.pop(name, None)
    return subprocess.run([script("vpay-worker"), "--worker-concurrency", "1"], env=environment,
                          capture_output=True, text=True, timeout=60)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    """The refusal: the one line on stderr that is not a JSON log line."""
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("{")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_the_worker_refuses_to_boot_without_keys(db_url):
    env = base_env(db_url)
    del env["VPAY_SECRET_KEYS"]
    proc = subprocess.run([script("vpay-worker")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78
    assert _one_line(proc).startswith("vpay: configuration refused: VPAY_SECRET_KEYS is not set")


def test_the_worker_refuses_to_boot_with_a_wrong_key(db, db_url):
    merchants.create_merchant(db, "m1")
    webhooks.add_endpoint(db, "m1", "http://127.0.0.1:9/h", permit_private=True)
    wrong = new_key()
    proc = _worker(db_url, VPAY_SECRET_KEYS=wrong)
    assert proc.returncode == 78
    line = _one_line(proc)
    assert "VPAY_SECRET_KEYS cannot open a stored secret" in line and wrong not in line


def test_secrets_rotate_with_two_keys_then_the_old_key_is_dropped(db, db_url, spawn):
    merchants.create_merchant(db, "m1")
    ep = webhooks.add_endpoint(db, "m1", "http://127.0.0.1:9/h", permit_private=True)
    old, new = os.environ["VPAY_SECRET_KEYS"], new_key()
    rotate = subprocess.run([script("vpay-server"), "secrets", "rotate", "--actor", "ops@example", "--json"],
                            env=base_env(db_url, VPAY_SECRET_KEYS=f"{new},{old}"),
                            capture_output=True, text=True, timeout=60)
    assert rotate.returncode == 0, rotate.stderr
    assert json.loads(rotate.stdout)["resealed"] == 1
    stored = db.execute("SELECT secret FROM webhook_endpoints").fetchone()[0]
    assert SecretBox((new,)).open(stored) == ep["secret"]
    # The operator action left one audit line: who, and counts; never a key or a secret.
    audit = [json.loads(line) for line in rotate.stderr.splitlines() if '"audit"' in line]
    assert len(audit) == 1 and audit[0]["actor"] == "ops@example" and audit[0]["resealed"] == 1
    assert new not in rotate.stderr and old not in rotate.stderr and ep["secret"] not in rotate.stderr
    # The worker now boots on the new key alone (its boot check opens the stored secret).
    worker = spawn("vpay-worker", "--worker-concurrency", "1", env=base_env(db_url, VPAY_SECRET_KEYS=new))
    worker.wait_for_log("worker started", timeout=30)


def test_secrets_rotate_refuses_a_wrong_key_in_one_line_and_changes_nothing(db, db_url):
    merchants.create_merchant(db, "m1")
    webhooks.add_endpoint(db, "m1", "http://127.0.0.1:9/h", permit_private=True)
    before = db.execute("SELECT secret FROM webhook_endpoints").fetchall()
    proc = subprocess.run([script("vpay-server"), "secrets", "rotate"],
                          env=base_env(db_url, VPAY_SECRET_KEYS=new_key()),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78
    assert "cannot open a stored secret" in _one_line(proc)
    assert db.execute("SELECT secret FROM webhook_endpoints").fetchall() == before


def test_rail_credentials_and_the_keys_from_a_credentials_directory(db_url, tmp_path, spawn, sandbox):
    """As under `LoadCredential=`: the secrets only as files named like their
    variables; the environment keeps the rest."""
    creds = tmp_path / "credentials"
    creds.mkdir(mode=0o700)
    port = free_port()
    env = base_env(db_url, **mtn_env(sandbox, port))
    for name in ("VPAY_MTN_SUBSCRIPTION_KEY", "VPAY_MTN_API_KEY", "VPAY_SECRET_KEYS"):
        (creds / name).write_text(env.pop(name) + "\n")
    env["CREDENTIALS_DIRECTORY"] = str(creds)
    worker = spawn("vpay-worker", "--worker-concurrency", "1", env=env)
    worker.wait_for_log("worker started", timeout=30)
    assert not [l for l in worker.lines() if l.get("message", "").startswith("no rail is configured")]
    api = spawn("vpay-server", "api", "--bind", f"127.0.0.1:{port}", "--workers", "1", env=env)
    import requests

    def healthy():
        assert api.popen.poll() is None, api.text()[-2000:]
        try:
            return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    wait_until(healthy, timeout=30, what="the API with its rail credentials from the directory")
    assert not api.find("rail not configured: its callbacks answer 404 and its payments 422", rail="mtn")
    # Never in the log.
    for secret in (sandbox.subscription_key, sandbox.api_key):
        assert secret not in worker.text() and secret not in api.text()
