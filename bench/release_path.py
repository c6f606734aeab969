"""Import one release of vpay from its source tree, laid out as an install
lays it out (bench only; ``bench/charges.py --against``).

setup.py ships the top-level ``sql/`` folder as ``vpay.sql`` (and
``sql/queries`` as ``vpay.sql.queries``); a source tree on ``sys.path``
alone has no ``vpay/sql``. ``install(root)`` puts ``root`` first on
``sys.path`` and maps those two packages to ``root``'s folders, as the
editable install's finder does, so a release older than this checkout runs
with its own code and its own SQL. Run in an interpreter started with
``-S``: the installed, editable ``vpay`` of this checkout is then not seen.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

ENV = "VPAY_BENCH_RELEASE_ROOT"
"""The source tree of the release a measurement's process runs."""


class _SqlFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path):
        self.folders = {"vpay.sql": root / "sql", "vpay.sql.queries": root / "sql" / "queries"}

    def find_spec(self, name, path=None, target=None):
        folder = self.folders.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def install(root: str | None = None) -> Path:
    """Make ``import vpay`` load the release at ``root`` (default: ``$ENV``)."""
    path = Path(root or os.environ[ENV]).resolve()
    sys.path.insert(0, str(path))
    sys.meta_path.insert(0, _SqlFinder(path))
    return path
