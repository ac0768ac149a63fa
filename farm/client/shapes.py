"""The shapes of what a service sends a device, and the one checker that holds an answer to its
shape before any field of it is read (the standard library only).

A shape is data: ``Text`` (optionally a pattern), ``Whole`` (an int in bounds, never a bool),
``Flag``, ``OneOf``, ``ListOf`` and ``Obj`` (required and optional fields). ``check`` walks a
parsed answer and its shape together and raises ``ShapeError`` naming the first field that is
not of its shape (``files[2].path is a number, not text``); ``conform`` turns that into the error
the answer's kind documents: ``server-error`` for an answer (resolve, package, upload, release),
``bad-manifest`` for a document fetched by its digest (a manifest, a package record). What a
shape can't say (the path rule, version order, a name listed twice) is checked after, on values
now known to be of their type (``farm.core.untrusted``, ``farm.core.packages.check_record``).

An object's fields that its shape does not name are never read, so they are left alone; an
optional field may be missing, but when present it is of its shape (``null`` included).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from farm.core.errors import FarmError
from farm.core.untrusted import BACKENDS, MAX_FILE_BYTES, MAX_FILES, MAX_NAME, shown

MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few KiB; its declared size must be under this
MAX_RECORD_BYTES = 4 << 20  # a package record: the size an answer may declare for it
MAX_SIGNATURES = 64
MAX_LIST = 100_000  # a package's files, a release's builds


class ShapeError(ValueError):
    """``where`` (a path into the answer: ``files[2].path``) is not of its shape."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where} {why}")
        self.where = where


def kind_of(value: Any) -> str:
    """What a JSON value is, in words (bool before int: JSON's true is Python's 1)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


@dataclass(frozen=True)
class Text:
    pattern: re.Pattern[str] | None = None  # the whole text must match
    means: str = "text of the expected form"  # what the pattern accepts, for the message
    max_len: int = 1024
    min_len: int = 0

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, str):
            raise ShapeError(where, f"is {kind_of(value)}, not text")
        if not self.min_len <= len(value) <= self.max_len:
            raise ShapeError(where, f"is {len(value)} characters long, not {self.min_len} to {self.max_len}")
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise ShapeError(where, f"{shown(value)} is not {self.means}")


@dataclass(frozen=True)
class Whole:
    low: int = 0
    high: int = MAX_FILE_BYTES

    def check(self, value: Any, where: str) -> None:
        if type(value) is not int:
            raise ShapeError(where, f"is {kind_of(value)}, not a whole number")
        if not self.low <= value <= self.high:
            raise ShapeError(where, f"{value} is not between {self.low} and {self.high}")


@dataclass(frozen=True)
class Flag:
    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, bool):
            raise ShapeError(where, f"is {kind_of(value)}, not true/false")


@dataclass(frozen=True)
class OneOf:
    values: tuple[str, ...]

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, str):
            raise ShapeError(where, f"is {kind_of(value)}, not text")
        if value not in self.values:
            raise ShapeError(where, f"{shown(value)} is not one of {', '.join(self.values)}")


@dataclass(frozen=True)
class ListOf:
    item: Shape
    max_items: int
    min_items: int = 0

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise ShapeError(where, f"is {kind_of(value)}, not a list")
        if not self.min_items <= len(value) <= self.max_items:
            raise ShapeError(where, f"holds {len(value)} items, not {self.min_items} to {self.max_items}")
        for i, v in enumerate(value):
            self.item.check(v, f"{where}[{i}]")


@dataclass(frozen=True)
class Obj:
    required: Mapping[str, Shape] = field(default_factory=dict)
    optional: Mapping[str, Shape] = field(default_factory=dict)

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise ShapeError(where, f"is {kind_of(value)}, not an object")
        prefix = "" if where == "it" else f"{where}."
        for key, shape in self.required.items():
            if key not in value:
                raise ShapeError(f"{prefix}{key}", "is missing")
            shape.check(value[key], f"{prefix}{key}")
        for key, shape in self.optional.items():
            if key in value:
                shape.check(value[key], f"{prefix}{key}")


Shape = Text | Whole | Flag | OneOf | ListOf | Obj


def check(value: Any, shape: Shape) -> Any:
    """``value`` when it is of ``shape``; ``ShapeError`` for the first field that is not."""
    shape.check(value, "it")
    return value


def conform(value: Any, shape: Shape, what: str, error: type[FarmError], hint: str) -> Any:
    """``check``, its refusal raised as ``error`` (``what is malformed: files[2].path is ...``)."""
    try:
        return check(value, shape)
    except ShapeError as exc:
        raise error(f"{what} is malformed: {exc}", hint=hint) from None


# ---- what each answer a device reads must be -------------------------------------------------------

DIGEST = Text(re.compile(r"sha256:[0-9a-f]{64}"), "a sha256 digest (sha256: and 64 lowercase hex digits)", 71)
NAME = Text(min_len=1, max_len=MAX_NAME)  # a file's name or path: farm.core.untrusted / names check its rule
SHORT = Text(max_len=200)
SIGNATURES = ListOf(Obj({"public_key": SHORT, "signature": SHORT}), MAX_SIGNATURES)

# GET /v1/resolve: the artifact that answers a device's question (farm.client.answers binds it).
RESOLVE_ANSWER = Obj(
    required={"artifact": DIGEST, "model": DIGEST, "backend": OneOf(BACKENDS), "target": SHORT, "toolchain": SHORT,
              "manifest_size": Whole(0, MAX_MANIFEST_BYTES)},
    optional={"signatures": SIGNATURES})

# An artifact's manifest, fetched by the artifact digest: the fields a device reads.
MANIFEST = Obj(
    required={"model": DIGEST, "backend": OneOf(BACKENDS), "ctxModel": NAME,
              "target": Obj({"name": SHORT}), "toolchain": Obj({"version": SHORT}),
              "files": ListOf(Obj({"name": NAME, "digest": DIGEST, "size": Whole()}), MAX_FILES, 1)},
    optional={"options": Obj(optional={"hardware_compatibility_level": SHORT}),
              # the roles of a genai package's files, or of a graph group's graphs (--json's stages)
              "genai": Obj(optional={"stages": ListOf(Obj({"file": NAME, "role": SHORT}), MAX_FILES)}),
              "graphs": ListOf(Obj({"ctxModel": NAME, "name": SHORT}), MAX_FILES)})

# GET /v1/packages?ref= and POST /v1/packages: the package record a device fetches by digest.
PACKAGE_ANSWER = Obj(required={"digest": DIGEST, "record_size": Whole(1, MAX_RECORD_BYTES)},
                     optional={"signatures": SIGNATURES,
                               # builds the package could not hold (ORT can't tell them apart), and why
                               "left_out": ListOf(Obj({"target": SHORT, "toolchain": SHORT,
                                                       "why": Text(max_len=2000)}), MAX_LIST)})

# An ORT model package's record, fetched by the package digest.
PACKAGE_RECORD = Obj({
    "kind": SHORT,
    "files": ListOf(Obj({"path": NAME, "digest": DIGEST, "size": Whole()}), MAX_LIST),
    "directories": ListOf(NAME, MAX_LIST)})

# Upload sessions (/v1/uploads): the id goes into a URL path.
UPLOAD_SESSION = Obj({"upload": Text(re.compile(r"[0-9a-f]{32}"), "an upload session id (32 hex digits)", 32)})
UPLOAD_OFFSET = Obj({"offset": Whole()})
# An answer naming the model or blob it stored (compared with the one sent).
STORED = Obj({"digest": DIGEST})

# POST /v1/reports: the report recorded (farm.client_report binds it to the artifact reported).
REPORT_ANSWER = Obj({"report": Whole(0, (1 << 63) - 1), "artifact": DIGEST, "runtime": SHORT},
                    optional={"soc": SHORT, "outcome": SHORT})

# GET /v1/releases/<id>: polled until done.
RELEASE = Obj({"builds": ListOf(Obj(), MAX_LIST)}, optional={"done": Flag()})
