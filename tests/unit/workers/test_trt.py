"""TensorRT backend pieces that need no GPU: GPU detection parsing, option mapping, routing and
the resolve rules (the GPU run itself is tests/integration/test_trt_gpu.py and bench/trt_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.core.catalog import load_catalog, parse_target
from farm.core.errors import BadOptionsError, NoMatchError
from farm.core.options import normalize
from farm.pipeline.queues import compile_queue
from registry.db import Database
from registry.index import record_model
from registry.resolve import Device, resolve
from tests.common.index_rows import add_artifact
from workers.trt.runner import GpuInfo, parse_nvidia_smi, provider_options, serves

SMI = """NVIDIA H100 80GB HBM3, 9.0, 570.86.15
NVIDIA L4, 8.9, 570.86.15
"""


def test_parse_nvidia_smi() -> None:
    gpus = parse_nvidia_smi(SMI)
    assert gpus == [GpuInfo("NVIDIA H100 80GB HBM3", "9.0", "570.86.15"), GpuInfo("NVIDIA L4", "8.9", "570.86.15")]
    assert [g.target for g in gpus] == ["sm_90", "sm_89"]
    assert GpuInfo("B200", "10.0", "x").target == "sm_100"
    assert parse_nvidia_smi("") == []


def test_every_detected_target_is_in_the_catalog() -> None:
    for cc in ("7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "12.0"):
        t = load_catalog().get(GpuInfo("x", cc, "d").target, backend="trt")
        assert t.compute_capability == cc


def opts(**kw: str) -> dict:  # type: ignore[type-arg]
    return normalize("trt", kw, parse_target("trt:sm_90"))


def test_provider_options_defaults(tmp_path: Path) -> None:
    p = provider_options(opts(), tmp_path / "out", tmp_path / "cache", "m_ctx.onnx")
    assert p["trt_dump_ep_context_model"] == "1" and p["trt_ep_context_embed_mode"] == "0"
    assert p["trt_ep_context_file_path"] == str(tmp_path / "out" / "m_ctx.onnx")
    assert p["trt_engine_cache_path"] == str(tmp_path / "out"), "engines beside the ctx model"
    assert p["trt_timing_cache_path"] == str(tmp_path / "cache")
    assert "trt_fp16_enable" not in p and "trt_int8_enable" not in p and "trt_engine_hw_compatible" not in p


def test_provider_options_mapping(tmp_path: Path) -> None:
    p = provider_options(opts(precision="int8", calibration_table="cal.flatbuffers", workspace_mb="2048",
                              builder_optimization_level="5", hardware_compatibility_level="ampere_plus",
                              embed_mode="1", profile_min_shapes="x:1x3x224x224", profile_opt_shapes="x:4x3x224x224",
                              profile_max_shapes="x:8x3x224x224"), tmp_path, tmp_path, "m_ctx.onnx")
    assert (p["trt_fp16_enable"], p["trt_int8_enable"]) == ("1", "1")
    assert p["trt_int8_calibration_table_name"] == "cal.flatbuffers"
    assert p["trt_max_workspace_size"] == str(2048 * 1024 * 1024)
    assert p["trt_builder_optimization_level"] == "5" and p["trt_engine_hw_compatible"] == "1"
    assert p["trt_ep_context_embed_mode"] == "1"
    assert p["trt_profile_opt_shapes"] == "x:4x3x224x224"


def test_version_compatible_is_refused_honestly() -> None:
    with pytest.raises(BadOptionsError, match="no option"):
        opts(version_compatible="true")


def test_routing_and_serving() -> None:
    assert compile_queue("trt", "10.13.3", "sm_90") == "compile.trt.10.13.3.sm_90"
    assert compile_queue("qnn", "2.51.0", "SM8650") == "compile.qnn.2.51.0"
    assert serves("sm_90", "sm_90", opts())
    assert not serves("sm_90", "sm_89", opts())
    assert serves("sm_86", "sm_90", opts(hardware_compatibility_level="ampere_plus"))
    assert not serves("sm_75", "sm_90", opts(hardware_compatibility_level="ampere_plus"))


@pytest.fixture
def db(tmp_path: Path) -> Database:
    return Database(f"sqlite:///{tmp_path / 'i.db'}")


def _artifact(db: Database, n: int, target: str, trt: str, **o: str) -> None:
    from farm.core.keys import sha256_bytes

    model = sha256_bytes(b"model")
    with db.session() as s:
        record_model(s, digest=model, onnx_digest=sha256_bytes(b"onnx"), size=1, files=[], name="m")
        add_artifact(s, model, backend="trt", target=target, toolchain=trt, options=dict(o))


def gpu(name: str, trt: str) -> Device:
    return Device("trt", load_catalog().get(name, backend="trt"), trt)


def test_trt_resolve_rules(db: Database) -> None:
    from farm.core.keys import sha256_bytes

    _artifact(db, 1, "sm_90", "10.13.3")
    _artifact(db, 2, "sm_86", "10.13.3", hardware_compatibility_level="ampere_plus")
    model = sha256_bytes(b"model")
    with db.session() as s:
        art, v = resolve(s, model, gpu("sm_90", "10.13.3"))
        assert art.target == "sm_90" and "same GPU arch" in v.reason  # exact target first
        art, v = resolve(s, model, gpu("sm_89", "10.13.3"))
        assert art.target == "sm_86" and "hardware-compatible" in v.reason  # Ampere+ engine serves sm_89
        with pytest.raises(NoMatchError) as exc:
            resolve(s, model, gpu("sm_75", "10.13.3"))
        assert "sm_80+" in (exc.value.hint or "")
        with pytest.raises(NoMatchError) as exc:
            resolve(s, model, gpu("sm_90", "10.14.1"))
        assert "tied to the TensorRT version" in (exc.value.hint or "")
