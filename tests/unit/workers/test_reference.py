"""The CPU reference kept for device agents: an .npz of fixed member names (an output's name is
data, never a path), bounded in bytes, read back only as the outputs the context has."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workers.qnn.accuracy import keep_reference, load_reference


def test_kept_within_the_bound_and_read_back_by_name(tmp_path: Path) -> None:
    path = tmp_path / "ref.npz"
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2], np.int64)
    got = keep_reference(path, ["../../etc/y", "z"], [a, b], max_bytes=a.nbytes + b.nbytes)
    assert got == {"kept": True, "bytes": 40, "why": None}
    with np.load(path, allow_pickle=False) as z:
        assert sorted(z.files) == ["names", "out0", "out1"]
    z_, y = load_reference(path, ["z", "../../etc/y"])
    np.testing.assert_array_equal(y, a)
    np.testing.assert_array_equal(z_, b)


def test_over_the_bound_is_not_written_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "ref.npz"
    got = keep_reference(path, ["y"], [np.zeros(64, np.float32)], max_bytes=255)
    assert got["kept"] is False and got["bytes"] == 256 and "FARM_REFERENCE_MAX_BYTES (255)" in got["why"]
    assert not path.exists()


def test_a_reference_of_other_outputs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ref.npz"
    keep_reference(path, ["y"], [np.zeros(4, np.float32)], max_bytes=1 << 20)
    with pytest.raises(ValueError, match="holds the outputs"):
        load_reference(path, ["logits"])
    np.savez(path, names=np.array(["y"]), out0=np.zeros(1), out1=np.zeros(1))  # an extra member
    with pytest.raises(ValueError):
        load_reference(path, ["y"])
