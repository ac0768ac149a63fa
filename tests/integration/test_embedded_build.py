"""The walking farm, for real: QNN HTP compiles (onnxruntime-qnn), the embedded registry
(SQLite + local blobs), rebuild from the index, device-style resolve/fetch/load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.core.settings import Settings
from farm.pipeline.plan import build
from registry.index import Registry, find_artifact
from registry.models import Build
from tests.common.cli import farm
from tests.common.onnx_models import conv_relu_add, light, partly_unsupported
from tests.common.registry_state import snapshot
from tests.common.schemas import valid


def test_two_socs_give_two_artifacts_and_rebuild_is_cached(settings: Settings, farm_env: dict[str, str]) -> None:
    model = str(light("squeezenet"))
    out = json.loads(farm(farm_env, "build", model, "-t", "qnn:SM8650", "-t", "qnn:SM8750",
                          "--name", "squeezenet", "--tag", "stable", "--json").stdout)
    first = {b["target"]: b for b in out["builds"]}
    assert {b["state"] for b in first.values()} == {"built"}
    assert first["qnn:SM8650"]["artifact"] != first["qnn:SM8750"]["artifact"]
    assert all(b["nodes_ep"] >= 1 and b["nodes_cpu"] == 0 for b in first.values())
    assert all(b["compile_seconds"] > 0 and b["size_bytes"] > 100_000 for b in first.values())

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            a = find_artifact(s, first["qnn:SM8650"]["artifact"])
            b = find_artifact(s, first["qnn:SM8750"]["artifact"])
            bins_a = {f.digest for f in a.files if f.role == "context"}
            bins_b = {f.digest for f in b.files if f.role == "context"}
            assert bins_a and bins_a.isdisjoint(bins_b), "different soc_model must give different context bytes"
            assert a.ep_sdk_version and a.ep_sdk_version.startswith("v2.51.0")
    finally:
        reg.close()

    before = snapshot(settings)
    again = json.loads(farm(farm_env, "build", model, "-t", "qnn:SM8650", "-t", "qnn:SM8750",
                            "--name", "squeezenet", "--tag", "stable", "--json").stdout)
    assert [b["state"] for b in again["builds"]] == ["cached", "cached"]
    assert {b["artifact"] for b in again["builds"]} == {b["artifact"] for b in first.values()}
    assert snapshot(settings) == before, "a cached rebuild must not write anything"


def test_early_compiles_write_the_bytes_of_compiles_after_the_claim(settings: Settings, farm_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """`farm build` starts its compiles before the pipeline (farm.pipeline.early) and each claimed
    build adopts its own: the artifacts are those of a call that compiles only after the claim
    (FARM_EARLY_COMPILE=0), and the builds say they were adopted."""
    model = str(light("squeezenet"))
    args = ["build", model, "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--json"]
    early = json.loads(farm(farm_env, *args).stdout)
    late_env = {**farm_env, "FARM_HOME": str(tmp_path / "late"), "FARM_EARLY_COMPILE": "0"}
    late = json.loads(farm(late_env, *args).stdout)
    assert [b["state"] for b in early["builds"]] == ["built", "built"] == [b["state"] for b in late["builds"]]
    assert early["model"] == late["model"]
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            got = {b["target"]: {f.name: f.digest for f in find_artifact(s, b["artifact"]).files
                                 if f.role in ("ctx-model", "context")} for b in early["builds"]}
            phases = [s.get(Build, b["build_id"]).phases for b in early["builds"]]  # type: ignore[union-attr]
    finally:
        reg.close()
    assert all("early_ahead" in ph and "bundle_fetch" not in ph for ph in phases), phases
    reg = Registry.open(Settings.from_env(late_env))
    try:
        with reg.db.session() as s:
            want = {b["target"]: {f.name: f.digest for f in find_artifact(s, b["artifact"]).files
                                  if f.role in ("ctx-model", "context")} for b in late["builds"]}
            late_phases = [s.get(Build, b["build_id"]).phases for b in late["builds"]]  # type: ignore[union-attr]
    finally:
        reg.close()
    assert got == want  # reproducible builds: the same context model and binary, byte for byte
    assert not any("early_ahead" in ph for ph in late_phases)


def test_fetch_as_device_and_load(settings: Settings, farm_env: dict[str, str], tmp_path: Path) -> None:
    farm(farm_env, "build", str(light("resnet50")), "-t", "qnn:SM8650", "--name", "resnet", "--tag", "stable")
    res = json.loads(farm(farm_env, "resolve", "--model", "resnet:stable", "--soc", "snapdragon-8-gen-3",
                          "--qnn", "2.51.0", "--json").stdout)
    assert res["target"] == "SM8650" and res["verdict"] == "loads"
    dev = tmp_path / "device"
    got = json.loads(farm(farm_env, "fetch", "--model", "resnet:stable", "--soc", "SM8650", "--qnn", "2.51.0",
                          "--out", str(dev), "--load-check", "--json").stdout)
    assert got["artifact"] == res["artifact"]
    # File names are fixed stems from the manifest, never the model name.
    assert Path(got["ctx_model"]) == dev / "model_ctx.onnx"
    assert sorted(p.name for p in dev.iterdir()) == sorted(f["name"] for f in res["files"])
    assert got["load"]["outputs"] == [[1, 1000]] or got["load"]["outputs"][0][:2] == [1, 1000]
    assert got["load"]["load_seconds"] > 0


def test_device_with_older_runtime_gets_explained_no_match(settings: Settings, farm_env: dict[str, str]) -> None:
    farm(farm_env, "build", str(light("squeezenet")), "-t", "qnn:SM8650", "--name", "sq")
    proc = farm(farm_env, "resolve", "--model", "sq", "--soc", "SM8650", "--qnn", "2.47.0", check=False)
    assert proc.returncode == 3
    assert "error[no-match]" in proc.stderr and "Traceback" not in proc.stderr
    assert "newer than the runtime 2.47.0" in proc.stderr and "QNN <= 2.47.0" in proc.stderr
    other = farm(farm_env, "resolve", "--model", "sq", "--soc", "SM8750", "--qnn", "2.51.0", check=False)
    assert other.returncode == 3 and "built for SM8650" in other.stderr


def test_full_offload_model_from_helper(settings: Settings, tmp_path: Path) -> None:
    model = conv_relu_add(tmp_path / "crelu.onnx")
    report = build(settings, model, ["qnn:SM8550"], ["require_full_offload=true"])
    (o,) = report.outcomes
    assert o.state == "built" and o.nodes_cpu == 0 and o.nodes_ep == 1


def test_external_data_model_compiles_and_digest_covers_data(settings: Settings, tmp_path: Path) -> None:
    model = conv_relu_add(tmp_path / "ext.onnx", external=True)
    assert (tmp_path / "ext.data").exists()
    (o,) = build(settings, model, ["qnn:SM8650"]).outcomes
    assert o.state == "built"
    # Same .onnx bytes, different weights in the data file: a different model, a new compile.
    other = tmp_path / "other"
    other.mkdir()
    conv_relu_add(other / "ext.onnx", seed=1, external=True)
    (model_b := other / "ext.onnx").write_bytes(model.read_bytes())
    report_b = build(settings, model_b, ["qnn:SM8650"])
    assert report_b.outcomes[0].state == "built"
    assert report_b.model_digest != build(settings, model, ["qnn:SM8650"]).model_digest


def test_require_full_offload_is_a_gate_on_the_answer(settings: Settings, farm_env: dict[str, str],
                                                       tmp_path: Path) -> None:
    """--require-full-offload is not a build input: gated first, the compile runs ungated and
    publishes the partial artifact while the answer fails with unsupported-ops (the CPU op types,
    exit 1); then a plain build is answered cached from that artifact, and a gated one again
    compiles nothing. Plain first, then gated: no second compile either."""
    model = partly_unsupported(tmp_path / "partial.onnx")
    proc = farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "--require-full-offload", check=False)
    assert proc.returncode == 1, proc.stderr
    assert "error[unsupported-ops] qnn:SM8650: 2 node(s) stay on the CPU (Erf, Mod)" in proc.stderr
    assert "failed (unsupported-ops)" in proc.stdout and "1 ctx / 2 cpu" in proc.stdout
    assert "Traceback" not in proc.stderr and "answered from the index" not in proc.stderr
    state = snapshot(settings)
    assert state["rows"]["artifacts"] == 1 and state["rows"]["builds_unfinished"] == 0  # published, ungated
    plain = json.loads(farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "--json").stdout)
    (p,) = plain["builds"]
    assert plain["ok"] and (p["state"], p["nodes_ep"], p["nodes_cpu"]) == ("cached", 1, 2)
    again = farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "-o", "require_full_offload=true", "--json",
                 check=False)  # the old -o spelling is the same gate
    assert again.returncode == 1
    (g,) = valid("build", again.stdout)["builds"]
    assert (g["state"], g["error_code"], g["cached_failure"]) == ("failed", "unsupported-ops", True)
    assert (g["build_id"], g["artifact"]) == (p["build_id"], p["artifact"]) and "Erf, Mod" in g["error_message"]
    assert snapshot(settings) == state, "neither answer may compile or write anything"

    # Plain first (another FARM_HOME, the same model): the gated request compiles nothing.
    env = {**farm_env, "FARM_HOME": str(tmp_path / "other-home")}
    first = json.loads(farm(env, "build", str(model), "-t", "qnn:SM8650", "--json").stdout)
    assert first["ok"] and first["builds"][0]["state"] == "built"
    other = Settings.from_env(env)
    before = snapshot(other)
    gated = farm(env, "build", str(model), "-t", "qnn:SM8650", "--require-full-offload", check=False)
    assert gated.returncode == 1 and "error[unsupported-ops]" in gated.stderr and "(Erf, Mod)" in gated.stderr
    assert "answered from the index" in gated.stderr
    assert snapshot(other) == before


def test_embed_mode_1_is_one_file_that_loads(settings: Settings, tmp_path: Path) -> None:
    from farm.core.catalog import parse_target
    from registry.install import fetch_artifact
    from workers.qnn.runner import QnnRunner

    (o,) = build(settings, light("squeezenet"), ["qnn:SM8650"], ["embed_mode=1"]).outcomes
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            art = find_artifact(s, o.artifact or "")
            assert [f.role for f in art.files if f.role in ("ctx-model", "context")] == ["ctx-model"]
            got = fetch_artifact(reg.store, art, tmp_path / "dev")
    finally:
        reg.close()
    result = QnnRunner().load_check(got.ctx_model, parse_target("qnn:SM8650"))
    assert result["load_seconds"] > 0


def test_compile_time_cap_is_a_deterministic_resource_limit(settings: Settings, tmp_path: Path) -> None:
    import dataclasses

    model = conv_relu_add(tmp_path / "t.onnx")
    hurried = dataclasses.replace(settings, compile_timeout=0.01)
    (o,) = build(hurried, model, ["qnn:SM8650"]).outcomes
    assert o.state == "failed" and o.error_code == "resource-limit"
    assert snapshot(settings)["rows"]["builds_unfinished"] == 0
    # Same inputs, same cap: answered from the index, until --retry-failed.
    (cached,) = build(settings, model, ["qnn:SM8650"]).outcomes
    assert cached.state == "failed" and cached.cached_failure and cached.error_code == "resource-limit"
    (o2,) = build(settings, model, ["qnn:SM8650"], retry_failed=True).outcomes
    assert o2.state == "built" and o2.build_id == o.build_id
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            assert find_artifact(s, o2.artifact or "").build.attempts == 1
    finally:
        reg.close()


def _one_node(path: Path, op: str, *, ir_version: int = 8, **attrs: object) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node(op, ["x", "x"][: 2 if op == "Mod" else 1], ["y"], **attrs)],
                              op.lower(), [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(("make", "code"), [
    # HTP has no kernel for Mod: the EP takes no node and writes no context model (measured).
    (lambda p: _one_node(p, "Mod", fmod=1), "unsupported-ops"),
    # (An IR version onnx accepts and onnxruntime refuses was the invalid-model case here: IR 14
    # under onnxruntime 1.31. Under 1.32 both stop at IR 14, so IR 15 is refused when the bundle
    # is inspected, before any build row: test_bad_input_is_a_clear_error_and_changes_nothing.)
], ids=["no-node-for-the-ep"])
def test_deterministic_model_failures_are_not_retried(settings: Settings, tmp_path: Path, make, code) -> None:  # type: ignore[no-untyped-def]
    """Both once failed as a retried toolchain-error (three attempts); the same model fails the
    same way every time, so one attempt, then answered from the index."""
    model = make(tmp_path / "m.onnx")
    (o,) = build(settings, model, ["qnn:SM8650"]).outcomes
    assert (o.state, o.error_code) == ("failed", code), o.error_message
    (again,) = build(settings, model, ["qnn:SM8650"]).outcomes
    assert again.cached_failure and again.error_code == code
    reg = Registry.open(settings)
    try:
        from registry.models import Build

        with reg.db.session() as s:
            assert s.get(Build, o.build_id).attempts == 1  # type: ignore[union-attr]
    finally:
        reg.close()


def test_concurrent_identical_builds_compile_once(settings: Settings, farm_env: dict[str, str],
                                                  tmp_path: Path) -> None:
    model = conv_relu_add(tmp_path / "c.onnx", seed=7)
    # Create the schema first so the racers contend on the build key, not on the migration.
    Registry.open(settings).close()
    args = [sys.executable, "-m", "farm.cli", "build", str(model), "-t", "qnn:SM8650", "--json"]
    procs = [subprocess.Popen(args, env=farm_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    builds = [json.loads(o[0])["builds"][0] for o in outs]
    assert len({b["artifact"] for b in builds}) == 1
    assert sorted(b["state"] for b in builds).count("built") == 1
    state = snapshot(settings)
    assert state["rows"]["builds"] == 1 and state["rows"]["artifacts"] == 1


@pytest.mark.parametrize(
    ("make_args", "code"),
    [
        (lambda d: [str(d / "not.onnx"), "-t", "qnn:SM8650"], "invalid-model"),
        (lambda d: [str(d / "trunc.onnx"), "-t", "qnn:SM8650"], "invalid-model"),
        (lambda d: [str(d / "good.onnx"), "-t", "qnn:SM9999"], "unknown-target"),
        (lambda d: [str(d / "good.onnx"), "-t", "qnn:SM8650", "-o", "precision=fp8"], "bad-options"),
        (lambda d: [str(d / "good.onnx"), "-t", "qnn:SM8650", "-o", "no_such=1"], "bad-options"),
        (lambda d: [str(d / "good.onnx"), "-t", "trt:sm_75", "-o", "hardware_compatibility_level=ampere_plus"],
         "bad-options"),
        (lambda d: [str(d / "escape" / "m.onnx"), "-t", "qnn:SM8650"], "invalid-model"),
        # Newer than onnx's checker and onnxruntime 1.32 read (both stop at IR 14).
        (lambda d: [str(_one_node(d / "ir15.onnx", "Relu", ir_version=15)), "-t", "qnn:SM8650"], "invalid-model"),
    ],
    ids=["not-onnx", "truncated", "unknown-target", "bad-value", "unknown-option", "bad-combination",
         "external-data-outside", "ir-version-too-new"],
)
def test_bad_input_is_a_clear_error_and_changes_nothing(settings: Settings, farm_env: dict[str, str],
                                                        tmp_path: Path, make_args, code: str) -> None:  # type: ignore[no-untyped-def]
    import onnx

    (tmp_path / "not.onnx").write_text("hello, not a model\n")
    good = conv_relu_add(tmp_path / "good.onnx")
    (tmp_path / "trunc.onnx").write_bytes(light("resnet50").read_bytes()[:30_000])
    esc = tmp_path / "escape"
    esc.mkdir()
    conv_relu_add(esc / "m.onnx", external=True)
    m = onnx.load(str(esc / "m.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../outside.data"
    (tmp_path / "outside.data").write_bytes((esc / "m.data").read_bytes())
    onnx.save_model(m, str(esc / "m.onnx"))

    # A registry that already holds something, to show it is left exactly as it was.
    build(settings, good, ["qnn:SM8650"], name="good")
    before = snapshot(settings)
    proc = farm(farm_env, "build", *make_args(tmp_path), check=False)
    assert proc.returncode != 0
    assert f"error[{code}]" in proc.stderr, proc.stderr
    assert "hint:" in proc.stderr and "Traceback" not in proc.stderr
    assert snapshot(settings) == before


def test_show_and_ls(settings: Settings, farm_env: dict[str, str]) -> None:
    out = json.loads(farm(farm_env, "build", str(light("squeezenet")), "-t", "qnn:SM8650", "--name", "sq",
                          "--json").stdout)
    art = out["builds"][0]["artifact"]
    shown = json.loads(farm(farm_env, "show", art[7:19], "--json").stdout)
    man = shown["manifest"]
    assert shown["artifact"] == art and man["target"]["soc_model"] == 57 and man["target"]["htp_arch"] == "v75"
    assert man["toolchain"]["version"] == "2.51.0" and man["toolchain"]["ep_version"] == "2.7.0"
    assert man["epcontext"][0]["source"] == "QNNExecutionProvider" and man["epcontext"][0]["embed_mode"] == 0
    assert {f["role"] for f in shown["files"]} == {"ctx-model", "context", "log", "manifest"}
    listed = json.loads(farm(farm_env, "ls", "--model", "sq:latest", "--json").stdout)
    assert [(r["id"], r["artifact"]) for r in listed] == [(art[7:19], art)]
    missing = farm(farm_env, "show", "abcdef012345", check=False)
    assert missing.returncode == 1 and "error[not-found]" in missing.stderr


def test_importing_farm_and_registry_does_not_import_onnxruntime() -> None:
    code = ("import sys, farm, farm.pipeline.plan, registry.install, farm.cli, registry, registry.index, registry.resolve, "
            "workers.runner, workers.qnn.runner; "
            "bad=[m for m in sys.modules if m.split('.')[0] in ('onnxruntime','onnxruntime_qnn','tensorrt')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ}, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_context_that_crashes_the_simulator_when_run_is_reported_not_fatal(settings: Settings, tmp_path: Path) -> None:
    """Measured here: light_inception_v1 built for SM8650 with QNN 2.51.0 loads on the x86_64 HTP
    simulator but running it segfaults the process. The load check survives and says so."""
    from farm.core.catalog import parse_target
    from registry.install import fetch_artifact
    from workers.qnn.runner import QnnRunner

    (o,) = build(settings, light("inception_v1"), ["qnn:SM8650"]).outcomes
    assert o.state == "built"
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            art = find_artifact(s, o.artifact or "")
            s.expunge_all()
        got = fetch_artifact(reg.store, art, tmp_path / "dev")
    finally:
        reg.close()
    result = QnnRunner().load_check(got.ctx_model, parse_target("qnn:SM8650"))
    assert result["load_seconds"] > 0
    assert result.get("crashed") == "signal 11 (SIGSEGV)" and "run_seconds" not in result
