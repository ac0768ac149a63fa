from __future__ import annotations

import shutil

import onnx
import pytest

from farm.core.bundle import inspect_model
from farm.core.errors import InvalidModelError
from farm.core.keys import sha256_file
from tests.common.onnx_models import empty_graph, matmul_add, save, save_external, set_external_location


def invalid(path) -> InvalidModelError:
    with pytest.raises(InvalidModelError) as info:
        inspect_model(path)
    assert info.value.code == "invalid-model"
    return info.value


def test_plain_model(tmp_path):
    path = save(matmul_add(), tmp_path / "m.onnx")
    b = inspect_model(path)
    assert b.path == path.resolve()
    assert b.onnx.digest == sha256_file(path)[0]
    assert b.size == path.stat().st_size
    assert b.external == ()
    assert (b.opset, b.node_count, b.op_types) == (17, 2, ("Add", "MatMul"))
    assert b.stem == "m"
    assert b.files_json() == [{"path": "model.onnx", "digest": b.onnx.digest, "size": b.onnx.size}]  # fixed name
    # The bundle digest is over the listing, not the raw .onnx digest.
    assert b.digest != b.onnx.digest


def test_same_bytes_same_digest_different_weights_different_digest(tmp_path):
    a = inspect_model(save(matmul_add(seed=1), tmp_path / "a.onnx"))
    b = inspect_model(save(matmul_add(seed=1), tmp_path / "b.onnx"))
    c = inspect_model(save(matmul_add(seed=2), tmp_path / "c.onnx"))
    assert a.digest == b.digest != c.digest


def test_missing_file(tmp_path):
    assert "no such file" in invalid(tmp_path / "nope.onnx").message


def test_directory(tmp_path):
    assert "not a regular file" in invalid(tmp_path).message


def test_empty_file(tmp_path):
    (tmp_path / "e.onnx").write_bytes(b"")
    assert "empty" in invalid(tmp_path / "e.onnx").message


@pytest.mark.parametrize("data", [b"hello, this is not a model\n", b"\xff\xfe\x00garbage" * 10,
                                  b"PK\x03\x04" + bytes(100)])
def test_not_onnx(tmp_path, data):
    (tmp_path / "x.onnx").write_bytes(data)
    assert "not an ONNX file" in invalid(tmp_path / "x.onnx").message


def test_truncated_onnx(tmp_path):
    data = matmul_add(size=32).SerializeToString()
    (tmp_path / "t.onnx").write_bytes(data[: len(data) // 2])
    exc = invalid(tmp_path / "t.onnx")
    assert "truncated" in exc.message
    assert exc.hint


def test_graph_without_nodes(tmp_path):
    assert "no nodes" in invalid(save(empty_graph(), tmp_path / "e.onnx")).message


def test_checker_rejection(tmp_path):
    model = matmul_add()
    model.graph.node[0].op_type = "NoSuchOp"
    assert "checker" in invalid(save(model, tmp_path / "bad.onnx")).message


# ---- external data ------------------------------------------------------------------------------

@pytest.fixture
def ext(tmp_path):
    """A model with its weights in w.data, in its own directory."""
    return save_external(matmul_add(size=16), tmp_path / "bundle" / "m.onnx")


def test_external_data_is_listed_and_digested(ext):
    b = inspect_model(ext)
    data = ext.parent / "w.data"
    assert [(f.path, f.digest, f.size) for f in b.external] == [("w.data", *sha256_file(data))]
    assert b.size == ext.stat().st_size + data.stat().st_size
    assert [f["path"] for f in b.files_json()] == ["model.onnx", "w.data"]


def test_digest_covers_the_data_file(ext):
    before = inspect_model(ext).digest
    data = ext.parent / "w.data"
    raw = bytearray(data.read_bytes())
    raw[5] ^= 0xFF
    data.write_bytes(bytes(raw))
    after = inspect_model(ext)
    assert after.onnx.digest == sha256_file(ext)[0]  # the .onnx did not change...
    assert after.digest != before  # ...but the bundle did


def test_digest_survives_moving_the_bundle(ext, tmp_path):
    before = inspect_model(ext).digest
    moved = tmp_path / "elsewhere" / "deeper"
    shutil.move(str(ext.parent), str(moved))
    assert inspect_model(moved / "m.onnx").digest == before


def test_digest_survives_renaming_the_onnx(ext):
    before = inspect_model(ext).digest
    renamed = ext.rename(ext.parent / "renamed.onnx")
    b = inspect_model(renamed)
    assert b.digest == before
    assert b.stem == "renamed"


def test_digest_depends_on_data_file_name(tmp_path):
    a = inspect_model(save_external(matmul_add(), tmp_path / "a" / "m.onnx", location="w.data"))
    b = inspect_model(save_external(matmul_add(), tmp_path / "b" / "m.onnx", location="v.data"))
    assert a.external[0].digest == b.external[0].digest
    assert a.digest != b.digest


def test_data_file_in_a_subdirectory(tmp_path):
    (tmp_path / "weights").mkdir()
    path = save_external(matmul_add(), tmp_path / "m.onnx", location="weights/w.data")
    assert [f.path for f in inspect_model(path).external] == ["weights/w.data"]


@pytest.mark.parametrize("location", ["../outside.data", "sub/../../outside.data"])
def test_relative_location_leaving_the_directory(ext, location):
    (ext.parent.parent / "outside.data").write_bytes((ext.parent / "w.data").read_bytes())
    set_external_location(ext, location)
    exc = invalid(ext)
    assert "outside" in exc.message


def test_absolute_location(ext, tmp_path):
    outside = tmp_path / "outside.data"
    outside.write_bytes((ext.parent / "w.data").read_bytes())
    set_external_location(ext, str(outside))
    assert "outside" in invalid(ext).message


def test_symlink_leaving_the_directory(ext, tmp_path):
    outside = tmp_path / "outside.data"
    shutil.move(str(ext.parent / "w.data"), str(outside))
    (ext.parent / "w.data").symlink_to(outside)
    assert "outside" in invalid(ext).message


def test_missing_data_file(ext):
    (ext.parent / "w.data").unlink()
    exc = invalid(ext)
    assert "missing" in exc.message and "w.data" in exc.message


def test_truncated_data_file(ext):
    data = ext.parent / "w.data"
    data.write_bytes(data.read_bytes()[:-10])
    exc = invalid(ext)
    assert "truncated" in exc.message


def test_external_tensor_without_location(ext):
    model = onnx.load(str(ext), load_external_data=False)
    for tensor in model.graph.initializer:
        kept = [e for e in tensor.external_data if e.key != "location"]
        del tensor.external_data[:]
        tensor.external_data.extend(kept)
    ext.write_bytes(model.SerializeToString())
    assert "refused" in invalid(ext).message


def test_a_data_file_two_graphs_share_is_read_once_while_unchanged(tmp_path, monkeypatch):
    """The prefill and decode graphs of a part share one external-data file: inspecting both reads
    it once (remembered by its stat in this process); a file written since is read again."""
    import os

    import farm.core.bundle as bundle

    a = save_external(matmul_add(size=16), tmp_path / "bundle" / "a.onnx")
    b = tmp_path / "bundle" / "b.onnx"
    shutil.copyfile(a, b)
    data = tmp_path / "bundle" / "w.data"
    os.utime(data, ns=(1_000_000_000, 1_000_000_000))  # written a while ago
    read = []
    monkeypatch.setattr(bundle, "sha256_file", lambda p: (read.append(p), sha256_file(p))[1])
    first, second = inspect_model(a), inspect_model(b)
    assert first.external == second.external and read == [data]
    raw = bytearray(data.read_bytes())
    raw[5] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert inspect_model(b).external[0].digest == sha256_file(data)[0] != first.external[0].digest
