"""The fleet's capabilities as the pipeline reads and uses them (farm.pipeline.capabilities): the
workers' announcements merged per toolchain, an LLM release routed before anything compiles
(no part and no package build for an SDK that can't make it, one warning, the package builds on
the genai queue), the ORT model package route to a worker that announced it, and a genai model
refused by ``farm package`` / ``farm install --package`` with ``package-unsupported``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from farm.core import capabilities as C
from farm.core.errors import CapabilityMissingError, PackageUnsupportedError
from farm.core.settings import Settings
from registry.index import Registry
from tests.common.genai import make_export

ABLE = C.from_probe({"onnxruntime": "1.32.0", "model_package": True, "genai": "0.18.0", "genai_ep": True}, "qnn")
NO_GENAI = C.from_probe({"onnxruntime": "1.24.4", "genai_error": "ModuleNotFoundError: onnxruntime_genai"}, "qnn")


@pytest.fixture
def reg(settings: Settings) -> Any:
    r = Registry.open(settings)
    yield r
    r.close()


def worker(reg: Registry, name: str, version: str, caps: C.Capabilities | None, *, ort: str = "1.32.0") -> int:
    from farm.pipeline.queues import compile_queue, genai_queue, probe_queue
    from registry.index import register_worker
    from workers.runner import Toolchain

    queues = [compile_queue("qnn", version), probe_queue("qnn", version)]
    if caps is not None and C.GENAI_PACKAGE in caps.makes:
        queues.append(genai_queue("qnn", version))
    with reg.db.session() as s:
        return register_worker(s, name=name, host="h", pid=1, queues=queues, extra=caps.to_extra() if caps else {},
                               toolchain=Toolchain("qnn", version, ort, "onnxruntime-qnn", "2.7.0"))


def test_the_fleet_is_what_each_toolchains_live_workers_announced(settings: Settings, reg: Registry) -> None:
    from farm.pipeline.capabilities import fleet_of
    from registry.index import heartbeat

    worker(reg, "a", "2.51.0", ABLE)
    worker(reg, "b", "2.51.0", NO_GENAI)  # one able worker is enough: the genai queue is its own
    worker(reg, "c", "2.47.0", NO_GENAI)
    gone = worker(reg, "d", "2.46.0", NO_GENAI)
    worker(reg, "e", "2.45.0", None)
    with reg.db.session() as s:
        heartbeat(s, gone, stopped=True)
    fleet = fleet_of(settings, reg)
    assert fleet[("qnn", "2.51.0")].makes == ABLE.makes
    assert fleet[("qnn", "2.47.0")].makes == frozenset()
    assert fleet[("qnn", "2.46.0")] == NO_GENAI  # a stopped worker still says what its SDK lacks
    assert fleet[("qnn", "2.45.0")] is None


def _release_builds(reg: Registry, release_id: int) -> list[Any]:
    from registry.index import release_builds

    with reg.db.session() as s:
        rows = release_builds(s, release_id)
        s.expunge_all()
    return rows


def test_an_llm_release_leaves_an_sdk_that_cannot_out_parts_and_all(settings: Settings, reg: Registry,
                                                                    tmp_path: Path) -> None:
    from farm.pipeline.genai import submit_package

    export = make_export(tmp_path / "export")
    served = {("qnn", "2.47.0"): ["w47"], ("qnn", "2.51.0"): ["w51"]}
    fleet = {("qnn", "2.47.0"): NO_GENAI, ("qnn", "2.51.0"): ABLE}
    heard: list[str] = []
    st = submit_package(settings, export, ["qnn:SM8650"], name="llm/tiny", tag="t", registry=reg, served=served,
                        dispatch=False, fleet=fleet, warn=heard.append)
    builds = _release_builds(reg, st.release_id)
    assert {b.toolchain for b in builds} == {"2.51.0"}  # 2 parts + the package, none for 2.47.0
    assert len(builds) == 3
    assert len(heard) == 1 and "QNN 2.47.0" in heard[0] and st.warnings == heard
    (pkg,) = [b for b in builds if b.queue and b.queue.endswith(".genai")]
    assert pkg.queue == "compile.qnn.2.51.0.genai"
    # Asked again: the same builds answer, nothing new is queued.
    again = submit_package(settings, export, ["qnn:SM8650"], name="llm/tiny", tag="t", registry=reg, served=served,
                           dispatch=False, fleet=fleet, warn=heard.append)
    assert sorted(b.id for b in _release_builds(reg, again.release_id)) == sorted(b.id for b in builds)


def test_an_llm_release_naming_an_sdk_that_cannot_is_refused_and_writes_nothing(settings: Settings, reg: Registry,
                                                                                tmp_path: Path) -> None:
    from sqlalchemy import func, select

    from farm.pipeline.genai import submit_package
    from registry.models import Build, Model

    export = make_export(tmp_path / "export")
    served = {("qnn", "2.47.0"): ["w47"], ("qnn", "2.51.0"): ["w51"]}
    with pytest.raises(CapabilityMissingError) as e:
        submit_package(settings, export, ["qnn:SM8650"], ["2.47.0"], registry=reg, served=served, dispatch=False,
                       fleet={("qnn", "2.47.0"): NO_GENAI, ("qnn", "2.51.0"): ABLE})
    assert "QNN 2.51.0" in (e.value.hint or "")
    with reg.db.session() as s:
        assert s.scalar(select(func.count()).select_from(Build)) == 0
        assert s.scalar(select(func.count()).select_from(Model)) == 0


def test_an_ort_model_package_goes_to_a_worker_that_announced_it(settings: Settings, reg: Registry) -> None:
    from farm.core.errors import NoWorkerError
    from farm.pipeline.package_jobs import package_queue

    worker(reg, "old-ort", "2.47.0", NO_GENAI, ort="1.32.0")  # announced it can't, whatever its onnxruntime says
    with pytest.raises(NoWorkerError):
        package_queue(settings, reg)
    worker(reg, "able", "2.49.40", ABLE)
    assert package_queue(settings, reg) == "probe.qnn.2.49.40"


def _genai_model(reg: Registry) -> None:
    from registry.index import record_model, set_tag
    from tests.common.index_rows import add_artifact, digest

    d = digest("genai-model")
    with reg.db.session() as s:
        record_model(s, digest=d, onnx_digest=digest("genai.json"), size=1, name="llm/tiny",
                     files=[{"path": "genai.json", "digest": digest("genai.json"), "size": 1},
                            {"path": "tokenizer.json", "digest": digest("tok"), "size": 1}])
        set_tag(s, "llm/tiny", "t", d)
        add_artifact(s, d)


def test_farm_package_of_a_genai_model_is_refused_with_its_own_code(settings: Settings, reg: Registry) -> None:
    from farm.pipeline.packages import current_package, make_package

    _genai_model(reg)
    for ask in (lambda: make_package(settings, reg, "llm/tiny:t"), lambda: current_package(reg, "llm/tiny:t")):
        with pytest.raises(PackageUnsupportedError) as e:
            ask()
        assert e.value.code == "package-unsupported" and "bug" not in (e.value.hint or "")
        assert "farm install --model llm/tiny:t" in (e.value.hint or "")


def test_the_service_side_refuses_it_before_asking_a_worker(settings: Settings, reg: Registry) -> None:
    from farm.pipeline.package_jobs import PackageJobs
    from tests.common.packages import InMemoryPackageBoard, RecordingDispatch

    _genai_model(reg)
    worker(reg, "able", "2.51.0", ABLE)
    dispatch = RecordingDispatch()
    with pytest.raises(PackageUnsupportedError):
        PackageJobs(settings, reg, InMemoryPackageBoard(), dispatch).step("llm/tiny:t")
    assert not dispatch.sent


def test_a_worker_that_cannot_assemble_fails_the_package_build_deterministically(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.pipeline.genai import release as genai
    from farm.pipeline.states import BuildSpec
    from workers import capabilities

    monkeypatch.setattr(capabilities, "here", lambda backend: NO_GENAI)
    refusal = genai._capability_refusal(BuildSpec("k", "m", "qnn", "SM8650", "2.47.0", {}, "o"))
    assert refusal is not None and refusal.code == "capability-missing" and "QNN 2.47.0" in refusal.message
    monkeypatch.setattr(capabilities, "here", lambda backend: ABLE)
    assert genai._capability_refusal(BuildSpec("k", "m", "qnn", "SM8650", "2.51.0", {}, "o")) is None


def test_a_capability_missing_failure_is_answered_again_until_retry_failed(reg: Registry) -> None:
    from farm.pipeline import states
    from tests.common.index_rows import add_model, spec

    with reg.db.session() as s:
        sp = spec(add_model(s).digest, toolchain="2.47.0")
        build_id, _ = states.enqueue(s, sp, "compile.qnn.2.47.0.genai")
        lease = states.claim(s, build_id, owner="t", lease_seconds=60, max_attempts=3).lease
        assert lease is not None
        states.fail(s, lease, "capability-missing", "this environment (QNN 2.47.0) can't make a genai package", None)
    with reg.db.session() as s:
        assert states.enqueue(s, sp, "compile.qnn.2.47.0.genai") == (build_id, False)
        assert states.get_build(s, build_id).error_code == "capability-missing"
        assert states.enqueue(s, sp, "compile.qnn.2.47.0.genai", retry_failed=True) == (build_id, True)
