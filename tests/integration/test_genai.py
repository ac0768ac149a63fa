"""An LLM export becomes one onnxruntime-genai folder a device opens (docs/shipping-llm.md), for real: the
export written by bench/genai_export.py, each part's prefill + decode compiled together by
QNN 2.51.0 (onnxruntime-qnn) in the embedded farm, the folder assembled, checked, fetched as a
device does, opened by onnxruntime-genai's og.Config in the QNN 2.51.0 worker env."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from farm.core.settings import Settings
from tests.common.cli import farm
from tests.common.registry_state import snapshot
from tests.common.schemas import valid

ROOT = Path(__file__).resolve().parents[2]
GENAI_PY = ROOT / ".venvs" / "qnn-2.51.0" / "bin" / "python"


def export(out: Path, *args: str) -> Path:
    subprocess.run([sys.executable, str(ROOT / "bench" / "genai_export.py"), str(out), "--parts", "2", *args],
                   check=True, capture_output=True, text=True, timeout=120)
    return out


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return export(tmp_path / "export")


def test_an_export_ships_as_one_folder_that_genai_opens(settings: Settings, farm_env: dict[str, str],
                                                       tiny: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = json.loads(farm({**farm_env, "TMPDIR": str(scratch)}, "build", "--genai", str(tiny), "-t", "qnn:SM8650",
                          "--name", "llm/tiny", "--tag", "t", "--json").stdout)
    assert out["ok"] and out["kind"] == "genai-package" and out["name"] == "llm/tiny" and out["tag"] == "t"
    # The package's genai.json and its parts' group.json lived in temporary directories: gone.
    assert sorted(p.name for p in scratch.glob("ctxfarm-*")) == []
    valid("build", out)
    (pkg,) = out["builds"]
    assert pkg["state"] == "built" and pkg["nodes_cpu"] == 0 and pkg["nodes_ep"] == 4
    # Each part one weight-shared group build of its own.
    assert [[b["state"] for b in p["builds"]] for p in out["parts"]] == [["built"], ["built"]]
    assert len({p["model"] for p in out["parts"]}) == 2

    dest = tmp_path / "device" / "llm"
    fetched = json.loads(farm(farm_env, "fetch", "--model", "llm/tiny:t", "--soc", "SM8650", "--qnn", "2.51.0",
                              "--dest", str(dest), "--json").stdout)
    valid("fetch", fetched)
    assert fetched["ctx_model"] == str(dest / "genai_config.json")
    roles = {s["role"]: s["file"] for s in fetched["stages"]}
    assert roles == {"embeddings": "embeddings.onnx", "part0.prefill": "context_0_ctx.onnx",
                     "part0.decode": "iterator_0_ctx.onnx", "part1.prefill": "context_1_ctx.onnx",
                     "part1.decode": "iterator_1_ctx.onnx", "lm_head": "lm_head.onnx"}
    # Every file the config names is there; one .bin per part, used by that part's two graphs only.
    config = json.loads((dest / "genai_config.json").read_text())
    stages = config["model"]["decoder"]["pipeline"][0]
    assert sorted(s["filename"] for s in stages.values()) == sorted(roles.values())
    assert all((dest / s["filename"]).is_file() for s in stages.values())
    assert sorted(p.name for p in dest.glob("*.bin")) == ["context_0_ctx_qnn.bin", "context_1_ctx_qnn.bin"]
    for i in (0, 1):
        for graph in (f"context_{i}_ctx.onnx", f"iterator_{i}_ctx.onnx"):
            assert f"context_{i}_ctx_qnn.bin".encode() in (dest / graph).read_bytes()
    assert (dest / "tokenizer.json").is_file()
    (qnn,) = stages["context_0"]["session_options"]["provider_options"]
    assert qnn["qnn"]["backend_type"] == "htp" and "soc_model" not in qnn["qnn"]  # runtime options only
    # onnxruntime-genai itself opens it.
    opened = subprocess.run([str(GENAI_PY), "-c", "import sys, onnxruntime_genai as og; og.Config(sys.argv[1]); "
                             "print('opened')", str(dest)], capture_output=True, text=True, timeout=120)
    assert opened.returncode == 0 and opened.stdout.strip() == "opened", opened.stderr

    # Resolve: unverified by load (weight-shared), carrying the twin's figures.
    res = json.loads(farm(farm_env, "resolve", "--model", "llm/tiny:t", "--soc", "SM8650", "--qnn", "2.51.0",
                          "--json").stdout)
    valid("resolve", res)
    assert res["artifact"] == pkg["artifact"] and res["verdict"] == "unverified"
    twin = res["twin"]
    assert twin["status"] == "ok", twin
    assert twin["tokens_compared"] >= 5 and twin["tokens_matched"] == twin["tokens_compared"]
    assert twin["first_step"]["psnr_db"] > 20

    shown = farm(farm_env, "show", pkg["artifact"]).stdout
    assert "part0.prefill    context_0_ctx.onnx" in shown and "lm_head          lm_head.onnx" in shown
    assert f"twin      {twin['tokens_matched']}/{twin['tokens_compared']} greedy tokens matched" in shown
    assert "verdict   unverified: a weight-shared context" in shown

    # The coverage page's cell of the package carries the twin's figure.
    from farm.api.page import render_page
    from registry.index import Registry

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            page = render_page(s, model=["llm/tiny"])
    finally:
        reg.close()
    assert f"built unverified twin {twin['tokens_matched']}/{twin['tokens_compared']}" in page

    # The same command again: answered from the index, nothing compiled or assembled.
    before = snapshot(settings)
    again = json.loads(farm(farm_env, "build", "--genai", str(tiny), "-t", "qnn:SM8650", "--name", "llm/tiny",
                            "--tag", "t", "--json").stdout)
    assert [b["state"] for b in again["builds"]] == ["cached"] and again["builds"][0]["artifact"] == pkg["artifact"]
    after = snapshot(settings)
    assert after["blobs"] == before["blobs"]

    # The device-side check: what it can, and its own outcome for what it can't (exit 4).
    checked = farm(farm_env, "load-check", str(dest), "-t", "qnn:SM8650", "--json", check=False)
    assert checked.returncode == 4, (checked.stdout, checked.stderr)
    err = json.loads(checked.stdout)["error"]
    assert err["code"] == "load-unverified" and "weight-shared" in err["message"]
    text = farm(farm_env, "fetch", "--model", "llm/tiny:t", "--soc", "SM8650", "--qnn", "2.51.0", "--dest",
                str(tmp_path / "again"), "--load-check", check=False)
    assert text.returncode == 4 and "error[load-unverified]" in text.stderr and "runtime-crashed" not in text.stderr
    assert (tmp_path / "again" / "genai_config.json").is_file()


def test_a_second_soc_stores_the_carried_files_once(settings: Settings, farm_env: dict[str, str],
                                                    tiny: Path) -> None:
    """Content-addressed: the tokenizer, embeddings and lm_head of packages for two SoCs are the
    same blobs; each package's binaries are its own parts' group blobs."""
    out = json.loads(farm(farm_env, "build", "--genai", str(tiny), "-t", "qnn:SM8650", "-t", "qnn:SM8750",
                          "--no-twin", "--json").stdout)
    assert [b["state"] for b in out["builds"]] == ["built", "built"]
    files = [{f["name"]: f["digest"] for f in json.loads(farm(farm_env, "show", b["artifact"], "--json").stdout)["files"]}
             for b in out["builds"]]
    for name in ("tokenizer.json", "embeddings.onnx", "embeddings.onnx.data", "lm_head.onnx.data"):
        assert files[0][name] == files[1][name]
    assert files[0]["context_0_ctx_qnn.bin"] != files[1]["context_0_ctx_qnn.bin"]
    parts = {b["target"]: b["artifact"] for p in out["parts"] for b in p["builds"]}
    assert len(parts) == 2
    # Built with --no-twin: a re-run with the gate runs the twin on the cached package, then gates.
    assert out["builds"][0]["accuracy"] is None
    again = json.loads(farm(farm_env, "build", "--genai", str(tiny), "-t", "qnn:SM8650", "--require-twin",
                            "--json").stdout)
    (b,) = again["builds"]
    assert b["state"] == "cached" and b["accuracy"]["twin"]["status"] == "ok"


def test_folders_that_cannot_be_mapped_are_refused_and_write_nothing(settings: Settings, farm_env: dict[str, str],
                                                                     tiny: Path, tmp_path: Path) -> None:
    before = snapshot(settings)
    broken = tmp_path / "broken"
    shutil.copytree(tiny, broken)
    (broken / "iterator_1.onnx").unlink()
    got = farm(farm_env, "build", "--genai", str(broken), "-t", "qnn:SM8650", "--json", check=False)
    assert got.returncode == 2 and json.loads(got.stdout)["error"]["code"] == "bad-genai"
    assert "iterator_1.onnx" in json.loads(got.stdout)["error"]["message"]
    # Not a folder at all; a target that can't share weights; models next to --genai.
    assert json.loads(farm(farm_env, "build", "--genai", str(tmp_path / "nope"), "-t", "qnn:SM8650", "--json",
                           check=False).stdout)["error"]["code"] == "bad-genai"
    low = farm(farm_env, "build", "--genai", str(tiny), "-t", "qnn:SM8450", "--json", check=False)
    assert json.loads(low.stdout)["error"]["code"] in ("sharing-unsupported", "unknown-target")
    mixed = farm(farm_env, "build", "--genai", str(tiny), str(tiny / "lm_head.onnx"), "-t", "qnn:SM8650", check=False)
    assert mixed.returncode == 2 and "error[usage]" in mixed.stderr and "Traceback" not in mixed.stderr
    assert snapshot(settings) == before


def test_a_part_that_fails_fails_the_package_with_its_code(settings: Settings, farm_env: dict[str, str],
                                                          tiny: Path) -> None:
    """A compile capped below what a part needs: the part's resource-limit is the package's,
    the message naming the part; the registry holds the failed rows, no artifact."""
    env = {**farm_env, "FARM_COMPILE_MEMORY_MB": "64"}
    got = farm(env, "build", "--genai", str(tiny), "-t", "qnn:SM8650", "--name", "llm/bad", "--no-twin", "--json",
               check=False)
    assert got.returncode == 1, (got.stdout, got.stderr)
    out = json.loads(got.stdout)
    (pkg,) = out["builds"]
    assert pkg["state"] == "failed" and pkg["artifact"] is None
    assert pkg["error_code"] == out["parts"][0]["builds"][0]["error_code"]
    assert pkg["error_message"].startswith("part 0 (")
    # Answered from the index the next time (a deterministic failure), with the same code.
    again = json.loads(farm(env, "build", "--genai", str(tiny), "-t", "qnn:SM8650", "--name", "llm/bad",
                            "--no-twin", "--json", check=False).stdout)
    assert again["builds"][0]["error_code"] == pkg["error_code"]


def test_a_folder_olive_exported_ships_too(settings: Settings, farm_env: dict[str, str], tmp_path: Path) -> None:
    """tests/data/genai/olive-qwen2-tiny: Olive 0.13's static passes on a random Qwen2 (the parts
    keep GroupQueryAttention on the CPU: context models with a main_context 0 node)."""
    olive = ROOT / "tests" / "data" / "genai" / "olive-qwen2-tiny"
    out = json.loads(farm(farm_env, "build", "--genai", str(olive), "-t", "qnn:SM8650", "--name", "llm/qwen",
                          "--tag", "o", "--json").stdout)
    (pkg,) = out["builds"]
    assert out["ok"] and pkg["state"] == "built", out
    assert pkg["accuracy"]["twin"]["status"] == "pending"  # the answer is the publication; the twin follows
    twin = json.loads(farm(farm_env, "resolve", "--model", "llm/qwen:o", "--soc", "SM8650", "--qnn", "2.51.0",
                           "--json").stdout)["twin"]
    assert twin["status"] == "ok" and twin["tokens_matched"] == twin["tokens_compared"] > 0
    dest = tmp_path / "qwen"
    farm(farm_env, "fetch", "--model", "llm/qwen:o", "--soc", "SM8650", "--qnn", "2.51.0", "--dest", str(dest))
    assert sorted(p.name for p in dest.glob("*.bin")) == ["context_0_ctx_qnn.bin", "context_1_ctx_qnn.bin"]
    opened = subprocess.run([str(GENAI_PY), "-c", "import sys, onnxruntime_genai as og; og.Config(sys.argv[1]); "
                             "print('opened')", str(dest)], capture_output=True, text=True, timeout=120)
    assert opened.returncode == 0 and opened.stdout.strip() == "opened", opened.stderr


def test_an_environment_without_onnxruntime_genai_refuses_before_anything_is_written(tmp_path: Path) -> None:
    """`farm build --genai` in the QNN 2.47.0 worker environment (onnxruntime 1.24.4: no
    onnxruntime-genai installs beside it that can run QNN) is refused with capability-missing from
    what the environment holds, before the export is read or the index made; the same in an
    environment that has it goes on (here: the TensorRT target it is then given is refused as such)."""
    import os

    from tests.common.genai import make_export

    src = make_export(tmp_path / "export")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FARM_")}, "FARM_HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(ROOT)}
    py = ROOT / ".venvs" / "qnn-2.47.0" / "bin" / "python"
    got = subprocess.run([str(py), "-m", "farm.cli", "build", "--genai", str(src), "-t", "qnn:SM8650", "--name",
                          "llm/x", "--tag", "t"], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 2, got.stderr
    assert "error[capability-missing]" in got.stderr and "QNN 2.47.0" in got.stderr
    assert "onnxruntime_genai" in got.stderr and "Traceback" not in got.stderr
    assert not (tmp_path / "home").exists()
    trt = subprocess.run([str(GENAI_PY), "-m", "farm.cli", "build", "--genai", str(src), "-t", "trt:sm_90"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert trt.returncode == 2 and "error[capability-missing]" in trt.stderr and "a trt target" in trt.stderr
    gone = subprocess.run([str(GENAI_PY), "-m", "farm.cli", "build", "--genai", str(tmp_path / "nope"), "-t",
                           "qnn:SM8650"], env=env, capture_output=True, text=True, timeout=120)
    assert gone.returncode == 2 and "no such folder" in gone.stderr


def test_every_front_door_refuses_a_bad_value_or_a_path_oddity_before_queueing(
        settings: Settings, farm_env: dict[str, str], tiny: Path, tmp_path: Path) -> None:
    """A config value of the wrong JSON type whose KV length is fixed in the graphs (it used to
    pass, compile, and fail the package as internal-error), and a symlink loop on one of the
    export's files (it was internal-error: RuntimeError): bad-genai naming the file and the key,
    exit 2, from `farm build --genai`, `farm submit --genai --server` and `farm submit --genai`
    on a cluster alike, nothing written; a plain model path that loops or is a FIFO: invalid-model."""
    import os

    from tests.common.genai import edit_config
    from tests.common.hostile_genai import make_odd

    before = snapshot(settings)
    bad = tmp_path / "bad-config"
    shutil.copytree(tiny, bad)
    edit_config(bad, lambda d: d["model"].update(context_length="64"))
    loop = tmp_path / "loop"
    shutil.copytree(tiny, loop)
    make_odd(loop / "tokenizer_config.json", "symlink loop")
    cluster = {**farm_env, "FARM_BROKER_URL": "redis://127.0.0.1:6379/15"}
    doors = [(farm_env, ["build"]), (farm_env, ["submit", "--server", "http://127.0.0.1:9"]),
             (cluster, ["submit", "--sdk", "2.51.0", "--allow-queue"])]
    for folder, needle in ((bad, 'genai_config.json: model.context_length: "64" is not an integer'),
                           (loop, "tokenizer_config.json: ")):
        for env, args in doors:
            got = farm(env, *args, "--genai", str(folder), "-t", "qnn:SM8650", "--json", check=False)
            err = json.loads(got.stdout)["error"]
            assert got.returncode == 2 and err["code"] == "bad-genai" and needle in err["message"], (args, got)
            assert "Traceback" not in got.stderr
    models = tmp_path / "models"
    models.mkdir()
    os.symlink("loop.onnx", models / "loop.onnx")
    os.mkfifo(models / "fifo.onnx")
    for name, why in (("loop.onnx", "a symlink loop"), ("fifo.onnx", "a FIFO")):
        got = farm(farm_env, "build", str(models / name), "-t", "qnn:SM8650", "--json", check=False, timeout=60)
        err = json.loads(got.stdout)["error"]
        assert err["code"] == "invalid-model" and why in err["message"] and err["hint"], got
    assert snapshot(settings) == before
