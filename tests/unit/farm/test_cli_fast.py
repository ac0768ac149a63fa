"""The CLI's fast paths from the shell: a cached ``farm build`` and ``farm resolve`` answer from
the index over a bare connection, importing no SQLAlchemy, no onnx, no onnxruntime, no
importlib.metadata; whatever they cannot answer goes the full way, with its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.core.errors import FarmError
from farm.core.settings import Settings
from farm.pipeline import plan
from tests.common.fake_runner import InstantRunner
from tests.common.onnx_models import matmul_add, save

# What a cached build or a resolve must not pay for: each costs tens of ms or more to import.
HEAVY = ("sqlalchemy", "alembic", "onnx", "onnxruntime", "onnxruntime_qnn", "numpy", "boto3", "psycopg",
         "importlib.metadata")
TARGETS = ["qnn:SM8650", "qnn:SM8750"]


def imported(stderr: str) -> set[str]:
    """Every module name in ``python -X importtime`` output."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and "|" in line} - {"imported package"}


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def farm(env: dict[str, str], *args: str, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "farm.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, dict[str, str], Path, plan.BuildReport]:
    """An embedded FARM_HOME where m.onnx is built for TARGETS (tagged m:stable), keyed by the
    real toolchain of this environment (an instant runner stands in for the compile)."""
    from workers.qnn.runner import detect_toolchain

    try:
        toolchain = detect_toolchain()
    except FarmError as exc:
        pytest.skip(f"no QNN toolchain here to key the builds by: {exc.message}")
    runner = InstantRunner()
    monkeypatch.setattr(runner, "toolchain", lambda: toolchain)
    monkeypatch.setattr("workers.backends.get_runner", lambda backend: runner)
    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home")})
    model = save(matmul_add(seed=3), tmp_path / "m.onnx")
    report = plan.build(settings, model, TARGETS, name="m", tag="stable")
    assert [o.state for o in report.outcomes] == ["built", "built"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(settings.home)
    return settings, env, model, report


def test_cached_build_imports_nothing_heavy(built: tuple[Settings, dict[str, str], Path, plan.BuildReport]) -> None:
    _, env, model, report = built
    args = ["build", str(model), *sum((["-t", t] for t in TARGETS), []), "--name", "m", "--tag", "stable", "--json"]
    proc = farm(env, *args, importtime=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert [(b["state"], b["artifact"]) for b in out["builds"]] == [("cached", o.artifact) for o in report.outcomes]
    modules = imported(proc.stderr)
    assert "farm.pipeline.cached" in modules and "sqlite3" in modules
    assert heavy(modules) == []


def test_resolve_imports_nothing_heavy(built: tuple[Settings, dict[str, str], Path, plan.BuildReport]) -> None:
    settings, env, _, report = built
    from workers.qnn.runner import detect_toolchain

    proc = farm(env, "resolve", "-m", "m:stable", "--soc", "SM8650", "--qnn", detect_toolchain().version, "--json",
                importtime=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["artifact"] == report.outcomes[0].artifact
    modules = imported(proc.stderr)
    assert "registry.lite" in modules
    assert heavy(modules) == []


def test_misses_take_the_full_path_and_its_errors(built: tuple[Settings, dict[str, str], Path, plan.BuildReport]
                                                  ) -> None:
    _, env, _, _ = built
    unknown = farm(env, "resolve", "-m", "m:nope", "--soc", "SM8650", "--qnn", "2.51.0")
    assert unknown.returncode != 0 and "error[not-found]" in unknown.stderr and "m:stable" in unknown.stderr
    too_old = farm(env, "resolve", "-m", "m:stable", "--soc", "SM8650", "--qnn", "2.40.0")
    assert too_old.returncode != 0 and "error[no-match]" in too_old.stderr


def test_newer_schema_is_schema_mismatch_from_the_shell(built: tuple[Settings, dict[str, str], Path,
                                                                      plan.BuildReport]) -> None:
    import sqlite3

    settings, env, model, _ = built
    db = sqlite3.connect(settings.home / "index.db")
    with db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    db.close()
    for args in (["resolve", "-m", "m:stable", "--soc", "SM8650", "--qnn", "2.51.0"],
                 ["build", str(model), "-t", "qnn:SM8650"]):
        proc = farm(env, *args)
        assert proc.returncode != 0 and "error[schema-mismatch]" in proc.stderr, (args, proc.stderr)
