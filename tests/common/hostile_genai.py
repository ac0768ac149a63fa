"""Hostile genai export folders, made from what the farm says it checks: every key of
``farm.core.genai_schema``'s spec given values of the wrong JSON type or out of range (so a key
added to the spec is attacked without touching the tests), and every file of an export replaced
by a filesystem oddity (a symlink loop, a dangling symlink, a FIFO, a device, a folder)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from farm.core import jsonspec

NAN, INF = float("nan"), float("inf")
STAGE = "lm_head"  # a stage every export has: the stage keys are attacked on it
UNKNOWN = "x_key"  # a key of an object that takes any key (its ``other`` spec)


def bad_values(spec: jsonspec.Spec) -> list[Any]:
    """Values ``spec`` must refuse: the wrong JSON types, NaN and infinities, the bounds' outsides."""
    if isinstance(spec, jsonspec.Null):
        return bad_values(spec.spec)
    if isinstance(spec, jsonspec.Int):
        return [str(spec.lo + 1), [spec.lo + 1], NAN, INF, -INF, True, spec.lo - 1, spec.hi + 1, spec.lo + 0.5, {}]
    if isinstance(spec, jsonspec.Num):
        return [str(spec.lo), [spec.lo], NAN, INF, -INF, True, spec.hi * 2 + 1, spec.lo * 2 - 1]
    if isinstance(spec, jsonspec.Bool):
        return [1, 0, "true", [True], NAN]
    if isinstance(spec, jsonspec.Str):
        out: list[Any] = [5, ["x"], NAN, True, "x" * (spec.max_len + 1), "a\nb"]
        return out + (["not-one-of-them"] if spec.choices else []) + (["../x"] if spec.pattern else [])
    if isinstance(spec, jsonspec.Either):
        return [{"an": "object"}, NAN, [[1]]]
    if isinstance(spec, jsonspec.Obj):
        return [[], "x", 1, NAN]
    if isinstance(spec, jsonspec.Arr):
        return [{}, "x", NAN, [None] * (spec.max_len + 1)]
    return []


def spec_cases(spec: jsonspec.Spec, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """(path, bad value) for every key ``spec`` describes, nested ones included: a list's first
    item, an object's other keys under ``UNKNOWN``, the pipeline's stages under ``STAGE``."""
    if isinstance(spec, jsonspec.Null):
        yield from spec_cases(spec.spec, path)
        return
    for v in bad_values(spec):
        yield path, v
    if isinstance(spec, jsonspec.Obj):
        for k, sub in spec.keys.items():
            yield from spec_cases(sub, (*path, k))
        if spec.other is not None and not isinstance(spec.other, jsonspec.Anything):
            key = STAGE if path[-2:] == ("pipeline", 0) else "qnn" if path[-2:-1] == ("provider_options",) else UNKNOWN
            yield from spec_cases(spec.other, (*path, key))
    elif isinstance(spec, jsonspec.Arr):
        yield from spec_cases(spec.item, (*path, 0))


def put(doc: Any, path: tuple[str | int, ...], value: Any) -> None:
    """``doc`` with ``value`` at ``path``, the containers on the way made as needed."""
    for i, k in enumerate(path[:-1]):
        nxt: Any = [] if isinstance(path[i + 1], int) else {}
        if isinstance(k, int):
            while len(doc) <= k:
                doc.append(nxt)
            if not isinstance(doc[k], type(nxt)):
                doc[k] = nxt
        elif not isinstance(doc.get(k), type(nxt)):
            doc[k] = nxt
        doc = doc[k]
    last = path[-1]
    if isinstance(last, int):
        while len(doc) <= last:
            doc.append(None)
    doc[last] = value


def linked_copy(src: Path, dest: Path) -> Path:
    """``src``'s files hard-linked into ``dest`` (cheap; ``genai_config.json`` copied, to be edited)."""
    dest.mkdir(parents=True)
    for p in src.iterdir():
        if p.name == "genai_config.json":
            shutil.copy2(p, dest / p.name)
        else:
            os.link(p, dest / p.name)
    return dest


def write_config(folder: Path, doc: Any) -> None:
    """Python's json writes NaN/Infinity literals: what a hostile exporter leaves."""
    (folder / "genai_config.json").write_text(json.dumps(doc, indent=1, allow_nan=True))


ODDITIES = ("symlink loop", "dangling symlink", "fifo", "device", "folder", "chain loop")


def make_odd(path: Path, kind: str) -> None:
    """Replace the file at ``path`` by a filesystem oddity of ``kind`` (one of ``ODDITIES``)."""
    path.unlink()
    if kind == "symlink loop":
        os.symlink(path.name, path)
    elif kind == "chain loop":  # a -> a.other -> a
        os.symlink(path.name + ".other", path)
        os.symlink(path.name, path.with_name(path.name + ".other"))
    elif kind == "dangling symlink":
        os.symlink(path.name + ".gone", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.symlink("/dev/zero", path)
    elif kind == "folder":
        path.mkdir()
    else:
        raise ValueError(kind)
