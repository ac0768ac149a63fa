"""The onnxruntime-qnn release <-> QNN SDK map (farm/core/catalog/runtimes.toml) is one fact with
two other witnesses: the worker pins (infra/workers/qnn-<SDK>/requirements.txt) and the SDK each
installed onnxruntime-qnn says it carries. All three must agree; `farm targets` prints the map."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from farm.cli import main
from farm.core.catalog.runtimes import qnn_map_text, qnn_runtimes

ROOT = Path(__file__).resolve().parents[3]


def _pins(kind: Path) -> dict[str, str]:
    out = {}
    for line in (kind / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            out[name.lower()] = version
    return out


def test_the_map_is_what_the_worker_environments_pin() -> None:
    # The map names the EP and its onnxruntime; other pins (onnxruntime-genai) are the env's own.
    keys = ("onnxruntime-qnn", "onnxruntime")
    pinned = {kind.name.removeprefix("qnn-"): {k: v for k, v in _pins(kind).items() if k in keys}
              for kind in sorted((ROOT / "infra" / "workers").glob("qnn-*"))}
    listed = {r.sdk: {"onnxruntime-qnn": r.version, "onnxruntime": r.onnxruntime} for r in qnn_runtimes()}
    assert listed == pinned
    assert len({r.version for r in qnn_runtimes()}) == len(qnn_runtimes())  # one SDK per release


def test_each_installed_onnxruntime_qnn_carries_the_sdk_the_map_names() -> None:
    by_release = {r.version: r.sdk for r in qnn_runtimes()}
    infos = sorted(ROOT.glob(".venv*/**/site-packages/onnxruntime_qnn/build_and_package_info.py"))
    if not infos:
        pytest.skip("no onnxruntime-qnn installed here (./infra/test.sh installs the worker venvs)")
    for info in infos:
        consts = dict(re.findall(r"^(\w+) = '([^']*)'$", info.read_text(), re.MULTILINE))
        assert by_release.get(consts["__version__"]) == consts["qnn_version"], info


def test_farm_targets_prints_the_map(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["targets", "--backend", "qnn"]) == 0
    out = capsys.readouterr().out
    for r in qnn_runtimes():
        assert re.search(rf"^{re.escape(r.version)}\s+{re.escape(r.sdk)}\s+{re.escape(r.onnxruntime)}$", out, re.MULTILINE)
    assert qnn_map_text() == "onnxruntime-qnn 2.3.0 = QNN 2.47.0, 2.5.0 = QNN 2.49.40, 2.7.0 = QNN 2.51.0"


def test_the_device_docs_print_the_same_map() -> None:
    text = (ROOT / "docs" / "device.md").read_text()
    rows = re.findall(r"^\| (\d[\d.]*) \| (\d[\d.]*) \| (\d[\d.]*) \|$", text, re.MULTILINE)
    assert rows == [(r.version, r.sdk, r.onnxruntime) for r in qnn_runtimes()]
