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
    assert twin["tokens_compared"] == 16 and twin["tokens_matched"] == 16, twin
    assert twin["twin_tokens"] == twin["reference_tokens"] and twin["first_mismatch"] is None
    # Every part graph ran on the HTP: one EPContext node each, nothing left on the CPU.
    assert set(twin["graphs"]) == {"part0.prefill", "part0.decode", "part1.prefill", "part1.decode"}
    assert all(g["ep_nodes"] == 1 and g["cpu_nodes"] == 0 for g in twin["graphs"].values())
    # fp16 on the HTP: close, not equal (identical logits would mean the CPU ran the "twin").
    assert 30.0 < twin["first_step"]["psnr_db"] < 200.0 and twin["max_logit_error"] > 0


def test_the_twin_of_what_olive_itself_wrote(tmp_path: Path) -> None:
    """tests/data/genai/olive-qwen2-tiny (Olive 0.13's static passes): GroupQueryAttention stays
    on the CPU inside each compiled graph, the rest runs on the HTP, and every token matches."""
    from workers.qnn.genai import run_twin

    export = Path(__file__).resolve().parents[1] / "data" / "genai" / "olive-qwen2-tiny"
    twin = run_twin(export, parse_target("qnn:SM8650"), {}, tmp_path / "work", tokens=16)
    assert twin["status"] == "ok", twin.get("detail")
    assert (twin["tokens_compared"], twin["tokens_matched"]) == (16, 16), twin
    assert all(g["ep_nodes"] >= 1 and g["cpu_op_types"] == ["GroupQueryAttention"] for g in twin["graphs"].values())
    assert twin["first_step"]["psnr_db"] > 30.0


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
