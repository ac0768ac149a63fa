"""`farm load-check` and `farm fetch --load-check` at the terminal, with real QNN compiles: a
zero exit only for a context that loads and runs for its target under this runtime; every other
case is an error of its own code and hint, read from the file before any runtime starts where
the file says enough (the SoC in the context binary, the SDK in ``ep_sdk_version``)."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.common.cli import farm
from tests.common.onnx_models import conv_relu_add, light

ROOT = Path(__file__).resolve().parents[2]
VENV_247 = ROOT / ".venvs" / "qnn-2.47.0" / "bin" / "python"
SIMULATOR = platform.machine().lower() in ("x86_64", "amd64")


def built(env: dict[str, str], model: Path, *targets: str, options: tuple[str, ...] = ()) -> dict[str, str]:
    out = json.loads(farm(env, "build", str(model), *[a for t in targets for a in ("-t", t)],
                          *[a for o in options for a in ("-o", o)], "--json").stdout)
    assert [b["state"] for b in out["builds"]] == ["built"] * len(targets)
    return {b["target"]: b["artifact"] for b in out["builds"]}


def fetched(env: dict[str, str], artifact: str, out: Path) -> Path:
    farm(env, "fetch", artifact, "--out", str(out))
    return out / "model_ctx.onnx"


def refused(proc: subprocess.CompletedProcess[str], code: str) -> None:
    """A load check that failed with ``code``: exit 1, the code on stderr, no traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert f"error[{code}]" in proc.stderr and "hint:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "build log" not in proc.stderr, "a load check has no build log: the hint must be its own"



def error_json(proc: subprocess.CompletedProcess[str], code: str) -> dict[str, Any]:
    refused(proc, code)
    err: dict[str, Any] = json.loads(proc.stdout)["error"]
    assert err["code"] == code and err["hint"]
    return err


def test_a_context_for_its_target_loads_runs_and_says_it_ran_on_the_simulator(farm_env: dict[str, str],
                                                                               tmp_path: Path) -> None:
    arts = built(farm_env, conv_relu_add(tmp_path / "net.onnx"), "qnn:SM8650")
    ctx = fetched(farm_env, arts["qnn:SM8650"], tmp_path / "dev")
    doc = json.loads(farm(farm_env, "load-check", str(ctx), "--target", "qnn:SM8650", "--json").stdout)
    schema = json.loads((ROOT / "farm" / "cli" / "schemas" / "load-check.json").read_text())
    errors = [e.message for e in Draft202012Validator(schema).iter_errors(doc)]
    assert not errors, errors
    assert doc["ok"] is True and doc["outputs"] == [[1, 8, 16, 16]] and doc["load_seconds"] > 0
    assert doc["context"]["soc"] == "SM8650" and doc["context"]["htp_arch"] == "v75"
    assert doc["context"]["sdk"] == doc["runtime"]["sdk"] == "2.51.0"
    assert doc["context"]["files"] == ["model_ctx_qnn.bin"]
    assert doc["runtime"]["simulator"] is SIMULATOR
    text = farm(farm_env, "load-check", str(ctx.parent), "--target", "qnn:snapdragon-8-gen-3").stdout
    assert text.startswith(f"loaded {ctx} for qnn:SM8650 in ") and "ran once in" in text
    assert "built with QNN 2.51.0, for SM8650 (HTP v75)" in text
    if SIMULATOR:
        assert "on the QNN HTP simulator (x86_64)" in text and "the timings are the simulator's" in text


def test_every_reason_a_context_would_not_load_has_its_own_code(farm_env: dict[str, str], tmp_path: Path) -> None:
    model = conv_relu_add(tmp_path / "net.onnx")
    arts = built(farm_env, model, "qnn:SM8650", "qnn:SM8750")
    sm8650 = fetched(farm_env, arts["qnn:SM8650"], tmp_path / "sm8650")
    sm8750 = fetched(farm_env, arts["qnn:SM8750"], tmp_path / "sm8750")

    def check(path: Path | str, target: str = "qnn:SM8650", *extra: str) -> subprocess.CompletedProcess[str]:
        return farm(farm_env, "load-check", str(path), "--target", target, *extra, check=False)

    # Built for SM8750, checked for SM8650: the simulator would load it, a device would not.
    err = error_json(check(sm8750, "qnn:SM8650", "--json"), "target-mismatch")
    assert "built for SM8750 (HTP v79), not for SM8650" in err["message"]
    assert "--soc SM8650" in err["hint"]
    assert err["details"]["context"]["soc"] == "SM8750" and err["details"]["context"]["soc_models"] == [69]
    # The plain model the build started from: no EPContext node, nothing to load.
    plain = check(model)
    refused(plain, "not-a-context")
    assert "has no EPContext node" in plain.stderr and "farm build" in plain.stderr
    # A path that is not there.
    missing = check(tmp_path / "nowhere" / "model_ctx.onnx")
    refused(missing, "not-found")
    assert "does not exist" in missing.stderr and "DIR/model_ctx.onnx" in missing.stderr
    # The model without the .bin it points at: the hint names the file and where it belongs.
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(sm8650, lone / "model_ctx.onnx")
    no_bin = check(lone / "model_ctx.onnx")
    refused(no_bin, "not-found")
    assert f"points at model_ctx_qnn.bin (EPContext ep_cache_context), which is not in {lone}" in no_bin.stderr
    assert f"put model_ctx_qnn.bin in {lone}" in no_bin.stderr
    # Not ONNX at all.
    (tmp_path / "junk.onnx").write_bytes(b"\x00 not a model")
    refused(check(tmp_path / "junk.onnx"), "invalid-model")
    # A damaged context whose SoC and SDK match: the SDK's own refusal, with a load-check hint.
    damaged = tmp_path / "damaged"
    shutil.copytree(sm8650.parent, damaged)
    blob = damaged / "model_ctx_qnn.bin"
    blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
    bad = check(damaged / "model_ctx.onnx")
    refused(bad, "toolchain-error")
    assert "could not load model_ctx.onnx" in bad.stderr and "SoC SM8650, SDK 2.51.0 matched" in bad.stderr
    # And the same file set for its own target is fine.
    assert check(sm8750, "qnn:SM8750").returncode == 0


def test_a_context_that_crashes_when_run_fails_load_check_and_fetch(farm_env: dict[str, str],
                                                                     tmp_path: Path) -> None:
    """Measured: light_inception_v1 built for SM8650 with QNN 2.51.0 loads on the x86_64 HTP
    simulator, and running it segfaults. That used to exit 0 with "ok": true."""
    art = built(farm_env, light("inception_v1"), "qnn:SM8650")["qnn:SM8650"]
    ctx = fetched(farm_env, art, tmp_path / "dev")
    err = error_json(farm(farm_env, "load-check", str(ctx), "--target", "qnn:SM8650", "--json", check=False),
                     "runtime-crashed")
    assert "then running it crashed the runtime: signal 11 (SIGSEGV)" in err["message"]
    assert err["details"]["load_seconds"] > 0 and "run_seconds" not in err["details"]
    if SIMULATOR:
        assert "simulator" in err["message"] and "device itself" in err["hint"]
    # fetch --load-check: the files are in place and verified, and the exit says the check failed.
    got = farm(farm_env, "fetch", art, "--out", str(tmp_path / "again"), "--load-check", check=False)
    refused(got, "runtime-crashed")
    assert got.stdout.startswith(f"fetched {art[7:19]} (") and (tmp_path / "again" / "model_ctx_qnn.bin").is_file()
    as_json = farm(farm_env, "fetch", art, "--out", str(tmp_path / "again"), "--load-check", "--json", check=False)
    assert error_json(as_json, "runtime-crashed")["details"]["fetched"]["artifact"] == art


def test_fetch_load_check_of_a_good_context_reports_the_load(farm_env: dict[str, str], tmp_path: Path) -> None:
    farm(farm_env, "build", str(conv_relu_add(tmp_path / "net.onnx")), "-t", "qnn:SM8650", "--name", "net")
    got = json.loads(farm(farm_env, "fetch", "--model", "net", "--soc", "SM8650", "--qnn", "2.51.0", "--out",
                          str(tmp_path / "dev"), "--load-check", "--json").stdout)
    assert got["load"]["ok"] is True and got["load"]["context"]["soc"] == "SM8650"
    assert got["load"]["outputs"] == [[1, 8, 16, 16]]


@pytest.mark.skipif(not VENV_247.exists(), reason="no QNN 2.47.0 worker venv (infra/workers/create-venvs.sh)")
def test_the_sdk_that_built_a_context_is_compared_with_the_runtime(farm_env: dict[str, str], tmp_path: Path) -> None:
    """DESIGN's measured matrix: a runtime loads contexts built with its own SDK or an older one.
    A QNN 2.51.0 context under the 2.47.0 runtime is refused from its ep_sdk_version (it used to
    reach the SDK's QNN_CONTEXT_ERROR_INVALID_ARGUMENT with a hint about a build log); a 2.47.0
    context under 2.51.0 loads, and says it is older."""
    model = conv_relu_add(tmp_path / "net.onnx")
    ctx_251 = fetched(farm_env, built(farm_env, model, "qnn:SM8650")["qnn:SM8650"], tmp_path / "b251")
    env_247 = {**farm_env, "FARM_HOME": str(tmp_path / "home-247")}

    def farm_247(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(VENV_247), "-m", "farm.cli", *args], env=env_247, capture_output=True, text=True,
                              timeout=300, cwd=ROOT, stdin=subprocess.DEVNULL)

    too_new = farm_247("load-check", str(ctx_251), "--target", "qnn:SM8650", "--json")
    err = error_json(too_new, "runtime-too-old")
    assert "built with QNN 2.51.0 (ep_sdk_version v2.51.0." in err["message"]
    assert "newer than this runtime's QNN 2.47.0" in err["message"]
    assert "QNN <= 2.47.0" in err["hint"] and "QNN >= 2.51.0" in err["hint"]
    assert err["details"]["runtime"]["sdk"] == "2.47.0"

    build_247 = farm_247("build", str(model), "-t", "qnn:SM8650", "--json")
    assert build_247.returncode == 0, build_247.stderr
    art_247 = json.loads(build_247.stdout)["builds"][0]["artifact"]
    assert farm_247("fetch", art_247, "--out", str(tmp_path / "b247")).returncode == 0
    older = farm(farm_env, "load-check", str(tmp_path / "b247"), "--target", "qnn:SM8650", "--json")
    doc = json.loads(older.stdout)
    assert doc["ok"] and doc["context"]["sdk"] == "2.47.0" and doc["context"]["soc"] == "SM8650"
    assert any("older than this runtime's 2.51.0" in n for n in doc["notes"])
