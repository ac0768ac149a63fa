"""Every docs page a hint or message names exists (a user told to read docs/genai.md found no
such page), and every page under docs/ is reachable: linked from the README or in mkdocs.yml's nav."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC_REF = re.compile(r"docs/[A-Za-z0-9_./-]+?\.md")


def _sources() -> Iterator[Path]:
    yield ROOT / "farm" / "core" / "errors.py"
    for package in ("farm", "registry", "workers"):
        yield from sorted((ROOT / package).rglob("*.py"))


def test_every_docs_page_the_code_names_exists() -> None:
    named: dict[str, set[str]] = {}
    for path in _sources():
        for ref in DOC_REF.findall(path.read_text()):
            named.setdefault(ref, set()).add(path.relative_to(ROOT).as_posix())
    assert "docs/errors.md" in named  # the scan reads the hints (errors.py names this page)
    missing = {ref: sorted(where) for ref, where in named.items() if not (ROOT / ref).is_file()}
    assert missing == {}, missing


def test_the_hints_errors_carry_name_pages_that_exist() -> None:
    """The same for the hints as the error classes build them (a default hint may be assembled)."""
    from farm.core import errors

    hints = [getattr(cls, "default_hint", "") or "" for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.FarmError)]
    refs = {ref for h in hints for ref in DOC_REF.findall(h)}
    assert refs and all((ROOT / ref).is_file() for ref in refs), sorted(r for r in refs if not (ROOT / r).is_file())


def nav_pages() -> set[str]:
    """Every page mkdocs.yml's nav names (its !!python tags ignored: only the nav is read)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)

    def pages(node: object) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from pages(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from pages(value)

    return set(pages(config["nav"]))


def test_every_docs_page_is_linked_from_the_readme_and_in_the_nav() -> None:
    readme = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", (ROOT / "README.md").read_text()))
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert on_disk - {r.removeprefix("docs/") for r in readme} == set(), "README's docs list lacks these pages"
    assert on_disk - nav_pages() == set(), "mkdocs.yml's nav lacks these pages"
