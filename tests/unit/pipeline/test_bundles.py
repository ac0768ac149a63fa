"""The executor's bundle cache: a bundle comes from the store once per digest, what a job gets is
verified, a corrupted or half-placed entry is fetched again, the size stays bounded."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from farm.core.errors import StorageError, StorageUnavailable
from farm.core.keys import sha256_bytes
from farm.pipeline.bundles import LISTING, BundleCache
from tests.common.store import InMemoryBlobStore


class CountingStore(InMemoryBlobStore):
    """Counts reads per digest; ``fail_reads`` makes the next reads of a digest fail (an
    outage, or a fetch killed half-way)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[str, int] = {}
        self.fail_reads: set[str] = set()
        self.lock = threading.Lock()

    @contextmanager
    def open(self, digest: str) -> Iterator[BinaryIO]:
        with self.lock:
            self.reads[digest] = self.reads.get(digest, 0) + 1
        if digest in self.fail_reads:
            raise StorageUnavailable("injected: the store went away mid-fetch")
        with super().open(digest) as f:
            yield f

    def total_reads(self) -> int:
        return sum(self.reads.values())


def bundle(store: InMemoryBlobStore, label: str, *, data_size: int = 1000) -> tuple[str, list[dict[str, Any]]]:
    """A stored two-file snapshot (model + external data); returns (model digest, listing)."""
    onnx = f"onnx-{label}".encode() * 10
    data = os.urandom(data_size)
    files = []
    for path, content in (("model.onnx", onnx), ("weights/w.data", data)):
        info = store.put_stream(io.BytesIO(content))
        files.append({"path": path, "digest": info.digest, "size": info.size, "stored": True})
    return sha256_bytes(label.encode()), files


def contents(dest: Path, files: list[dict[str, Any]]) -> list[str]:
    return [sha256_bytes((dest / f["path"]).read_bytes()) for f in files]


def test_second_fetch_hits_the_cache_and_gets_verified_files(tmp_path: Path) -> None:
    store = CountingStore()
    digest, files = bundle(store, "a")
    cache = BundleCache(tmp_path / "cache", 10**9)
    onnx, hit = cache.fetch(store, digest, files, tmp_path / "job1")
    assert (hit, store.total_reads()) == (False, 2)
    assert onnx == tmp_path / "job1" / "model.onnx"
    onnx2, hit2 = cache.fetch(store, digest, files, tmp_path / "job2")
    assert hit2 and store.total_reads() == 2  # nothing read from the store again
    assert contents(tmp_path / "job2", files) == [f["digest"] for f in files]
    assert (cache.hits, cache.misses) == (1, 1)


def test_a_corrupted_entry_is_fetched_again(tmp_path: Path) -> None:
    store = CountingStore()
    digest, files = bundle(store, "a")
    cache = BundleCache(tmp_path / "cache", 10**9)
    cache.fetch(store, digest, files, tmp_path / "job1")
    victim = cache.entry(digest) / "weights" / "w.data"
    victim.chmod(0o644)
    victim.write_bytes(b"x" * files[1]["size"])  # same size, other bytes: only the sha256 tells
    _, hit = cache.fetch(store, digest, files, tmp_path / "job2")
    assert not hit and store.total_reads() == 4
    assert contents(tmp_path / "job2", files) == [f["digest"] for f in files]
    assert contents(cache.entry(digest), files) == [f["digest"] for f in files]  # the entry is whole again


def test_a_job_writing_its_copy_never_hands_a_changed_bundle_to_the_next(tmp_path: Path) -> None:
    store = CountingStore()
    digest, files = bundle(store, "a")
    cache = BundleCache(tmp_path / "cache", 10**9)
    cache.fetch(store, digest, files, tmp_path / "job1")
    try:
        # A job's files are hard links of the entry, read-only; root ignores the mode.
        (tmp_path / "job1" / "model.onnx").write_bytes(b"changed")
        wrote = True
    except PermissionError:
        wrote = False
    assert wrote == (os.geteuid() == 0)
    _, hit = cache.fetch(store, digest, files, tmp_path / "job2")
    assert hit is not wrote  # a changed entry fails verification and is fetched again
    assert contents(tmp_path / "job2", files) == [f["digest"] for f in files]


def test_a_fetch_that_dies_half_way_leaves_no_entry(tmp_path: Path) -> None:
    store = CountingStore()
    digest, files = bundle(store, "a")
    cache = BundleCache(tmp_path / "cache", 10**9)
    store.fail_reads.add(files[1]["digest"])
    with pytest.raises(StorageUnavailable):
        cache.fetch(store, digest, files, tmp_path / "job1")
    assert not cache.entry(digest).exists()
    store.fail_reads.clear()
    _, hit = cache.fetch(store, digest, files, tmp_path / "job2")
    assert not hit and contents(tmp_path / "job2", files) == [f["digest"] for f in files]
    # The staging dir of the failed placement is gone too.
    assert [p.name for p in (tmp_path / "cache").iterdir() if "ctxfarm-new" in p.name] == []


def test_a_placed_snapshot_is_the_next_fetchs_hit_and_placing_twice_reads_once(tmp_path: Path) -> None:
    """A worker's prefetch of its next build's model (Executor._prefetch_next), then its claim."""
    store = CountingStore()
    digest, files = bundle(store, "a")
    cache = BundleCache(tmp_path / "cache", 10**9)
    cache.place(store, digest, files)
    cache.place(store, digest, files)
    assert store.total_reads() == 2
    onnx, hit = cache.fetch(store, digest, files, tmp_path / "job")
    assert hit and store.total_reads() == 2
    assert contents(tmp_path / "job", files) == [f["digest"] for f in files]
    with pytest.raises(StorageError, match="never stored"):
        cache.place(store, digest, [{**f, "stored": False} for f in files])


def test_concurrent_fetches_of_one_digest_read_the_store_once(tmp_path: Path) -> None:
    store = CountingStore()
    digest, files = bundle(store, "a", data_size=200_000)
    cache = BundleCache(tmp_path / "cache", 10**9)
    errors: list[BaseException] = []

    def job(i: int) -> None:
        try:
            c = BundleCache(tmp_path / "cache", 10**9)  # another executor on the same host
            c.fetch(store, digest, files, tmp_path / f"job{i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.reads == {f["digest"]: 1 for f in files}
    for i in range(4):
        assert contents(tmp_path / f"job{i}", files) == [f["digest"] for f in files]
    assert cache.fetch(store, digest, files, tmp_path / "again")[1]


def test_least_recently_used_entries_are_evicted_past_the_bound(tmp_path: Path) -> None:
    store = CountingStore()
    a, fa = bundle(store, "a", data_size=6000)
    b, fb = bundle(store, "b", data_size=6000)
    c, fc = bundle(store, "c", data_size=6000)
    cache = BundleCache(tmp_path / "cache", 14000)  # room for two entries
    cache.fetch(store, a, fa, tmp_path / "j1")
    cache.fetch(store, b, fb, tmp_path / "j2")
    os.utime(cache.entry(a) / LISTING, (1, 1))  # a: least recently used
    cache.fetch(store, c, fc, tmp_path / "j3")
    assert not cache.entry(a).exists()
    assert (cache.entry(b) / LISTING).is_file() and (cache.entry(c) / LISTING).is_file()
    # The job that got a keeps its files: they are links of its own.
    assert contents(tmp_path / "j1", fa) == [f["digest"] for f in fa]


def test_unsafe_names_and_unstored_snapshots_are_refused(tmp_path: Path) -> None:
    store = CountingStore()
    digest, files = bundle(store, "a")
    cache = BundleCache(tmp_path / "cache", 10**9)
    with pytest.raises(StorageError, match="unsafe path"):
        cache.fetch(store, digest, [files[0], {**files[1], "path": "../../escape"}], tmp_path / "job")
    with pytest.raises(StorageError, match="never stored"):
        cache.fetch(store, digest, [{**files[0], "stored": False}], tmp_path / "job")
    assert not (tmp_path / "escape").exists()


def test_an_unusable_cache_dir_costs_the_cache_not_the_build(tmp_path: Path) -> None:
    store = CountingStore()
    digest, files = bundle(store, "a")
    (tmp_path / "not-a-dir").write_text("a file where the cache should go")
    cache = BundleCache(tmp_path / "not-a-dir" / "bundles", 10**9)
    onnx, hit = cache.fetch(store, digest, files, tmp_path / "job")
    assert not hit and onnx.is_file()
    assert contents(tmp_path / "job", files) == [f["digest"] for f in files]


# ---- files named by digest (POST /v1/models/DIGEST with files, POST /v1/genai) -------------------

def _held_store(*blobs: bytes) -> Any:
    from registry.store.base import put_bytes
    from tests.common.store import InMemoryBlobStore

    store = InMemoryBlobStore()
    for b in blobs:
        put_bytes(store, b)
    return store


def test_lay_out_blobs_places_each_blob_once_and_a_second_name_as_a_link(tmp_path: Path) -> None:
    from farm.core.errors import InvalidModelError
    from farm.core.keys import sha256_bytes
    from farm.pipeline.bundles import lay_out_blobs

    store = _held_store(b"graph", b"weights")
    files = [("model.onnx", sha256_bytes(b"graph"), 5), ("w/a.data", sha256_bytes(b"weights"), 7),
             ("b.data", sha256_bytes(b"weights"), 7)]
    lay_out_blobs(store, files, tmp_path / "out", max_bytes=12, error=InvalidModelError, too_large="big")
    assert (tmp_path / "out" / "w" / "a.data").read_bytes() == b"weights"
    assert (tmp_path / "out" / "b.data").stat().st_ino == (tmp_path / "out" / "w" / "a.data").stat().st_ino


@pytest.mark.parametrize("files, error", [
    ([("../x", "g", 5)], "invalid-model"),
    ([("/etc/passwd", "g", 5)], "invalid-model"),
    ([("a", "g", 5), ("a", "g", 5)], "invalid-model"),
    ([("a", "g", 5), ("a/b", "g", 5)], "invalid-model"),
    ([("a", "sha256:" + "0" * 64, 5)], "not-found"),
    ([("a", "g", 6)], "not-found"),
    ([("a", "g", 5), ("b", "w", 10 ** 12)], "too-large"),
    ([("a", "not a digest", 5)], "invalid-model"),
])
def test_lay_out_blobs_refuses_before_a_byte_is_copied(tmp_path: Path, files: list[tuple[str, str, int]],
                                                       error: str) -> None:
    from farm.core.errors import FarmError, InvalidModelError
    from farm.core.keys import sha256_bytes
    from farm.pipeline.bundles import lay_out_blobs

    store = _held_store(b"graph", b"weights")
    real = {"g": sha256_bytes(b"graph"), "w": sha256_bytes(b"weights")}
    files = [(n, real.get(d, d), s) for n, d, s in files]
    with pytest.raises(FarmError) as got:
        lay_out_blobs(store, files, tmp_path / "out", max_bytes=1 << 20, error=InvalidModelError, too_large="big")
    assert got.value.code == error and got.value.hint
    assert not (tmp_path / "out").exists()
