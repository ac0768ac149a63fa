"""Partial offload in plain sight and the build's own compatibility string, for real:
QNN 2.51.0 compiles under onnxruntime 1.32.0 in the embedded farm, read back through build,
resolve, show and coverage (CLI, JSON and the /coverage page)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.core.settings import Settings
from tests.common.cli import farm
from tests.common.groups import prefill_decode
from tests.common.onnx_models import gemm_left_on_cpu, light, save
from tests.common.schemas import valid

QNN = "QNNExecutionProvider"


def _compat_fields(value: str) -> list[str]:
    # v2:<backend>:<sdk>:<backend api>:<htp archs>:<soc models>:<vtcm>:...
    fields = value.split(":")
    assert fields[0] == "v2" and fields[2] == "2.51.0", value
    return fields


def test_a_partly_offloaded_build_is_flagged_everywhere(settings: Settings, farm_env: dict[str, str],
                                                         tmp_path: Path) -> None:
    model = str(gemm_left_on_cpu(tmp_path / "decode.onnx"))
    text = farm(farm_env, "build", model, "-t", "qnn:SM8650", "--name", "llm/decode", "--tag", "t1")
    assert "1 ctx / 1 cpu" in text.stdout
    assert "warning[partial-offload] qnn:SM8650: 1 node(s) stay on the CPU (Gemm)" in text.stderr
    doc = valid("build", farm(farm_env, "build", model, "-t", "qnn:SM8650", "--name", "llm/decode", "--tag", "t1",
                              "--json").stdout)
    (b,) = doc["builds"]
    assert doc["ok"] and (b["state"], b["nodes_cpu"], b["cpu_op_types"]) == ("cached", 1, ["Gemm"])
    (w,) = doc["warnings"]
    assert (w["code"], w["artifact"], w["cpu_op_types"]) == ("partial-offload", b["artifact"], ["Gemm"])

    res = valid("resolve", farm(farm_env, "resolve", "-m", "llm/decode:t1", "--soc", "SM8650", "--qnn", "2.51.0",
                                "--json").stdout)
    assert res["offload"] == {"full": False, "ep_nodes": 1, "cpu_nodes": 1, "cpu_op_types": ["Gemm"]}
    assert set(res["compatibility"]) == {QNN} and _compat_fields(res["compatibility"][QNN])[5] == "57"
    said = farm(farm_env, "resolve", "-m", "llm/decode:t1", "--soc", "SM8650", "--qnn", "2.51.0").stdout
    assert "partial offload: 1 node(s) stay on the CPU (Gemm) beside 1 EP node(s)" in said

    show = valid("show", farm(farm_env, "show", b["artifact"], "--json").stdout)
    manifest = show["manifest"]
    # The manifest keeps the op types and their counts (what a package's variant metadata carries).
    assert manifest["placement"]["cpu_op_counts"] == {"Gemm": 1}
    assert manifest["compatibility"] == show["compatibility"] == res["compatibility"]
    assert show["offload"] == res["offload"]
    shown = farm(farm_env, "show", b["artifact"]).stdout
    assert f"compat    {QNN}: {res['compatibility'][QNN]}" in shown and "offload   partial offload" in shown

    cov = valid("coverage", farm(farm_env, "coverage", "--json").stdout)
    (cell,) = cov["cells"]
    assert (cell["partial_offload"], cell["cpu_op_types"]) == (True, ["Gemm"])
    table = farm(farm_env, "coverage").stdout
    assert "built +cpu" in table and "+cpu: partial offload" in table and "(Gemm;" in table
    models = valid("coverage-missing", farm(farm_env, "coverage", "--missing", "--json", check=False).stdout)
    assert models == []  # built, if only partly offloaded: nothing missing

    # The drill-down (GET /v1/coverage/models) and the /coverage page read the same marks.
    from farm.api.page import render_page
    from registry.coverage import models_page
    from registry.index import Registry

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            (m,) = models_page(s).models
            page = render_page(s)
    finally:
        reg.close()
    (c,) = m.cells
    assert (c["partial_offload"], c["cpu_op_types"]) == (True, ["Gemm"])
    assert "+cpu (Gemm)" in page and "class='built partial'" in page


def test_a_fully_offloaded_build_says_so(settings: Settings, farm_env: dict[str, str]) -> None:
    doc = valid("build", farm(farm_env, "build", str(light("squeezenet")), "-t", "qnn:SM8750", "--name", "sq",
                              "--json").stdout)
    (b,) = doc["builds"]
    assert (b["nodes_cpu"], b["cpu_op_types"], doc["warnings"]) == (0, [], [])
    res = valid("resolve", farm(farm_env, "resolve", "-m", "sq", "--soc", "SM8750", "--qnn", "2.51.0",
                                "--json").stdout)
    assert res["offload"]["full"] is True and res["offload"]["cpu_op_types"] == []
    assert _compat_fields(res["compatibility"][QNN])[5] == "69"
    cov = valid("coverage", farm(farm_env, "coverage", "--json").stdout)
    assert [c["partial_offload"] for c in cov["cells"]] == [False]


def test_multi_soc_and_group_builds_record_their_compatibility_string(
        settings: Settings, farm_env: dict[str, str], tmp_path: Path) -> None:
    multi = valid("build", farm(farm_env, "build", str(light("squeezenet")), "-t", "qnn:SM8650+SM8750",
                                "--json").stdout)
    info = valid("show", farm(farm_env, "show", multi["builds"][0]["artifact"], "--json").stdout)
    assert _compat_fields(info["compatibility"][QNN])[5] == "57,69"
    assert info["manifest"]["compatibility"] == info["compatibility"]

    prefill, decode = prefill_decode(tmp_path / "g")
    group = valid("build", farm(farm_env, "build", "--graph", f"prefill={prefill}", "--graph", f"decode={decode}",
                                "-t", "qnn:SM8650", "--json").stdout)
    g = valid("show", farm(farm_env, "show", group["builds"][0]["artifact"], "--json").stdout)
    # Each graph keeps its own; the group's is the first graph's (one set of binaries).
    per_graph = [x["compatibility"] for x in g["manifest"]["graphs"]]
    assert len(per_graph) == 2 and all(set(c) == {QNN} for c in per_graph)
    assert g["compatibility"] == per_graph[0] and _compat_fields(per_graph[0][QNN])[5] == "57"


def _group_with_an_unoffloadable_graph(root: Path) -> tuple[Path, Path]:
    from onnx import TensorProto, helper

    prefill, _ = prefill_decode(root)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    mod = helper.make_graph([helper.make_node("Mod", ["x", "x"], ["y"], fmod=1)], "mod", [x], [y])
    return prefill, save(helper.make_model(mod, opset_imports=[helper.make_opsetid("", 17)]), root / "mod.onnx")


@pytest.mark.parametrize("how", ["model", "group"])
def test_a_compile_that_offloads_nothing_is_unsupported_ops(settings: Settings, farm_env: dict[str, str],
                                                           tmp_path: Path, how: str) -> None:
    """Under onnxruntime 1.32: a single model (a session with ep.context_enable) and a graph of a
    group (onnxruntime.ModelCompiler) whose every node stays on the CPU fail unsupported-ops,
    naming the op, and publish nothing."""
    from onnx import TensorProto, helper

    if how == "model":
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
        g = helper.make_graph([helper.make_node("Mod", ["x", "x"], ["y"], fmod=1)], "mod", [x], [y])
        args = [str(save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "mod.onnx"))]
    else:
        prefill, mod = _group_with_an_unoffloadable_graph(tmp_path)
        args = ["--graph", f"prefill={prefill}", "--graph", f"mod={mod}"]
    proc = farm(farm_env, "build", *args, "-t", "qnn:SM8650", "--json", check=False)
    assert proc.returncode == 1, proc.stderr
    (b,) = valid("build", proc.stdout)["builds"]
    assert (b["state"], b["error_code"], b["artifact"]) == ("failed", "unsupported-ops", None), b
    assert "Mod" in (b["error_message"] or "") or "Mod" in proc.stderr
    assert json.loads(farm(farm_env, "ls", "--json").stdout) == []
