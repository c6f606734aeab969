"""Named queries are sent without their comment lines (issue 30;
``vpay.base.queries.sent_text``), and dropping them changes no SQL."""

from __future__ import annotations

import re

from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from vpay.base import queries
from vpay.base.queries import Q, sent_text

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def _bodies() -> dict[str, str]:
    out = {}
    for entry in (queries.sql_root() / "queries").iterdir():
        if entry.name.endswith(".sql"):
            parts = _NAME.split(entry.read_text(encoding="utf-8"))
            out.update(zip(parts[1::2], parts[2::2]))
    return out


def _comment_lines_outside_strings(body: str) -> list[int]:
    """Indexes of the lines ``sent_text`` drops, each checked to start
    outside a string literal (a line inside one would be SQL, not a comment)."""
    dropped, quoted = [], False
    for i, line in enumerate(body.splitlines()):
        if not quoted and line.lstrip().startswith("--"):
            dropped.append(i)
            continue
        assert not (quoted and line.lstrip().startswith("--")), f"a string literal spans line {i}: {line!r}"
        j = 0
        while j < len(line):
            c = line[j]
            if not quoted and line.startswith("--", j):
                break  # the rest of the line is a comment: its quotes are prose
            if c == "'":
                quoted = not quoted
            j += 1
    assert not quoted, "an unterminated string literal"
    return dropped


def test_a_named_query_is_sent_without_its_comment_lines():
    body = "-- why\nSELECT 1 -- kept: on a line with SQL\n  -- indented, dropped\nFROM t;\n"
    assert sent_text(body) == "SELECT 1 -- kept: on a line with SQL\nFROM t;"


def test_every_dropped_line_of_every_named_query_is_a_comment_and_only_those_are_dropped():
    bodies = _bodies()
    assert set(bodies) == set(Q)
    for name, body in bodies.items():
        dropped = set(_comment_lines_outside_strings(body))
        kept = [line for i, line in enumerate(body.splitlines()) if i not in dropped]
        assert Q[name] == "\n".join(kept).strip(), name
        assert not any(line.lstrip().startswith("--") for line in Q[name].splitlines()), name


def test_every_named_query_is_short_enough_for_psycopg_to_cache_and_prepare():
    # psycopg converts (and so can prepare) only queries up to this many bytes
    long = {name: len(text.encode()) for name, text in Q.items()
            if len(text.encode()) > MAX_CACHED_STATEMENT_LENGTH}
    assert long == {}
