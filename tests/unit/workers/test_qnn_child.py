"""The QNN child's constants, checked against how they are made (no onnxruntime here)."""

from __future__ import annotations

from onnx import TensorProto, helper

from workers.childproc import _prefault_mb
from workers.qnn.child import WARMUP_MODEL


def test_the_warmup_model_is_the_recipe_its_comment_gives() -> None:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "warmup",
                              [helper.make_tensor_value_info("x", TensorProto.STRING, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.STRING, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="ctxfarm")
    model.ir_version = 8
    assert model.SerializeToString() == WARMUP_MODEL


def test_a_standby_heap_follows_the_last_job_within_the_limit_and_the_cap() -> None:
    assert _prefault_mb(job_peak_mb=600, host_mb=150, limit_mb=1024, cap_mb=0) == 456  # 450, in 8 MiB blocks
    assert _prefault_mb(job_peak_mb=5000, host_mb=150, limit_mb=1024, cap_mb=0) == 1024
    assert _prefault_mb(job_peak_mb=5000, host_mb=150, limit_mb=1024, cap_mb=900) == 232  # cap - host - 512
    assert _prefault_mb(job_peak_mb=100, host_mb=150, limit_mb=1024, cap_mb=0) == 0
    assert _prefault_mb(job_peak_mb=600, host_mb=150, limit_mb=0, cap_mb=0) == 0


def test_the_prefault_limit_is_the_settings_default_and_reads_the_environment() -> None:
    from farm.core.settings import Settings
    from workers.childproc import PREFAULT_DEFAULT_MB, prefault_limit_mb

    assert Settings.from_env({"FARM_HOME": "/tmp/x"}).prefault_mb == PREFAULT_DEFAULT_MB == prefault_limit_mb({})
    assert prefault_limit_mb({"FARM_PREFAULT_MB": "0"}) == 0
    assert prefault_limit_mb({"FARM_PREFAULT_MB": "300"}) == 300


def test_compatibility_info_reads_every_ep_s_string() -> None:
    from workers.epcontext import compatibility_info

    meta = {"ep_compatibility_info.QNNExecutionProvider": "v2:6:2.51.0:5.51.0:0,0:57,69:0,0:0",
            "ep_compatibility_info.": "no EP name", "other": "x", "ep_compatibility_info.NvTensorRTRTX": "y"}
    assert compatibility_info(meta) == {"NvTensorRTRTX": "y",
                                        "QNNExecutionProvider": "v2:6:2.51.0:5.51.0:0,0:57,69:0,0:0"}
    assert compatibility_info({}) == {}


def test_placement_counts_each_op_type_left_on_the_cpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import onnx
    from onnx import TensorProto, helper

    from workers.epcontext import read_context

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    nodes = [helper.make_node("EPContext", ["x"], ["a"], domain="com.microsoft", source="QNNExecutionProvider",
                              embed_mode=1, ep_cache_context=b"ctx"),
             helper.make_node("Gemm", ["a", "a"], ["b"]), helper.make_node("Gemm", ["b", "b"], ["c"]),
             helper.make_node("Erf", ["c"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", 1, [1])]))
    helper.set_model_props(m, {"ep_compatibility_info.QNNExecutionProvider": "v2:6:2.51.0"})
    onnx.save(m, str(tmp_path / "m_ctx.onnx"))
    eps, placement, compat = read_context(tmp_path / "m_ctx.onnx")
    assert len(eps) == 1 and placement == {"ep_nodes": 1, "cpu_nodes": 3, "cpu_op_types": ["Erf", "Gemm"],
                                           "cpu_op_counts": {"Erf": 1, "Gemm": 2}}
    assert compat == {"QNNExecutionProvider": "v2:6:2.51.0"}
