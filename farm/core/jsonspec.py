"""A declarative checker for JSON documents that come from outside (an exporter's
``genai_config.json``, tokenizer files): what each key may hold is data (``Obj``, ``Arr``,
``Int``...), one walk checks a document against it, and the first value out of place is named
by its JSON path (``model.decoder.pipeline[0].context_0.filename``) with what it should be.

``loads`` parses strictly: the NaN/Infinity/-Infinity literals Python's json accepts (no JSON
has them) and a key given twice in one object (parsers disagree on which one counts) are
refused. Nothing here knows about genai:
``farm.core.genai_schema`` holds its spec.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class SpecError(ValueError):
    """A value out of place: ``path`` (its JSON path) and ``problem`` (what it is, and should be)."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path or '(the document)'}: {problem}")
        self.path, self.problem = path, problem


def shown(v: Any) -> str:
    """A value as a message shows it: JSON, at most 60 characters."""
    try:
        s = json.dumps(v, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError):
        s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the key {shown(k)} is given twice in one object")
        out[k] = v
    return out


def loads(raw: bytes) -> Any:
    """Strict JSON from UTF-8 bytes: ValueError (UnicodeError, json's; RecursionError for absurd
    nesting) for what is not JSON or gives a key twice in one object; ``SpecError`` naming the
    JSON path of a NaN/Infinity literal (Python's json takes them; JSON has no such number)."""
    seen: list[str] = []

    def constant(name: str) -> float:
        seen.append(name)
        return float(name.replace("Infinity", "inf"))

    doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=constant)
    if seen:  # walked only then: a large tokenizer.json is parsed at C speed and not walked again
        stack: list[tuple[Any, tuple[str | int, ...]]] = [(doc, ())]
        while stack:
            v, path = stack.pop()
            if isinstance(v, dict):
                stack.extend((x, (*path, k)) for k, x in v.items())
            elif isinstance(v, list):
                stack.extend((x, (*path, i)) for i, x in enumerate(v))
            elif isinstance(v, float) and not math.isfinite(v):
                raise SpecError(json_path(path), f"{shown(v)} is not a JSON number (NaN and infinities are not JSON)")
    return doc


def _key_path(path: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{shown(key)}]"


def json_path(parts: Sequence[str | int]) -> str:
    """The JSON path a ``SpecError`` names for these keys and list indices."""
    out = ""
    for p in parts:
        out = f"{out}[{p}]" if isinstance(p, int) else _key_path(out, p)
    return out


# ---- the vocabulary of a spec ----------------------------------------------------------------------

class Spec:
    """What a value may be. ``check(value, path)`` raises ``SpecError`` or returns None."""

    def check(self, value: Any, path: str) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Spec):
    """An integer (never a bool, never 64.0) in [lo, hi]."""

    lo: int = -(1 << 31)
    hi: int = (1 << 31) - 1

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not self.lo <= value <= self.hi:
            raise SpecError(path, f"{shown(value)} is not an integer from {self.lo} to {self.hi}")


@dataclass(frozen=True)
class Num(Spec):
    """A finite number (never a bool) in [lo, hi]."""

    lo: float = -1e9
    hi: float = 1e9

    def check(self, value: Any, path: str) -> None:
        if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
                or not self.lo <= value <= self.hi):
            raise SpecError(path, f"{shown(value)} is not a number from {self.lo:g} to {self.hi:g}")


@dataclass(frozen=True)
class Bool(Spec):
    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, bool):
            raise SpecError(path, f"{shown(value)} is not true or false")


@dataclass(frozen=True)
class Str(Spec):
    """A string of at most ``max_len`` characters, none of them a control character; matching
    ``pattern`` (described by ``what``) when given; one of ``choices`` when given."""

    max_len: int = 256
    pattern: re.Pattern[str] | None = None
    what: str = ""
    choices: tuple[str, ...] = ()

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, str) or len(value) > self.max_len or any(ord(c) < 32 for c in value):
            raise SpecError(path, f"{shown(value)} is not a string of at most {self.max_len} printable characters")
        if self.choices and value not in self.choices:
            raise SpecError(path, f"{shown(value)} is not one of {', '.join(map(shown, self.choices))}")
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise SpecError(path, f"{shown(value)} is not {self.what or 'allowed'}")


@dataclass(frozen=True)
class Arr(Spec):
    """A list of ``min_len`` to ``max_len`` items, each an ``item``."""

    item: Spec
    min_len: int = 0
    max_len: int = 4096

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or not self.min_len <= len(value) <= self.max_len:
            raise SpecError(path, f"{shown(value)} is not a list of {self.min_len} to {self.max_len} items")
        for i, v in enumerate(value):
            self.item.check(v, f"{path}[{i}]")


@dataclass(frozen=True)
class Obj(Spec):
    """An object: each key of ``keys`` (absent is fine unless listed in ``required``) holds its
    spec; any other key holds ``other`` (None: refused), at most ``max_keys`` keys; a key
    matching ``key_pattern`` (when given)."""

    keys: Mapping[str, Spec] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    other: Spec | None = None
    max_keys: int = 512
    key_pattern: re.Pattern[str] | None = None
    key_what: str = ""

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise SpecError(path, f"{shown(value)} is not an object")
        if len(value) > self.max_keys:
            raise SpecError(path, f"an object of {len(value)} keys, over {self.max_keys}")
        for k in self.required:
            if k not in value:
                raise SpecError(_key_path(path, k), "is missing")
        for k, v in value.items():
            where = _key_path(path, k)
            if self.key_pattern is not None and not self.key_pattern.fullmatch(k):
                raise SpecError(where, f"the key is not {self.key_what or 'allowed'}")
            spec = self.keys.get(k, self.other)
            if spec is None:
                raise SpecError(where, f"is not a key this object has (known: {', '.join(sorted(self.keys))})")
            spec.check(v, where)


@dataclass(frozen=True)
class Either(Spec):
    """One of ``options`` (the first one's complaint is the message, ``what`` names them all)."""

    options: tuple[Spec, ...]
    what: str

    def check(self, value: Any, path: str) -> None:
        for o in self.options:
            try:
                o.check(value, path)
                return
            except SpecError:
                continue
        raise SpecError(path, f"{shown(value)} is not {self.what}")


@dataclass(frozen=True)
class Null(Spec):
    """``null``, or ``spec`` (an exporter writes null for what it did not know)."""

    spec: Spec

    def check(self, value: Any, path: str) -> None:
        if value is not None:
            self.spec.check(value, path)


@dataclass(frozen=True)
class Anything(Spec):
    """Any JSON value (already finite, bounded in depth by ``loads``)."""

    def check(self, value: Any, path: str) -> None:
        return None


def check(doc: Any, spec: Spec) -> None:
    """Raise ``SpecError`` for the first value of ``doc`` out of ``spec``."""
    spec.check(doc, "")
