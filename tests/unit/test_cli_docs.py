"""docs/cli.md is the click tree: every command, its options, what it prints
and its exit codes (vpay/cli/reference.py writes it), and the exit codes it
names agree with what the table-driven test makes each command give."""

from __future__ import annotations

from pathlib import Path

from test_cli_contract import CASES, TREE
from vpay.cli.reference import exit_codes, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_written_from_the_click_tree():
    assert DOC.read_text(encoding="utf-8") == render(), \
        "docs/cli.md differs from the commands: python -m vpay.cli.reference > docs/cli.md"


def test_every_command_has_its_section_and_the_codes_it_is_tested_for():
    text = DOC.read_text(encoding="utf-8")
    for path, command in TREE.items():
        name = " ".join(path)
        assert f"\n## vpay-server {name}\n" in text, name
        codes = exit_codes(name, command)
        case = CASES[path]
        assert 2 in codes and 69 in codes and 70 in codes and 78 in codes, name
        if isinstance(case.bad_id, tuple):
            assert 1 in codes, f"{name}: a bad id exits 1, the page must say so"


def test_the_lane_options_name_every_registered_lane():
    # The help was written by hand and missed mpesa and pawapay: it comes
    # from the lanes registry now.
    import click

    from vpay.cli import main
    from vpay.engine import lanes
    assert {"mpesa", "pawapay", "webhooks", "housekeeping"} <= set(lanes.LANES)
    ctx = click.Context(main)
    helps = {
        "jobs list --lane": main.commands["jobs"].commands["list"],
        "worker --queues": main.commands["worker"],
    }
    for where, command in helps.items():
        option = next(p for p in command.params if p.name == where.split("--")[1].replace("-", "_"))
        record = option.get_help_record(ctx)[1]
        assert ", ".join(lanes.LANES) in record, (where, record)
    text = DOC.read_text(encoding="utf-8")
    assert text.count(", ".join(lanes.LANES)) >= 2
