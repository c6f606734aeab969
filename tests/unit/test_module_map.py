"""docs/architecture.md's module map is the package's own module docstrings
(issue 22): a module missing from the map, a stale row, a module without a
docstring, or a link in docs/ to a file outside the repository fails here."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import module_map  # noqa: E402


def test_every_module_has_a_docstring_and_the_map_in_the_docs_is_the_generated_one():
    assert module_map.current() is not None, "docs/architecture.md has no module map markers"
    assert module_map.current() == module_map.render(), (
        "docs/architecture.md's module map is stale: run `python tools/module_map.py --write`")


def test_the_map_names_every_module_of_the_package():
    listed = set(re.findall(r"\| `(vpay/[^`]+\.py)` \|", module_map.current()))
    on_disk = {str(p.relative_to(ROOT)) for p in module_map.modules()}
    assert on_disk - listed == set()
    assert listed - on_disk == set()


def test_a_new_module_without_a_row_would_fail(tmp_path, monkeypatch):
    package = tmp_path / "vpay"
    (package / "engine").mkdir(parents=True)
    (package / "engine" / "new.py").write_text('"""A new concern."""\n')
    monkeypatch.setattr(module_map, "PACKAGE", package)
    monkeypatch.setattr(module_map, "ROOT", tmp_path)
    assert "`vpay/engine/new.py` | A new concern." in module_map.render()
    assert module_map.render() != module_map.current()


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_links_in_the_docs_point_at_files_in_the_repository():
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_no_doc_points_at_the_steering_repository_instead_of_its_copy_in_docs():
    offenders = [str(p.relative_to(ROOT)) for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
                 if p.parent.name != "design" and re.search(r"(?<![\w/])shared/(seeds|design)/", p.read_text())]
    assert offenders == []
