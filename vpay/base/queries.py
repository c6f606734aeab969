"""Named SQL queries, loaded once from ``sql/queries/*.sql``.

Each file holds blocks that start with a ``-- name: <name>`` line, in the
style of procrastinate's ``queries.sql``: a reader finds every query the
project runs in one folder. ``Q["claim_lane"]`` is the text of the block named
``claim_lane`` as it is sent: its whole-line ``--`` comments dropped
(``sent_text``); names are unique across files (a duplicate raises at import).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def sql_root():
    """The shipped ``sql/`` folder: ``vpay.sql`` when installed; the source
    tree's ``sql/`` when ``vpay`` is imported from a checkout that is not
    the installed copy (``python -m pytest`` from the repo root)."""
    try:
        return resources.files("vpay.sql")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "sql"  # vpay/base/queries.py → the checkout


def _load() -> dict[str, str]:
    queries: dict[str, str] = {}
    folder = sql_root() / "queries"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        parts = _NAME.split(text)
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2]):
            if name in queries:
                raise RuntimeError(f"query {name!r} is defined twice (second time in {entry.name})")
            queries[name] = sent_text(body)
    return queries


def sent_text(body: str) -> str:
    """A named query's text as it goes to Postgres: every line that is only a
    ``--`` comment dropped (the comments are for the reader of the .sql file;
    a comment on the same line as SQL is kept). Shorter text costs every
    unprepared run its bytes on the wire and its parse, and psycopg caches
    the conversion of a query's ``%(name)s`` placeholders, and so prepares it,
    only up to ``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH`` (4096) bytes
    (issue 30). No named query has a string literal spanning a line that
    starts with ``--`` (tests/unit/test_queries_sent.py)."""
    kept = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
    return "\n".join(kept).strip()


Q: dict[str, str] = _load()
