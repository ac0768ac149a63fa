"""Every QNN build option is in the catalog for a measured effect (real compiles, QNN 2.51.0):
compiled with and without it, the context bytes differ, or, for the one gate, the bytes are the
same and only the outcome changes. An option that changes nothing is not offered: ``precision``
is refused with what HTP really runs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from farm.core.catalog import parse_target
from farm.core.errors import BadOptionsError, UnsupportedOpsError
from farm.core.options import QNN_OPTIONS, normalize, parse_pairs
from farm.core.settings import Settings
from farm.pipeline.plan import build
from tests.common.cli import farm
from tests.common.onnx_models import conv_relu_add, partly_unsupported
from tests.common.registry_state import snapshot
from workers.qnn.runner import QnnRunner
from workers.runner import CompileJob

# option=value -> what differs from the default build (measured: see the README's options table)
CHANGES_BYTES = {
    "graph_optimization": "graph_optimization=3",  # another finalization: another .bin
    "vtcm_mb": "vtcm_mb=4",  # another .bin, and the compatibility string in the _ctx.onnx records it
    "embed_mode": "embed_mode=1",  # one _ctx.onnx holding the context instead of a .bin beside it
}
GATES = {"require_full_offload": "require_full_offload=true"}  # fails a partial offload; no bytes change


def test_every_qnn_option_has_a_measured_effect() -> None:
    assert set(QNN_OPTIONS) == set(CHANGES_BYTES) | set(GATES)


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


def test_require_full_offload_is_a_gate_not_a_compile_input(settings: Settings, tmp_path: Path) -> None:
    whole = conv_relu_add(tmp_path / "net.onnx")
    assert contexts(whole, tmp_path / "a", [GATES["require_full_offload"]]) == contexts(whole, tmp_path / "b", [])
    partial = partly_unsupported(tmp_path / "partial.onnx")
    assert contexts(partial, tmp_path / "c", [])  # ships with CPU nodes beside the EPContext
    with pytest.raises(UnsupportedOpsError):
        contexts(partial, tmp_path / "d", [GATES["require_full_offload"]])
    (o,) = build(settings, partial, ["qnn:SM8650"], [GATES["require_full_offload"]]).outcomes
    assert o.state == "failed" and o.error_code == "unsupported-ops"


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
