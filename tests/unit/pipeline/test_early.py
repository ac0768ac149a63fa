"""Early compiles (farm.pipeline.early): the compiles an uncached `farm build` starts before its
pipeline. A claimed build adopts the early compile only when it is exactly the compile its
executor would run (build key, file digests, memory cap, time limit, self-probe); anything else
is stopped and removed, and the executor compiles the recorded snapshot itself. The real
pipeline runs here (SQLite, local store) with a runner that "compiles" instantly and writes
what it compiled into the context model."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from farm.core.errors import LeaseLostError, UnsupportedOpsError
from farm.core.settings import Settings
from farm.pipeline import early, plan
from registry.index import Registry
from registry.models import Build
from tests.common.fake_runner import InstantRunner
from tests.common.onnx_models import matmul_add, save, save_external
from workers.runner import CompileJob, CompileOutput

TARGETS = ["qnn:SM8650", "qnn:SM8750"]


class RecordingRunner(InstantRunner):
    """Writes the sha256 of the model it compiled into the context model, records each job, and
    (``hold``) waits until told to go on or cancelled, as a warm host's job does."""

    warm_host = True

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[dict[str, Any]] = []
        self.hold = threading.Event()  # set: compiles wait for ``release`` or their cancel flag
        self.release = threading.Event()
        self.fail: Exception | None = None
        self._lock = threading.Lock()

    def compile(self, job: CompileJob, work_dir: Path) -> CompileOutput:
        data = job.model_path.read_bytes()
        with self._lock:
            self.jobs.append({"model": hashlib.sha256(data).hexdigest(), "target": job.target.name,
                              "dir": work_dir.parent, "memory_mb": job.memory_mb, "timeout": job.timeout,
                              "verify_load": job.verify_load, "cancel": job.cancel})
        if self.hold.is_set():
            while not self.release.wait(0.01):
                if job.cancel is not None and job.cancel.is_set():
                    raise LeaseLostError("compile stopped")
        if self.fail is not None:
            raise self.fail
        out = super().compile(job, work_dir)
        (out.out_dir / "model_ctx.onnx").write_bytes(
            f"ctx of {hashlib.sha256(data).hexdigest()} for {job.target.name}".encode())
        return out


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> RecordingRunner:
    r = RecordingRunner()
    monkeypatch.setattr("workers.backends.get_runner", lambda backend: r)
    return r


def ctx_of(settings: Settings, build_id: int) -> bytes:
    """The published context model of a build, read back from the store."""
    from registry.models import Artifact, ArtifactFile

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            art = s.query(Artifact).filter(Artifact.build_id == build_id).one()
            f = s.query(ArtifactFile).filter(ArtifactFile.artifact_id == art.id,
                                             ArtifactFile.name == "model_ctx.onnx").one()
            digest = f.digest
        with reg.store.open(digest) as fh:
            return fh.read()
    finally:
        reg.close()


def phases(settings: Settings, build_id: int) -> dict[str, Any]:
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            b = s.get(Build, build_id)
            assert b is not None
            return dict(b.phases or {})
    finally:
        reg.close()


def build(settings: Settings, model: Path, started: early.EarlyCompiles, options: list[str] | None = None
          ) -> plan.BuildReport:
    try:
        return plan.build_many(settings, [model], TARGETS, options or [], early=started)[0]
    finally:
        started.close()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_claimed_build_adopts_its_own_early_compile(settings: Settings, tmp_path: Path,
                                                      runner: RecordingRunner) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    seen: list[tuple[str, str, str]] = []
    started = early.start(settings, [model], TARGETS, progress=[lambda e, t, info: seen.append(
        (e, t, info["toolchain"]))])
    assert len(started) == 2
    assert seen == [("compiling", t, "2.51.0") for t in TARGETS]  # timed from here, as the table shows it
    dirs = [j["dir"] for j in runner.jobs] or [e.dir for e in started._by_key.values()]
    report = build(settings, model, started)
    assert [o.state for o in report.outcomes] == ["built", "built"]
    assert len(runner.jobs) == 2  # the early compiles only: nothing compiled twice
    for o in report.outcomes:
        soc = o.target.split(":")[1]
        assert ctx_of(settings, o.build_id) == f"ctx of {sha(model)} for {soc}".encode()
        ph = phases(settings, o.build_id)
        assert "early_ahead" in ph and "early_wait" in ph and "bundle_fetch" not in ph
    # The executor's own limits: the same cap, time limit and self-probe as a compile after the claim.
    assert {(j["memory_mb"], j["timeout"], j["verify_load"]) for j in runner.jobs} == {
        (settings.compile_memory_mb, settings.compile_timeout, True)}
    assert not any(Path(d).exists() for d in dirs)  # each job dir went with its build


def test_the_same_bytes_as_a_build_without_it(settings: Settings, tmp_path: Path, runner: RecordingRunner) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    with_early = build(settings, model, early.start(settings, [model], TARGETS))
    other = Settings.from_env({"FARM_HOME": str(tmp_path / "other"), "FARM_EARLY_COMPILE": "0"})
    assert len(early.start(other, [model], TARGETS)) == 0  # switched off
    without = build(other, model, early.EarlyCompiles())
    assert with_early.model_digest == without.model_digest
    assert [o.artifact for o in with_early.outcomes] != [None, None]
    assert [ctx_of(settings, o.build_id) for o in with_early.outcomes] == [
        ctx_of(other, o.build_id) for o in without.outcomes]


def test_a_model_changed_after_the_early_start_is_compiled_from_its_snapshot(
        settings: Settings, tmp_path: Path, runner: RecordingRunner) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    runner.hold.set()  # the early compiles are still running when the executors claim
    started = early.start(settings, [model], TARGETS)
    first = [dict(j) for j in runner.jobs] if runner.jobs else None
    save(matmul_add(seed=2), model)  # same path, other weights: another snapshot
    runner.release.set()
    report = build(settings, model, started)
    assert [o.state for o in report.outcomes] == ["built", "built"]
    assert len(runner.jobs) == 4  # two early ones discarded, two compiled after the claim
    compiled_after = [j for j in runner.jobs if j["model"] == sha(model)]
    assert len(compiled_after) == 2
    for o in report.outcomes:
        soc = o.target.split(":")[1]
        assert ctx_of(settings, o.build_id) == f"ctx of {sha(model)} for {soc}".encode()
        assert "early_ahead" not in phases(settings, o.build_id)
    assert first is None or all(j["model"] != sha(model) for j in first)
    assert not any(Path(j["dir"]).exists() for j in runner.jobs)  # every job dir removed


@pytest.mark.parametrize("change", ["options", "timeout", "memory"])
def test_other_options_or_limits_are_not_adopted(settings: Settings, tmp_path: Path, runner: RecordingRunner,
                                                 change: str) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    started = early.start(settings, [model], TARGETS)
    options: list[str] = []
    if change == "options":
        options = ["graph_optimization=3"]  # another build key
    elif change == "timeout":
        settings = dataclasses.replace(settings, compile_timeout=settings.compile_timeout + 1)
    else:
        settings = dataclasses.replace(settings, compile_memory_mb=settings.compile_memory_mb * 2)
    report = build(settings, model, started, options)
    assert [o.state for o in report.outcomes] == ["built", "built"]
    assert len(runner.jobs) == 4
    after = runner.jobs[2:]
    assert {(j["memory_mb"], j["timeout"]) for j in after} == {(
        settings.compile_memory_mb, settings.compile_timeout)}
    for o in report.outcomes:
        assert "early_ahead" not in phases(settings, o.build_id)


def test_what_no_build_takes_is_stopped_and_removed(settings: Settings, tmp_path: Path,
                                                    runner: RecordingRunner) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    runner.hold.set()
    started = early.start(settings, [model], TARGETS)
    dirs = [e.dir for e in started._by_key.values()]
    assert all(d.exists() for d in dirs)
    started.close()  # e.g. the request was refused after the early start
    assert len(runner.jobs) == 2 and all(j["cancel"].is_set() for j in runner.jobs)
    assert not any(d.exists() for d in dirs)


def test_an_adopted_compile_stops_when_the_executor_is_told_to(tmp_path: Path) -> None:
    flag = early._Flag()
    e = early.EarlyCompile("k", [], 0, 1.0, True, tmp_path)
    e.flag = flag
    lease_lost = threading.Event()
    e.future.set_result("out")
    assert e.result(lease_lost) == "out"
    assert not flag.is_set()
    lease_lost.set()  # the executor's lease lost or Ctrl-C: the job's flag says stop
    assert flag.is_set()


def test_an_early_failure_is_the_builds_failure_after_its_claim(settings: Settings, tmp_path: Path,
                                                                runner: RecordingRunner) -> None:
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    runner.fail = UnsupportedOpsError("the QNN EP took no node of this model (Foo)")
    report = build(settings, model, early.start(settings, [model], TARGETS))
    assert [(o.state, o.error_code) for o in report.outcomes] == [("failed", "unsupported-ops")] * 2
    assert len(runner.jobs) == 2  # deterministic: failed once, by the executor's one failure path


def test_only_plain_models_without_external_data_start_early(settings: Settings, tmp_path: Path,
                                                             runner: RecordingRunner) -> None:
    external = save_external(matmul_add(seed=1, size=64), tmp_path / "x" / "m.onnx", location="w.data")
    assert len(early.start(settings, [external], TARGETS)) == 0
    report = build(settings, external, early.EarlyCompiles())
    assert [o.state for o in report.outcomes] == ["built", "built"]
    plain = save(matmul_add(seed=1), tmp_path / "m.onnx")
    # A request the pipeline refuses starts nothing (the pipeline says why).
    assert len(early.start(settings, [plain], ["qnn:SM0000"])) == 0
    assert len(early.start(settings, [plain], TARGETS, ["precision=fp64"])) == 0
    assert len(early.start(settings, [tmp_path / "missing.onnx"], TARGETS)) == 0


def test_only_the_pools_first_builds_start_early(settings: Settings, tmp_path: Path, runner: RecordingRunner,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.core.catalog import parse_target
    from farm.core.keys import build_key, bundle_digest, options_digest
    from farm.core.options import normalize

    models = [save(matmul_add(seed=i), tmp_path / f"m{i}.onnx") for i in range(3)]
    monkeypatch.setattr("farm.pipeline.memory.build_jobs", lambda settings, builds: 3)
    started = early.start(settings, models, TARGETS)
    try:
        def key(m: Path, ref: str) -> str:
            t = parse_target(ref)
            return build_key(bundle_digest("sha256:" + sha(m), []), "qnn", t.name, "2.51.0",
                             options_digest(normalize("qnn", {}, t)))

        assert sorted(started._by_key) == sorted([key(models[0], TARGETS[0]), key(models[0], TARGETS[1]),
                                                  key(models[1], TARGETS[0])])
    finally:
        started.close()


def test_builds_the_index_answers_start_nothing(settings: Settings, tmp_path: Path, runner: RecordingRunner) -> None:
    """A call the cached path can't answer whole (a new tag: a write) may still need no compile:
    those builds start none early."""
    model = save(matmul_add(seed=1), tmp_path / "m.onnx")
    build(settings, model, early.EarlyCompiles())
    assert len(runner.jobs) == 2
    assert len(early.start(settings, [model], TARGETS)) == 0
    report = plan.build_many(settings, [model], TARGETS, name="m", tag="v2", early=early.EarlyCompiles())[0]
    assert [o.state for o in report.outcomes] == ["cached", "cached"] and len(runner.jobs) == 2
    # A deterministic failure is answered too, unless it is to be retried.
    runner.fail = UnsupportedOpsError("the QNN EP took no node of this model (Foo)")
    other = save(matmul_add(seed=2), tmp_path / "o.onnx")
    build(settings, other, early.EarlyCompiles())
    assert len(early.start(settings, [other], TARGETS)) == 0
    again = early.start(settings, [other], TARGETS, retry_failed=True)
    try:
        assert len(again) == 2
    finally:
        again.close()
