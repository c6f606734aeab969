"""The output layer of every command that prints data: a table for people,
JSON with ``--json`` for scripts.

* ``json_option``: the ``--json`` flag, the same on every data command.
* ``emit(data, as_json, columns=…)``: a list of rows is a table (a header of
  upper-case column names, one line per row, ``(none)`` when empty); one
  object (a dict) is a record: ``FIELD  value`` lines, then each of its
  lists (``charges``, ``events``, ``keys``) as a table under its name.
* Times are printed whole, in UTC, the same way everywhere: in a table
  ``2024-05-01T12:00:03Z`` (``format_time``); in JSON ISO 8601 in UTC with
  the offset (``2024-05-01T12:00:03.123456+00:00``), never cut.
* Every cell of a table goes through ``safe_text``: control characters
  (an ESC from a rail's text or a statement line) are escaped, never sent
  to the terminal; free-text columns are cut at 60 characters, ids never.

Logs and notices go to stderr, so stdout is the table or the JSON alone.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, Mapping, Sequence

import click

TEXT_COLUMNS = ("last_error", "details", "note", "reason", "description", "evidence", "url",
                "failure_code", "message")
"""Free-text columns, cut at 60 characters in a table (ids never are)."""

_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?([+-]\d{2}:?\d{2}|Z)?$")


def json_option(fn):
    """``--json``: print JSON instead of a table (for scripts)."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(fn)


_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and line feed, DEL, C1 controls (an 8-bit CSI
among them), and the Unicode bidirectional overrides that reorder what a
line appears to say (CVE-2021-42574, "Trojan Source")."""
_BREAKS = re.compile("[\t\n]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe_text(value: object, *, one_line: bool = True) -> str:
    """``value`` as text a terminal shows literally: control characters and
    bidirectional overrides written as ``\\x1b`` / ``\\u202e``; with
    ``one_line`` (the default, for a table cell or a ``vpay:`` line) tab and
    line feed too. ``None`` is ``""``."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    text = _UNSAFE.sub(_escape, text)
    if one_line:
        text = _BREAKS.sub(_escape, text)
    return text

def as_utc(value: datetime) -> datetime:
    """``value`` in UTC (a naive datetime is taken as UTC already)."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def format_time(value: datetime | str) -> str:
    """A time for a table: whole seconds, UTC, ``2024-05-01T12:00:03Z``.
    An ISO 8601 string is read first (rows made JSON-ready upstream)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return as_utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return as_utc(value).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def echo_json(doc: Any) -> None:
    """``doc`` as indented JSON on stdout (times as UTC ISO 8601)."""
    click.echo(json.dumps(doc, indent=2, default=_json_default))


def _cell(value: Any, column: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime) or (isinstance(value, str) and _ISO.match(value)):
        try:
            return format_time(value)
        except ValueError:
            pass
    if isinstance(value, (dict, list)):
        value = json.dumps(value, default=_json_default, ensure_ascii=False)
    text = safe_text(" ".join(str(value).split()))
    return text if len(text) <= 60 or column not in TEXT_COLUMNS else text[:59] + "…"


def echo_text(text: str) -> None:
    """A report already laid out for a person (``statements`` render their
    own): each line through ``safe_text``, so it cannot drive the terminal either."""
    click.echo("\n".join(safe_text(line.replace("\t", " ")) for line in text.split("\n")))


def echo_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """``rows`` as a plain text table of ``columns`` (a header, then one line
    per row), or ``(none)``."""
    if not rows:
        click.echo("(none)")
        return
    cells = [[_cell(r.get(c), c) for c in columns] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip())
    for line in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())


def echo_record(doc: Mapping[str, Any], fields: Sequence[str] | None = None,
                tables: Mapping[str, tuple[Sequence[Mapping[str, Any]], Sequence[str]]] | None = None) -> None:
    """One object for a person: ``FIELD  value`` lines for ``fields``
    (default: every key whose value is not a list), then each of ``tables``
    (``{title: (rows, columns)}``) as a table under its title."""
    if fields is None:
        fields = [k for k, v in doc.items() if not isinstance(v, list)]
    width = max((len(f) for f in fields), default=0)
    for f in fields:
        click.echo(f"{f.upper().ljust(width)}  {_cell(doc.get(f), f)}".rstrip())
    for title, (rows, columns) in (tables or {}).items():
        click.echo("")
        click.echo(f"{title.upper()}:")
        echo_table(list(rows), columns)


def emit(data: Any, as_json: bool, columns: Sequence[str] | None = None, done: str | None = None) -> None:
    """What a data command answers: ``data`` as JSON (``--json``), else a
    list as a table of ``columns`` (default: the first row's keys) or a dict
    as a record. For a table, ``done`` (a past-tense verb) is followed by the
    row count on stderr (``retried 3``), so stdout stays the table alone."""
    if as_json:
        echo_json(data)
        return
    if isinstance(data, Mapping):
        echo_record(data)
        return
    rows = list(data)
    echo_table(rows, columns or (list(rows[0]) if rows else ["-"]))
    if done is not None:
        click.echo(f"{done} {len(rows)}", err=True)


def echo_rows(rows: list[dict[str, Any]], columns: Sequence[str], as_json: bool,
              done: str | None = None) -> None:
    """``emit`` for a list of rows (kept for the operator commands)."""
    emit(rows, as_json, columns, done)
