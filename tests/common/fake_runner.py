"""InstantRunner: a Runner fake for executor unit tests. It "compiles" by writing a small
context model and binary (no SDK, no child), optionally holding until told to go on."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from farm.core.catalog import Target
from workers.runner import CompileJob, CompileOutput, OutputFile, Toolchain

TOOLCHAIN = Toolchain("qnn", "2.51.0", "1.31.1", "onnxruntime-qnn", "2.7.0")


class InstantRunner:
    backend = "qnn"

    def __init__(self) -> None:
        self.compiling = threading.Event()  # set while a compile is in progress
        self.go_on = threading.Event()  # cleared: a compile holds until it is set
        self.go_on.set()
        self.compiles = 0
        # What the "compile" leaves where (a test sets CPU nodes to model a partial offload).
        self.placement: dict[str, Any] = {"ep_nodes": 1, "cpu_nodes": 0, "cpu_op_types": []}

    def toolchain(self) -> Toolchain:
        return TOOLCHAIN

    def compile(self, job: CompileJob, work_dir: Path) -> CompileOutput:
        self.compiles += 1
        self.compiling.set()
        try:
            if not self.go_on.wait(60):
                raise TimeoutError("the test never let the compile go on")
        finally:
            self.compiling.clear()
        out = work_dir / "out"
        out.mkdir(parents=True)
        (out / "model_ctx.onnx").write_bytes(b"ctx of " + job.model_path.read_bytes()[:16] + job.target.name.encode())
        (out / "model_ctx_qnn.bin").write_bytes(b"context " * 64 + job.target.name.encode())
        files = [OutputFile("model_ctx.onnx", out / "model_ctx.onnx", "ctx-model", "application/x-ctx"),
                 OutputFile("model_ctx_qnn.bin", out / "model_ctx_qnn.bin", "context", "application/x-qnn")]
        return CompileOutput(out, "model_ctx.onnx", files, 0.01, 0.02, [{"ep_sdk_version": "2.51.0"}],
                             dict(self.placement), TOOLCHAIN, "log",
                             self_load={"ok": True, "load_seconds": 0.001})

    def load_check(self, ctx_model: Path, target: Target, *, timeout: float = 300.0) -> dict[str, Any]:
        return {"load_seconds": 0.0}
