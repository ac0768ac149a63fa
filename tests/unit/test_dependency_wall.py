"""The dependency wall: the control plane and the worker harness never import onnxruntime; only the
compile/load child processes under workers/<backend>/ do."""

from __future__ import annotations

import subprocess
import sys

MODULES = ("farm", "farm.pipeline.plan", "registry.install", "farm.cli", "farm.core.bundle", "farm.core.options", "registry",
           "registry.index", "registry.resolve", "registry.lite", "registry.reads", "farm.pipeline.cached",
           "registry.manifest", "registry.store.local", "workers", "workers.backends",
           "workers.runner", "workers.qnn.runner", "workers.qnn.accuracy", "workers.epcontext", "workers.host",
           "workers.childproc", "farm.core.packages", "farm.pipeline.packages", "workers.ortpackage",
           "farm.core.genai", "workers.qnn.genai", "workers.qnn.genai_child")
FORBIDDEN = ("onnxruntime", "onnxruntime_qnn", "tensorrt", "onnxruntime_genai")


def test_no_onnxruntime_in_the_control_plane():
    script = (
        "import importlib, sys\n"
        f"for m in {MODULES!r}:\n"
        "    importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{FORBIDDEN!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"

