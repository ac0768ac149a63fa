"""onnxruntime-genai packages for real: the fixture exported by bench/genai_export.py, its
parts compiled by QNN 2.51.0 (onnxruntime-qnn) for SM8650, the twin generated through
onnxruntime-genai 0.18 on the HTP simulator against the source on the CPU EP, and the folder
check of a weight-shared package (og.Config, files, EPContext paths, each .bin's graphs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from farm.core import genai
from farm.core.catalog import parse_target
from farm.core.errors import GenaiFolderError
from tests.common.genai import build_package, edit_config, make_export

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnxruntime_qnn")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_export(tmp_path_factory.mktemp("genai") / "export")


@pytest.fixture(scope="module")
def package(export_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_package(export_dir, tmp_path_factory.mktemp("pkg") / "folder")


def test_the_twin_generates_the_cpu_tokens_on_the_simulator(export_dir: Path, tmp_path: Path) -> None:
    from workers.qnn.genai import run_twin

    twin = run_twin(export_dir, parse_target("qnn:SM8650"), {}, tmp_path / "work", tokens=16)
    assert twin["status"] == "ok", twin.get("detail")
    # At least 4 tokens from the simulator's decode steps (the first is the CPU prefill's), more
    # while the part checks run beside the generation, up to 16: every one compared and matched.
    assert 5 <= twin["tokens_compared"] <= 16 and twin["tokens_matched"] == twin["tokens_compared"], twin
    assert twin["tokens_stopped"] in ("tokens", "parts-done") and twin["prefill_on"] == "cpu"
    assert twin["twin_tokens"] == twin["reference_tokens"] and twin["first_mismatch"] is None
    # Every part graph ran on the HTP: one EPContext node each, nothing left on the CPU.
    assert set(twin["graphs"]) == {"part0.prefill", "part0.decode", "part1.prefill", "part1.decode"}
    assert all(g["ep_nodes"] == 1 and g["cpu_nodes"] == 0 for g in twin["graphs"].values())
    # fp16 on the HTP: close, not equal (identical logits would mean the CPU ran the "twin").
    assert 30.0 < twin["first_step"]["psnr_db"] < 200.0 and twin["max_logit_error"] > 0
    # Each part's prefill and one decode step against the CPU EP: a finite PSNR for every output.
    export = genai.read_export(export_dir)
    assert [p["part"] for p in twin["parts"]] == [0, 1] and all(p["status"] == "ok" for p in twin["parts"])
    for p, part in zip(twin["parts"], export.parts, strict=True):
        assert set(p["prefill"]) == set(part.prefill.graph.output_names)
        assert set(p["decode"]) == set(part.decode.graph.output_names)
        assert all(30.0 < v < 200.0 for phase in ("prefill", "decode") for v in p[phase].values()), p
    assert twin["compiled"] == "here" and twin["timing"]["compile"] > 0
    assert twin["timing"]["parts_check"] > 0 and twin["timing"]["generate"] > 0
    assert twin["worst_part"]["psnr_db"] == min(v for p in twin["parts"] for ph in ("prefill", "decode")
                                                for v in p[ph].values())


def _twin_contexts(export_dir: Path, out: Path, parts: tuple[int, ...] = (0, 1)) -> dict[str, str]:
    from workers.qnn.genai import twin_compile_part

    files: dict[str, str] = {}
    for i in parts:
        res = twin_compile_part(export_dir, i, parse_target("qnn:SM8650"), {}, out / f"part{i}")
        assert res["part"] == i and res["compile_seconds"] > 0
        files.update(res["files"])
    return files


def test_precompiled_twin_contexts_are_used_and_nothing_is_compiled(export_dir: Path, tmp_path: Path) -> None:
    """The contexts of each part compiled as their own jobs (twin_compile_part), then the check:
    it compiles nothing; the prefill runs on the CPU EP in the generation (the part checks ran
    it on the simulator), and 4 decode steps on the simulator are compared."""
    from workers.qnn.genai import run_twin

    files = _twin_contexts(export_dir, tmp_path / "ctx")
    assert set(files) == {"context_0", "iterator_0", "context_1", "iterator_1"}
    assert all(Path(f).is_file() and Path(f).with_name(Path(f).stem + "_qnn.bin").is_file() for f in files.values())
    twin = run_twin(export_dir, parse_target("qnn:SM8650"), {}, tmp_path / "work", tokens=4, compiled=files,
                    prefill_on="cpu")
    assert twin["status"] == "ok", twin.get("detail")
    assert twin["compiled"] == "given" and twin["timing"]["compile"] == 0 and twin["compile_seconds"] == 0
    assert all(g["given"] and g["compile_seconds"] is None and g["ep_nodes"] == 1 for g in twin["graphs"].values())
    assert not list((tmp_path / "work").glob("twin-compile"))  # no compile child ran
    # 4 tokens from the HTP's decode steps (the first token is the CPU prefill's: 5 compared).
    assert twin["prefill_on"] == "cpu" and twin["tokens_compared"] == twin["tokens_matched"] == 5
    assert 30.0 < twin["first_step"]["psnr_db"] < 200.0
    assert [p["status"] for p in twin["parts"]] == ["ok", "ok"]


def test_a_broken_part_gives_a_low_psnr_naming_the_part(export_dir: Path, tmp_path: Path) -> None:
    """Part 1's twin compiled from weights changed on purpose: its check against the export's own
    graphs on the CPU EP falls far below the gate, and --require-twin's refusal names part 1."""
    import numpy as np

    from farm.core.genai import TWIN_MIN_PSNR
    from farm.pipeline.genai import twin_refusal
    from workers.qnn.genai import run_twin

    broken = tmp_path / "broken"
    shutil.copytree(export_dir, broken)
    data = broken / "context_1.onnx.data"
    raw = np.fromfile(data, dtype=np.float32)
    raw[:] = np.random.default_rng(0).normal(0.0, 1.0, raw.size).astype(np.float32)
    raw.tofile(data)
    files = {**_twin_contexts(export_dir, tmp_path / "ok", (0,)), **_twin_contexts(broken, tmp_path / "bad", (1,))}
    twin = run_twin(export_dir, parse_target("qnn:SM8650"), {}, tmp_path / "work", tokens=4, compiled=files,
                    prefill_on="qnn")  # the generation's prefill on the simulator too (the other mode)
    assert twin["prefill_on"] == "qnn" and twin["compiled"] == "given"
    p0, p1 = twin["parts"]
    assert p0["worst"]["psnr_db"] > TWIN_MIN_PSNR and p1["worst"]["psnr_db"] < TWIN_MIN_PSNR, twin["parts"]
    assert twin["worst_part"]["part"] == 1
    refusal = twin_refusal(twin, "sha256:" + "0" * 64)
    assert refusal is not None and refusal.code == "twin-mismatch" and "part 1's" in refusal.message


def test_the_twin_of_what_olive_itself_wrote(tmp_path: Path) -> None:
    """tests/data/genai/olive-qwen2-tiny (Olive 0.13's static passes): GroupQueryAttention stays
    on the CPU inside each compiled graph, the rest runs on the HTP, and every token matches."""
    from workers.qnn.genai import run_twin

    export = Path(__file__).resolve().parents[1] / "data" / "genai" / "olive-qwen2-tiny"
    twin = run_twin(export, parse_target("qnn:SM8650"), {}, tmp_path / "work", tokens=16)
    assert twin["status"] == "ok", twin.get("detail")
    assert twin["tokens_compared"] >= 5 and twin["tokens_matched"] == twin["tokens_compared"], twin
    assert all(g["ep_nodes"] >= 1 and g["cpu_op_types"] == ["GroupQueryAttention"] for g in twin["graphs"].values())
    assert twin["first_step"]["psnr_db"] > 30.0
    # Olive's parts pass the residual stream as two tensors and a scalar total_seq_len: each part
    # is checked with its inputs as the stages before it compute them.
    assert [p["status"] for p in twin["parts"]] == ["ok", "ok"] and twin["worst_part"]["psnr_db"] > 30.0


def test_a_part_the_ep_splits_around_a_cpu_op_builds_as_a_group(farm_env: dict[str, str]) -> None:
    """Olive's part graphs keep GroupQueryAttention on the CPU, so the QNN EP cuts each in two
    partitions; the second EPContext node (main_context 0) names no binary of its own. The group
    build used to fail on it (toolchain-error: "EPContext points outside its directory: ''")."""
    import json

    from tests.common.cli import farm

    export = Path(__file__).resolve().parents[1] / "data" / "genai" / "olive-qwen2-tiny"
    out = json.loads(farm(farm_env, "build", "--graph", f"prefill={export / 'context_0.onnx'}",
                          "--graph", f"decode={export / 'iterator_0.onnx'}", "-t", "qnn:SM8650", "--json").stdout)
    (b,) = out["builds"]
    assert b["state"] == "built", b
    assert (b["nodes_ep"], b["nodes_cpu"]) == (4, 2)  # two partitions and one GQA per graph


def test_a_weight_shared_package_passes_the_folder_check(export_dir: Path, package: Path, tmp_path: Path) -> None:
    from workers.qnn.genai import check_folder

    res = check_folder(package, tmp_path / "w", parts=[["context_0_ctx.onnx", "iterator_0_ctx.onnx"],
                                                      ["context_1_ctx.onnx", "iterator_1_ctx.onnx"]])
    # One .bin per part, holding exactly that part's prefill and decode graph.
    assert {b: (v["prefill"], v["decode"], len(v["graphs"])) for b, v in res["binaries"].items()} == {
        "context_0_ctx_qnn.bin": ("context_0_ctx.onnx", "iterator_0_ctx.onnx", 2),
        "context_1_ctx_qnn.bin": ("context_1_ctx.onnx", "iterator_1_ctx.onnx", 2)}
    # The pipeline in the exporter's order: embeddings, context_*, iterator_*, lm_head.
    assert [s["name"] for s in res["stages"]] == [s.name for s in genai.read_export(export_dir).stages] == [
        "embeddings", "context_0", "context_1", "iterator_0", "iterator_1", "lm_head"]


@pytest.mark.parametrize("breakage,needle", [
    ("missing-bin", "context_1_ctx_qnn.bin"),
    ("bad-schema", "onnxruntime-genai refuses it"),
    ("crossed-parts", "context_0_ctx_qnn.bin"),
    ("missing-stage", "lm_head.onnx"),
])
def test_a_broken_package_is_refused_with_its_code(package: Path, tmp_path: Path, breakage: str, needle: str) -> None:
    from workers.qnn.genai import check_folder

    broken = tmp_path / "broken"
    shutil.copytree(package, broken)
    if breakage == "missing-bin":
        (broken / "context_1_ctx_qnn.bin").unlink()
    elif breakage == "bad-schema":
        edit_config(broken, lambda d: d["model"]["decoder"].update(bogus=1))
    elif breakage == "crossed-parts":  # part 1's decode stage runs part 0's decode graph
        edit_config(broken, lambda d: d["model"]["decoder"]["pipeline"][0]["iterator_1"].update(
            filename="iterator_0_ctx.onnx"))
    else:
        (broken / "lm_head.onnx").unlink()
    with pytest.raises(GenaiFolderError) as info:
        check_folder(broken, tmp_path / "w")
    assert info.value.code == "genai-folder-invalid" and needle in info.value.message, info.value.message


def test_a_prompt_the_cache_cannot_hold_is_bad_genai(export_dir: Path, tmp_path: Path) -> None:
    from farm.core.errors import BadGenaiError
    from workers.qnn.genai import run_twin

    with pytest.raises(BadGenaiError, match="the KV cache holds 64"):
        run_twin(export_dir, parse_target("qnn:SM8650"), {}, tmp_path / "work", prompt="The farm " * 40)
