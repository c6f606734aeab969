"""Every CLI failure is one line on stderr and a documented exit code, never a
traceback (contract: Commands, exit codes): the installed scripts, run for real."""

from __future__ import annotations

import json
import signal
import socket
import subprocess

import psycopg
import pytest

from support import ConnCounter, base_env, rail_env, script, wait_until
from vpay import __version__


def run(name: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([script(name), *args], env=env, capture_output=True, text=True, timeout=120)


def one_line(res: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    lines = [l for l in res.stderr.splitlines() if l.startswith("vpay:")]
    assert len(lines) == 1, res.stderr
    # anything else on stderr is the JSON log, one object per line
    for other in res.stderr.splitlines():
        if not other.startswith("vpay:"):
            json.loads(other)
    return lines[0]


COMMANDS = [("vpay-server", "migrate"), ("vpay-server", "payments", "show", "pi_x"),
            ("vpay-server", "jobs", "list"), ("vpay-server", "alerts", "list"),
            ("vpay-server", "prune", "--older-than", "30"), ("vpay-worker",)]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("url, says", [
    ("mysql://vpay@127.0.0.1/vpay", "must be a postgresql:// URL, not mysql://"),
    ("postgres://", "names no database"),
    ("postgresql://127.0.0.1:5432", "names no database"),
    ("not a url", "not a libpq URL"),
])
def test_a_url_that_cannot_be_meant_is_refused_at_once_with_78(command, url, says):
    res = run(*command, env=base_env(url))
    assert res.returncode == 78, res.stderr
    assert says in one_line(res)


@pytest.mark.parametrize("command", COMMANDS[:-1], ids=" ".join)
def test_an_unreachable_database_is_69_in_one_line(command):
    counter = ConnCounter()  # accepts and closes: no Postgres there
    try:
        res = run(*command, env=base_env(f"postgresql://nobody@127.0.0.1:{counter.port}/x",
                                         VPAY_DATABASE_OPEN_TIMEOUT_SECONDS="2"))
    finally:
        counter.close()
    assert res.returncode == 69, res.stderr
    assert one_line(res).startswith("vpay: database unavailable:")


def test_a_database_that_does_not_exist_says_to_create_it(server_url):
    url = psycopg.conninfo.make_conninfo(server_url, dbname="vpay_no_such_database")
    res = run("vpay-server", "migrate", env=base_env(url))
    assert res.returncode == 69
    line = one_line(res)
    assert "vpay_no_such_database" in line and "create it first" in line


def test_a_schema_that_was_never_migrated_says_to_migrate(server_url):
    name = "vpay_unmigrated_" + __import__("uuid").uuid4().hex[:8]
    with psycopg.connect(psycopg.conninfo.make_conninfo(server_url, dbname="postgres"),
                         autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            res = run("vpay-server", "jobs", "list",
                      env=base_env(psycopg.conninfo.make_conninfo(server_url, dbname=name)))
        finally:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    assert res.returncode == 69
    assert "run vpay-server migrate" in one_line(res)


@pytest.mark.parametrize("args, env, code", [
    (("vpay-server", "--log-level", "LOUD", "migrate"), {}, 2),
    (("vpay-worker", "--log-level", "LOUD"), {}, 2),
    (("vpay-server", "jobs", "list", "--no-such-flag"), {}, 2),
    (("vpay-server", "no-such-command"), {}, 2),
    (("vpay-server", "migrate"), {"VPAY_LOG_LEVEL": "LOUD"}, 78),
    (("vpay-worker",), {"VPAY_LOG_LEVEL": "LOUD"}, 78),
], ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v))
def test_usage_and_log_level_errors_are_one_line(db_url, args, env, code):
    res = run(*args, env=base_env(db_url, **env))
    assert res.returncode == code, res.stderr
    one_line(res)


@pytest.mark.parametrize("args", [
    ("prune", "--older-than", "999999999", "--dry-run"),
    ("charges", "list", "--older-than", "99999999999999d"),
    ("jobs", "retry", "99999999999999999999999"),
    ("jobs", "release", "99999999999999999999999"),
    ("alerts", "ack", "99999999999999999999", "--note", "x"),
], ids=" ".join)
def test_a_number_past_what_the_database_holds_is_a_usage_error_not_a_bug(db_url, args):
    # These reached Postgres (timestamp or bigint out of range) and came back
    # as "internal error", exit 70: the code for a bug, not for a typo.
    res = run("vpay-server", *args, env=base_env(db_url))
    assert res.returncode == 2, res.stderr
    assert "internal error" not in one_line(res)


def test_a_busy_sandbox_rail_port_is_one_line_and_69(db_url):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = run("vpay-server", "sandbox-rail", "--port", str(port), env=base_env(db_url))
    assert res.returncode == 69
    assert f"cannot listen on 127.0.0.1:{port}" in one_line(res)


@pytest.mark.parametrize("bind", ["127.0.0.1:99999", "127.0.0.1:-1", "", "127.0.0.1"])
def test_a_bind_that_is_not_host_port_is_a_usage_error(db_url, sandbox, bind):
    # gunicorn took "" as 127.0.0.1:8000 and a port past 65535 as a traceback (70)
    res = run("vpay-server", "api", "--bind", bind, env=base_env(db_url, **rail_env(sandbox)))
    assert res.returncode == 2, res.stderr
    assert "--bind" in one_line(res)


def test_a_busy_api_port_is_one_line_and_69(db_url, sandbox):
    # gunicorn retried for five seconds and exited 1 (restarted by systemd for ever), no vpay: line
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = run("vpay-server", "api", "--bind", f"127.0.0.1:{port}", env=base_env(db_url, **rail_env(sandbox)))
    assert res.returncode == 69, res.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in one_line(res)


def test_version():
    res = run("vpay-server", "--version", env=base_env("postgres://"))
    assert res.returncode == 0 and res.stdout.strip() == f"vpay-server {__version__}"


def test_the_worker_takes_a_log_level(db, db_url, spawn):
    worker = spawn("vpay-worker", "--log-level", "warning", "--idle-sleep", "0.1",
                   env=base_env(db_url, VPAY_LOG_LEVEL="DEBUG"))
    # at boot it schedules the hourly jobs, then claims them: it is running
    wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE attempts > 0").fetchone()[0] >= 1,
               timeout=60, what="the worker to claim its first job")
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0
    levels = {l.get("level") for l in worker.lines()}
    assert levels and levels <= {"WARNING", "ERROR", "CRITICAL"}, levels  # the flag beat VPAY_LOG_LEVEL


def test_the_demo_drops_only_a_database_it_made_itself(server_url):
    name = "vpay_demo_t" + __import__("uuid").uuid4().hex[:8]
    admin_url = psycopg.conninfo.make_conninfo(server_url, dbname="postgres")
    env = base_env(server_url)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # somebody else's
        try:
            with psycopg.connect(psycopg.conninfo.make_conninfo(server_url, dbname=name),
                                 autocommit=True) as theirs:
                theirs.execute("CREATE TABLE precious (x int)")
            res = run("vpay-server", "demo", "--database", name, "--deadline-seconds", "1", env=env)
            assert res.returncode == 1 and "--reset" in one_line(res)
            with psycopg.connect(psycopg.conninfo.make_conninfo(server_url, dbname=name)) as theirs:
                theirs.execute("SELECT * FROM precious")  # untouched

            # with --reset it is dropped and made again, marked as the demo's: a
            # later run drops it unasked
            res = run("vpay-server", "demo", "--database", name, "--reset", "--deadline-seconds", "1", env=env)
            assert "vpay: refused" not in res.stderr, res.stderr[-2000:]
            with psycopg.connect(psycopg.conninfo.make_conninfo(server_url, dbname=name)) as ours:
                assert ours.execute("SELECT to_regclass('precious')").fetchone() == (None,)
                ours.execute("CREATE TABLE scratch (x int)")
            res = run("vpay-server", "demo", "--database", name, "--deadline-seconds", "1", env=env)
            assert "vpay: refused" not in res.stderr, res.stderr[-2000:]
            with psycopg.connect(psycopg.conninfo.make_conninfo(server_url, dbname=name)) as ours:
                assert ours.execute("SELECT to_regclass('scratch')").fetchone() == (None,)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
