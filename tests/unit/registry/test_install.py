from __future__ import annotations

import os

import pytest

from farm.core.errors import DigestMismatchError, InstallConflictError, ManifestError, SignatureError
from registry import manifest as mf
from registry.install import Expected, fetch_artifact
from registry.models import Artifact, ArtifactFile
from registry.store.base import put_bytes
from tests.common.index_rows import digest
from tests.common.store import InMemoryBlobStore

CTX = b"onnx model with EPContext node"
BIN = b"\x00context binary\x00" * 100


def publish(store: InMemoryBlobStore, files: dict[str, bytes], *, ctx_model: str = "m_ctx.onnx",
            index_files: dict[str, bytes] | None = None, manifest: dict | None = None) -> Artifact:
    """Blobs + manifest in the store, and the Artifact row the index would hold (no database).
    ``manifest`` replaces the manifest wholesale (crafted manifests)."""
    listed = []
    for name, data in files.items():
        info = put_bytes(store, data)
        role = "ctx-model" if name == ctx_model else "context"
        listed.append({"name": name, "role": role, "digest": info.digest, "size": info.size,
                       "mediaType": "application/octet-stream"})
    doc = manifest if manifest is not None else mf.make_manifest(
        model_digest=digest("model"), build_key="0" * 64, backend="qnn",
        target={"ref": "qnn:SM8650", "name": "SM8650"}, toolchain={"version": "2.51.0"}, options={},
        options_digest=digest("opts"), ctx_model=ctx_model, files=listed, epcontext=[],
        placement={"ep_nodes": 1, "cpu_nodes": 0}, compile_seconds=1.0, built_at="2026-01-01T00:00:00+00:00", log=None)
    data, manifest_digest = mf.encode(doc)
    put_bytes(store, data)
    art = Artifact(digest=manifest_digest, ctx_model=ctx_model, model_digest=digest("model"), backend="qnn",
                   target="SM8650", toolchain="2.51.0")
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


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_fetch_lays_out_every_file(store, tmp_path):
    art = publish(store, {"m_ctx.onnx": CTX, "m_qnn.bin": BIN})
    res = fetch_artifact(store, art, tmp_path / "out")
    assert res.ctx_model == tmp_path / "out" / "m_ctx.onnx"
    assert (tmp_path / "out" / "m_ctx.onnx").read_bytes() == CTX
    assert (tmp_path / "out" / "m_qnn.bin").read_bytes() == BIN
    assert res.bytes == len(CTX) + len(BIN)
    assert sorted(os.listdir(tmp_path / "out")) == ["m_ctx.onnx", "m_qnn.bin"]


def test_install_swaps_the_whole_directory(store, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old_ctx.onnx").write_bytes(b"previous artifact")
    fetch_artifact(store, publish(store, {"m_ctx.onnx": CTX, "m_qnn.bin": BIN}), out)
    assert sorted(os.listdir(out)) == ["m_ctx.onnx", "m_qnn.bin"]
    # nothing is left beside it, not even the lock
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


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


def test_a_failed_file_leaves_the_previous_content_whole(store, tmp_path):
    out = tmp_path / "out"
    fetch_artifact(store, publish(store, {"m_ctx.onnx": CTX, "m_qnn.bin": BIN}), out)
    before = {p: (out / p).read_bytes() for p in os.listdir(out)}
    art = publish(store, {"m_ctx.onnx": CTX + b"v2", "m_qnn.bin": BIN + b"v2"})
    bad = next(f for f in art.files if f.name == "m_qnn.bin")
    store.tamper(bad.digest, b"evil")
    with pytest.raises(DigestMismatchError):
        fetch_artifact(store, art, out)
    assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_leftovers_of_a_killed_install_are_cleaned(store, tmp_path):
    (tmp_path / ".out.ctxfarm-new-abc").mkdir()
    (tmp_path / ".out.ctxfarm-new-abc" / "half.bin").write_bytes(b"x")
    fetch_artifact(store, publish(store, {"m_ctx.onnx": CTX}), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_out_that_is_a_file_is_a_conflict_before_anything_moves(store, tmp_path):
    (tmp_path / "out").write_bytes(b"mine")
    with pytest.raises(InstallConflictError):
        fetch_artifact(store, publish(store, {"m_ctx.onnx": CTX}), tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"mine"


def test_manifest_for_another_model_is_refused(store, tmp_path):
    art = publish(store, {"m_ctx.onnx": CTX})
    wanted = Expected(digest("another model"), "qnn", "SM8650", "2.51.0")
    with pytest.raises(SignatureError, match="not for what was requested"):
        fetch_artifact(store, art, tmp_path / "out", expected=wanted)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("unsafe", ["../evil.bin", "/tmp/evil.bin", "a\\..\\b.bin", "./x.bin", "a//b", "", ".",
                                    "nul\x00.bin", "m_ctx.onnx/inner"])
def test_unsafe_file_name_in_manifest(store, tmp_path, unsafe):
    art = publish(store, {"m_ctx.onnx": CTX, unsafe: BIN})
    with pytest.raises(ManifestError):
        fetch_artifact(store, art, tmp_path / "d" / "out")
    assert tree(tmp_path) == []


def _manifest(**over):
    base = {"model": digest("model"), "backend": "qnn", "target": {"name": "SM8650"},
            "toolchain": {"version": "2.51.0"}, "ctxModel": "m_ctx.onnx",
            "files": [{"name": "m_ctx.onnx", "digest": digest("x"), "size": 1}]}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("crafted", [
    _manifest(files=None), _manifest(files=[]), _manifest(files="m_ctx.onnx"),
    _manifest(files=[{"name": "m_ctx.onnx", "digest": digest("x"), "size": "12"}]),
    _manifest(files=[{"name": "m_ctx.onnx", "digest": digest("x"), "size": -1}]),
    _manifest(files=[{"name": "m_ctx.onnx", "digest": digest("x"), "size": True}]),
    _manifest(files=[{"name": "m_ctx.onnx", "digest": "sha256:zz", "size": 1}]),
    _manifest(files=[{"name": "m_ctx.onnx", "digest": digest("x"), "size": 1},
                     {"name": "m_ctx.onnx/b", "digest": digest("y"), "size": 1}]),
    _manifest(files=[{"name": "m_ctx.onnx", "digest": digest("x"), "size": 1},
                     {"name": "m_ctx.onnx", "digest": digest("y"), "size": 1}]),
    _manifest(ctxModel="other.onnx"), _manifest(model="not-a-digest"), _manifest(target=None),
    _manifest(toolchain={"v": 1}), [1, 2], "manifest",
])
def test_crafted_manifests_are_bad_manifest(store, tmp_path, crafted):
    art = publish(store, {"m_ctx.onnx": CTX}, manifest=crafted)
    with pytest.raises(ManifestError):
        fetch_artifact(store, art, tmp_path / "out")
    assert tree(tmp_path) == []


def test_a_garbage_public_key_in_a_signature_row_is_refused_not_a_crash(store, tmp_path):
    import base64

    art = publish(store, {"m_ctx.onnx": CTX})
    trusted = [base64.b64encode(b"k" * 32).decode()]
    garbage = [("!!not base64!!", "also not"), ("", ""), (base64.b64encode(b"short").decode(), "x")]
    with pytest.raises(SignatureError):
        fetch_artifact(store, art, tmp_path / "out", signatures=garbage, trusted=trusted)
    assert not (tmp_path / "out").exists()
