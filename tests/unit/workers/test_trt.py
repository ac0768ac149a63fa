"""TensorRT backend pieces that need no GPU: GPU detection parsing, option mapping, routing and
the resolve rules (the GPU run itself is tests/integration/test_trt_gpu.py and bench/trt_gpu.py)."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from farm.core.catalog import load_catalog, parse_target
from farm.core.errors import BadOptionsError, NoMatchError, NoWorkerError, ToolchainError, UnsupportedOpsError
from farm.core.options import normalize
from farm.pipeline.queues import compile_queue
from registry.db import Database
from registry.index import record_model
from registry.resolve import Device, resolve
from tests.common.index_rows import add_artifact
from workers.trt.ep_options import ACCEPTED, BOOLEAN, ORT_GPU_VERSION
from workers.trt.runner import (
    CHILD_ENV,
    GpuInfo,
    check_hw_architecture,
    check_profiles,
    check_whole,
    dynamic_inputs,
    parse_nvidia_smi,
    platform_tag,
    provider_options,
    serves,
    toolchain_version,
)

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
    p = provider_options(opts(), tmp_path / "out", tmp_path / "cache", "model_ctx.onnx")
    assert p["trt_dump_ep_context_model"] == "True" and p["trt_ep_context_embed_mode"] == "0"
    assert p["trt_ep_context_file_path"] == str(tmp_path / "out" / "model_ctx.onnx")
    # Relative: in dump mode the EP resolves it against the context model's dir and writes a
    # relative ep_cache_context (an absolute path would be refused by the artifact's checks).
    assert p["trt_engine_cache_path"] == "engines" and not Path(p["trt_engine_cache_path"]).is_absolute()
    assert p["trt_timing_cache_path"] == str(tmp_path / "cache")
    assert "trt_fp16_enable" not in p and "trt_int8_enable" not in p and "trt_engine_hw_compatible" not in p
    assert "trt_ep_context_compute_capability_enable" not in p  # not an option: an environment variable
    assert CHILD_ENV == {"ORT_EP_CONTEXT_COMPUTE_CAPABILITY_ENABLE": "1"}


def test_provider_options_mapping(tmp_path: Path) -> None:
    p = provider_options(opts(precision="int8", calibration_table="cal.flatbuffers", workspace_mb="2048",
                              builder_optimization_level="5", hardware_compatibility_level="ampere_plus",
                              embed_mode="1", profile_min_shapes="x:1x3x224x224", profile_opt_shapes="x:4x3x224x224",
                              profile_max_shapes="x:8x3x224x224"), tmp_path, tmp_path, "model_ctx.onnx")
    assert (p["trt_fp16_enable"], p["trt_int8_enable"]) == ("True", "True")
    assert p["trt_int8_calibration_table_name"] == "cal.flatbuffers"
    assert p["trt_max_workspace_size"] == str(2048 * 1024 * 1024)
    assert p["trt_builder_optimization_level"] == "5" and p["trt_engine_hw_compatible"] == "True"
    assert p["trt_ep_context_embed_mode"] == "1"
    assert p["trt_profile_opt_shapes"] == "x:4x3x224x224"


REPRESENTATIVE = [
    {}, {"precision": "fp16"}, {"precision": "int8", "calibration_table": "c.cache"}, {"embed_mode": "1"},
    {"hardware_compatibility_level": "ampere_plus", "workspace_mb": "512", "builder_optimization_level": "1"},
    {"profile_min_shapes": "x:1x3x8x8", "profile_opt_shapes": "x:2x3x8x8", "profile_max_shapes": "x:4x3x8x8"},
]


@pytest.mark.parametrize("raw", REPRESENTATIVE)
def test_every_emitted_option_is_accepted_by_the_pinned_binding(raw: dict[str, str], tmp_path: Path) -> None:
    p = provider_options(opts(**raw), tmp_path, tmp_path, "model_ctx.onnx")
    assert set(p) <= ACCEPTED
    for key, value in p.items():
        if key in BOOLEAN:
            assert value in ("True", "true", "False", "false"), (key, value)
        else:
            assert value not in ("True", "False"), key


def test_checked_in_key_list_matches_the_installed_binding() -> None:
    """Where onnxruntime-gpu is installed (the TRT worker venv), read its binding's option keys
    again and compare with workers/trt/ep_options.py; elsewhere check the list's own shape."""
    import importlib.metadata as md
    import importlib.util
    import re

    assert len(ACCEPTED) == 43 and BOOLEAN <= ACCEPTED and len(BOOLEAN) == 20
    try:
        version = md.version("onnxruntime-gpu")
    except md.PackageNotFoundError:
        pytest.skip("onnxruntime-gpu is not installed here: the checked-in list (43 keys of 1.31.1) stands")
    spec = importlib.util.find_spec("onnxruntime")
    assert spec and spec.submodule_search_locations
    capi = Path(next(iter(spec.submodule_search_locations))) / "capi"
    binding = next(capi.glob("onnxruntime_pybind11_state*.so")).read_bytes()
    keys = {m.decode() for m in re.findall(rb"(?<![a-z0-9_])(trt_[a-z0-9_]+)\x00", binding)}
    assert version == ORT_GPU_VERSION and keys == ACCEPTED


def test_version_compatible_is_refused_honestly() -> None:
    with pytest.raises(BadOptionsError, match="no option"):
        opts(version_compatible="true")


@pytest.mark.parametrize("target", ["sm_87", "sm_75"])
def test_ampere_plus_is_refused_where_the_ep_silently_drops_it(target: str) -> None:
    with pytest.raises(BadOptionsError, match="ampere_plus"):
        normalize("trt", {"hardware_compatibility_level": "ampere_plus"}, parse_target(f"trt:{target}"))
    assert not serves(target, "sm_90", opts(hardware_compatibility_level="ampere_plus"))


def test_routing_and_serving() -> None:
    assert compile_queue("trt", "10.14.1.48+linux-x86-64", "sm_90") == "compile.trt.10.14.1.48+linux-x86-64.sm_90"
    assert compile_queue("qnn", "2.51.0", "SM8650") == "compile.qnn.2.51.0"
    assert serves("sm_90", "sm_90", opts())
    assert not serves("sm_90", "sm_89", opts())
    assert serves("sm_86", "sm_90", opts(hardware_compatibility_level="ampere_plus"))
    assert not serves("sm_75", "sm_90", opts(hardware_compatibility_level="ampere_plus"))


def test_unknown_gpu_is_a_clear_error() -> None:
    with pytest.raises(NoWorkerError, match="sm_103 is not in the target catalog"):
        serves("sm_103", "sm_103", opts())


def test_toolchain_carries_full_version_and_platform() -> None:
    assert toolchain_version("10.14.1.48", "linux-x86-64") == "10.14.1.48+linux-x86-64"
    assert platform_tag() == f"{sys.platform}-{platform.machine().lower()}".replace("_", "-")


@pytest.fixture
def db(tmp_path: Path, migrated_index: Path) -> Database:
    from tests.common.indexes import copy_index

    return Database(copy_index(migrated_index, tmp_path / "i.db"))


def _artifact(db: Database, n: int, target: str, trt: str, **o: str) -> None:
    from farm.core.keys import sha256_bytes

    model = sha256_bytes(b"model")
    with db.session() as s:
        record_model(s, digest=model, onnx_digest=sha256_bytes(b"onnx"), size=1, files=[], name="m")
        add_artifact(s, model, backend="trt", target=target, toolchain=trt, options=dict(o))


def gpu(name: str, trt: str, plat: str = "linux-x86-64") -> Device:
    return Device("trt", load_catalog().get(name, backend="trt"), f"{trt}+{plat}")


TC = "10.14.1.48+linux-x86-64"


def test_trt_resolve_rules(db: Database) -> None:
    from farm.core.keys import sha256_bytes

    _artifact(db, 1, "sm_90", TC)
    _artifact(db, 2, "sm_86", TC, hardware_compatibility_level="ampere_plus")
    model = sha256_bytes(b"model")
    with db.session() as s:
        art, v = resolve(s, model, gpu("sm_90", "10.14.1.48"))
        assert art.target == "sm_90" and "same GPU arch" in v.reason  # exact target first
        art, v = resolve(s, model, gpu("sm_89", "10.14.1.48"))
        assert art.target == "sm_86" and "hardware-compatible" in v.reason  # Ampere+ engine serves sm_89
        with pytest.raises(NoMatchError) as exc:
            resolve(s, model, gpu("sm_75", "10.14.1.48"))
        assert "sm_80+" in (exc.value.hint or "")
        with pytest.raises(NoMatchError) as exc:
            resolve(s, model, gpu("sm_90", "10.14.1.49"))  # another build number
        assert "major.minor.patch.build" in (exc.value.hint or "")
        with pytest.raises(NoMatchError) as exc:
            resolve(s, model, gpu("sm_90", "10.14.1.48", "linux-aarch64"))
        assert "across platforms" in (exc.value.hint or "")


def _io_model(path: Path, inputs: list[tuple[str, list[object]]], outputs: list[str], epcontext: bool = False,
              hw: str | None = None) -> Path:
    import onnx
    from onnx import TensorProto, helper

    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n, dims in inputs]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in outputs]
    if epcontext:
        attrs = {"embed_mode": 0, "ep_cache_context": "engines/m.engine", "onnx_model_filename": "m.onnx"}
        if hw:
            attrs["hardware_architecture"] = hw
        nodes = [helper.make_node("EPContext", [n for n, _ in inputs], outputs, domain="com.microsoft", **attrs)]
    else:
        nodes = [helper.make_node("Identity", [inputs[0][0]], [o]) for o in outputs]
    model = helper.make_model(helper.make_graph(nodes, "g", ins, outs))
    onnx.save(model, str(path))
    return path


def test_partial_context_model_is_refused(tmp_path: Path) -> None:
    """A simulated EP dump that covers only the TensorRT subgraph (other I/O than the source)."""
    src = _io_model(tmp_path / "src.onnx", [("x", [1, 3])], ["y", "z"])
    whole = _io_model(tmp_path / "whole.onnx", [("x", [1, 3])], ["y", "z"], epcontext=True)
    part = _io_model(tmp_path / "part.onnx", [("x", [1, 3])], ["trt_out_0"], epcontext=True)
    check_whole(src, whole)
    with pytest.raises(UnsupportedOpsError, match="only part of the model"):
        check_whole(src, part)


def test_dynamic_inputs_need_a_profile(tmp_path: Path) -> None:
    model = _io_model(tmp_path / "dyn.onnx", [("x", ["batch", 3, 224, 224]), ("m", [1, 128])], ["y"])
    assert dynamic_inputs(model) == {"x": ["batch", 3, 224, 224]}
    with pytest.raises(BadOptionsError, match="x"):
        check_profiles(model, opts())
    check_profiles(model, opts(profile_min_shapes="x:1x3x224x224", profile_opt_shapes="x:4x3x224x224",
                               profile_max_shapes="x:8x3x224x224"))


def test_hardware_architecture_is_checked_after_an_ampere_plus_build(tmp_path: Path) -> None:
    from workers.epcontext import read_epcontext

    good, _ = read_epcontext(_io_model(tmp_path / "g.onnx", [("x", [1])], ["y"], epcontext=True, hw="80+"))
    bad, _ = read_epcontext(_io_model(tmp_path / "b.onnx", [("x", [1])], ["y"], epcontext=True, hw="86"))
    check_hw_architecture(good, opts(hardware_compatibility_level="ampere_plus"))
    check_hw_architecture(bad, opts())
    with pytest.raises(ToolchainError, match="80\\+"):
        check_hw_architecture(bad, opts(hardware_compatibility_level="ampere_plus"))
