"""Every command behaves the same way (issue 28), walked from the click tree.

One table, ``CASES``, holds for every command and subcommand of
``vpay-server`` the arguments of a run that works (``ok``), a bad id (an
id that names nothing: exit 1), a bad value (a malformed value: exit 2), and
whether it opens the database (then, with the database down: exit 69). A
bad flag (exit 2) is tried on every command. Each failure must be exactly one
line on stderr starting ``vpay:``, and nothing on stdout. A test checks the
table against the click tree, so a new command cannot be left out; where a
case does not apply, the table says why.

The runs are in process (click's ``CliRunner``), against the test's
Postgres; ``test_cli_errors.py`` runs the installed scripts for real for the
cases a process must show (a real database timeout, the worker).
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass, field

import click
import pytest
from click.testing import CliRunner

from support import rail_env
from vpay.cli import main

DOWN_URL = "postgresql://nobody@127.0.0.1:{port}/x"


@dataclass(frozen=True)
class Case:
    """One command's row: args after the command path; a ``str`` where a
    case does not apply says why."""

    ok: tuple[str, ...] = ()
    bad_id: tuple[str, ...] | str = "takes no id"
    bad_value: tuple[str, ...] | str = "takes no value"
    db: bool | str = True
    env: dict[str, str] = field(default_factory=dict)


RAIL = {"VPAY_MTN_BASE_URL": "http://127.0.0.1:9", "VPAY_MTN_SUBSCRIPTION_KEY": "k", "VPAY_MTN_API_USER": "u",
        "VPAY_MTN_API_KEY": "p"}

CASES: dict[tuple[str, ...], Case] = {
    ("alerts", "ack"): Case(("1", "--note", "x"), ("999999", "--note", "x"), ("0", "--note", "x")),
    ("alerts", "list"): Case((), "filters only (an unknown charge lists none)", ("--kind", "bogus")),
    ("api",): Case((), "takes no id", ("--bind", "127.0.0.1:99999"),
                   "starts with the database down (its pooling probe only warns then: vpay/base/pooling.py): "
                   "/healthz answers 503 (docs/api.md)"),
    ("charges", "list"): Case((), "filters only", ("--older-than", "24")),
    ("charges", "resolve"): Case(("ch_x", "--outcome", "failed", "--evidence", "e"),
                                 ("ch_nope", "--outcome", "failed", "--evidence", "e"),
                                 ("ch_x", "--outcome", "maybe", "--evidence", "e")),
    ("console",): Case((), "takes no id", ("--bind", "127.0.0.1:99999"),
                       "starts with the database down, like api (tests/integration/test_console.py)"),
    ("demo",): Case((), "takes no id", ("--database", "Not-A-Name"),
                    "makes its own database and processes: test_demo.py"),
    ("jobs", "list"): Case((), "filters only", ("--lane", "bogus")),
    ("jobs", "release"): Case(("1",), ("999999",), ("0",)),
    ("jobs", "retry"): Case(("1",), ("999999",), ("0",)),
    ("merchants", "create"): Case(("--id", "m_new"), ("--id", "m_exists"), ("--id", "no spaces")),
    ("merchants", "create-key"): Case(("--id", "m_exists"), ("--id", "m_nope"), ("--id", "no spaces")),
    ("merchants", "list"): Case(),
    ("merchants", "revoke-key"): Case(("key_x",), ("key_nope",), "any text is a key id (an unknown one: 1)"),
    ("migrate",): Case(),
    ("operators", "create"): Case(("--email", "o@example.com", "--role", "viewer"),
                                  "an email, not an id (a taken one: 1, tests/integration/test_console.py)",
                                  ("--email", "o@example.com", "--role", "root")),
    ("operators", "disable"): Case(("--email", "o@example.com"), ("--email", "nobody@example.com"),
                                   "any text is an email (an unknown one: 1)"),
    ("operators", "list"): Case(),
    ("payments", "create"): Case(("--merchant", "m_exists", "--amount", "100", "--currency", "EUR", "--payer",
                                  "256770000001"),
                                 ("--merchant", "NOPE", "--amount", "100", "--currency", "EUR", "--payer",
                                  "256770000001"),
                                 ("--merchant", "m_exists", "--amount", "1_0", "--currency", "EUR", "--payer",
                                  "256770000001"), env=RAIL),
    ("payments", "show"): Case(("ch_x",), ("ch_nope",), "any text is an id (an unknown one: 1)"),
    ("prune",): Case(("--older-than", "30d", "--dry-run"), "takes no id", ("--older-than", "24")),
    ("rails", "list"): Case(),
    ("refunds", "create"): Case(("--charge", "ch_x"), ("--charge", "ch_nope"), ("--charge", "ch_x", "--amount", "-5")),
    ("refunds", "show"): Case(("re_x",), ("re_nope",), "any text is an id (an unknown one: 1)"),
    ("sandbox-rail",): Case((), "takes no id", ("--port", "70000"), "uses no database"),
    ("secrets", "new-key"): Case((), "takes no id", "takes no value", "uses no database"),
    ("secrets", "rotate"): Case((), "takes no id", ("--actor", "")),
    ("statements", "import"): Case(("{statement}", "--rail", "mtn", "--profile", "sandbox"),
                                   ("{not_a_statement}", "--rail", "mtn", "--profile", "sandbox"),
                                   ("{statement}", "--rail", "bogus")),
    ("statements", "list"): Case((), "lists only", ("--limit", "0")),
    ("statements", "show"): Case(("st_x",), ("st_nope",), "any text is an id (an unknown one: 1)"),
    ("webhooks", "add"): Case(("--merchant", "m_exists", "--url", "http://127.0.0.1:9/h"),
                              ("--merchant", "NOPE", "--url", "http://127.0.0.1:9/h"),
                              ("--merchant", "m_exists", "--url", "ftp://127.0.0.1/h"),
                              env={"VPAY_WEBHOOKS_ALLOW_PRIVATE": "1"}),
    ("webhooks", "disable"): Case(("we_x",), ("we_nope",), "any text is an id (an unknown one: 1)"),
    ("webhooks", "enable"): Case(("we_x",), ("we_nope",), "any text is an id (an unknown one: 1)"),
    ("webhooks", "list"): Case((), ("--merchant", "NOPE"), "filters only"),
    ("webhooks", "redeliver"): Case(("evt_x", "--endpoint", "we_x"), ("evt_nope", "--endpoint", "we_nope"),
                                    "any text is an id (an unknown one: 1)"),
    ("webhooks", "rotate-secret"): Case(("we_x",), ("we_nope",), ("we_x", "--overlap-hours", "-1")),
    ("workers", "list"): Case((), "lists only", ("--state", "zombie")),
    ("worker",): Case((), "takes no id", ("--idle-sleep", "nan"),
                      "a real process: test_cli_errors.py::test_the_worker_with_the_database_down"),
}

SERVICES = {("api",), ("console",), ("demo",), ("sandbox-rail",), ("worker",)}
"""Commands that run rather than print data: no --json."""


def leaves(command: click.Command, path: tuple[str, ...] = ()):
    """``(path, command)`` of every command that runs (not a group) under ``command``."""
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from leaves(sub, path + (name,))
    else:
        yield path, command


TREE = dict(leaves(main))


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    statement = tmp_path / "statement.csv"
    statement.write_text("Date (UTC),Type,Reference ID,Financial Transaction ID,External ID,MSISDN,Amount,"
                         "Currency,Status,Reason\n2024-05-01T12:00:00Z,REQUEST_TO_PAY,"
                         "0b6f0e0c-0000-4000-8000-000000000001,9001,ext,256770000001,15.00,EUR,SUCCESSFUL,\n",
                         encoding="utf-8")
    junk = tmp_path / "junk.csv"
    junk.write_bytes(b"\xff\xfe\x00not a statement")
    return {"statement": str(statement), "not_a_statement": str(junk)}


@pytest.fixture
def invoke():
    """Run ``vpay-server ARGS`` in process; the root logger is put back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(args, env: dict[str, str]):
        os_env = __import__("os").environ
        # a clean VPAY_ environment but the run's own secret keys (tests/conftest.py)
        full_env = {k: None for k in os_env if k.startswith("VPAY_")} | {
            "VPAY_SECRET_KEYS": os_env["VPAY_SECRET_KEYS"]} | env
        try:
            return CliRunner().invoke(main, list(args), env=full_env)
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)
    return run


def fill(args, files):
    return [a.format(**files) for a in args]


def one_vpay_line(res) -> str:
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vpay: "), res.stderr
    assert "internal error" not in lines[0] and "Traceback" not in res.stderr
    assert res.stdout == "", res.stdout
    return lines[0]


def test_the_table_covers_every_command_of_the_click_tree():
    assert set(CASES) == set(TREE)


@pytest.mark.parametrize("path", sorted(TREE), ids=" ".join)
def test_a_bad_flag_is_a_usage_error_in_one_line(invoke, db_url, path, files):
    res = invoke([*path, *fill(CASES[path].ok, files), "--no-such-flag"], {"VPAY_DATABASE_URL": db_url})
    assert res.exit_code == 2, res.stderr
    assert "--no-such-flag" in one_vpay_line(res)


@pytest.mark.parametrize("path", sorted(p for p, c in CASES.items() if not isinstance(c.bad_value, str)),
                         ids=" ".join)
def test_a_bad_value_is_a_usage_error_in_one_line(invoke, db, db_url, path, files):
    case = CASES[path]
    res = invoke([*path, *fill(case.bad_value, files)], {"VPAY_DATABASE_URL": db_url, **case.env})
    assert res.exit_code == 2, res.stderr
    assert one_vpay_line(res).startswith("vpay: usage: ")


@pytest.mark.parametrize("path", sorted(p for p, c in CASES.items() if not isinstance(c.bad_id, str)),
                         ids=" ".join)
def test_a_bad_id_is_not_found_in_one_line_and_changes_nothing(invoke, db, db_url, path, files):
    from vpay.money.merchants import create_merchant
    create_merchant(db, "m_exists", "Exists")
    before = _counts(db)
    case = CASES[path]
    res = invoke([*path, *fill(case.bad_id, files)], {"VPAY_DATABASE_URL": db_url, **case.env})
    assert res.exit_code == 1, res.stderr
    one_vpay_line(res)
    assert _counts(db) == before


def _counts(db) -> dict[str, int]:
    tables = ("merchants", "merchant_api_keys", "payment_intents", "charges", "refunds", "jobs", "alerts",
              "webhook_endpoints", "statements")
    return {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}


@pytest.fixture(scope="module")
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


@pytest.mark.parametrize("path", sorted(p for p, c in CASES.items() if c.db is True), ids=" ".join)
def test_the_database_down_is_69_in_one_line_naming_host_and_port(invoke, path, files, closed_port):
    case = CASES[path]
    res = invoke([*path, *fill(case.ok, files)],
                 {"VPAY_DATABASE_URL": DOWN_URL.format(port=closed_port), **case.env})
    assert res.exit_code == 69, res.stderr
    line = one_vpay_line(res)
    assert line.startswith(f"vpay: database unavailable: nobody@127.0.0.1:{closed_port}/x: ") and \
        "refused" in line.lower(), line


def test_every_case_that_does_not_apply_says_why():
    for path, case in CASES.items():
        for value in (case.bad_id, case.bad_value, case.db):
            assert value is True or isinstance(value, tuple) or (isinstance(value, str) and value), path


# ---- --json on every data command --------------------------------------------

def test_every_command_that_prints_data_takes_json_and_only_services_do_not():
    with_json = {p for p, c in TREE.items() if any(o.name == "as_json" for o in c.params)}
    assert with_json == set(TREE) - SERVICES


def test_every_data_command_prints_valid_json(invoke, db, db_url, sandbox, files):
    env = {"VPAY_DATABASE_URL": db_url, "VPAY_WEBHOOKS_ALLOW_PRIVATE": "1", **rail_env(sandbox)}
    seen: dict[tuple[str, ...], object] = {}

    def ok(*args: str):
        path = next(p for p in TREE if tuple(args[:len(p)]) == p)
        res = invoke([*args, "--json"], env)
        assert res.exit_code == 0, (args, res.stderr)
        seen[path] = json.loads(res.stdout)
        return seen[path]

    ok("migrate")
    key = ok("merchants", "create", "--id", "m_json")
    ok("merchants", "create-key", "--id", "m_json")
    ok("merchants", "list")
    ok("merchants", "revoke-key", key["key_id"])
    endpoint = ok("webhooks", "add", "--merchant", "m_json", "--url", "http://127.0.0.1:9/h")
    ok("webhooks", "list")
    ok("webhooks", "disable", endpoint["id"])
    ok("webhooks", "enable", endpoint["id"])
    ok("webhooks", "rotate-secret", endpoint["id"], "--overlap-hours", "0")
    paid = ok("payments", "create", "--merchant", "m_json", "--amount", "1500", "--currency", "EUR",
              "--payer", "256770000001")
    charge = paid["charge"]["id"]
    ok("payments", "show", charge)
    event = db.execute("SELECT id FROM events ORDER BY created_at LIMIT 1").fetchone()[0]
    db.execute("DELETE FROM jobs WHERE kind IN ('fanout', 'deliver')")  # none in flight
    ok("webhooks", "redeliver", event, "--endpoint", endpoint["id"])
    ok("charges", "list", "--status", "pending")
    db.execute("INSERT INTO alerts (kind, charge_id, details) VALUES ('charge_unresolved', %s, '{}')", (charge,))
    ok("alerts", "list")
    ok("charges", "resolve", charge, "--outcome", "succeeded", "--evidence", "payer's receipt 42")
    ok("alerts", "ack", "--all-open", "--note", "resolved on the receipt")
    refund = ok("refunds", "create", "--charge", charge, "--amount", "500")
    ok("refunds", "show", refund["refund"]["id"])
    ok("jobs", "list")
    ok("jobs", "retry", "--all-dead")
    ok("jobs", "release", "--all-stranded")
    ok("workers", "list")
    ok("prune", "--older-than", "30d", "--dry-run")
    assert [r["rail"] for r in ok("rails", "list")][:1] == ["mtn"]
    imported = ok("statements", "import", files["statement"], "--rail", "mtn", "--profile", "sandbox", "--apply")
    ok("statements", "list")
    ok("statements", "show", imported["statement"])
    ok("operators", "create", "--email", "json@example.com", "--role", "viewer")
    ok("operators", "list")
    ok("operators", "disable", "--email", "json@example.com")
    assert ok("secrets", "new-key")["key"]
    assert ok("secrets", "rotate")["resealed"] >= 0
    assert set(seen) == set(TREE) - SERVICES


def test_tables_print_times_whole_in_utc_and_escape_control_characters(invoke, db, db_url):
    from vpay.cli.output import format_time, safe_text
    assert safe_text("a\x1b[31mred\x07\u202e") == "a\\x1b[31mred\\x07\\u202e"
    assert format_time("2024-05-01T14:00:03.987654+02:00") == "2024-05-01T12:00:03Z"
    from vpay.money.merchants import create_merchant
    create_merchant(db, "m_t", "evil \x1b[2J name")
    res = invoke(["merchants", "list"], {"VPAY_DATABASE_URL": db_url})
    assert res.exit_code == 0 and "\x1b" not in res.stdout and "\\x1b[2J" in res.stdout
    [created] = [line.split()[-3] for line in res.stdout.splitlines()[1:]]
    assert created.endswith("Z") and len(created) == len("2024-05-01T12:00:03Z")


@pytest.mark.parametrize("args, says", [
    (("jobs", "list", "--stranded", "--dead"), "--dead and --stranded exclude each other"),
    (("jobs", "list", "--dead", "--stranded", "--json"), "--dead and --stranded exclude each other"),
    (("jobs", "retry", "1", "--kind", "poll"), "--kind narrows --all-dead; with job ids it would be ignored"),
    (("jobs", "retry", "1", "--lane", "mtn", "--kind", "poll"), "--kind and --lane narrow --all-dead"),
    (("alerts", "ack", "1", "--kind", "charge_unresolved", "--note", "x"),
     "--kind narrows --all-open; with alert ids it would be ignored"),
], ids=" ".join)
def test_filters_that_exclude_each_other_or_would_be_ignored_are_a_usage_error(invoke, db, db_url, args, says):
    # `jobs list --stranded --dead` printed nothing, exit 0; `jobs retry 1 --kind poll`
    # retried job 1 whatever its kind.
    from vpay.engine import queue
    queue.enqueue(db, "test.count", "k:1", lane="housekeeping")
    before = _counts(db)
    res = invoke(list(args), {"VPAY_DATABASE_URL": db_url})
    assert res.exit_code == 2, res.stderr
    assert says in one_vpay_line(res)
    assert _counts(db) == before
