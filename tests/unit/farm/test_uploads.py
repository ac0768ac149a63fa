"""Archive bombs of every accepted format (farm.api.uploads): each refused with invalid-model
while it streams, having decompressed no more than the cap (counted, not timed), and nothing
written outside the bundle directory. The bombs are built here, small: a few KiB that would
expand to tens of MiB."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import struct
import tarfile
import threading
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from farm.api import uploads
from farm.core.errors import InvalidModelError

CAP = 1 << 20  # the upload cap of these tests: 1 MiB
BIG = 48 << 20  # what a bomb expands to


def _zeros_stream(compress: Callable[[], object], n: int) -> bytes:
    """``n`` zero bytes through a streaming compressor, without holding them in memory."""
    c = compress()
    out = [c.compress(b"\0" * (1 << 20)) for _ in range(n >> 20)]  # type: ignore[attr-defined]
    out.append(c.flush())  # type: ignore[attr-defined]
    return b"".join(out)


def _tar_header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _compressed_tar(compressor: Callable[[], object], size: int) -> bytes:
    """A compressed tar: a tiny model.onnx, then ``weights.bin`` of ``size`` zeros."""
    c = compressor()
    parts = [c.compress(_tar_header("model.onnx", 4) + b"onnx".ljust(512, b"\0"))]  # type: ignore[attr-defined]
    parts.append(c.compress(_tar_header("weights.bin", size)))  # type: ignore[attr-defined]
    for _ in range(size >> 20):
        parts.append(c.compress(b"\0" * (1 << 20)))  # type: ignore[attr-defined]
    parts.append(c.compress(b"\0" * 1024))  # type: ignore[attr-defined]
    parts.append(c.flush())  # type: ignore[attr-defined]
    return b"".join(parts)


def _gzip() -> object:
    return zlib.compressobj(9, zlib.DEFLATED, 31)


COMPRESSORS: dict[str, Callable[[], object]] = {
    "tar.gz": _gzip,
    "tar.bz2": lambda: bz2.BZ2Compressor(9),
    "tar.xz": lambda: lzma.LZMACompressor(),
}


def _unpack(tmp: Path, data: bytes, kind: str) -> Path:
    up = tmp / "upload"
    up.write_bytes(data)
    dest = tmp / "bundle"
    dest.mkdir()
    return uploads.unpack(up, kind, dest, max_bytes=CAP)


@pytest.fixture
def spent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes decompressed and written, as the budget was charged."""
    seen = [0, 0]
    decompressed, written = uploads.Budget.decompressed, uploads.Budget.written

    def d(self: uploads.Budget, n: int) -> None:
        seen[0] += n
        decompressed(self, n)

    def w(self: uploads.Budget, n: int) -> None:
        seen[1] += n
        written(self, n)

    monkeypatch.setattr(uploads.Budget, "decompressed", d)
    monkeypatch.setattr(uploads.Budget, "written", w)
    return seen


@pytest.mark.parametrize("fmt", sorted(COMPRESSORS))
def test_compressed_tar_bomb_is_refused_on_its_declared_size(tmp_path: Path, fmt: str, spent: list[int]) -> None:
    bomb = _compressed_tar(COMPRESSORS[fmt], BIG)
    assert len(bomb) < BIG // 100
    with pytest.raises(InvalidModelError, match="past the upload size limit"):
        _unpack(tmp_path, bomb, "application/x-tar")
    assert spent[0] <= 64 << 10, "refused on the header, before the data was decompressed"
    assert not (tmp_path / "bundle" / "weights.bin").exists()


@pytest.mark.parametrize("fmt", sorted(COMPRESSORS))
def test_many_members_under_the_cap_each_stop_at_the_total(tmp_path: Path, fmt: str, spent: list[int]) -> None:
    c = COMPRESSORS[fmt]()
    parts = [c.compress(_tar_header("model.onnx", 4) + b"onnx".ljust(512, b"\0"))]  # type: ignore[attr-defined]
    for i in range(64):  # 64 x 512 KiB = 32 MiB, each member alone under the 1 MiB cap
        parts.append(c.compress(_tar_header(f"w{i}.bin", 512 << 10) + b"\0" * (512 << 10)))  # type: ignore[attr-defined]
    parts.append(c.flush())  # type: ignore[attr-defined]
    with pytest.raises(InvalidModelError, match="past the upload size limit"):
        _unpack(tmp_path, b"".join(parts), "application/x-tar")
    assert spent[1] <= CAP + uploads.CHUNK and spent[0] <= CAP + uploads.OVERHEAD + 2 * uploads.CHUNK


def test_pax_header_bomb_is_refused_before_it_is_read(tmp_path: Path, spent: list[int]) -> None:
    size = 32 << 20
    c = _gzip()
    parts = [c.compress(_tar_header("././@PaxHeader", size, tarfile.XHDTYPE))]  # type: ignore[attr-defined]
    for _ in range(size >> 20):
        parts.append(c.compress(b"9" * (1 << 20)))  # type: ignore[attr-defined]
    parts.append(c.flush())  # type: ignore[attr-defined]
    with pytest.raises(InvalidModelError, match="extended header"):
        _unpack(tmp_path, b"".join(parts), "application/gzip")
    assert spent[0] <= 64 << 10


def test_member_count_is_capped_while_streaming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads, "MAX_MEMBERS", 50)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i in range(200):
            tar.addfile(tarfile.TarInfo(f"d{i}"), io.BytesIO(b""))
    with pytest.raises(InvalidModelError, match="more than 50 members"):
        _unpack(tmp_path, buf.getvalue(), "application/gzip")


def test_sparse_members_are_refused(tmp_path: Path) -> None:
    data = _tar_header("model.onnx", 0, tarfile.GNUTYPE_SPARSE) + b"\0" * 1024
    with pytest.raises(InvalidModelError, match="sparse"):
        _unpack(tmp_path, data, "application/x-tar")


def test_gzip_of_zeros_that_is_no_tar_costs_nothing(tmp_path: Path, spent: list[int]) -> None:
    bomb = _zeros_stream(_gzip, BIG)
    with pytest.raises(InvalidModelError):
        _unpack(tmp_path, bomb, "application/gzip")
    assert spent[0] <= 64 << 10


def test_ratio_cap_stops_decompression(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spent: list[int]) -> None:
    # A cap far above the bomb's size: only the ratio (past its floor) stops it, and it stops
    # at the ratio, not at the end of the expansion.
    monkeypatch.setattr(uploads, "RATIO_FLOOR", 2 << 20)
    monkeypatch.setattr(uploads, "MAX_RATIO", 20)
    bomb = _compressed_tar(lambda: bz2.BZ2Compressor(9), BIG)
    up = tmp_path / "upload"
    up.write_bytes(bomb)
    dest = tmp_path / "bundle"
    dest.mkdir()
    with pytest.raises(InvalidModelError, match="expands past its limit"):
        uploads.unpack(up, "application/x-tar", dest, max_bytes=1 << 30)
    assert spent[0] <= max(2 << 20, 20 * len(bomb)) + uploads.CHUNK


def test_zip_bomb_declared_and_lying(tmp_path: Path, spent: list[int]) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model.onnx", b"onnx")
        with zf.open("weights.bin", "w", force_zip64=True) as f:
            for _ in range(BIG >> 20):
                f.write(b"\0" * (1 << 20))
    honest = buf.getvalue()
    (tmp_path / "a").mkdir()
    with pytest.raises(InvalidModelError, match="declares more bytes"):
        _unpack(tmp_path / "a", honest, "application/zip")
    assert spent[0] == 0
    # The same archive whose headers claim 1 KiB: decompression stops at what was declared.
    lying = honest.replace((BIG).to_bytes(8, "little"), (1024).to_bytes(8, "little"))
    assert lying != honest
    (tmp_path / "b").mkdir()
    with pytest.raises(InvalidModelError):
        _unpack(tmp_path / "b", lying, "application/zip")
    assert spent[0] <= CAP + uploads.CHUNK


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_zip_members_of_every_method_are_capped_as_they_expand(tmp_path: Path, method: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        zf.writestr("model.onnx", b"onnx")
        zf.writestr("weights.bin", b"\0" * (8 << 20))
    # Headers within the cap are trusted for the quick refusal: only the streaming cap is left.
    monkeypatch.setattr(uploads.Budget, "member", lambda self, name, declared: None)
    with pytest.raises(InvalidModelError, match="declares more bytes|expands past"):
        _unpack(tmp_path, buf.getvalue(), "application/zip")


def test_a_cancelled_upload_stops_at_the_next_chunk(tmp_path: Path) -> None:
    data = _compressed_tar(_gzip, 512 << 10)
    up = tmp_path / "upload"
    up.write_bytes(data)
    (tmp_path / "bundle").mkdir()
    gone = threading.Event()
    gone.set()
    with pytest.raises(InvalidModelError, match="abandoned"):
        uploads.unpack(up, "application/gzip", tmp_path / "bundle", max_bytes=CAP, cancelled=gone)


@pytest.mark.parametrize("fmt", sorted(COMPRESSORS))
def test_an_honest_compressed_tar_unpacks(tmp_path: Path, fmt: str) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in (("m.onnx", b"onnx"), ("data/w.bin", b"\1" * 5000)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    packed = {"tar.gz": gzip.compress, "tar.bz2": bz2.compress, "tar.xz": lzma.compress}[fmt](raw.getvalue())
    model = _unpack(tmp_path, packed, "application/x-tar")
    assert model.name == "m.onnx" and (tmp_path / "bundle" / "data" / "w.bin").read_bytes() == b"\1" * 5000


@pytest.mark.parametrize("names", [["a", "a/b"], ["a/b", "a"], ["x", "x"]])
def test_names_that_collide_are_refused_before_writing(tmp_path: Path, names: list[str]) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for n in ["m.onnx", *names]:
            info = tarfile.TarInfo(n)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(InvalidModelError, match="twice, or as both"):
        _unpack(tmp_path, raw.getvalue(), "application/x-tar")


def _zip_of_empty_members(n: int, *, zip64: bool) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(n):
            zf.writestr(f"{i}.bin", b"")
    data = buf.getvalue()
    if not zip64:
        return data
    # The same directory behind a zip64 end record (what a zip of 65535+ entries has).
    at = data.rfind(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack("<II", data[at + 12:at + 20])
    record = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, cd_size, cd_offset)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, at, 1)
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return data[:at] + record + locator + eocd


@pytest.mark.parametrize("zip64", [False, True])
def test_a_zip_directory_of_too_many_entries_is_refused_before_it_is_parsed(
        tmp_path: Path, zip64: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads, "MAX_MEMBERS", 100)
    under = tmp_path / "under.zip"
    under.write_bytes(_zip_of_empty_members(100, zip64=zip64))
    uploads._zip_directory(under)  # its end records read right: within the cap
    assert zipfile.ZipFile(under).namelist()[-1] == "99.bin"
    parsed: list[int] = []
    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", lambda self: parsed.append(1))
    with pytest.raises(InvalidModelError, match="more than 100 members"):
        _unpack(tmp_path, _zip_of_empty_members(101, zip64=zip64), "application/zip")
    assert not parsed, "zipfile never built the directory's objects"
