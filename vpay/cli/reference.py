"""docs/cli.md, written from the click tree: every command, its options, what
it prints and its exit codes. ``python -m vpay.cli.reference > docs/cli.md``
rewrites it; tests/unit/test_cli_docs.py fails when the page and the tree differ.
"""

from __future__ import annotations

from typing import Iterator

import click

from vpay.cli.errors import EX_CONFIG, EX_DATA, EX_OK, EX_SOFTWARE, EX_UNAVAILABLE, EX_USAGE, EXIT_CODES

SERVICES = {"api": "a service: gunicorn; its JSON log on stdout (journald)",
            "worker": "a service: its JSON log on stdout (journald); one `vpay:` line on stderr if it cannot boot",
            "sandbox-rail": "a service: `{\"url\": …}` on stderr once it listens, then serves until SIGTERM",
            "demo": "a report for a person: what ran, one row per charge"}

NO_DATA_REFUSAL = {"migrate", "merchants list", "jobs list", "alerts list", "charges list", "statements list",
                   "prune", "api", "sandbox-rail", "worker"}
"""Commands that cannot answer 1 (no id, nothing the data refuses); the worker's 1 is a drain not clean."""

WHY_1 = {"worker": "a drain not clean: the grace ran out (or a second signal) with jobs in flight, jobs whose "
                   "outcome could not be written were still leased, or the worker id was taken over by another "
                   "process; the leases still held were handed back if the database answered, else they "
                   "stay until reaped",
         "demo": "--database exists and was not made by the demo (nothing touched)",
         "statements import": "the file cannot be a statement (nothing written)"}
WHY_69 = {"api": "the address cannot be listened on (the database is not contacted at start)",
          "sandbox-rail": "the port cannot be listened on",
          "worker": "the database is unreachable at boot, or the metrics port cannot be listened on"}

HEADER = """# Commands

Written from the click tree by `python -m vpay.cli.reference > docs/cli.md`
(tests/unit/test_cli_docs.py fails when they differ). Every command follows the
same rules:

- **Output**: a command that prints data prints a table for people, or JSON
  with `--json` for scripts (stdout holds only that; notices and logs go to
  stderr). Times are whole and in UTC: `2024-05-01T12:00:03Z` in a table,
  ISO 8601 with `+00:00` in JSON. Control characters in a table's cells are
  escaped (`\\x1b`), never sent to the terminal.
- **Failures**: exactly one line on stderr starting `vpay:`, never a
  traceback, and nothing else unless `--log-level` asks for the log (at
  `DEBUG` the trace too). Operator actions (`jobs retry`, `alerts ack`, keys
  issued or revoked, `prune`) also log one JSON audit line on stderr.
- **The database**: every command and the worker open it the same way:
  at most `VPAY_DATABASE_OPEN_TIMEOUT_SECONDS` (30) for a server that does not
  answer, at once for one that refuses; the line names `user@host:port/db`
  and the cause (exit 69).
- **Durations** take a unit: `30s`, `15m`, `24h`, `90d`. A bare number is
  refused with a hint (`prune --older-than 24`: hours, days?), except by a
  flag whose name says its unit (`--lease-seconds 300`, `--overlap-hours 24`,
  `--lag-minutes 60`), which takes either.

| exit code | means |
|---|---|
""" + "".join(f"| {code} | {what} |\n" for code, what in EXIT_CODES.items())


def leaves(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """``(path, command)`` of every command that runs (not a group), in name order."""
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from leaves(sub, path + (name,))
    else:
        yield path, command


def exit_codes(name: str, command: click.Command) -> dict[int, str]:
    """The exit codes ``vpay-server NAME`` may give, with what each means there."""
    codes = {EX_OK: "done" if name not in ("worker",) else "a clean drain"}
    if name not in NO_DATA_REFUSAL or name == "worker":
        codes[EX_DATA] = WHY_1.get(name, EXIT_CODES[EX_DATA])
    codes[EX_USAGE] = EXIT_CODES[EX_USAGE]
    codes[EX_UNAVAILABLE] = WHY_69.get(name, "the database is unavailable")
    codes[EX_SOFTWARE] = EXIT_CODES[EX_SOFTWARE]
    codes[EX_CONFIG] = EXIT_CODES[EX_CONFIG]
    return codes


def _option(param: click.Parameter) -> str:
    if isinstance(param, click.Argument):
        return f"| `{param.human_readable_name}` | argument{'s' if param.nargs != 1 else ''} |"
    names = ", ".join(f"`{o}`" for o in param.opts)
    text = " ".join((getattr(param, "help", None) or "").split()).replace("|", "\\|")
    if getattr(param, "required", False):
        text = "required. " + text
    return f"| {names} | {text} |"


def render() -> str:
    """docs/cli.md as it must read."""
    from vpay.cli import main
    out = [HEADER]
    for path, command in leaves(main):
        name = " ".join(path)
        ctx = click.Context(command, info_name=f"vpay-server {name}")
        out.append(f"\n## vpay-server {name}\n\n")
        if name == "worker":
            out.append("Also `vpay-worker` (the same command under its own name; `--version`).\n\n")
        out.append(f"```\n{command.get_usage(ctx)}\n```\n\n")
        out.append((command.help or "").split("\f")[0].strip() + "\n\n")
        shown = [p for p in command.params if not getattr(p, "hidden", False)]
        if shown:
            out.append("| option | |\n|---|---|\n")
            out.extend(_option(p) + "\n" for p in shown)
            out.append("\n")
        prints = SERVICES.get(name, "a table, or JSON with `--json`")
        out.append(f"Prints: {prints}.\n\n")
        codes = exit_codes(name, command)
        out.append("Exit codes: " + "; ".join(f"{c} {w}" for c, w in codes.items()) + ".\n")
    return "".join(out)


if __name__ == "__main__":
    click.echo(render(), nl=False)
