"""Resumable downloads, the bookkeeping: which byte ranges of a blob are still missing (the
plan, in parts, in file order), what a partial file already holds (its ``.ranges`` record, or a
one-stream download's prefix), the one answer a range request accepts, and the state the
workers of one blob's ranged download share with the thread that hashes it as it fills.

The partial files are the device's own, named by checked digests, but never trusted past what
is checked here and by the digest at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from farm.client.transport import CHUNK, HINT_RESUME, HINT_SERVER, check_length
from farm.core.errors import ServerError
from farm.core.untrusted import shown

RANGES_SUFFIX = ".ranges"  # partial/<hex>.ranges: the byte ranges of partial/<hex> written so far
MAX_RANGES_BYTES = 1 << 20


def merge_ranges(ranges: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """``ranges`` ([start, end) pairs) clipped to [0, size), sorted, empty ones dropped and
    overlapping or touching ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((max(a, 0), min(b, size)) for a, b in ranges):
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def plan_ranges(size: int, done: list[tuple[int, int]], part: int) -> list[tuple[int, int]]:
    """The bytes of [0, size) that ``done`` does not cover, as [start, end) ranges of at most
    ``part`` bytes, in file order (so the prefix a hasher waits for fills first)."""
    if part <= 0:
        raise ValueError("part must be positive")
    plan, pos = [], 0
    for a, b in [*merge_ranges(done, size), (size, size)]:
        while pos < a:
            plan.append((pos, min(pos + part, a)))
            pos = plan[-1][1]
        pos = max(pos, b)
    return plan


def covered(ranges: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in ranges)


def ranges_file(dest: Path) -> Path:
    return dest.with_name(dest.name + RANGES_SUFFIX)


def drop_ranges(dest: Path) -> None:
    ranges_file(dest).unlink(missing_ok=True)


def load_ranges(dest: Path, size: int) -> list[tuple[int, int]]:
    """What ``dest`` holds of a blob of ``size`` bytes: the ranges its ``.ranges`` file records,
    or (none recorded: a one-stream download) its bytes from the start. A record that is not
    exactly the expected shape, or a file longer than the blob, keeps nothing (both removed):
    local files, but never trusted past what is checked here and by the digest at the end."""
    record = ranges_file(dest)
    try:
        st = os.stat(dest, follow_symlinks=False)
    except FileNotFoundError:
        drop_ranges(dest)
        return []
    if st.st_size > size:
        dest.unlink()
        drop_ranges(dest)
        return []
    if not record.exists() and not record.is_symlink():
        return [(0, st.st_size)] if st.st_size else []
    try:
        if record.is_symlink() or record.stat().st_size > MAX_RANGES_BYTES:
            raise ValueError("not a ranges record")
        doc = json.loads(record.read_bytes())
        if not isinstance(doc, dict) or doc.get("size") != size or not isinstance(doc.get("done"), list):
            raise ValueError("another blob's record")
        ranges = []
        for r in doc["done"]:
            if not (isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
                    and 0 <= r[0] < r[1] <= min(size, st.st_size)):
                raise ValueError("a range out of bounds")
            ranges.append((r[0], r[1]))
        return merge_ranges(ranges, size)
    except (OSError, ValueError, RecursionError):
        dest.unlink(missing_ok=True)
        drop_ranges(dest)
        return []


def kept_prefix(dest: Path, size: int) -> int:
    """The bytes at the start of ``dest`` that a one-stream download goes on from: its whole
    length, or where a ranged download left a hole (the file is cut there)."""
    done = load_ranges(dest, size)
    have = done[0][1] if done and done[0][0] == 0 else 0
    if dest.exists() and dest.stat().st_size != have:
        os.truncate(dest, have)
    drop_ranges(dest)
    return have


def kept_bytes(dest: Path, size: int) -> int:
    """How much of a blob of ``size`` bytes ``dest`` already holds (nothing is changed)."""
    try:
        st = os.stat(dest, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    if not os.path.isfile(dest) or st.st_size > size:
        return 0
    record = ranges_file(dest)
    if not record.exists():
        return st.st_size
    try:
        doc = json.loads(record.read_bytes()[:MAX_RANGES_BYTES])
        return covered(merge_ranges([(int(a), int(b)) for a, b in doc["done"]], min(size, st.st_size)))
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return 0


def check_range(resp: Any, rng: tuple[int, int], size: int, digest: str) -> None:
    """A 206 for ``rng`` of a blob of ``size`` bytes: ``Content-Range`` exactly that range of
    exactly that size, and a ``Content-Length`` (when sent) of exactly the range's bytes."""
    want = f"bytes {rng[0]}-{rng[1] - 1}/{size}"
    got = (resp.headers.get("Content-Range") or "").strip()
    if resp.status != 206 or got != want:
        raise ServerError(f"blob {digest[7:19]}: asked for {want}, the service answered HTTP {resp.status} with "
                          f"Content-Range {shown(got, 60)}", hint=HINT_SERVER)
    check_length(resp, rng[1] - rng[0], digest)


class RangeState:
    """One blob's ranged download: the ranges written (shared by its workers and the hasher),
    the first failure, and the stop every worker checks between pieces."""

    def __init__(self, dest: Path, size: int, done: list[tuple[int, int]]):
        self.dest, self.size, self.done = dest, size, list(done)
        self.direct: str | None = None  # where the service redirected the first range
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.cond = threading.Condition()
        self.running = 0
        self.h = hashlib.sha256()
        self.hashed = 0

    def enter(self, n: int) -> None:
        with self.cond:
            self.running += n

    def leave(self) -> None:
        with self.cond:
            self.running -= 1
            self.cond.notify_all()

    def wrote(self, a: int, b: int) -> None:
        with self.cond:
            if self.done and self.done[-1][1] == a:
                self.done[-1] = (self.done[-1][0], b)  # the usual case: a range growing
            else:
                self.done = merge_ranges([*self.done, (a, b)], self.size)
            self.cond.notify_all()

    def finished(self, rng: tuple[int, int]) -> None:
        self.save()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.stop.set()
            self.cond.notify_all()

    def save(self) -> None:
        """The ranges written so far, to the ``.ranges`` record beside the file (replaced whole:
        a kill leaves the previous record or this one)."""
        with self.cond:
            doc = {"size": self.size, "done": [list(r) for r in merge_ranges(self.done, self.size)]}
        record = ranges_file(self.dest)
        tmp = record.with_name(record.name + f".{threading.get_ident()}")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, record)

    def _prefix(self) -> int:
        for a, b in self.done:
            if a <= self.hashed < b:
                return b
        return self.hashed

    def hash_while_running(self, fd: int) -> None:
        """Hash the file in order as its prefix fills, until it is whole, a worker failed or
        every worker left."""
        while True:
            with self.cond:
                while (upto := self._prefix()) == self.hashed and self.error is None and self.running:
                    self.cond.wait(1.0)
                if self.error is not None or upto == self.hashed:
                    return
            self.hash_upto(fd, upto)
            if self.hashed >= self.size:
                return

    def hash_upto(self, fd: int, upto: int) -> None:
        while self.hashed < upto:
            data = os.pread(fd, min(4 * CHUNK, upto - self.hashed), self.hashed)
            if not data:
                raise ServerError(f"{self.dest.name}: the file being downloaded was cut short here",
                                  hint=HINT_RESUME)
            self.h.update(data)
            self.hashed += len(data)


def range_start(resp: Any) -> int | None:
    m = re.fullmatch(r"bytes (\d{1,19})-\d{1,19}/(\d{1,19}|\*)", (resp.headers.get("Content-Range") or "").strip())
    return int(m.group(1)) if m else None
