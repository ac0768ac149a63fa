"""An optional extra's install hint is a command that works where ctxfarm runs: in a checkout
(the quick start's editable install) the checkout's own `pip install -e '.[EXTRA]'`, not the
published package's `pip install 'ctxfarm[EXTRA]'`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from farm.core import extras

ROOT = Path(__file__).resolve().parents[3]


def test_in_a_checkout_the_hint_is_its_editable_install() -> None:
    assert extras.checkout() == ROOT
    hint = extras.install_hint("service")
    assert hint.startswith(f"cd {ROOT} && ") and hint.endswith("pip install -e '.[service]'"), hint


def test_outside_a_checkout_the_hint_is_the_published_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(extras, "ROOT", tmp_path)  # a wheel: no pyproject.toml beside the package
    assert extras.install_hint("service") == "pip install 'ctxfarm[service]'"


def test_farm_serve_without_the_service_extra_says_the_checkout_command(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['uvicorn'] = None; from farm.cli import main; sys.exit(main(['serve']))")
    env = {"PYTHONPATH": str(ROOT), "FARM_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "error[missing-extra]" in proc.stderr, proc.stderr
    assert "pip install -e '.[service]'" in proc.stderr and "'ctxfarm[service]'" not in proc.stderr, proc.stderr
