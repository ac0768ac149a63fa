"""Docs pages run as written, as the README's journeys do (tests/integration/test_readme.py).

Every fenced ``sh``, ``python`` or ``console`` block of the pages below carries a marker:
``<!-- tested: NAME [exit=N] -->`` (run here, in page order, in a fresh directory with a fresh
FARM_HOME; ``exit`` when the block is meant to end with that status) or ``<!-- untested: WHY
-->`` (it can't run on this host, and the page says why). ``sh`` blocks run with bash, ``python``
blocks with the QNN 2.51.0 worker environment's interpreter (onnxruntime 1.32, onnxruntime-qnn,
onnxruntime-genai). The only words changed are the paths the pages name for a device
(``/data/...``: a directory here) and the fixture script's path (run from the checkout)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("shipping-llm.md", "packages.md")
GENAI_PY = ROOT / ".venvs" / "qnn-2.51.0" / "bin" / "python"
MARK = re.compile(r"<!-- (?P<kind>tested|untested): (?P<what>[^\n]*?) -->\n```(?P<lang>[a-z]+)\n(?P<code>.*?)```",
                  re.S)
RUNNABLE = re.compile(r"^```(?:sh|python|console)\n", re.M)


@dataclass
class Block:
    name: str
    lang: str
    code: str
    exit: int


def blocks(page: str) -> dict[str, Block]:
    found = {}
    for m in MARK.finditer((ROOT / "docs" / page).read_text()):
        if m["kind"] == "tested":
            name, _, rest = m["what"].partition(" ")
            found[name] = Block(name, m["lang"], m["code"], int(rest.removeprefix("exit=")) if rest else 0)
    return found


@pytest.mark.parametrize("page", PAGES)
def test_every_runnable_block_is_tested_or_says_why_not(page: str) -> None:
    text = (ROOT / "docs" / page).read_text()
    marked = list(MARK.finditer(text))
    assert len(marked) == len(RUNNABLE.findall(text)), f"{page}: a sh/python/console block without a marker"
    for m in marked:
        if m["kind"] == "untested":
            assert len(m["what"]) >= 30, f"{page}: an untested block says exactly why: {m['what']!r}"
        else:
            assert re.fullmatch(r"[a-z-]+( exit=\d)?", m["what"]), m["what"]
    assert sum(m["kind"] == "tested" for m in marked) >= 2


class Page:
    """Runs a page's tested blocks in order in one directory; keeps what each printed."""

    def __init__(self, tmp: Path, fills: dict[str, str]) -> None:
        self.dir = tmp / "work"
        self.dir.mkdir()
        self.fills = fills
        bindir = str(Path(sys.executable).parent)  # farm and python of this environment
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
        self.env.update(PATH=bindir + os.pathsep + self.env.get("PATH", ""), FARM_HOME=str(tmp / "farm-home"),
                        HOME=str(tmp))

    def run(self, block: Block) -> subprocess.CompletedProcess[str]:
        code = block.code
        for placeholder, value in self.fills.items():
            code = code.replace(placeholder, value)
        script = self.dir / f"{block.name}.{'py' if block.lang == 'python' else 'sh'}"
        script.write_text(code)
        argv = [str(GENAI_PY), str(script)] if block.lang == "python" else ["bash", "-e", "-o", "pipefail", str(script)]
        proc = subprocess.run(argv, cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == block.exit, f"{block.name} exited {proc.returncode}, the page means " \
                                              f"{block.exit}\n--- ran\n{code}\n--- stdout\n{proc.stdout[-3000:]}\n" \
                                              f"--- stderr\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc


@pytest.fixture
def qnn_env() -> None:
    pytest.importorskip("onnxruntime_qnn", reason="the pages build with the [qnn] extra")
    if not GENAI_PY.exists():
        pytest.skip("no QNN 2.51.0 worker environment (.venvs/qnn-2.51.0) for the pages' python blocks")


@pytest.mark.usefixtures("qnn_env")
def test_shipping_an_llm_runs_as_written(tmp_path: Path) -> None:
    device = tmp_path / "device" / "llm"
    page = Page(tmp_path, {"bench/genai_export.py": str(ROOT / "bench" / "genai_export.py"),
                           "/data/llm": str(device)})
    b = blocks("shipping-llm.md")
    assert list(b) == ["export", "build", "fetch", "load-check", "config"], list(b)
    page.run(b["export"])
    assert (page.dir / "OUT" / "genai_config.json").is_file()
    built = page.run(b["build"])
    assert "genai package llm/tiny:t" in built.stdout and " built " in built.stdout, built.stdout
    fetched = page.run(b["fetch"])
    assert str(device / "genai_config.json") in fetched.stdout
    checked = page.run(b["load-check"])
    assert "error[load-unverified]" in checked.stderr and "weight-shared" in checked.stderr
    assert page.run(b["config"]).stdout.strip() == "genai_config.json parsed"


@pytest.mark.usefixtures("qnn_env")
def test_model_packages_run_as_written(tmp_path: Path) -> None:
    pkg = tmp_path / "device" / "mynet-pkg"
    page = Page(tmp_path, {"/data/models/mynet-pkg": str(pkg)})
    import onnx

    # What the page starts from: mynet:stable built for SM8650.
    model = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_squeezenet.onnx"
    subprocess.run([sys.executable, "-m", "farm.cli", "build", str(model), "-t", "qnn:SM8650", "--name", "mynet",
                    "--tag", "stable"], env=page.env, check=True, capture_output=True, timeout=300)
    b = blocks("packages.md")
    assert list(b) == ["package", "select"], list(b)
    page.run(b["package"])
    assert (pkg / "manifest.json").is_file()
    selected = page.run(b["select"])
    lines = selected.stdout.strip().splitlines()
    assert "No suitable model variant found" in lines[0] and lines[-1] == "cpu", selected.stdout
