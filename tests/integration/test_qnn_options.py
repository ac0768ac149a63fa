"""Every QNN build option is in the catalog for a measured effect (real compiles, QNN 2.51.0):
compiled with and without it, the context bytes differ. An option that changes nothing is not
offered: ``precision`` is refused with what HTP really runs, and ``require_full_offload`` (the
same bytes either way, measured) is a gate on the answer, not a build option."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from farm.core.catalog import parse_target
from farm.core.errors import BadOptionsError
from farm.core.options import QNN_OPTIONS, normalize, parse_pairs
from farm.core.settings import Settings
from farm.pipeline.plan import build
from tests.common.cli import farm
from tests.common.onnx_models import conv_relu_add, partly_unsupported
from tests.common.registry_state import snapshot
from workers.qnn.runner import QnnRunner
from workers.runner import CompileJob

# option=value -> what differs from the default build (measured: see the options table in docs/usage.md)
CHANGES_BYTES = {
    "graph_optimization": "graph_optimization=3",  # another finalization: another .bin
    "vtcm_mb": "vtcm_mb=4",  # another .bin, and the compatibility string in the _ctx.onnx records it
    "embed_mode": "embed_mode=1",  # one _ctx.onnx holding the context instead of a .bin beside it
}


def test_every_qnn_option_has_a_measured_effect() -> None:
    assert set(QNN_OPTIONS) == set(CHANGES_BYTES)


def contexts(model: Path, work: Path, pairs: list[str]) -> dict[str, str]:
    """{name: sha256} of what one real compile wrote for SM8650 with these ``--option`` pairs.

    The model is always compiled from the same path: ORT names the EPContext partition after a
    hash of the model's path, so the same model at another path compiles to other bytes
    (measured); the pipeline's own builds compile from a per-job directory."""
    target = parse_target("qnn:SM8650")
    job = CompileJob(model, target, normalize("qnn", parse_pairs(pairs), target), timeout=300)
    out = QnnRunner(warm_host=False).compile(job, work)
    return {f.name: hashlib.sha256(f.path.read_bytes()).hexdigest() for f in out.files}


@pytest.mark.parametrize("option", sorted(CHANGES_BYTES))
def test_the_option_changes_the_compiled_bytes(tmp_path: Path, option: str) -> None:
    model = conv_relu_add(tmp_path / "net.onnx")
    default = contexts(model, tmp_path / "a", [])
    assert default == contexts(model, tmp_path / "b", []), "the same inputs must give the same bytes"
    changed = contexts(model, tmp_path / "c", [CHANGES_BYTES[option]])
    if option == "embed_mode":
        assert set(default) == {"model_ctx.onnx", "model_ctx_qnn.bin"} and set(changed) == {"model_ctx.onnx"}
    else:
        assert set(changed) == set(default) == {"model_ctx.onnx", "model_ctx_qnn.bin"}
        assert changed["model_ctx_qnn.bin"] != default["model_ctx_qnn.bin"]


def test_require_full_offload_is_a_gate_not_a_build_option(settings: Settings, tmp_path: Path) -> None:
    """It compiled byte-identical contexts (measured before it left the catalog), so it is not a
    compile input: a gated request is answered from the plain build, compiling nothing."""
    with pytest.raises(BadOptionsError, match="unknown qnn option"):
        normalize("qnn", {"require_full_offload": "true"})
    partial = partly_unsupported(tmp_path / "partial.onnx")
    (plain,) = build(settings, partial, ["qnn:SM8650"]).outcomes
    assert plain.state == "built" and plain.nodes_cpu == 2  # ships with CPU nodes beside the EPContext
    before = snapshot(settings)
    (gated,) = build(settings, partial, ["qnn:SM8650"], ["require_full_offload=true"]).outcomes
    assert (gated.state, gated.error_code, gated.build_id) == ("failed", "unsupported-ops", plain.build_id)
    assert "(Erf, Mod)" in (gated.error_message or "")
    assert snapshot(settings) == before, "the gate must not compile or write anything"


@pytest.mark.parametrize("value", ["fp16", "fp32"])
def test_precision_is_refused_with_what_htp_runs(settings: Settings, farm_env: dict[str, str], tmp_path: Path,
                                                 value: str) -> None:
    """enable_htp_fp16_precision 0, 1 or unset compiled byte-identical contexts (QNN 2.47.0,
    2.49.40, 2.51.0): fp32 is not what HTP runs, and fp16 is what it runs anyway."""
    model = conv_relu_add(tmp_path / "net.onnx")
    before = snapshot(settings)
    proc = farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "-o", f"precision={value}", check=False)
    assert proc.returncode == BadOptionsError.exit_code and "error[bad-options]" in proc.stderr, proc.stderr
    assert "HTP runs float models in fp16 and quantized (QDQ) models in their integer types" in proc.stderr
    assert "quantize the model to QDQ" in proc.stderr
    assert snapshot(settings) == before, "a refused option must write nothing"
