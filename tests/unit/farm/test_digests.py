"""Bundle digests remembered by stat (farm.core.digests): the same digest as inspect_model, no
byte read again while nothing changed, a changed or missing file noticed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from farm.core.bundle import inspect_model
from farm.core.digests import local_bundle
from farm.core.errors import InvalidModelError
from tests.common.onnx_models import matmul_add, save, save_external


def test_remembered_until_a_file_changes(tmp_path: Path) -> None:
    model = save_external(matmul_add(seed=1, size=64), tmp_path / "m" / "model.onnx")
    memo = tmp_path / "cache" / "digests.json"
    first = local_bundle(model, memo)
    assert first.digest == inspect_model(model).digest and first.hashed_bytes >= first.size
    assert [name for name, _ in first.members] == ["model.onnx", "w.data"]
    again = local_bundle(model, memo)
    assert (again.digest, again.size, again.hashed_bytes) == (first.digest, first.size, 0)
    data = model.parent / "w.data"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 1
    data.write_bytes(bytes(raw))
    changed = local_bundle(model, memo)
    assert changed.digest == inspect_model(model).digest != first.digest
    assert changed.hashed_bytes == data.stat().st_size  # only the changed file was read


def test_a_missing_data_file_is_invalid_model_even_when_remembered(tmp_path: Path) -> None:
    model = save_external(matmul_add(seed=2, size=16), tmp_path / "m" / "model.onnx")
    memo = tmp_path / "digests.json"
    local_bundle(model, memo)
    os.unlink(model.parent / "w.data")
    with pytest.raises(InvalidModelError, match="w.data"):
        local_bundle(model, memo)


def test_no_memo_and_a_broken_memo_still_answer(tmp_path: Path) -> None:
    model = save(matmul_add(seed=3), tmp_path / "model.onnx")
    memo = tmp_path / "digests.json"
    memo.write_text("{not json")
    assert local_bundle(model, memo).digest == local_bundle(model, None).digest == inspect_model(model).digest


def test_a_lone_model_that_names_no_external_data_is_not_inspected_here(tmp_path: Path) -> None:
    """Its bundle digest follows from its hash (the same as inspect_model's); onnx is not
    imported; an invalid one gets a digest too: the service, which inspects every bundle it is
    sent, refuses it (tests/integration/test_upload_skip.py)."""
    import subprocess
    import sys

    model = save(matmul_add(seed=4), tmp_path / "model.onnx")
    got = local_bundle(model, None)
    assert got.digest == inspect_model(model).digest and got.hashed_bytes == model.stat().st_size
    probe = ("import sys; from pathlib import Path; from farm.core.digests import local_bundle; "
             f"b = local_bundle(Path({str(model)!r}), None); "
             "print(b.digest, [m for m in ('onnx', 'numpy', 'google.protobuf') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == got.digest and out[1:] == ["[]"]
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07 not a model")
    assert local_bundle(junk, None).members == [("model.onnx", junk)]
    # A model whose bytes hold "location" anywhere is inspected in full, as before.
    named = save(matmul_add(seed=4), tmp_path / "named" / "model.onnx")
    named.write_bytes(named.read_bytes() + b"\x00location")
    with pytest.raises(InvalidModelError):
        local_bundle(named, None)
