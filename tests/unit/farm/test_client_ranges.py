"""The device client's ranged downloads, without a server: the plan (what is still missing, in
parts, in order), what a partial file is taken to hold (its ``.ranges`` record, a one-stream
download's prefix, a record that can't be trusted), and which placed files an install takes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from farm.client import (
    _holds_exactly,
    _kept_prefix,
    _load_ranges,
    _take_placed,
    kept_bytes,
    merge_ranges,
    plan_ranges,
)


def test_merge_joins_overlapping_and_touching_ranges_and_clips() -> None:
    assert merge_ranges([(5, 9), (0, 3), (3, 4), (8, 12), (20, 30), (-5, 0), (7, 7)], 25) == [(0, 4), (5, 12),
                                                                                              (20, 25)]
    assert merge_ranges([], 10) == []


@pytest.mark.parametrize(("size", "done", "part", "plan"), [
    (10, [], 4, [(0, 4), (4, 8), (8, 10)]),
    (8, [], 4, [(0, 4), (4, 8)]),
    (0, [], 4, []),
    (10, [(0, 10)], 4, []),
    (10, [(0, 3)], 4, [(3, 7), (7, 10)]),
    # Holes between written ranges, each cut into parts, in file order.
    (20, [(2, 5), (9, 10), (15, 20)], 4, [(0, 2), (5, 9), (10, 14), (14, 15)]),
    # Overlapping, unsorted, past the end: merged first.
    (10, [(6, 12), (1, 3), (2, 4)], 100, [(0, 1), (4, 6)]),
])
def test_plan_covers_exactly_what_is_missing(size: int, done: list[tuple[int, int]], part: int,
                                             plan: list[tuple[int, int]]) -> None:
    got = plan_ranges(size, done, part)
    assert got == plan
    assert all(0 < b - a <= part for a, b in got)
    covered = merge_ranges([*done, *got], size)
    assert covered == ([(0, size)] if size else [])
    assert not any(a < d and c < b for a, b in got for c, d in merge_ranges(done, size))  # nothing twice


def test_plan_refuses_a_nonpositive_part() -> None:
    with pytest.raises(ValueError):
        plan_ranges(10, [], 0)


def _record(dest: Path, size: int, done: object) -> None:
    dest.with_name(dest.name + ".ranges").write_text(json.dumps({"size": size, "done": done}))


def test_a_ranged_partial_keeps_what_its_record_says(tmp_path: Path) -> None:
    dest = tmp_path / "blob"
    dest.write_bytes(b"\0" * 30)
    _record(dest, 100, [[0, 10], [20, 30], [5, 12]])
    assert _load_ranges(dest, 100) == [(0, 12), (20, 30)]
    assert kept_bytes(dest, 100) == 22
    # A one-stream download goes on from the contiguous start, the rest cut off.
    assert _kept_prefix(dest, 100) == 12
    assert dest.stat().st_size == 12 and not dest.with_name("blob.ranges").exists()


def test_a_partial_without_record_is_a_one_stream_prefix(tmp_path: Path) -> None:
    dest = tmp_path / "blob"
    dest.write_bytes(b"x" * 40)
    assert _load_ranges(dest, 100) == [(0, 40)] and kept_bytes(dest, 100) == 40
    assert _load_ranges(tmp_path / "none", 100) == [] and kept_bytes(tmp_path / "none", 100) == 0


@pytest.mark.parametrize("record", [
    "not json",
    json.dumps([1, 2]),
    json.dumps({"size": 99, "done": [[0, 10]]}),  # another blob's size
    json.dumps({"size": 100, "done": [[0, 50]]}),  # past the file's end (30 bytes)
    json.dumps({"size": 100, "done": [[10, 5]]}),
    json.dumps({"size": 100, "done": [[0, True]]}),
    json.dumps({"size": 100, "done": [[0, 1.5]]}),
    json.dumps({"size": 100, "done": "all"}),
    "[" * 100_000,
])
def test_a_record_that_is_not_exactly_right_keeps_nothing(tmp_path: Path, record: str) -> None:
    dest = tmp_path / "blob"
    dest.write_bytes(b"\0" * 30)
    dest.with_name("blob.ranges").write_text(record)
    assert _load_ranges(dest, 100) == []
    assert not dest.exists() and not dest.with_name("blob.ranges").exists()


def test_a_partial_longer_than_the_blob_keeps_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "blob"
    dest.write_bytes(b"x" * 200)
    assert kept_bytes(dest, 100) == 0
    assert _load_ranges(dest, 100) == [] and not dest.exists()


def _files(*entries: tuple[str, int]) -> list[dict[str, object]]:
    return [{"name": n, "digest": "sha256:" + f"{i:064x}", "size": s} for i, (n, s) in enumerate(entries, start=1)]


def test_placed_files_of_the_declared_size_are_taken_by_link(tmp_path: Path) -> None:
    out, partial = tmp_path / "out", tmp_path / "partial"
    (out / "sub").mkdir(parents=True)
    partial.mkdir()
    (out / "a.bin").write_bytes(b"a" * 10)
    (out / "b.bin").write_bytes(b"b" * 5)  # another size: not taken
    (out / "sub" / "c.bin").write_bytes(b"c" * 7)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"d" * 3)
    (out / "d.bin").symlink_to(outside)  # a symlink: never taken
    files = _files(("a.bin", 10), ("b.bin", 6), ("sub/c.bin", 7), ("d.bin", 3))
    taken = _take_placed(out, partial, files)
    assert taken == {files[0]["digest"], files[2]["digest"]}
    assert os.stat(partial / str(files[0]["digest"])[7:]).st_ino == os.stat(out / "a.bin").st_ino
    assert not (partial / str(files[3]["digest"])[7:]).exists()


def test_a_kept_partial_is_not_replaced_by_a_placed_file(tmp_path: Path) -> None:
    out, partial = tmp_path / "out", tmp_path / "partial"
    out.mkdir()
    partial.mkdir()
    (out / "a.bin").write_bytes(b"a" * 10)
    files = _files(("a.bin", 10))
    (partial / str(files[0]["digest"])[7:]).write_bytes(b"a" * 4)
    assert _take_placed(out, partial, files) == set()
    assert (partial / str(files[0]["digest"])[7:]).read_bytes() == b"a" * 4


def test_holds_exactly_only_the_taken_files_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "out"
    partial = tmp_path / ".out.ctxfarm-partial"
    (out / "sub").mkdir(parents=True)
    partial.mkdir()
    (out / "a.bin").write_bytes(b"a")
    (out / "sub" / "c.bin").write_bytes(b"c")
    files = [{"name": "a.bin", "digest": "sha256:" + "1" * 64, "size": 1},
             {"name": "sub/c.bin", "digest": "sha256:" + "2" * 64, "size": 1}]
    assert _take_placed(out, partial, files) == {"sha256:" + "1" * 64, "sha256:" + "2" * 64}
    assert _holds_exactly(out, files)
    (out / "extra.txt").write_text("x")
    assert not _holds_exactly(out, files)
    (out / "extra.txt").unlink()
    (out / "empty").mkdir()
    assert not _holds_exactly(out, files)
    (out / "empty").rmdir()
    # The same content at the name, but not the file that was taken and verified.
    (out / "a.bin").unlink()
    (out / "a.bin").write_bytes(b"a")
    assert not _holds_exactly(out, files)
