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


def on_pre_build(config: Any) -> None:
    _cache.clear()  # `mkdocs serve` rebuilds: render again from the code as it is now


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return MARKER.sub(lambda m: _render(m.group(1)), markdown)
