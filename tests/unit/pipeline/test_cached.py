"""The CLI's fast path for a cached ``farm build`` (farm.pipeline.cached.answer): it answers
exactly what plan.build answers when plan.build would write and compile nothing, and steps aside
(None) in every other case. plan.build runs the real pipeline here with an instant runner."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from sqlalchemy import text, update

from farm.core.errors import BadOptionsError, FarmError, UnknownTargetError, UsageError
from farm.core.settings import Settings
from farm.pipeline import plan
from farm.pipeline.cached import answer
from registry.index import Registry
from registry.models import Artifact, Build, Model
from tests.common.fake_runner import InstantRunner
from tests.common.onnx_models import matmul_add, save, save_external

TARGETS = ["qnn:SM8650", "qnn:SM8750"]


@pytest.fixture(autouse=True)
def instant_runner(monkeypatch: pytest.MonkeyPatch) -> InstantRunner:
    runner = InstantRunner()
    monkeypatch.setattr("workers.backends.get_runner", lambda backend: runner)
    return runner


def build(settings: Settings, model: Path, **kw: object) -> plan.BuildReport:
    return plan.build(settings, model, TARGETS, **kw)  # type: ignore[arg-type]


def same_answer(fast: plan.BuildReport | None, full: plan.BuildReport) -> None:
    assert fast is not None
    assert (fast.model_digest, fast.name, fast.tag) == (full.model_digest, full.name, full.tag)
    strip = [{k: v for k, v in o.to_dict().items() if k != "wall_seconds"} for o in fast.outcomes]
    assert strip == [{k: v for k, v in o.to_dict().items() if k != "wall_seconds"} for o in full.outcomes]


def sql(settings: Settings, statement, **params: object) -> None:  # type: ignore[no-untyped-def]
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            s.execute(statement if not isinstance(statement, str) else text(statement), params)
    finally:
        reg.close()


def test_answers_what_plan_build_answers(settings: Settings, tmp_path: Path, instant_runner: InstantRunner) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    assert answer(settings, model, TARGETS) is None  # fresh FARM_HOME: nothing to answer from
    first = build(settings, model, name="vision/m", tag="stable")
    assert [o.state for o in first.outcomes] == ["built", "built"] and instant_runner.compiles == 2
    seen: list[tuple[str, str, str]] = []
    fast = answer(settings, model, TARGETS, name="vision/m", tag="stable",
                  progress=lambda e, t, info: seen.append((e, t, info["state"])))
    assert [o.state for o in fast.outcomes] == ["cached", "cached"]  # type: ignore[union-attr]
    assert seen == [("finished", t, "cached") for t in TARGETS]
    same_answer(fast, build(settings, model, name="vision/m", tag="stable"))
    same_answer(answer(settings, model, TARGETS), build(settings, model))  # no --name: the file's stem
    assert instant_runner.compiles == 2


@pytest.mark.parametrize(("refs", "tag", "options", "error"), [
    (TARGETS, "x", [], UsageError),  # --tag without --name
    (["qnn:SM0000"], None, [], UnknownTargetError),
    (TARGETS, None, ["precision=fp64"], BadOptionsError),
])
def test_validation_errors_are_plan_builds(settings: Settings, tmp_path: Path, refs: list[str], tag: str | None,
                                           options: list[str], error: type[FarmError]) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    with pytest.raises(error) as fast:
        answer(settings, model, refs, options, tag=tag)
    with pytest.raises(error) as full:
        plan.build(settings, model, refs, options, tag=tag)
    assert (fast.value.code, fast.value.message) == (full.value.code, full.value.message)


def test_modified_model_with_the_same_name_is_not_cached(settings: Settings, tmp_path: Path,
                                                          instant_runner: InstantRunner) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    build(settings, model)
    save(matmul_add(seed=2), model)  # same path, other weights
    assert answer(settings, model, TARGETS) is None
    assert [o.state for o in build(settings, model).outcomes] == ["built", "built"]
    assert instant_runner.compiles == 4


def test_external_data_is_hashed_again(settings: Settings, tmp_path: Path) -> None:
    model = save_external(matmul_add(seed=1, size=64), tmp_path / "m.onnx", location="w.data")
    build(settings, model)
    same_answer(answer(settings, model, TARGETS), build(settings, model))
    data = tmp_path / "w.data"
    original = data.read_bytes()
    data.write_bytes(original[:-4] + b"\x00\x00\x80\x3f")  # same size, one weight changed
    assert answer(settings, model, TARGETS) is None
    data.unlink()
    assert answer(settings, model, TARGETS) is None
    # A data file that leads out of the model's directory is refused, even with the right bytes.
    outside = tmp_path.parent / f"{tmp_path.name}-outside.data"
    outside.write_bytes(original)
    os.symlink(outside, data)
    assert answer(settings, model, TARGETS) is None
    data.unlink()
    data.write_bytes(original)
    assert answer(settings, model, TARGETS) is not None


def test_a_copy_elsewhere_is_the_same_model(settings: Settings, tmp_path: Path) -> None:
    model = save_external(matmul_add(seed=1, size=64), tmp_path / "a" / "m.onnx", location="w.data")
    first = build(settings, model)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    again = answer(settings, tmp_path / "b" / "m.onnx", TARGETS)
    assert again is not None and again.model_digest == first.model_digest


def test_steps_aside_whenever_plan_build_would_write(settings: Settings, tmp_path: Path) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    first = build(settings, model, name="m", tag="stable")
    assert answer(settings, model, TARGETS, name="m", tag="stable") is not None
    assert answer(settings, model, TARGETS, name="m", tag="beta") is None  # a new tag
    assert answer(settings, model, TARGETS + ["qnn:SM8550"]) is None  # a new target
    assert answer(settings, model, TARGETS, ["graph_optimization=3"]) is None  # other options: another key
    sm8650 = first.outcomes[0].build_id
    sql(settings, update(Artifact).where(Artifact.build_id == sm8650).values(status="broken"))
    assert answer(settings, model, TARGETS) is None  # enqueue reopens a broken artifact's build
    sql(settings, update(Artifact).where(Artifact.build_id == sm8650).values(status="active"))
    sql(settings, update(Build).where(Build.id == sm8650).values(state="queued"))
    assert answer(settings, model, TARGETS) is None  # in flight: plan.build runs or waits for it
    sql(settings, update(Build).where(Build.id == sm8650).values(state="succeeded"))
    assert answer(settings, model, TARGETS) is not None
    digest = first.model_digest
    sql(settings, update(Model).where(Model.digest == digest).values(
        files=[{k: v for k, v in f.items() if k != "stored"} for f in _files(settings, digest)]))
    assert answer(settings, model, TARGETS) is None  # snapshot not marked stored: plan.build uploads it


def _files(settings: Settings, digest: str) -> list[dict[str, object]]:
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            m = s.get(Model, digest)
            assert m is not None
            return list(m.files)
    finally:
        reg.close()


@pytest.mark.parametrize(("code", "retry", "cached"), [("invalid-model", False, True), ("invalid-model", True, False),
                                                        ("worker-lost", False, False)])
def test_failures_answered_like_enqueue(settings: Settings, tmp_path: Path, code: str, retry: bool,
                                        cached: bool) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    first = build(settings, model)
    sql(settings, update(Build).where(Build.id == first.outcomes[1].build_id).values(
        state="failed", error_code=code, error_message="it failed"))
    fast = answer(settings, model, TARGETS, retry_failed=retry)
    if not cached:
        assert fast is None
        return
    assert fast is not None and not fast.ok
    assert (fast.outcomes[1].state, fast.outcomes[1].error_code, fast.outcomes[1].cached_failure) == (
        "failed", code, True)
    same_answer(fast, build(settings, model))


@pytest.mark.parametrize("gate", [["require_full_offload=true"], []])
def test_full_offload_gate_is_answered_from_the_ungated_build(settings: Settings, tmp_path: Path,
                                                              instant_runner: InstantRunner, gate: list[str]) -> None:
    """--require-full-offload is not in the build key: the build runs ungated and publishes its
    artifact; each gated answer (full path and fast path) fails the partial one with
    unsupported-ops naming the CPU op types from its manifest. Either order compiles once."""
    instant_runner.placement = {"ep_nodes": 1, "cpu_nodes": 2, "cpu_op_types": ["Erf", "Mod"]}
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    first = plan.build(settings, model, ["qnn:SM8650"], gate)  # gated first, or plain first
    assert instant_runner.compiles == 1 and first.outcomes[0].artifact is not None
    for gated in (plan.build(settings, model, ["qnn:SM8650"], require_full_offload=True),
                  answer(settings, model, ["qnn:SM8650"], require_full_offload=True),
                  answer(settings, model, ["qnn:SM8650"], ["require_full_offload=true"])):
        assert gated is not None and not gated.ok
        (o,) = gated.outcomes
        assert (o.state, o.error_code, o.cached_failure) == ("failed", "unsupported-ops", True)
        assert "2 node(s) stay on the CPU (Erf, Mod)" in (o.error_message or "")
        assert (o.artifact, o.nodes_cpu, o.build_id) == (first.outcomes[0].artifact, 2, first.outcomes[0].build_id)
    if gate:
        assert first.outcomes[0].state == "failed" and not first.outcomes[0].cached_failure
    plain = answer(settings, model, ["qnn:SM8650"])
    assert plain is not None and plain.ok and plain.outcomes[0].state == "cached"
    assert plain.outcomes[0].artifact == first.outcomes[0].artifact
    assert instant_runner.compiles == 1
    instant_runner.placement = {"ep_nodes": 1, "cpu_nodes": 0, "cpu_op_types": []}
    whole = save(matmul_add(seed=2), tmp_path / "whole.onnx")  # fully offloaded: the gate changes nothing
    (o,) = plan.build(settings, whole, ["qnn:SM8650"], require_full_offload=True).outcomes
    assert o.state == "built" and o.nodes_cpu == 0


def test_release_request_keeps_the_gate_out_of_the_options() -> None:
    """A release's options (and so its build keys) never hold the gate; either spelling sets it."""
    old = plan.ReleaseRequest.parse(["qnn:SM8650"], ["2.51.0"], {"require_full_offload": "true", "vtcm_mb": "4"})
    new = plan.ReleaseRequest.parse(["qnn:SM8650"], ["2.51.0"], {"vtcm_mb": "4"}, require_full_offload=True)
    plain = plan.ReleaseRequest.parse(["qnn:SM8650"], ["2.51.0"], {"vtcm_mb": "4"})
    assert old.require_full_offload and new.require_full_offload and not plain.require_full_offload
    assert old.raw_options == new.raw_options == {"vtcm_mb": "4"} and old.options == new.options == plain.options


@pytest.mark.parametrize("revision", ["0004", "9999"])
def test_another_schema_takes_the_full_path(settings: Settings, tmp_path: Path, revision: str) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    build(settings, model)
    sql(settings, "UPDATE alembic_version SET version_num = :rev", rev=revision)
    assert answer(settings, model, TARGETS) is None


# ---- a cached `farm submit` (farm.pipeline.cached.resubmit) ----------------------------------------

def live_worker(settings: Settings, version: str = "2.51.0") -> None:
    from registry.index import register_worker
    from workers.runner import Toolchain

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            register_worker(s, name=f"w-{version}", host="h", pid=1, queues=["q"],
                            toolchain=Toolchain("qnn", version, "1.31.1", "onnxruntime-qnn", "2.7.0"))
    finally:
        reg.close()


def releases(settings: Settings) -> list[tuple[int, str | None, list[int]]]:
    from sqlalchemy import select

    from registry.models import Release, ReleaseBuild

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            return [(r.id, r.label, sorted(s.scalars(select(ReleaseBuild.build_id).where(
                ReleaseBuild.release_id == r.id)))) for r in s.scalars(select(Release).order_by(Release.id))]
    finally:
        reg.close()


def same_release(fast: plan.ReleaseStatus | None, full: plan.ReleaseStatus) -> None:
    assert fast is not None and fast.release_id != full.release_id
    assert (fast.model, fast.builds, fast.tag_moved) == (full.model, full.builds, full.tag_moved)


def test_resubmit_records_what_submit_release_records(settings: Settings, tmp_path: Path) -> None:
    from farm.pipeline.cached import resubmit

    model = save(matmul_add(seed=3), tmp_path / "m.onnx")
    build(settings, model, name="vision/m", tag="stable")
    live_worker(settings)
    fast = resubmit(settings, model, TARGETS, [], name="vision/m", tag="stable")  # toolchains: the live workers'
    full = plan.submit_release(settings, model, TARGETS, [], name="vision/m", tag="stable")
    same_release(fast, full)
    assert [b["state"] for b in full.builds] == ["succeeded", "succeeded"] and fast is not None
    (r1, label1, builds1), (r2, label2, builds2) = releases(settings)
    assert (r1, label1) == (fast.release_id, "vision/m:stable") and (label1, builds1) == (label2, builds2)
    # The rows read back through the ORM as the full path's do (timestamps, matrix JSON).
    assert plan.release_status(settings, fast.release_id) == plan.ReleaseStatus(
        fast.release_id, "vision/m:stable", full.builds)
    same_release(resubmit(settings, model, TARGETS, ["2.51.0"]), plan.submit_release(settings, model, TARGETS,
                                                                                     ["2.51.0"]))


def test_resubmit_raises_what_submit_release_raises(settings: Settings, tmp_path: Path) -> None:
    from farm.pipeline.cached import resubmit

    model = save(matmul_add(seed=3), tmp_path / "m.onnx")
    build(settings, model)
    live_worker(settings)
    for sdks, error in ((["2.47.0"], "no-worker"), (["2.5x"], "usage")):
        with pytest.raises(FarmError) as fast:
            resubmit(settings, model, TARGETS, sdks)
        with pytest.raises(FarmError) as full:
            plan.submit_release(settings, model, TARGETS, sdks)
        assert (fast.value.code, fast.value.message) == (error, full.value.message) and full.value.code == error
    assert releases(settings) == []


def test_resubmit_steps_aside_and_writes_nothing_unless_every_build_is_final(settings: Settings,
                                                                           tmp_path: Path) -> None:
    from farm.pipeline.cached import resubmit

    model = save(matmul_add(seed=3), tmp_path / "m.onnx")
    other = save(matmul_add(seed=4), tmp_path / "o.onnx")
    first = build(settings, model, name="vision/m", tag="stable")
    build(settings, other, name="vision/o", tag="stable")
    live_worker(settings)
    assert resubmit(settings, model, TARGETS, [], name="vision/o", tag="stable") is None  # a tag move: full path
    assert resubmit(settings, model, TARGETS, [], name="vision/m", tag="new") is None  # a new tag: a write
    assert resubmit(settings, model, ["qnn:SM8650", "qnn:SM8475"], []) is None  # a build never queued
    assert resubmit(settings, model, TARGETS, [], ["vtcm_mb=4"]) is None  # other options: other builds
    sql(settings, update(Artifact).where(Artifact.build_id == first.outcomes[0].build_id).values(status="broken"))
    assert resubmit(settings, model, TARGETS, []) is None  # enqueue reopens a broken artifact's build
    assert resubmit(settings, save(matmul_add(seed=5), tmp_path / "m.onnx"), TARGETS, []) is None  # new bytes
    sql(settings, update(Build).where(Build.target == "SM8650").values(state="queued"))
    assert resubmit(settings, other, TARGETS, []) is None  # queued: the full path answers it
    sql(settings, update(Build).where(Build.target == "SM8650").values(state="failed", error_code="storage-error"))
    assert resubmit(settings, other, TARGETS, []) is None  # failed, not for good: reopened
    sql(settings, update(Build).where(Build.target == "SM8650").values(error_code="unsupported-ops"))
    assert resubmit(settings, other, TARGETS, [], retry_failed=True) is None
    assert releases(settings) == []
    failed = resubmit(settings, other, TARGETS, [])  # failed for good: answered
    assert failed is not None and [b["state"] for b in failed.builds] == ["failed", "succeeded"]
    assert failed.builds[0]["error_code"] == "unsupported-ops" and failed.builds[0]["artifact"] is None
    same_release(failed, plan.submit_release(settings, other, TARGETS, []))


def test_resubmit_answers_force_tag_allow_queue_and_the_gate_as_submit_release(
        settings: Settings, tmp_path: Path, instant_runner: InstantRunner) -> None:
    """Flags that change nothing written but the release: --force-tag with the tag already on the
    model, --allow-queue for an unserved toolchain, --require-full-offload (either spelling)."""
    from farm.pipeline.cached import resubmit

    instant_runner.placement = {"ep_nodes": 1, "cpu_nodes": 2, "cpu_op_types": ["Erf", "Mod"]}
    model = save(matmul_add(seed=3), tmp_path / "m.onnx")
    build(settings, model, name="vision/m", tag="stable")
    live_worker(settings, "2.52.0")  # the builds' 2.51.0 is served by no live worker
    for kw, options in (({"force_tag": True, "name": "vision/m", "tag": "stable"}, []),
                        ({"require_full_offload": True}, []), ({}, ["require_full_offload=true"])):
        fast = resubmit(settings, model, TARGETS, ["2.51.0"], options, allow_queue=True, **kw)  # type: ignore[arg-type]
        full = plan.submit_release(settings, model, TARGETS, ["2.51.0"], options, allow_queue=True,
                                   **kw)  # type: ignore[arg-type]
        same_release(fast, full)
        assert plan.release_status(settings, fast.release_id).builds == full.builds  # type: ignore[union-attr]
    assert [b["error_code"] for b in full.builds] == ["unsupported-ops"] * 2 and not full.ok
    assert "2 node(s) stay on the CPU (Erf, Mod)" in full.builds[0]["error_message"]
    with pytest.raises(FarmError, match="no live worker serves qnn 2.51.0"):
        resubmit(settings, model, TARGETS, ["2.51.0"])
    assert len(releases(settings)) == 6


def test_an_untagged_name_or_a_deleted_artifact_is_not_answered_from_stale_rows(settings: Settings,
                                                                                tmp_path: Path) -> None:
    """`farm untag` removes NAME:TAG: a call naming it again writes it (the full path). A build
    whose artifact row is gone has nothing to answer with: the full path decides."""
    from registry.index import delete_tag

    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    first = build(settings, model, name="m", tag="stable")
    assert answer(settings, model, TARGETS, name="m", tag="stable") is not None
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            delete_tag(s, "m", "stable")
    finally:
        reg.close()
    assert answer(settings, model, TARGETS, name="m", tag="stable") is None
    again = build(settings, model, name="m", tag="stable")  # the tag written again, nothing compiled
    assert [o.state for o in again.outcomes] == ["cached", "cached"]
    assert answer(settings, model, TARGETS, name="m", tag="stable") is not None
    sm8650 = first.outcomes[0].build_id
    sql(settings, "DELETE FROM artifacts WHERE build_id = :b", b=sm8650)  # its files and verdicts cascade
    assert answer(settings, model, TARGETS) is None
