"""MkDocs hook (``hooks:`` in mkdocs.yml): fills each ``<!-- gen:NAME -->`` marker of a page with
the Markdown ``docs/gen/render.py`` makes from the code at build time (the CLI parser, the error
module, the service's OpenAPI document, the state machine, the import contracts, bench/out/*.json).
Nothing generated is checked in, so nothing generated can be stale."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- gen:([a-z-]+) -->$", re.M)
_cache: dict[str, str] = {}


def _render(name: str) -> str:
    for path in (str(ROOT), str(Path(__file__).resolve().parent)):
        if path not in sys.path:
            sys.path.insert(0, path)
    import render

    if name not in render.BLOCKS:
        raise ValueError(f"unknown generated block {name!r}; known: {', '.join(sorted(render.BLOCKS))}")
    if name not in _cache:
        _cache[name] = render.BLOCKS[name]()
    return _cache[name]


def _listed(node: Any) -> set[str]:
    if isinstance(node, str):
        return {node}
    if isinstance(node, list):
        return set().union(*(_listed(n) for n in node)) if node else set()
    if isinstance(node, dict):
        return set().union(*(_listed(v) for v in node.values())) if node else set()
    return set()


def on_config(config: Any) -> Any:
    """A page added to docs/ without a place in mkdocs.yml's nav still gets one, under "More": each
    feature writes its own docs/<topic>.md, and a page no one can reach is no documentation."""
    nav = config.get("nav")
    if nav is None:
        return config
    docs = Path(config["docs_dir"])
    listed = _listed(nav)
    extra = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md")
                   if "gen" not in p.relative_to(docs).parts and p.relative_to(docs).as_posix() not in listed)
    if extra:
        nav.append({"More": extra})
    return config


def on_pre_build(config: Any) -> None:
    _cache.clear()  # `mkdocs serve` rebuilds: render again from the code as it is now


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return MARKER.sub(lambda m: _render(m.group(1)), markdown)
