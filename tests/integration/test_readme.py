"""The README's commands work as written: a new user's journeys, run from the README's own words.

Every fenced ``sh`` block marked ``<!-- tested: NAME [token=SCOPE] -->`` in README.md (and the
pipeline script of docs/ci.md) runs here with bash, in order, in a fresh directory with a fresh
FARM_HOME (the embedded default: SQLite and a local blob directory) and the service the README
starts, as a user would paste them. The only words changed are the placeholders the README names:
the service's address (``http://farm:8080``, port 8080: a free port here) and the tokens
(``cfk_...``: the one of the block's scope, printed by the README's own ``farm token create``).
A real QNN compile of light_squeezenet runs behind the pipeline journey. Docs pages' blocks are
marked and run the same way by tests/integration/test_doc_pages.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The quick start's two commands: the README's first sh block.
README_COMMANDS = [line.split("#", 1)[0].strip()
                   for line in (ROOT / "README.md").read_text().split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
                   if line.strip()]
MARKED = re.compile(r"<!-- tested: (?P<name>[a-z-]+)(?: token=(?P<scope>[a-z]+))? -->\n```sh\n(?P<code>.*?)```",
                    re.S)


@dataclass
class Block:
    name: str
    scope: str | None
    code: str


@dataclass
class Ran:
    block: Block
    code: str  # what ran, placeholders filled in
    rc: int
    out: str
    err: str


def blocks(path: Path) -> dict[str, Block]:
    found = [Block(m["name"], m["scope"], m["code"]) for m in MARKED.finditer(path.read_text())]
    assert len({b.name for b in found}) == len(found), "each tested block has its own name"
    return {b.name: b for b in found}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fill(code: str, port: int, tokens: dict[str, str], scope: str | None) -> str:
    code = code.replace("http://farm:8080", f"http://127.0.0.1:{port}").replace("--port 8080", f"--port {port}")
    if "cfk_..." in code:
        assert scope, "a block with a token placeholder names its scope"
        code = code.replace("cfk_...", tokens[scope])
    return code


class Journeys:
    """Runs the blocks in README order in one directory and keeps what each printed."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "work"
        self.dir.mkdir()
        self.port = free_port()
        self.tokens: dict[str, str] = {}
        self.ran: dict[str, Ran] = {}
        self.sessions: list[int] = []
        bindir = str(Path(sys.executable).parent)  # farm, python and weed of this environment
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
        self.env.update(PATH=bindir + os.pathsep + self.env.get("PATH", ""), FARM_HOME=str(tmp / "farm-home"),
                        HOME=str(tmp))

    def run(self, block: Block, *args: str, shell: tuple[str, ...] = ("bash", "-e", "-o", "pipefail"),
            env: dict[str, str] | None = None) -> Ran:
        code = fill(block.code, self.port, self.tokens, block.scope)
        script = self.dir / f"{block.name}.sh"
        script.write_text(code)
        out, err = self.dir / f"{block.name}.out", self.dir / f"{block.name}.err"
        # Files, not pipes: a command the block leaves running (farm serve &) keeps its stdout open.
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen([*shell, str(script), *args], cwd=self.dir, env={**self.env, **(env or {})},
                                    stdout=o, stderr=e, stdin=subprocess.DEVNULL, start_new_session=True)
            self.sessions.append(proc.pid)
            rc = proc.wait(timeout=600)
        ran = Ran(block, code, rc, out.read_text(), err.read_text())
        self.ran[block.name] = ran
        return ran

    def wait_for_service(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise AssertionError("the README's `farm serve` did not answer within 60 s")

    def stop(self) -> None:
        for pgid in self.sessions:  # each block ran in a session of its own: its group is ours
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def journeys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Journeys]:
    pytest.importorskip("fastapi", reason="the service needs the [service] extra")
    pytest.importorskip("onnxruntime_qnn", reason="the journeys compile with the [qnn] extra")
    readme = blocks(ROOT / "README.md")
    assert list(readme) == ["path", "model", "serve", "pipeline", "device", "ops", "embedded"], list(readme)
    j = Journeys(tmp_path_factory.mktemp("readme"))
    try:
        model = j.run(readme["model"])
        assert model.rc == 0, model.err
        serve = j.run(readme["serve"])
        assert serve.rc == 0, serve.err
        # `farm token create` prints the token on its last line: the README's two, in its order.
        printed = re.findall(r"^(cfk_\S+)$", serve.out, re.M)
        assert len(printed) == 2, serve.out
        j.tokens = {"submit": printed[0], "read": printed[1]}
        j.wait_for_service()
        for name in ("pipeline", "device", "ops", "embedded"):
            j.run(readme[name])
        # The CI page's script, as a CI job runs it: plain sh, the URL and a submit token in its environment.
        j.run(blocks(ROOT / "docs" / "ci.md")["ci"], "model.onnx", "ci-net", "stable", shell=("sh",),
              env={"FARM_SERVER": f"http://127.0.0.1:{j.port}", "FARM_TOKEN": j.tokens["submit"]})
        yield j
    finally:
        j.stop()


def ok(ran: Ran) -> Ran:
    assert ran.rc == 0, f"{ran.block.name} exited {ran.rc}\n--- ran\n{ran.code}\n--- stdout\n{ran.out[-3000:]}\n" \
                        f"--- stderr\n{ran.err[-3000:]}"
    assert "Traceback" not in ran.err
    return ran


def test_the_service_and_tokens_start_as_written(journeys: Journeys) -> None:
    ran = ok(journeys.ran["serve"])
    assert "release-pipeline (submit)" in ran.out + ran.err and "pixel-fleet (read)" in ran.out + ran.err
    assert (journeys.dir / "model.onnx").stat().st_size > 0


def test_pipeline_journey_submits_waits_and_resolves(journeys: Journeys) -> None:
    ran = ok(journeys.ran["pipeline"])
    assert ran.out.count("succeeded") >= 2  # the release's two builds
    assert "qnn:SM8650" in ran.out and "qnn:SM8750" in ran.out
    assert "picked by" in ran.out  # resolve says what picked the answer


def test_device_journey_resolves_and_installs(journeys: Journeys) -> None:
    ran = ok(journeys.ran["device"])
    dest = journeys.dir / "models" / "mynet"
    assert str(dest / "model_ctx.onnx") in ran.out
    listed = ran.out.split()
    comment = next(line for line in ran.code.splitlines() if line.startswith("ls "))
    assert set(comment.split("#", 1)[1].split()) <= set(listed)  # the README says what the directory holds
    assert (dest / "model_ctx_qnn.bin").stat().st_size > 0


def test_ops_journey_sees_coverage_workers_store_and_tokens(journeys: Journeys) -> None:
    if shutil.which("curl") is None and journeys.ran["ops"].rc != 0:
        pytest.skip("the ops journey ends with curl, which this machine lacks")
    ran = ok(journeys.ran["ops"])
    assert "mynet:stable" in ran.out and "loads" in ran.out  # coverage with probe verdicts
    coverage = json.loads((journeys.dir / "coverage.json").read_text())
    assert any("mynet:stable" in m["tags"] for m in coverage["models"])
    assert "good blob" in ran.out  # registry verify
    assert "release-pipeline" in ran.out and "pixel-fleet" in ran.out  # token list
    assert '"ready":true' in ran.out.replace(" ", "")


def test_the_ci_script_of_the_docs_releases_as_written(journeys: Journeys) -> None:
    ran = ok(journeys.ran["ci"])
    assert ran.out.count("succeeded") >= 2  # farm status of the release, for the log
    release = json.loads((journeys.dir / "release.json").read_text())
    assert release["ok"] is True and len(release["builds"]) == 2
    resolved = json.loads((journeys.dir / "resolve-SM8650.json").read_text())
    assert resolved  # a device of the fleet gets an artifact


def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    """The README's first command, `./infra/quickstart.sh`, in a fresh FARM_HOME: it builds, answers the
    second build from the index, fetches as a device and loads the fetched context. As written, it
    also runs `pip install -e '.[qnn,service]'` into this checkout's .venv (a no-op change to an installed
    checkout; the suite runs its tests one at a time)."""
    pytest.importorskip("onnxruntime_qnn", reason="the quick start compiles with the [qnn] extra")
    first = README_COMMANDS[0]
    assert first == "./infra/quickstart.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_HOME=str(tmp_path / "farm-home"), PYTHON=sys.executable)
    proc = subprocess.run([first], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "cached" in proc.stdout + proc.stderr  # the second build
    assert re.search(r"light_resnet50 on qnn:SM8650: compile [\d.]+ s vs load of the fetched context", proc.stdout)
    assert "Traceback" not in proc.stderr


def test_embedded_commands_answer_from_the_index_and_fetch(journeys: Journeys) -> None:
    ran = ok(journeys.ran["embedded"])
    assert "SM8650" in ran.out and "SM8750" in ran.out  # farm targets
    assert "cached" in ran.out + ran.err  # the pipeline built these: nothing compiles again
    assert (journeys.dir / "fetched" / "model_ctx.onnx").exists()


def test_farm_on_the_path_as_written(tmp_path: Path) -> None:
    """The README's PATH block, in the checkout as the README means it: `farm --version` prints what
    its comment says."""
    block = blocks(ROOT / "README.md")["path"]
    if not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip("no .venv in this checkout: the quick start or infra/test.sh makes it")
    script = tmp_path / "path.sh"
    script.write_text(block.code)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"  # a shell where farm is not on the PATH yet
    proc = subprocess.run(["bash", "-e", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    expected = next(line for line in block.code.splitlines() if line.startswith("farm --version")).split("# ", 1)[1]
    assert proc.stdout.strip() == expected.strip()
