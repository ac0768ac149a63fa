"""Sample inputs (``.npz``) through the one archive reader: a directory of 250,000
entries is refused before zipfile parses it (memory bounded), a bad CRC, a cut member or a header
past its data is ``bad-samples`` with a hint, never an internal error."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from farm.core.errors import BadSamplesError
from registry.evidence import check_samples
from tests.common.accuracy_models import matmul_model
from tests.common.hostile_archives import bad_crc, many_entries


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def _lying_header() -> bytes:
    """A well-formed zip (right CRC) whose .npy header claims 9x the rows its data holds."""
    import zipfile

    npy = io.BytesIO()
    np.lib.format.write_array(npy, X)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("x.npy", npy.getvalue().replace(b"(1, 64)", b"(9, 64)"))
    return buf.getvalue()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return matmul_model(tmp_path_factory.mktemp("m") / "m.onnx")


def test_an_archive_of_250000_entries_is_refused_before_its_directory_is_parsed(model: Path, tmp_path: Path) -> None:
    path = tmp_path / "many.npz"
    path.write_bytes(many_entries(250_000))
    tracemalloc.start()
    try:
        with pytest.raises(BadSamplesError, match="more than 1024 members") as caught:
            check_samples(path, model)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.hint
    # Parsed by zipfile, this directory cost 136 MiB (the measure); read from its end: KiB.
    assert peak < 8 * 1024 * 1024, peak


X = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)


@pytest.mark.parametrize("case,body,message", [
    ("bad crc", lambda good: bad_crc(good, X), "CRC"),
    ("cut short", lambda good: good[:len(good) // 2], "not a readable"),
    ("header past its data", lambda good: _lying_header(), "declares"),
    ("a pickle", lambda good: _npz(x=np.array([{"a": 1}], dtype=object)), "pickle"),
])
def test_damaged_sample_archives_are_bad_samples(model: Path, tmp_path: Path, case: str, body: object,
                                                 message: str) -> None:
    path = tmp_path / "s.npz"
    path.write_bytes(body(_npz(x=X)))  # type: ignore[operator]
    with pytest.raises(BadSamplesError, match=message) as caught:
        check_samples(path, model)
    assert caught.value.code == "bad-samples" and caught.value.hint, case


def test_good_samples_are_read_whole(model: Path, tmp_path: Path) -> None:
    path = tmp_path / "s.npz"
    path.write_bytes(_npz(x=X))
    assert check_samples(path, model) == [{"name": "x", "dtype": "float32", "shape": [1, 64]}]
