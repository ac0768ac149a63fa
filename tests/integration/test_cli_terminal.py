"""The CLI as a person and as a script see it (embedded: SQLite + local blobs, real QNN compiles):
a live table on a terminal (a real pty), plain lines and no escape sequence in a pipe, tables
instead of Python reprs, --json that validates against the schema each command ships, and the
README's "Load it on the device" block run against a fetched artifact."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.common.cli import farm, in_pty
from tests.common.onnx_models import light
from tests.common.schemas import valid

ROOT = Path(__file__).resolve().parents[2]


def test_build_on_a_terminal_shows_a_live_table_with_elapsed_time(farm_env: dict[str, str]) -> None:
    rc, out = in_pty(farm_env, "build", str(light("squeezenet")), "-t", "qnn:SM8650", "-t", "qnn:SM8750",
                     "--name", "sq")
    assert rc == 0, out
    plain = re.sub(r"\x1b\[[0-?]*[ -/]*[@-~]", "", out)
    assert "\x1b[" in out  # drawn and redrawn in place
    assert plain.count("ELAPSED") >= 2, plain  # the table was redrawn while the compiles ran
    # A 0.3 s compile may finish between two redraws: at least one target is seen compiling with its
    # elapsed time, and every target ends built with its own.
    assert re.search(r"qnn:SM8[67]50\s+compiling\s+\d+\.\d s", plain), plain
    for target in ("qnn:SM8650", "qnn:SM8750"):
        assert re.search(rf"{target}\s+built\s+\d+\.\d s", plain), plain
    assert "model sq:latest sha256:" in plain  # then the result table


def test_pipes_get_plain_lines_tables_and_typed_json(farm_env: dict[str, str], tmp_path: Path) -> None:
    model = str(light("squeezenet"))
    proc = farm(farm_env, "build", model, "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--name", "sq")
    assert "\x1b" not in proc.stdout + proc.stderr
    progress = [line for line in proc.stderr.splitlines() if line.startswith("  qnn:")]
    # One line per state change: compiling, then built, for each target (order between them varies).
    assert len(progress) == 4, proc.stderr
    for target in ("qnn:SM8650", "qnn:SM8750"):
        mine = [line for line in progress if line.startswith(f"  {target}:")]
        assert mine[0] == f"  {target}: compiling (with 2.51.0)", proc.stderr
        assert re.fullmatch(rf"  {target}: built in \d+\.\d s", mine[1]), proc.stderr

    doc = valid("build", farm(farm_env, "build", model, "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--name", "sq",
                              "--json").stdout)
    assert [b["state"] for b in doc["builds"]] == ["cached", "cached"] and doc["ok"] is True
    assert all(isinstance(b["size_bytes"], int) and isinstance(b["compile_seconds"], float) for b in doc["builds"])
    build_id = doc["builds"][0]["build_id"]

    # status --build: a table, no Python repr, no None; the log without the SDK's colour codes.
    text = farm(farm_env, "status", "--build", str(build_id), "--log")
    assert "None" not in text.stdout and "{'" not in text.stdout and "\x1b" not in text.stdout
    assert re.search(r"^state\s+succeeded$", text.stdout, re.M) and re.search(r"^options\s+\S+=", text.stdout, re.M)
    assert "onnxruntime" in text.stdout  # the log is there (the EP's own lines)
    one = valid("status", farm(farm_env, "status", "--build", str(build_id), "--log", "--json").stdout)
    assert one["build"] == build_id and one["state"] == "succeeded" and "\x1b" not in one["log"]
    assert isinstance(one["options"], dict) and isinstance(one["compile_seconds"], float)

    # db, tokens, help and a failure: typed documents.
    valid("db", farm(farm_env, "db", "current", "--json").stdout)
    created = valid("token-create", farm(farm_env, "token", "create", "ci", "--scope", "submit", "--json").stdout)
    assert created["scope"] == "submit"
    listed = valid("token-list", farm(farm_env, "token", "list", "--json").stdout)
    assert [t["name"] for t in listed] == ["ci"] and listed[0]["created_at"].endswith("Z")
    valid("token-revoke", farm(farm_env, "token", "revoke", "ci", "--json").stdout)
    assert valid("token-list", farm(farm_env, "token", "list", "--json").stdout)[0]["revoked_at"]
    valid("help", farm(farm_env, "help", "errors", "--json").stdout)
    valid("targets", farm(farm_env, "targets", "--json").stdout)
    miss = farm(farm_env, "resolve", "--model", "nope", "--soc", "SM8650", "--qnn", "2.51.0", "--json", check=False)
    assert miss.returncode == 1 and valid("error", miss.stdout)["error"]["code"] == "not-found"
    assert "\x1b" not in miss.stdout + miss.stderr


def test_several_models_build_in_one_call_and_then_answer_from_the_index(farm_env: dict[str, str]) -> None:
    """`farm build A.onnx B.onnx -t T1 -t T2`: the 4 builds in one call (one pool of compiles),
    a row per model and target, one table with a MODEL column; the same call again answers all 4
    from the index, and --json gives a report per model."""
    models = [str(light("squeezenet")), str(light("shufflenet"))]
    targets = ["-t", "qnn:SM8650", "-t", "qnn:SM8750"]
    proc = farm(farm_env, "build", *models, *targets)
    for stem in ("light_squeezenet", "light_shufflenet"):
        for target in ("qnn:SM8650", "qnn:SM8750"):
            assert f"  {stem} {target}: compiling (with 2.51.0)" in proc.stderr.splitlines(), proc.stderr
            assert re.search(rf"^  {stem} {target}: built in \d+\.\d s$", proc.stderr, re.M), proc.stderr
            assert re.search(rf"^{stem}\s+{target}\s+2\.51\.0\s+built\s+[0-9a-f]{{12}}", proc.stdout, re.M), proc.stdout
    assert proc.stdout.count("model light_") == 2 and re.search(r"^MODEL\s+TARGET\s+TOOLCHAIN", proc.stdout, re.M)
    assert "4 build(s) in" in proc.stderr

    listed = valid("ls", farm(farm_env, "ls", "--json").stdout)
    assert len(listed) == 4 and len({a["artifact"] for a in listed}) == 4
    assert {(a["model"], a["target"]) for a in listed} == {(m, t) for m in {a["model"] for a in listed}
                                                           for t in ("qnn:SM8650", "qnn:SM8750")}

    doc = valid("build", farm(farm_env, "build", *models, *targets, "--json").stdout)
    assert doc["ok"] is True and [m["name"] for m in doc["models"]] == ["light_squeezenet", "light_shufflenet"]
    assert [[b["state"] for b in m["builds"]] for m in doc["models"]] == [["cached", "cached"]] * 2
    assert {b["artifact"] for m in doc["models"] for b in m["builds"]} == {a["artifact"] for a in listed}
    assert len(valid("ls", farm(farm_env, "ls", "--json").stdout)) == 4  # nothing built again

    # Names are per model: --name with several models is a usage error, nothing built or written.
    named = farm(farm_env, "build", *models, *targets, "--name", "both", check=False)
    assert named.returncode == 2 and "error[usage]" in named.stderr and "Traceback" not in named.stderr
    assert farm(farm_env, "resolve", "--model", "both", "--soc", "SM8650", "--qnn", "2.51.0",
                check=False).returncode == 1

def test_the_readme_device_snippet_loads_a_fetched_artifact(farm_env: dict[str, str], tmp_path: Path) -> None:
    """The README's "Load it on the device" block, as written, with only the two values a device
    fills in replaced: the fetched model_ctx.onnx and the SoC's soc_model."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Load it on the device", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    farm(farm_env, "build", str(light("squeezenet")), "-t", "qnn:SM8650", "--name", "sq")
    fetched = farm(farm_env, "fetch", "-m", "sq", "--soc", "SM8650", "--qnn", "2.51.0", "-d", str(tmp_path / "dev"))
    ctx_model = tmp_path / "dev" / "model_ctx.onnx"
    assert str(ctx_model) in fetched.stdout
    code, n = re.subn(r'^ctx_model = "[^"]*"', f"ctx_model = {str(ctx_model)!r}", snippet, flags=re.M)
    assert n == 1
    code, n = re.subn(r'^soc_model = "[^"]*"', 'soc_model = "57"', code, flags=re.M)  # SM8650
    assert n == 1
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "['QNNExecutionProvider'" in proc.stdout and "[(1, 1000, 1, 1)]" in proc.stdout, proc.stdout
