"""The /coverage page in a real browser (Debian's headless chromium): a screenshot, and the
rendered DOM shows built, failed (with its code) and missing cells."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from farm.core.settings import Settings
from farm.pipeline.plan import build
from infra.devfarm.services import free_port
from tests.common.onnx_models import light, partly_unsupported
from tests.common.service import serve, token

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (infra/test.sh installs Debian's chromium as root)")
def test_coverage_page_in_headless_chromium(tmp_path: Path, farm_env: dict[str, str]) -> None:
    env = {**farm_env, "FARM_HOME": str(tmp_path / "home")}
    settings = Settings.from_env(env)
    build(settings, light("squeezenet"), ["qnn:SM8650", "qnn:SM8750"], name="sq", tag="stable")
    # A time limit no compile meets: a failed cell (resource-limit).
    build(dataclasses.replace(settings, compile_timeout=0.01), partly_unsupported(tmp_path / "p.onnx"),
          ["qnn:SM8650"], name="partial", tag="v1")
    read = token(settings, "ops-browser", "read")
    port = free_port()
    server = serve(env, port, tmp_path / "serve.log")
    url = f"http://127.0.0.1:{port}/coverage?token={read}"
    shot = tmp_path / "coverage.png"
    flags = [str(CHROMIUM), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={tmp_path / 'profile'}"]
    try:
        subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1000,700", url], capture_output=True,
                       timeout=120, check=True)
        dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120,
                             check=True).stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, out / "coverage.png")
    # A drill-down cell: its state label, then its probe verdicts written out (<div class="v">).
    cells = re.findall(r"<td class=\"(\w+)\" data-target=\"([^\"]+)\" data-sdk=\"([^\"]+)\"[^>]*>([^<]*)"
                       r"(?:<div[^>]*>[^<]*</div>)*</td>", dom)
    by = {(t, state) for state, t, _sdk, _label in cells}
    assert ("qnn:SM8650", "built") in by and ("qnn:SM8750", "built") in by
    assert any(state == "failed" and "resource-limit" in label for state, _t, _s, label in cells)
    # One SDK here: nothing is "missing" (a SoC a model was built for, without a build on an SDK);
    # partial:v1 was never built for SM8750, which it does not want (as `farm coverage --missing`).
    assert "<h2>Summary</h2>" in dom and "<h2>Legend</h2>" in dom
    assert re.search(r'data-target="qnn:SM8650" data-sdk="2.51.0">.*?1 built.*?1 failed', dom), \
        "the summary counts sq:stable built and partial:v1 failed on SM8650"
    assert "sq:stable" in dom and "partial:v1" in dom
    assert "\u2713probe" in dom, "the executor's self-probe is evidence the page shows"
    assert "QNN 2.51.0 loads" in dom, "each cell's probe verdicts are written out in it"
