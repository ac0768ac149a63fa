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
