"""schemathesis (its CLI) against a real `farm serve` and the service's own OpenAPI document:
every operation with generated inputs and an admin token; no input may produce a server error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from farm.core.settings import Settings
from farm.pipeline.plan import build
from infra.devfarm.services import free_port
from tests.common.onnx_models import light
from tests.common.service import serve, token


def test_schemathesis_finds_no_server_error(tmp_path: Path, farm_env: dict[str, str]) -> None:
    env = {**farm_env, "FARM_HOME": str(tmp_path / "home"), "FARM_MAX_UPLOAD_MB": "1"}
    settings = Settings.from_env(env)
    build(settings, light("squeezenet"), ["qnn:SM8650"], name="sq", tag="stable")
    admin = token(settings, "fuzz-admin", "admin")
    port = free_port()
    proc = serve(env, port, tmp_path / "serve.log")
    try:
        st = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
        run = subprocess.run(
            [st, "run", f"http://127.0.0.1:{port}/openapi.json", "-H", f"Authorization: Bearer {admin}",
             "--checks", "not_a_server_error", "--max-examples", "20", "--phases", "examples,coverage,fuzzing",
             "--generation-deterministic"],
            capture_output=True, text=True, timeout=900, env={**os.environ, "NO_COLOR": "1"},
            cwd=tmp_path)  # schemathesis keeps a cache in its working directory
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
        print(run.stdout[-3000:])
        assert "passed" in run.stdout.lower()
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
