"""Every CLI failure is one line on stderr and a documented exit code, never a
traceback (contract: Commands, exit codes): the installed scripts, run for
real, for what only a real process shows (the database's own answers, the
worker, busy ports). The table over every command (bad id, flag, value,
database down) is tests/test_cli_contract.py."""

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
    """The failure's one line: nothing else on stderr (no JSON log line, no
    psycopg pool warning) unless --log-level asks for it."""
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vpay: "), res.stderr
    return lines[0]


COMMANDS = [("vpay-server", "migrate"), ("vpay-server", "payments", "show", "pi_x"),
            ("vpay-server", "jobs", "list"), ("vpay-server", "alerts", "list"),
            ("vpay-server", "prune", "--older-than", "30d"), ("vpay-worker",)]


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


PAY = ("vpay-server", "payments", "create", "--merchant", "M", "--amount", "100", "--currency", "EUR",
       "--payer", "256770000001")
RAIL = {"VPAY_MTN_BASE_URL": "http://127.0.0.1:9", "VPAY_MTN_SUBSCRIPTION_KEY": "k", "VPAY_MTN_API_USER": "u",
        "VPAY_MTN_API_KEY": "p"}


@pytest.mark.parametrize("command", [*COMMANDS, PAY], ids=lambda c: " ".join(c[:3]))
def test_an_unreachable_database_is_69_in_one_line_naming_host_and_port(command):
    # the pool-using commands (payments create, the worker) waited 30 s and said
    # "pool initialization incomplete"; every one now fails the same way, at once
    counter = ConnCounter()  # accepts and closes: no Postgres there
    port = counter.port
    try:
        res = run(*command, env=base_env(f"postgresql://nobody@127.0.0.1:{port}/x", **RAIL))
    finally:
        counter.close()
    assert res.returncode == 69, res.stderr
    assert one_line(res).startswith(f"vpay: database unavailable: nobody@127.0.0.1:{port}/x: ")


def test_the_worker_with_the_database_down_says_so_on_stderr_and_logs_it_on_stdout():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run("vpay-worker", env=base_env(f"postgresql://nobody@127.0.0.1:{port}/x"))
    assert res.returncode == 69
    assert one_line(res) == f"vpay: database unavailable: nobody@127.0.0.1:{port}/x: Connection refused"
    assert [json.loads(l)["message"] for l in res.stdout.splitlines()][-1] == "database unreachable at boot"


def test_debug_shows_the_log_and_the_trace_on_stderr():
    res = run("vpay-server", "--log-level", "DEBUG", "jobs", "list",
              env=base_env("postgresql://nobody@127.0.0.1:9/x"))
    assert res.returncode == 69
    assert len([l for l in res.stderr.splitlines() if l.startswith("vpay:")]) == 1
    assert '"database in use"' in res.stderr


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
    ("prune", "--older-than", "999999999d", "--dry-run"),
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


@pytest.mark.parametrize("name", ["vpay-server", "vpay-worker"])
def test_version(name):
    res = run(name, "--version", env=base_env("postgres://"))
    assert res.returncode == 0 and res.stdout.strip() == f"{name} {__version__}"


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
