"""The `farm` console script (farm.cli.console:console): it ends with os._exit after the exit
handlers and a flush, so its exit status and its output must be exactly those of `main`; a
failed flush is not a silent success."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from farm.cli.console import exit_status, flushed

FARM = Path(sys.executable).with_name("farm")


@pytest.mark.parametrize(("code", "rc"), [(None, 0), (0, 0), (2, 2), (141, 141), (True, 1), ("bad thing", 1)])
def test_exit_status_is_sys_exits(code: object, rc: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status(code) == rc
    assert capsys.readouterr().err == ("bad thing\n" if isinstance(code, str) else "")


class _Full(io.StringIO):
    def __init__(self, error: OSError) -> None:
        super().__init__()
        self.error = error

    def flush(self) -> None:
        raise self.error


def test_a_failed_flush_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", _Full(OSError(28, "No space left on device")))
    assert flushed(0) == 120
    assert "could not write the output: No space left on device" in err.getvalue()
    assert flushed(3) == 3  # a failure already reported keeps its own status


def test_the_installed_script_exits_as_main_with_all_its_output(tmp_path: Path) -> None:
    script = FARM if FARM.exists() else shutil.which("farm")
    if script is None:
        pytest.skip("the farm console script is not installed (pip install -e .)")
    assert "farm.cli.console import console" in Path(script).read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(tmp_path / "home")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(script), *argv], env=env, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)

    via_module = subprocess.run([sys.executable, "-m", "farm.cli", "targets", "--json"], env=env,
                                capture_output=True, text=True, timeout=120)
    out = run("targets", "--json")
    # Less than a pipe buffer: all of it sits in stdout's buffer until the script's own flush.
    assert (out.returncode, out.stdout) == (0, via_module.stdout) and out.stdout.endswith("]\n")
    assert run("--version").returncode == 0
    bad = run("no-such-command")
    assert bad.returncode == 2 and "error[usage]" in bad.stderr and "Traceback" not in bad.stderr
    help_ = run("--help")
    assert help_.returncode == 0 and "COMMAND" in help_.stdout
    if Path("/dev/full").exists():
        with open("/dev/full", "w") as full:
            proc = subprocess.run([str(script), "targets"], env=env, stdout=full, stderr=subprocess.PIPE,
                                  text=True, timeout=120)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
