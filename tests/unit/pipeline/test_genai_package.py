"""The genai package's pieces that need no compile (farm.pipeline.genai, farm.core.untrusted's
manifest_stages, farm.cli.folder_check, the bundle cache's shared files)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import helper

from farm.core.errors import LoadUnverifiedError, ManifestError, NotAContextError, NotFoundError
from farm.core.untrusted import manifest_stages
from farm.pipeline.genai import rename_contexts, twin_refusal

DIGEST = "sha256:" + "ab" * 32


def _ctx_model(bin_name: str) -> bytes:
    node = helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft", embed_mode=0,
                            ep_cache_context=bin_name, source="QNNExecutionProvider")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def test_rename_contexts_points_the_epcontext_at_the_new_binary_only() -> None:
    data = _ctx_model("g0_ctx_qnn.bin")
    out = onnx.load_from_string(rename_contexts(data, {"g0_ctx_qnn.bin": "context_0_ctx_qnn.bin"}))
    (attr,) = [a for a in out.graph.node[0].attribute if a.name == "ep_cache_context"]
    assert attr.s == b"context_0_ctx_qnn.bin"
    # A name not in the mapping: the very same bytes (the blob stays the group's).
    assert rename_contexts(data, {"other.bin": "x.bin"}) == data


def _manifest(**extra: Any) -> dict[str, Any]:
    return {"files": [{"name": n, "digest": DIGEST, "size": 1} for n in
                      ("genai_config.json", "context_0_ctx.onnx", "embeddings.onnx")], **extra}


def test_manifest_stages_names_roles_and_refuses_what_the_manifest_does_not_hold() -> None:
    stages = [{"file": "embeddings.onnx", "role": "embeddings"}, {"file": "context_0_ctx.onnx", "role": "part0.prefill"}]
    assert manifest_stages(_manifest(genai={"stages": stages})) == stages
    assert manifest_stages(_manifest(graphs=[{"name": "prefill", "ctxModel": "context_0_ctx.onnx"}])) == [
        {"file": "context_0_ctx.onnx", "role": "prefill"}]
    assert manifest_stages(_manifest()) == []
    for bad in ([{"file": "../etc/passwd", "role": "embeddings"}],       # not one of its files
                [{"file": "embeddings.onnx", "role": "../x"}],           # not a plain role
                [{"file": "embeddings.onnx", "role": "x" * 200}],
                ["embeddings.onnx"]):
        with pytest.raises(ManifestError):
            manifest_stages(_manifest(genai={"stages": bad}))


def test_the_twin_gate() -> None:
    assert twin_refusal({"status": "ok", "tokens_compared": 16, "tokens_matched": 16}, DIGEST) is None
    for tw in (None, {"status": "unverified", "detail": "budget"}, {"status": "ok", "tokens_compared": 16,
                                                                     "tokens_matched": 15},
               {"status": "ok", "tokens_compared": 0, "tokens_matched": 0}):
        refusal = twin_refusal(tw, DIGEST)
        assert refusal is not None and refusal.code == "twin-mismatch"


def test_the_twin_gate_refuses_a_part_below_the_psnr_threshold_naming_it() -> None:
    good = {"status": "ok", "part": 0, "prefill": {"h": 74.7, "present.0.key": 87.9}, "decode": {"h": 73.5}}
    tw = {"status": "ok", "tokens_compared": 4, "tokens_matched": 4, "parts": [good]}
    assert twin_refusal(tw, DIGEST) is None
    low = {**good, "part": 1, "decode": {"/model/norm/output_0": 12.0}}
    refusal = twin_refusal({**tw, "parts": [good, low]}, DIGEST)
    assert refusal is not None and refusal.code == "twin-mismatch"
    assert "part 1's decode" in refusal.message and "'/model/norm/output_0'" in refusal.message
    assert twin_refusal({**tw, "parts": [good, low]}, DIGEST, min_psnr=10.0) is None
    crashed = {"part": 1, "status": "runtime-crashed", "detail": "part 1: the simulator crashed"}
    refusal = twin_refusal({**tw, "parts": [good, crashed]}, DIGEST)
    assert refusal is not None and "part 1" in refusal.message


def _folder(tmp_path: Path, config: Any) -> Path:
    d = tmp_path / "pkg"
    d.mkdir()
    (d / "genai_config.json").write_text(json.dumps(config))
    return d


class _Target:
    ref = "qnn:SM8650"


def test_folder_check_gives_one_outcome_for_the_folder(tmp_path: Path) -> None:
    from farm.cli.folder_check import check_folder

    config = {"model": {"decoder": {"pipeline": [{"e": {"filename": "embeddings.onnx"},
                                                  "c": {"filename": "context_0_ctx.onnx"}}]}}}
    d = _folder(tmp_path, config)
    (d / "embeddings.onnx").write_bytes(b"x")
    # A stage file the config names is missing, and the tokenizer (no config names it): not-found naming both.
    with pytest.raises(NotFoundError, match="lacks 2 file.s. the genai package needs: context_0_ctx.onnx, tokenizer.json"):
        check_folder(d, _Target(), lambda p, t: {})
    (d / "context_0_ctx.onnx").write_bytes(b"x")
    (d / "tokenizer.json").write_text("{}")
    # Nothing in it is a context model (an export that was never built): refused, not "loaded".
    with pytest.raises(NotAContextError, match="holds no context model") as plain:
        check_folder(d, _Target(), lambda p, t: (_ for _ in ()).throw(NotAContextError("plain")))
    assert "build it first" in (plain.value.hint or "")

    def weight_shared(path: Path, target: Any) -> dict[str, Any]:
        if path.name == "embeddings.onnx":
            raise NotAContextError("plain model")
        raise LoadUnverifiedError("shared", details={"unverified": "the simulator cannot load weight-shared contexts"})

    with pytest.raises(LoadUnverifiedError) as got:
        check_folder(d, _Target(), weight_shared)
    assert got.value.exit_code == 4 and "weight-shared" in got.value.message
    outcomes = {c["file"]: c["outcome"] for c in got.value.details["contexts"]}
    assert outcomes["embeddings.onnx"].startswith("cpu stage") and outcomes["context_0_ctx.onnx"].startswith("checked")
    # Every context loads: one report, ok.
    ok = check_folder(d, _Target(), lambda p, t: (_ for _ in ()).throw(NotAContextError("x"))
                      if p.name == "embeddings.onnx" else {"load_seconds": 0.1})
    assert ok["ok"] and len(ok["contexts"]) == 2


def test_folder_check_refuses_a_config_naming_a_path_outside(tmp_path: Path) -> None:
    from farm.cli.folder_check import check_folder

    d = _folder(tmp_path, {"model": {"decoder": {"pipeline": [{"c": {"filename": "../outside.onnx"}}]}}})
    (tmp_path / "outside.onnx").write_bytes(b"x")
    with pytest.raises(NotFoundError, match="outside"):
        check_folder(d, _Target(), lambda p, t: {})
    (d / "genai_config.json").write_text("{not json")
    with pytest.raises(NotFoundError, match="not a readable genai config"):
        check_folder(d, _Target(), lambda p, t: {})


def test_a_file_listed_twice_in_a_snapshot_is_fetched_once_and_stored_once(tmp_path: Path) -> None:
    from farm.pipeline.bundles import download_bundle
    from registry.store.base import put_bytes
    from registry.store.local import LocalBlobStore

    store = LocalBlobStore(tmp_path / "store")
    data = os.urandom(4096)
    digest = put_bytes(store, data).digest
    head = put_bytes(store, b"onnx").digest
    files = [{"path": "group.json", "digest": head, "size": 4, "stored": True},
             {"path": "g0/model.data", "digest": digest, "size": 4096, "stored": True},
             {"path": "g1/model.data", "digest": digest, "size": 4096, "stored": True}]
    download_bundle(store, files, tmp_path / "out")
    a, b = tmp_path / "out" / "g0" / "model.data", tmp_path / "out" / "g1" / "model.data"
    assert a.read_bytes() == b.read_bytes() == data
    assert a.stat().st_ino == b.stat().st_ino  # one file on disk, two names


def _layout(stages: list[dict[str, Any]], parts: list[dict[str, Any]]) -> Any:
    from farm.pipeline.genai import Layout

    return Layout([], stages, parts, {}, {}, [], {}, 0.0, 0, 0)


def test_the_farm_refuses_to_publish_a_folder_that_does_not_hold_together(tmp_path: Path) -> None:
    """genai-folder-invalid, naming the file: a stage the config does not name, a binary a
    part's context models do not both use, an EPContext pointing outside the folder."""
    from farm.core.errors import GenaiFolderError
    from farm.pipeline.genai import check_folder

    stages = [{"file": "context_0_ctx.onnx", "role": "part0.prefill", "part": 0},
              {"file": "iterator_0_ctx.onnx", "role": "part0.decode", "part": 0}]
    parts = [{"part": 0, "binaries": ["context_0_ctx_qnn.bin"]}]
    config = {"model": {"decoder": {"pipeline": [{"c": {"filename": "context_0_ctx.onnx"},
                                                  "i": {"filename": "iterator_0_ctx.onnx"}}]}}}
    d = _folder(tmp_path, config)
    (d / "context_0_ctx_qnn.bin").write_bytes(b"ctx")
    (d / "context_0_ctx.onnx").write_bytes(_ctx_model("context_0_ctx_qnn.bin"))
    (d / "iterator_0_ctx.onnx").write_bytes(_ctx_model("context_0_ctx_qnn.bin"))
    check_folder(d, _layout(stages, parts))  # holds together
    (d / "iterator_0_ctx.onnx").write_bytes(_ctx_model("other.bin"))
    (d / "other.bin").write_bytes(b"x")
    with pytest.raises(GenaiFolderError, match="context_0_ctx_qnn.bin"):
        check_folder(d, _layout(stages, parts))
    (d / "iterator_0_ctx.onnx").write_bytes(_ctx_model("../escape.bin"))
    with pytest.raises(GenaiFolderError, match="outside the folder"):
        check_folder(d, _layout(stages, parts))
    (d / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"pipeline": [
        {"c": {"filename": "context_0_ctx.onnx"}}]}}}))
    with pytest.raises(GenaiFolderError, match="iterator_0_ctx.onnx"):
        check_folder(d, _layout(stages, parts))


def test_a_binary_its_part_build_described_is_neither_laid_out_nor_read_again(tmp_path: Path) -> None:
    """A part's binary the part build described (the QNN System API read its graphs from the same
    bytes) is not fetched for the folder check: from S3 it is most of the package. The rest of the
    check still holds: a binary neither in the folder nor described is refused, and a described
    one still has to be used by exactly its part's two context models."""
    from farm.core.errors import GenaiFolderError
    from farm.pipeline.genai import Layout, check_folder
    from farm.pipeline.genai.assembly import _described, _materialize

    description = {"check": "ok: the binaries hold exactly the requested graphs",
                   "graphs": [{"name": "prefill", "qnn_graphs": ["p0"], "binaries": ["out_ctx.bin"]},
                              {"name": "decode", "qnn_graphs": ["d0"], "binaries": ["out_ctx.bin"]}]}
    renamed = {"out_ctx.bin": "context_0_ctx_qnn.bin"}
    assert _described(description, renamed) == {"context_0_ctx_qnn.bin": ["d0", "p0"]}
    # Evidence that is not the check's ok, or not shaped as one, vouches for nothing: read it again.
    assert _described({**description, "check": "not read: embedded"}, renamed) == {}
    assert _described({"check": "ok", "graphs": ["x"]}, renamed) == {}
    assert _described(None, renamed) == {}

    class Store:
        def stat(self, digest: str) -> Any:
            raise AssertionError(f"{digest} was fetched")

    class Reg:
        store = Store()

    stages = [{"file": "context_0_ctx.onnx", "role": "part0.prefill", "part": 0},
              {"file": "iterator_0_ctx.onnx", "role": "part0.decode", "part": 0}]
    parts = [{"part": 0, "binaries": ["context_0_ctx_qnn.bin"]}]
    layout = Layout([{"name": "context_0_ctx_qnn.bin", "role": "context", "digest": "sha256:" + "a" * 64,
                      "size": 1 << 31, "mediaType": "application/octet-stream"}], stages, parts, {}, {}, [], {},
                    0.0, 0, 0, _described(description, renamed))
    folder = tmp_path / "package"
    _materialize(Reg, layout, folder)  # nothing fetched
    assert not (folder / "context_0_ctx_qnn.bin").exists()
    config = {"model": {"decoder": {"pipeline": [{"c": {"filename": "context_0_ctx.onnx"},
                                                  "i": {"filename": "iterator_0_ctx.onnx"}}]}}}
    (folder / "genai_config.json").write_text(json.dumps(config))
    (folder / "context_0_ctx.onnx").write_bytes(_ctx_model("context_0_ctx_qnn.bin"))
    (folder / "iterator_0_ctx.onnx").write_bytes(_ctx_model("context_0_ctx_qnn.bin"))
    check_folder(folder, layout)
    with pytest.raises(GenaiFolderError, match="not in the folder"):
        check_folder(folder, _layout(stages, parts))  # not described: it must be there
    (folder / "iterator_0_ctx.onnx").write_bytes(_ctx_model("other.bin"))
    (folder / "other.bin").write_bytes(b"x")
    with pytest.raises(GenaiFolderError, match="context_0_ctx_qnn.bin"):
        check_folder(folder, layout)


def _blob_layout(files: list[tuple[str, str, int]]) -> Any:
    from farm.pipeline.genai import Layout

    return Layout([{"name": n, "role": "context", "digest": d, "size": s, "mediaType": "application/octet-stream"}
                   for n, d, s in files], [], [], {}, {}, [], {}, 0.0, 0, 0)


def test_each_target_folder_links_the_stored_blobs_and_each_blob_is_read_once(tmp_path: Path) -> None:
    """The fan-in of two targets: the carried files (CPU stages, tokenizer: the same blobs in every
    target's folder) are hard links of the store's blobs, each verified once for all targets, not
    copied and hashed per target; a blob this store wrote (a part's binary) is not read again."""
    from farm.core.errors import DigestMismatchError
    from farm.pipeline.genai.assembly import _materialize
    from registry.store.base import put_bytes
    from registry.store.local import LocalBlobStore

    root = tmp_path / "store"
    carried = [(f"carried{i}.onnx.data", put_bytes(LocalBlobStore(root), os.urandom(8192)).digest, 8192)
               for i in range(5)]

    class Reg:
        store = LocalBlobStore(root)  # another process's view: nothing it wrote itself

    for _, d, _ in carried:  # stored a while ago
        os.utime(Reg.store.path_of(d), ns=(1_000_000_000, 1_000_000_000))
    bins = {soc: put_bytes(Reg.store, os.urandom(4096)).digest for soc in ("SM8650", "SM8750")}
    for soc, digest in bins.items():
        _materialize(Reg, _blob_layout([*carried, ("context_0_ctx_qnn.bin", digest, 4096)]), tmp_path / soc)
        for name, d, _ in carried:
            assert (tmp_path / soc / name).stat().st_ino == Reg.store.path_of(d).stat().st_ino
    assert Reg.store.hashes == len(carried)  # once per carried digest, for both targets; the binaries never
    # A blob altered in place after it was verified is read again and refused.
    victim = Reg.store.path_of(carried[0][1])
    victim.chmod(0o644)
    victim.write_bytes(os.urandom(8192))
    with pytest.raises(DigestMismatchError):
        _materialize(Reg, _blob_layout(carried[:1]), tmp_path / "again")


def test_the_bundle_cache_links_a_local_stores_blobs_and_reads_a_shared_file_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import farm.pipeline.bundles as bundles
    from registry.store.base import put_bytes
    from registry.store.local import LocalBlobStore

    store = LocalBlobStore(tmp_path / "store")
    data = put_bytes(store, os.urandom(4096)).digest
    head = put_bytes(store, b"onnx").digest
    files = [{"path": "group.json", "digest": head, "size": 4, "stored": True},
             {"path": "g0/model.data", "digest": data, "size": 4096, "stored": True},
             {"path": "g1/model.data", "digest": data, "size": 4096, "stored": True}]
    read: list[Path] = []
    real = bundles.sha256_file
    monkeypatch.setattr(bundles, "sha256_file", lambda p: (read.append(p), real(p))[1])
    cache = bundles.BundleCache(tmp_path / "cache", 1 << 20)
    _, hit = cache.fetch(store, "sha256:" + "cd" * 32, files, tmp_path / "job")
    assert not hit
    job = tmp_path / "job" / "g1" / "model.data"
    assert job.stat().st_ino == store.path_of(data).stat().st_ino  # no copy of the weights
    # The store object that wrote the blobs hashed them as it did: nothing is read again.
    assert read == []
    # Another store object (another process) verifies what it did not write; the shared file once.
    _, hit = cache.fetch(LocalBlobStore(tmp_path / "store"), "sha256:" + "cd" * 32, files, tmp_path / "job2")
    assert hit and len(read) == 2
