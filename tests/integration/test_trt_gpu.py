"""TensorRT on a real GPU. Skipped, with the reason, where there is no NVIDIA GPU or no TRT venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venvs" / "trt-10.14.1-cu13"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no NVIDIA GPU here (nvidia-smi not found)"),
    pytest.mark.skipif(not (VENV / "bin" / "python").exists(),
                       reason=f"no TensorRT worker venv ({VENV}); infra/workers/create-venvs.sh trt-10.14.1-cu13"),
]


def test_trt_build_fetch_load_matches_cpu(tmp_path: Path) -> None:
    """The whole bench on one small model: build for this GPU, publish, fetch, load, compare with CPU."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "trt_gpu.py"), "--models", "squeezenet"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    data = json.loads((ROOT / "bench" / "out" / "trt_gpu.json").read_text())
    (row,) = data["rows"]
    assert row["state"] == "built" and row["load_s"] < row["compile_s"]
    assert row["max_abs_diff"] < 1e-2
