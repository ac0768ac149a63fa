from __future__ import annotations

import os

import pytest

from farm.errors import DigestMismatchError, StorageError
from farm.fetch import fetch_artifact
from registry import manifest as mf
from registry.models import Artifact, ArtifactFile
from registry.store.base import put_bytes
from tests.common.index_rows import digest
from tests.common.store import InMemoryBlobStore

CTX = b"onnx model with EPContext node"
BIN = b"\x00context binary\x00" * 100


def publish(store: InMemoryBlobStore, files: dict[str, bytes], *, ctx_model: str = "m_ctx.onnx",
            index_files: dict[str, bytes] | None = None) -> Artifact:
    """Blobs + manifest in the store, and the Artifact row the index would hold (no database)."""
    listed = []
    for name, data in files.items():
        info = put_bytes(store, data)
        role = "ctx-model" if name == ctx_model else "context"
        listed.append({"name": name, "role": role, "digest": info.digest, "size": info.size,
                       "mediaType": "application/octet-stream"})
    manifest = mf.make_manifest(
        model_digest=digest("model"), build_key="0" * 64, backend="qnn", target={"ref": "qnn:SM8650"},
        toolchain={"version": "2.51.0"}, options={}, options_digest=digest("opts"), ctx_model=ctx_model,
        files=listed, epcontext=[], placement={"ep_nodes": 1, "cpu_nodes": 0}, compile_seconds=1.0,
        built_at="2026-01-01T00:00:00+00:00", log=None)
    data, manifest_digest = mf.encode(manifest)
    put_bytes(store, data)
    art = Artifact(digest=manifest_digest, ctx_model=ctx_model)
    indexed = index_files if index_files is not None else files
    art.files = [ArtifactFile(name=n, role="ctx-model" if n == ctx_model else "context",
                              digest=put_bytes(store, d).digest, size=len(d), media_type="x")
                 for n, d in indexed.items()]
    art.files.append(ArtifactFile(name="manifest.json", role="manifest", digest=manifest_digest, size=len(data),
                                  media_type=mf.MEDIA_MANIFEST))
    return art


@pytest.fixture
def store():
    return InMemoryBlobStore()


def test_fetch_lays_out_every_file(store, tmp_path):
    art = publish(store, {"m_ctx.onnx": CTX, "m_qnn.bin": BIN})
    res = fetch_artifact(store, art, tmp_path / "out")
    assert res.ctx_model == tmp_path / "out" / "m_ctx.onnx"
    assert (tmp_path / "out" / "m_ctx.onnx").read_bytes() == CTX
    assert (tmp_path / "out" / "m_qnn.bin").read_bytes() == BIN
    assert res.bytes == len(CTX) + len(BIN)
    assert sorted(os.listdir(tmp_path / "out")) == ["m_ctx.onnx", "m_qnn.bin"]


def test_fetch_renames_only_the_context_model(store, tmp_path):
    art = publish(store, {"m_ctx.onnx": CTX, "m_qnn.bin": BIN})
    res = fetch_artifact(store, art, tmp_path, name="resnet")
    assert res.ctx_model == tmp_path / "resnet_ctx.onnx"
    assert sorted(p.name for p in res.files) == ["m_qnn.bin", "resnet_ctx.onnx"]


def test_tampered_manifest_writes_nothing(store, tmp_path):
    art = publish(store, {"m_ctx.onnx": CTX})
    store.tamper(art.digest, b"{}")
    with pytest.raises(DigestMismatchError):
        fetch_artifact(store, art, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_index_and_manifest_disagree(store, tmp_path):
    art = publish(store, {"m_ctx.onnx": CTX, "m_qnn.bin": BIN}, index_files={"m_ctx.onnx": CTX, "m_qnn.bin": b"x"})
    with pytest.raises(DigestMismatchError, match="disagree"):
        fetch_artifact(store, art, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_tampered_payload_is_not_written(store, tmp_path):
    art = publish(store, {"m_ctx.onnx": CTX})
    ctx = next(f for f in art.files if f.name == "m_ctx.onnx")
    store.tamper(ctx.digest, b"evil" + CTX[4:])
    with pytest.raises(DigestMismatchError):
        fetch_artifact(store, art, tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("unsafe", ["../evil.bin", "/tmp/evil.bin"])
def test_unsafe_file_name_in_manifest(store, tmp_path, unsafe):
    art = publish(store, {"m_ctx.onnx": CTX, unsafe: BIN})
    with pytest.raises(StorageError, match="unsafe"):
        fetch_artifact(store, art, tmp_path / "out")
    assert not (tmp_path / "evil.bin").exists()
