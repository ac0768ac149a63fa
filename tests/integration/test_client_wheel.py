"""The device client as its own wheel (infra/client/): built from the repository offline, installed
alone into a bare venv (no pip, no index, no dependencies), then used for a real install from a
live `farm serve` holding a real QNN build; every installed file has the digest the manifest
names, and nothing but ctxfarm-client is in that venv."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.core.settings import Settings
from tests.common.onnx_models import conv_relu_add
from tests.common.service import serve, token

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def bare_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv without pip holding only the ctxfarm-client wheel; returns its bin directory."""
    tmp = tmp_path_factory.mktemp("client-wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT / "infra" / "client"), "--no-deps",
                    "--no-build-isolation", "--no-index", "-q", "-w", str(tmp / "dist")], check=True, timeout=120)
    (wheel,) = (tmp / "dist").glob("ctxfarm_client-*-py3-none-any.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True, timeout=60)
    bin_dir = tmp / "venv" / "bin"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "--no-index",
                    "--no-deps", "-q", str(wheel)], check=True, timeout=120)
    return bin_dir


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`farm serve` on an embedded registry with one real QNN build of a small model."""
    from farm.pipeline.plan import build

    home = tmp_path_factory.mktemp("wheel-home")
    settings = Settings.from_env({"FARM_HOME": str(home)})
    model = conv_relu_add(home / "m.onnx", seed=21)
    (outcome,) = build(settings, model, ["qnn:SM8650"], name="sq", tag="stable").outcomes
    read = token(settings, "device", "read")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(home)
    port = _free_port()
    proc = serve(env, port, home / "serve.log")
    try:
        yield {"url": f"http://127.0.0.1:{port}", "token": read, "artifact": outcome.artifact, "settings": settings}
    finally:
        proc.terminate()
        proc.wait(10)


def _bare_env() -> dict[str, str]:
    # No PYTHONPATH, and every command runs outside the checkout (cwd=tmp_path): the bare venv
    # sees only what the wheel installed.
    return {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}


def test_the_client_wheel_has_no_dependencies_and_installs_from_a_live_service(
        bare_client: Path, live: dict[str, Any], tmp_path: Path) -> None:
    py = str(bare_client / "python")
    names = subprocess.run([py, "-c", "import importlib.metadata as m, json; "
                            "print(json.dumps(sorted(d.metadata['Name'] for d in m.distributions())))"],
                           capture_output=True, text=True, check=True, env=_bare_env(), cwd=tmp_path).stdout
    assert json.loads(names) == ["ctxfarm-client"]
    dest = tmp_path / "device" / "sq"
    proc = subprocess.run([str(bare_client / "ctxfarm-install"), "--server", live["url"], "--token", live["token"],
                           "--model", "sq:stable", "--soc", "snapdragon-8-gen-3", "--qnn", "2.51.0",
                           "--dest", str(dest), "--json"], capture_output=True, text=True, env=_bare_env(), cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["artifact"] == live["artifact"] and Path(got["ctx_model"]) == dest / "model_ctx.onnx"
    # Every installed file is the one the manifest (named by the artifact digest) lists.
    from registry.index import Registry
    from registry.store.base import read_bytes

    reg = Registry.open(live["settings"])
    try:
        manifest = json.loads(read_bytes(reg.store, live["artifact"]))
    finally:
        reg.close()
    assert sorted(os.listdir(dest)) == sorted(f["name"] for f in manifest["files"])
    for f in manifest["files"]:
        data = (dest / f["name"]).read_bytes()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == f["digest"] and len(data) == f["size"]
    assert sorted(os.listdir(dest.parent)) == ["sq"]  # no partial directory, no lock file
    # The installed client imports nothing beyond the standard library and its own modules.
    loaded = subprocess.run([py, "-c", "import sys, farm.client, json; "
                             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"],
                            capture_output=True, text=True, check=True, env=_bare_env(), cwd=tmp_path).stdout
    assert not {"onnx", "numpy", "sqlalchemy", "alembic", "rich", "onnxruntime"} & set(json.loads(loaded))


def test_the_client_wheel_installs_an_ort_model_package(bare_client: Path, live: dict[str, Any],
                                                       tmp_path: Path) -> None:
    """ctxfarm-install --package: the package a pipeline made, with the wheel alone."""
    from farm.pipeline.packages import make_package
    from registry.index import Registry

    reg = Registry.open(live["settings"])
    try:
        made = make_package(live["settings"], reg, "sq:stable")
    finally:
        reg.close()
    dest = tmp_path / "device" / "sq-pkg"
    proc = subprocess.run([str(bare_client / "ctxfarm-install"), "--server", live["url"], "--token", live["token"],
                           "--package", "sq:stable", "--dest", str(dest), "--json"], capture_output=True, text=True,
                          env=_bare_env(), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["artifact"] == made["digest"] and Path(got["ctx_model"]) == dest / "manifest.json"
    on_disk = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert on_disk == {f["path"] for f in made["files"]}
    for f in made["files"]:
        assert "sha256:" + hashlib.sha256((dest / f["path"]).read_bytes()).hexdigest() == f["digest"]
    both = subprocess.run([str(bare_client / "ctxfarm-install"), "--server", live["url"], "--package", "sq:stable",
                           "--model", "sq:stable", "--dest", str(dest)], capture_output=True, text=True,
                          env=_bare_env(), cwd=tmp_path, timeout=60)
    assert both.returncode == 2 and "error[usage]" in both.stderr


def test_device_hints_are_things_a_device_can_do(bare_client: Path, live: dict[str, Any], tmp_path: Path) -> None:
    """--detect without onnxruntime-qnn: usage, the runtime <-> SDK map in the hint (no compile
    toolchain talk); a wrong token: unauthorized; no traceback anywhere."""
    cli = str(bare_client / "ctxfarm-install")
    detect = subprocess.run([cli, "--server", live["url"], "--token", live["token"], "--model", "sq:stable",
                             "--soc", "SM8650", "--detect", "--dest", str(tmp_path / "d")],
                            capture_output=True, text=True, env=_bare_env(), cwd=tmp_path, timeout=60)
    assert detect.returncode == 2 and "error[usage]" in detect.stderr
    assert "2.7.0 = QNN 2.51.0" in detect.stderr and "compile" not in detect.stderr
    wrong = subprocess.run([cli, "--server", live["url"], "--token", "cfk_wrong", "--model", "sq:stable",
                            "--soc", "SM8650", "--qnn", "2.51.0", "--dest", str(tmp_path / "d")],
                           capture_output=True, text=True, env=_bare_env(), cwd=tmp_path, timeout=60)
    assert wrong.returncode == 1 and "error[unauthorized]" in wrong.stderr
    for proc in (detect, wrong):
        assert "Traceback" not in proc.stderr and "farm registry" not in proc.stderr and "farm fetch" not in proc.stderr
    assert not (tmp_path / "d").exists()


def test_load_check_hints_point_at_farm_install(live: dict[str, Any], tmp_path: Path) -> None:
    """A context installed for SM8650, load-checked as SM8550: target-mismatch, and the hint is
    the device's own command (farm install), not an operator's (farm fetch)."""
    pytest.importorskip("onnxruntime_qnn", reason="load-check loads with the [qnn] extra")
    from farm.client import install

    dest = tmp_path / "sq"
    install(live["url"], live["token"], "sq:stable", soc="SM8650", qnn="2.51.0", dest=dest)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(tmp_path / "home")
    proc = subprocess.run([sys.executable, "-m", "farm.cli", "load-check", str(dest), "--target", "qnn:SM8550"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "error[target-mismatch]" in proc.stderr, proc.stderr
    assert "farm install --model NAME:TAG --soc SM8550" in proc.stderr and "farm fetch" not in proc.stderr


def test_farm_resolve_server_against_a_live_service(live: dict[str, Any], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The checked `farm resolve --server` accepts what a real service answers (human and JSON)."""
    from farm.cli import main as farm

    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    argv = ["resolve", "--server", live["url"], "--token", live["token"], "--model", "sq:stable", "--soc", "SM8650",
            "--qnn", "2.51.0"]
    capsys.readouterr()
    assert farm(argv) == 0
    assert live["artifact"][7:19] in capsys.readouterr().out
    assert farm([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["artifact"] == live["artifact"] and doc["manifest"]["model"] == doc["model"]
    assert {f["name"] for f in doc["files"]} == {f["name"] for f in doc["manifest"]["files"]}


def test_the_wheel_packs_the_whole_import_closure_of_the_client() -> None:
    """Every ``farm`` module the packed modules import (at the top or inside a function) is
    packed too, and nothing else but the standard library (and cryptography, for signatures):
    a new import in an untested branch can't break a device."""
    import ast
    import importlib.util

    spec = importlib.util.spec_from_file_location("client_backend", ROOT / "infra" / "client" / "backend.py")
    assert spec is not None and spec.loader is not None
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    packed = set(backend.MODULES)
    missing = set()
    for rel in (m for m in packed if m.endswith(".py")):
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                if top not in ("farm", "cryptography") and top not in sys.stdlib_module_names:
                    missing.add(f"{rel}: {name} (not the standard library)")
                if top != "farm":
                    continue
                path = name.replace(".", "/")
                if f"{path}.py" not in packed and f"{path}/__init__.py" not in packed:
                    missing.add(f"{rel}: {name}")
    assert not missing
