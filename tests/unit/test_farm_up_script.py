"""infra/farm-up.sh hands its process over to infra.devfarm (tests/integration/test_farm_up.py
shows that one stopping everything on SIGTERM and restarting a dead worker): a SIGTERM sent to
the script's PID must reach devfarm, so the script must `exec` it, not run it as a child. And the
farm it makes in the checkout (.farm/) is ignored by git."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_farm_up_execs_devfarm_so_sigterm_reaches_it() -> None:
    script = (ROOT / "infra" / "farm-up.sh").read_text()
    commands = [line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1].startswith("exec ") and "-m infra.devfarm" in commands[-1], commands[-1]
    assert "&" not in commands[-1].replace("&&", "")  # not in the background either
    assert 'DIR=${FARM_UP_DIR:-$PWD/.farm}' in script


def test_the_local_farm_directory_is_ignored_by_git() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in (".farm/farm.json", ".farm/redis/dump.rdb", ".farm/logs/worker-qnn-2.51.0.log"):
        proc = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", path], capture_output=True, timeout=30)
        assert proc.returncode == 0, f"{path} is not git-ignored"
