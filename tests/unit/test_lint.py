"""The code stays ruff- and mypy-clean and its layers point one way (STYLE habits 4 and 10):
checked by the suite, with pinned tool versions, not by memory."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("tool,args", [
    ("ruff", ["check", "farm", "registry", "workers", "migrations", "tests", "bench", "infra/devfarm", "docs/gen"]),
    ("mypy", ["farm", "registry", "workers"]),
    # The layer contracts in pyproject.toml: imports point one way, no runtime in the control plane.
    ("lint-imports", []),
])
def test_clean(tool: str, args: list[str]) -> None:
    exe = shutil.which(tool, path=str(Path(sys.executable).parent)) or shutil.which(tool)
    assert exe, f"{tool} is not installed (it is in the test extra)"
    proc = subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
