"""Quantized models: a QDQ model, uint8 or uint16 activations and int8 weights,
compiles for the HTP with the real QNN EP, and its context loads and runs on the x86_64 simulator,
at the terminal as a user would (`farm build`, `farm fetch`, `farm load-check`)."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

from tests.common.cli import farm
from tests.common.qdq_models import qdq_matmul_relu

SIMULATOR = platform.machine().lower() in ("x86_64", "amd64")


@pytest.mark.parametrize("activations", ["uint8", "uint16"])
def test_a_qdq_model_compiles_loads_and_runs(farm_env: dict[str, str], tmp_path: Path, activations: str) -> None:
    model = qdq_matmul_relu(tmp_path / "q" / "model.onnx", activations=activations, seed=3)
    out = json.loads(farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "--json").stdout)
    b = out["builds"][0]
    assert b["state"] == "built", b
    # The MatMul, Add and Relu with their inner Q/DQ run on the HTP in one EPContext node; the
    # input's QuantizeLinear and the output's DequantizeLinear stay on the CPU (float in, float out).
    assert b["nodes_ep"] == 1 and b["nodes_cpu"] == 2
    farm(farm_env, "fetch", b["artifact"], "--out", str(tmp_path / "dev"))
    ctx = tmp_path / "dev" / "model_ctx.onnx"
    if not SIMULATOR:
        pytest.skip("loading needs the x86_64 HTP simulator or a device")
    doc = json.loads(farm(farm_env, "load-check", str(ctx), "--target", "qnn:SM8650", "--json").stdout)
    assert doc["ok"] is True and doc["outputs"] == [[1, 64]] and doc["load_seconds"] > 0
