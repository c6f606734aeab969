"""Named SQL queries, loaded once from ``sql/queries/*.sql``.

Each file holds blocks that start with a ``-- name: <name>`` line, in the
style of procrastinate's ``queries.sql``: a reader finds every query the
project runs in one folder. ``Q["claim_lane"]`` is the text of the block named
``claim_lane``; names are unique across files (a duplicate raises at import).
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
            queries[name] = body.strip()
    return queries


Q: dict[str, str] = _load()
