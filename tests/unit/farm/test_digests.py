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
