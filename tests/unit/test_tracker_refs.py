"""No reference to the project's own tracker in the code, docs, benches or tests: a number like
that tells the next reader nothing, so a comment, docstring or page says what the code does and
why in its own words (or links the docs/ page). Another project's tracker, written
``owner/repo#123``, is fine: the pattern below does not match it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("farm", "workers", "registry", "infra", "migrations", "docs", "bench", "tests", "README.md", "mkdocs.yml")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules", "site"}
# The word, a space, then a number with or without "#" (as `grep -rniE "issues? #?[0-9]+"`).
TRACKER = re.compile(r"issues? #?[0-9]+", re.IGNORECASE)
W = "issue"  # the examples below are built from it, so that this file passes its own scan


def text_files() -> list[Path]:
    """Every text file under SCANNED (binary files and caches left out)."""
    found = []
    for name in SCANNED:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            rel = path.relative_to(ROOT).parts
            if not path.is_file() or any(p in SKIPPED_DIRS or p.startswith(".") for p in rel[:-1]):
                continue
            found.append(path)
    return found


def references(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``file:line: text`` (``file`` relative to ``root``) for each line that names a tracker number."""
    hits = []
    for path in paths:
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if TRACKER.search(line):
                hits.append(f"{path.relative_to(root)}:{number}: {line.strip()[:160]}")
    return hits


@pytest.mark.parametrize(("line", "found"), [
    (f"# see {W} 23 for why", True), (f"({W}s 31, 33)", True), (f"{W.title()} #7: the fix", True),
    ("onnx/onnx#6123 upstream", False), ("the issue is 2 bytes", False), ("issue33_targets", False),
])
def test_the_pattern_finds_tracker_numbers_and_nothing_else(line: str, found: bool) -> None:
    assert bool(TRACKER.search(line)) is found


def test_the_walk_sees_every_scanned_tree_and_a_planted_reference(tmp_path: Path) -> None:
    # The test below asserts an absence: first show that it would see a presence.
    paths = text_files()
    for name in SCANNED:
        assert any(p == ROOT / name or ROOT / name in p.parents for p in paths), name
    (tmp_path / "planted.py").write_text(f"x = 1\n# fixed in {W} 12\n")
    (tmp_path / "blob.bin").write_bytes(f"\0{W} 12".encode())
    assert references(sorted(tmp_path.iterdir()), tmp_path) == [f"planted.py:2: # fixed in {W} 12"]


def test_no_tracker_numbers_in_the_project() -> None:
    hits = references(text_files())
    assert not hits, "tracker numbers; say what and why instead:\n" + "\n".join(hits)
