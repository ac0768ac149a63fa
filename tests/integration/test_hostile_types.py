"""Every field a device reads, of every answer kind, given a value of another JSON type by a hostile
service (``tests/common/hostile_answers.py``: ``TYPE_CASES``, ``PACKAGE_TYPE_CASES``): the device
client refuses it with the kind's documented code before any field is used, through
``farm install`` and ``ctxfarm-install`` (``python -m farm.client``) alike, exits 1 without a
traceback, and places nothing: no --dest, no partial directory, nothing else written. A report's
answer (``farm.client_report``) is held to its shape as well."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from farm.cli import main as farm
from farm.client import main as ctxfarm_install
from farm.core.errors import FarmError
from tests.common.hostile_answers import PACKAGE_TYPE_CASES, REPORT_TYPE_CASES, REPORTED, TYPE_CASES, TypeCase
from tests.common.hostile_server import CTX, QNN, SOC, PackageScenario, Scenario, fresh, hostile_service

TOKEN = "cfk_device-secret"


def _files(root: Path) -> dict[str, bytes | None]:
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def _device(tmp_path: Path) -> Path:
    device = tmp_path / "device"
    (device / "victim").mkdir(parents=True)
    (device / "victim" / "keep.txt").write_text("keep")
    return device


def _run(argv: list[str], command: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = farm(["install", *argv]) if command == "farm install" else ctxfarm_install(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(case: TypeCase, rc: int, out: str, err: str) -> None:
    assert rc == 1 and f"error[{case.code}]" in err, (rc, err)
    assert "Traceback" not in err and "internal-error" not in err
    assert json.loads(out.strip().splitlines()[-1])["error"]["code"] == case.code


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["farm install", "ctxfarm-install"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in TYPE_CASES])
def test_a_wrong_type_in_a_resolve_answer_or_manifest_is_refused(case: TypeCase, command: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    device = _device(tmp_path)
    before = _files(device)
    scenario: Scenario = fresh()
    case.mutate(scenario)
    with hostile_service(scenario) as url:
        rc, out, err = _run(["--server", url, "--token", TOKEN, "--model", "sq:stable", "--soc", SOC, "--qnn", QNN,
                             "--dest", str(device / "sq"), "--json"], command, capsys)
    _refused(case, rc, out, err)
    assert _files(device) == before
    # Refused before any blob was asked: the manifest at most.
    assert not [p for p, _ in scenario.seen if p.startswith("/v1/blobs/") and p[10:] != scenario.answer.get("artifact")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["farm install", "ctxfarm-install"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in PACKAGE_TYPE_CASES])
def test_a_wrong_type_in_a_package_answer_or_record_is_refused(case: TypeCase, command: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    device = _device(tmp_path)
    before = _files(device)
    scenario = PackageScenario()
    case.mutate(scenario)
    with hostile_service(scenario) as url:
        rc, out, err = _run(["--server", url, "--token", TOKEN, "--package", "pk:v1", "--dest", str(device / "pk"),
                             "--json"], command, capsys)
    _refused(case, rc, out, err)
    assert _files(device) == before
    files = {sha for sha in scenario.blobs if sha != scenario.answer.get("digest")}
    assert not [p for p, _ in scenario.seen if p[len("/v1/blobs/"):] in files]


@pytest.mark.parametrize("command", ["farm install", "ctxfarm-install"])
def test_the_package_scenario_installs_as_served(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the unmodified package installs through both commands."""
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    device = _device(tmp_path)
    scenario = PackageScenario()
    with hostile_service(scenario) as url:
        rc, out, err = _run(["--server", url, "--token", TOKEN, "--package", "pk:v1", "--dest", str(device / "pk"),
                             "--json"], command, capsys)
    assert rc == 0, err
    got = json.loads(out)
    assert got["artifact"] == scenario.answer["digest"] and Path(got["ctx_model"]) == device / "pk" / "manifest.json"
    assert {k: v for k, v in _files(device / "pk").items() if v is not None} == scenario.files
    assert (device / "pk" / "c0" / "cpu" / "model.onnx").read_bytes() == CTX
    assert sorted(os.listdir(device)) == ["pk", "victim"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", [5, ["c0/cpu/model.onnx"], {"path": "c0/cpu/model.onnx"}])
def test_a_package_file_path_not_text_is_bad_manifest_from_both_commands(value: Any, tmp_path: Path) -> None:
    """A record whose file ``path`` is a number, a list or an object: exit 1 with bad-manifest
    (it used to be exit 70, an AttributeError or 'unhashable type'), from the real processes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(tmp_path / "home")
    device = _device(tmp_path)
    before = _files(device)
    scenario = PackageScenario()
    scenario.record["files"][1]["path"] = value
    with hostile_service(scenario) as url:
        argv = ["--server", url, "--token", TOKEN, "--package", "pk:v1", "--dest", str(device / "pk")]
        for command in (["-m", "farm.client"], ["-m", "farm.cli", "install"]):
            proc = subprocess.run([sys.executable, *command, *argv], env=env, capture_output=True, text=True,
                                  timeout=60)
            assert proc.returncode == 1 and "error[bad-manifest]" in proc.stderr, (command, proc.returncode,
                                                                                   proc.stderr)
            assert "Traceback" not in proc.stderr and "files[1].path" in proc.stderr
            assert _files(device) == before


class _Reported:
    """What a report case mutates: the answer to ``POST /v1/reports``."""

    def __init__(self) -> None:
        self.answer: dict[str, Any] = json.loads(json.dumps(REPORTED))

    def seal(self) -> None:
        pass


def _report_answer(answer: Any) -> dict[str, Any]:
    from farm.client_report import make_report, send
    from tests.common.hostile_server import Raw

    scenario = Scenario()
    scenario.routes["/v1/reports"] = Raw(200, [("Content-Type", "application/json")], json.dumps(answer).encode())
    body = make_report(artifact=REPORTED["artifact"], soc="SM8650", runtime_version="2.51.0", outcome="loads",
                       onnxruntime="1.31.1", device="d1", arch="aarch64")
    with hostile_service(scenario) as url:
        return send(url, "cfk_report", body, timeout=5)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in REPORT_TYPE_CASES])
def test_a_wrong_type_in_a_report_answer_is_refused(case: TypeCase) -> None:
    """A device's report (``farm report``, ``farm install --report``, ``farm.client_report``): the
    service's answer is held to its shape too."""
    reported = _Reported()
    case.mutate(reported)
    with pytest.raises(FarmError) as exc:
        _report_answer(reported.answer)
    assert exc.value.code == case.code and "is malformed" in exc.value.message


def test_a_report_answer_of_its_shape_is_taken() -> None:
    assert _report_answer(REPORTED) == REPORTED
