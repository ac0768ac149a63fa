"""ORT model packages a worker makes for a service without onnxruntime >= 1.32
(farm.pipeline.package_jobs, POST /v1/packages in a cluster), with a board and a dispatch that
are fakes: one message per inputs key however often it is asked, the worker's failure answered
with its own code, no-worker when no live worker has onnxruntime >= 1.32, and the route's 202,
wait and answers."""

from __future__ import annotations

import time
from typing import Any

import pytest

from farm.core import errors as E
from farm.core.settings import Settings
from farm.pipeline import package_jobs as pj
from registry.index import Registry
from tests.common.packages import InMemoryPackageBoard, RecordingDispatch

PACKAGE = "sha256:" + "c" * 64


@pytest.fixture
def reg(settings: Settings) -> Any:
    r = Registry.open(settings)
    yield r
    r.close()


@pytest.fixture(autouse=True)
def answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A package in the index is answered without reading its record from the store."""
    from farm.pipeline import packages

    monkeypatch.setattr(packages, "package_answer", lambda reg, digest, *, cached: {"digest": digest, "cached": cached})


def publish(reg: Registry, name: str = "net", tag: str = "v1", builds: int = 1) -> None:
    from registry.index import set_tag
    from tests.common.index_rows import add_artifact, add_model

    with reg.db.session() as s:
        model = add_model(s, label=name, name=name)
        set_tag(s, name, tag, model.digest)
        for target in ("SM8650", "SM8750")[:builds]:
            add_artifact(s, model.digest, target=target)


def worker(reg: Registry, name: str, *, version: str = "2.51.0", ort: str = "1.32.0", probe: bool = True) -> None:
    from farm.pipeline.queues import compile_queue, probe_queue
    from registry.index import register_worker
    from workers.runner import Toolchain

    queues = [compile_queue("qnn", version)] + ([probe_queue("qnn", version)] if probe else [])
    with reg.db.session() as s:
        register_worker(s, name=name, host="h", pid=1, queues=queues,
                        toolchain=Toolchain("qnn", version, ort, "onnxruntime-qnn", "2.7.0"))


def made(reg: Registry, key: str) -> None:
    """What a worker's make_package leaves: the package's row for these inputs."""
    from sqlalchemy import select

    from registry.models import Model, ModelPackageRow

    with reg.db.session() as s:
        model = s.scalars(select(Model.digest)).first()
        s.add(ModelPackageRow(digest=PACKAGE, inputs=key, model_digest=model, ref="net:v1", size=1,
                              files=[{"path": "", "digest": PACKAGE, "size": 1}]))


def test_asked_again_and_again_one_message_is_sent_then_the_index_answers(settings: Settings, reg: Registry) -> None:
    from farm.pipeline.packages import package_inputs

    publish(reg)
    worker(reg, "w1")
    board, dispatch = InMemoryPackageBoard(), RecordingDispatch()
    jobs = pj.PackageJobs(settings, reg, board, dispatch)
    assert [jobs.step("net:v1") for _ in range(3)] == [None, None, None]
    key = package_inputs(reg, "net:v1").key
    assert dispatch.sent == [(["net:v1", key], "probe.qnn.2.51.0")]
    # The claim outlives the worker's own time limit for a package: a slow one is not sent twice.
    assert board.claims == {key: settings.compile_timeout + pj.CLAIM_MARGIN_S}
    made(reg, key)
    board.finish(key, None, 0)
    assert jobs.step("net:v1") == {"digest": PACKAGE, "cached": True}
    assert len(dispatch.sent) == 1
    # A claim gone (the worker's TTL ran out) with nothing made: the next look sends it again.
    publish(reg, "other", "v1")
    assert jobs.step("other:v1") is None
    board.expire(package_inputs(reg, "other:v1").key)
    assert jobs.step("other:v1") is None and len(dispatch.sent) == 3


def test_a_new_build_while_it_waits_is_a_new_message(settings: Settings, reg: Registry) -> None:
    from farm.pipeline.packages import package_inputs
    from tests.common.index_rows import add_artifact

    publish(reg)
    worker(reg, "w1")
    dispatch = RecordingDispatch()
    jobs = pj.PackageJobs(settings, reg, InMemoryPackageBoard(), dispatch)
    assert jobs.step("net:v1") is None
    first = package_inputs(reg, "net:v1")
    with reg.db.session() as s:
        add_artifact(s, first.model, target="SM8750")
    assert jobs.step("net:v1") is None
    assert [args[1] for args, _q in dispatch.sent] == [first.key, package_inputs(reg, "net:v1").key]
    assert first.key != dispatch.sent[1][0][1]


def test_a_workers_failure_is_answered_with_its_code_to_every_asker(settings: Settings, reg: Registry) -> None:
    from farm.api.errors import status_of
    from farm.pipeline.packages import package_inputs

    publish(reg)
    worker(reg, "w1")
    board, dispatch = InMemoryPackageBoard(), RecordingDispatch()
    jobs = pj.PackageJobs(settings, reg, board, dispatch)
    assert jobs.step("net:v1") is None
    key = package_inputs(reg, "net:v1").key
    err = E.PackageFilesMissingError("artifact 0123: gone", hint="run farm registry verify --repair")
    board.finish(key, err.to_dict(), pj.FAILED_TTL_S)
    for _ in range(2):
        with pytest.raises(E.PackageFilesMissingError) as e:
            jobs.step("net:v1")
        assert (e.value.code, e.value.message, e.value.hint) == (err.code, err.message, err.hint)
        assert status_of(e.value) == 409
    assert len(dispatch.sent) == 1
    # Its time is up: the next request tries again.
    board.expire(key)
    assert jobs.step("net:v1") is None and len(dispatch.sent) == 2


def test_no_worker_with_onnxruntime_1_32_is_no_worker_and_nothing_is_claimed(settings: Settings,
                                                                              reg: Registry) -> None:
    publish(reg)
    board, dispatch = InMemoryPackageBoard(), RecordingDispatch()
    jobs = pj.PackageJobs(settings, reg, board, dispatch)
    worker(reg, "old", version="2.47.0", ort="1.24.4")  # too old an onnxruntime
    worker(reg, "deaf", ort="1.32.0", probe=False)  # not listening on its probe queue
    with pytest.raises(E.NoWorkerError) as e:
        jobs.step("net:v1")
    assert "onnxruntime >= 1.32" in e.value.message and "2.51.0" in (e.value.hint or "")
    assert board.claims == {} and dispatch.sent == []


def test_the_queue_is_the_toolchain_most_workers_serve_then_the_newest(settings: Settings, reg: Registry) -> None:
    worker(reg, "a", version="2.49.40")
    assert pj.package_queue(settings, reg) == "probe.qnn.2.49.40"
    worker(reg, "b", version="2.51.0")
    assert pj.package_queue(settings, reg) == "probe.qnn.2.51.0"
    worker(reg, "c", version="2.49.40")
    assert pj.package_queue(settings, reg) == "probe.qnn.2.49.40"


def test_no_published_builds_and_unknown_refs_are_answered_without_a_worker(settings: Settings,
                                                                             reg: Registry) -> None:
    from registry.index import set_tag
    from tests.common.index_rows import add_model

    with reg.db.session() as s:
        set_tag(s, "bare", "v1", add_model(s, label="bare", name="bare").digest)
    dispatch = RecordingDispatch()
    jobs = pj.PackageJobs(settings, reg, InMemoryPackageBoard(), dispatch)
    for ref, err in (("bare:v1", E.NoPublishedBuildsError), ("nosuch:v1", E.NotFoundError),
                     ("Bad Name", E.BadNameError)):
        with pytest.raises(err):
            jobs.step(ref)
    assert dispatch.sent == []


def test_a_message_that_could_not_be_sent_leaves_no_claim(settings: Settings, reg: Registry) -> None:
    publish(reg)
    worker(reg, "w1")
    board = InMemoryPackageBoard()
    jobs = pj.PackageJobs(settings, reg, board, RecordingDispatch(fail=ConnectionError("broker down")))
    with pytest.raises(ConnectionError):
        jobs.step("net:v1")
    assert board.claims == {}
    ok = RecordingDispatch()
    assert pj.PackageJobs(settings, reg, board, ok).step("net:v1") is None and len(ok.sent) == 1


def test_the_worker_records_its_failure_without_its_log_and_drops_the_claim(settings: Settings, reg: Registry,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.pipeline import packages

    board = InMemoryPackageBoard()
    key = "a" * 64

    def fails(*_a: Any, **_k: Any) -> Any:
        raise E.PackageVerifyError("the package failed its check (cpu-run): boom", details={"log": "/tmp/x ..."})

    for raised, code in ((fails, "package-verify-failed"), (lambda *a, **k: 1 / 0, "internal-error")):
        board.claim(key, 60)
        monkeypatch.setattr(packages, "make_package", raised)
        assert pj.make_for_service(settings, reg, "net:v1", key, board) == code
        assert board.claims == {}
        doc, ttl = board.failures[key]
        assert doc["code"] == code and "details" not in doc and ttl == pj.FAILED_TTL_S
    board.failures.clear()
    board.claim(key, 60)
    monkeypatch.setattr(packages, "make_package", lambda *a, **k: {"digest": PACKAGE})
    assert pj.make_for_service(settings, reg, "net:v1", key, board) == "made"
    assert board.claims == {} and board.failures == {}


def test_a_recorded_failure_is_the_error_it_was_and_an_unknown_code_is_internal() -> None:
    got = pj.error_of({"code": "no-published-builds", "message": "m", "hint": "h"})
    assert isinstance(got, E.NoPublishedBuildsError) and (got.message, got.hint) == ("m", "h")
    for doc in ({"code": "rm -rf", "message": "x"}, {"code": "farm-error"}, {}):
        assert pj.error_of(doc).code == "internal-error"


# ---- the route: POST /v1/packages on a service that can't make packages -----------------------------

@pytest.fixture
def service(settings: Settings, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A service with a broker (never reached: its board and dispatch are the fakes) and no
    onnxruntime >= 1.32; a published model, a live 2.51.0 worker, a submit token."""
    from fastapi.testclient import TestClient

    from farm.api.app import create_app
    from tests.common.service import token
    from workers import ortpackage

    def missing() -> str:
        raise E.MissingExtraError("no onnxruntime here")

    monkeypatch.setattr(ortpackage, "runtime", missing)
    cluster = Settings.from_env({"FARM_HOME": str(settings.home), "FARM_BROKER_URL": "redis://127.0.0.1:9/0"})
    r = Registry.open(cluster)
    try:
        publish(r)
        worker(r, "w1")
    finally:
        r.close()
    app = create_app(cluster)
    board = InMemoryPackageBoard()
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token(cluster, 'ci', 'submit')}"
        yield client, app, board


def jobs_of(app: Any, board: InMemoryPackageBoard, dispatch: RecordingDispatch) -> None:
    app.state.package_jobs = pj.PackageJobs(app.state.settings, app.state.registry, board, dispatch)


def test_the_route_answers_202_with_retry_after_then_the_workers_package(service: Any) -> None:
    client, app, board = service
    dispatch = RecordingDispatch()
    jobs_of(app, board, dispatch)
    for _ in range(2):
        r = client.post("/v1/packages", params={"wait": 0}, json={"ref": "net:v1"})
        assert r.status_code == 202 and r.headers["Retry-After"] == str(pj.RETRY_AFTER_S)
        assert r.json()["status"] == "making" and r.json()["ref"] == "net:v1"
    assert len(dispatch.sent) == 1
    made(app.state.registry, dispatch.sent[0][0][1])
    r = client.post("/v1/packages", params={"wait": 0}, json={"ref": "net:v1"})
    assert r.status_code == 200 and r.json() == {"digest": PACKAGE, "cached": True}
    paths = client.get("/openapi.json").json()["paths"]["/v1/packages"]["post"]
    assert {"202", "503"} <= set(paths["responses"]) and "wait" in {p["name"] for p in paths["parameters"]}


def test_a_waiting_post_answers_what_the_worker_did_once_it_did(service: Any) -> None:
    client, app, board = service
    reg = app.state.registry

    def worker_made(ref: str, key: str) -> None:
        made(reg, key)
        board.finish(key, None, 0)

    jobs_of(app, board, RecordingDispatch(then=worker_made, later=0.5))
    t0 = time.monotonic()
    r = client.post("/v1/packages", params={"wait": 20}, json={"ref": "net:v1"})
    assert r.status_code == 200 and r.json() == {"digest": PACKAGE, "cached": False}, r.text
    assert time.monotonic() - t0 < 20  # answered when made, not at the end of the wait
    # Asked again: the index answers, as for any package made earlier.
    r = client.post("/v1/packages", params={"wait": 20}, json={"ref": "net:v1"})
    assert r.json() == {"digest": PACKAGE, "cached": True}


def test_a_waiting_post_is_woken_by_the_workers_package_event(service: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's make_for_service tells the service (PACKAGE_EVENT) once it made the package:
    the waiting POST reads the index then, not at its next look (set to a minute here, past the
    wait: without the event it is answered by its last read, at the end of the wait)."""
    from farm.api.routes import packages as route
    from farm.pipeline import packages

    client, app, board = service
    reg = app.state.registry
    monkeypatch.setattr(route, "LOOK_EVERY_S", 60.0)

    def worker(ref: str, key: str) -> None:  # as workers.tasks.make_package runs it
        monkeypatch.setattr(packages, "make_package", lambda *a, **k: made(reg, key))
        assert pj.make_for_service(app.state.settings, reg, ref, key, board) == "made"

    jobs_of(app, board, RecordingDispatch(then=worker, later=0.3))
    t0 = time.monotonic()
    r = client.post("/v1/packages", params={"wait": 8}, json={"ref": "net:v1"})
    assert r.status_code == 200 and r.json() == {"digest": PACKAGE, "cached": False}, r.text
    assert time.monotonic() - t0 < 8  # on the event, not at the end of the wait (its last read)


def test_a_waiting_post_answers_the_workers_error_with_its_status(service: Any) -> None:
    client, app, board = service

    def worker_failed(ref: str, key: str) -> None:
        board.finish(key, E.PackageFilesMissingError(f"{ref}: a context file is gone").to_dict(), pj.FAILED_TTL_S)

    jobs_of(app, board, RecordingDispatch(then=worker_failed, later=0.3))
    r = client.post("/v1/packages", params={"wait": 20}, json={"ref": "net:v1"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "package-files-missing", r.text
    assert "net:v1: a context file is gone" == r.json()["error"]["message"]


def test_the_route_without_a_live_worker_is_503_no_worker(service: Any) -> None:
    client, app, board = service
    from sqlalchemy import delete

    from registry.models import Worker

    with app.state.registry.db.session() as s:
        s.execute(delete(Worker))
    jobs_of(app, board, RecordingDispatch())
    r = client.post("/v1/packages", json={"ref": "net:v1"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no-worker"
    assert "onnxruntime >= 1.32" in r.json()["error"]["message"]


# ---- the client: farm package --server follows 202 -------------------------------------------------

class FakeClient:
    """Answers POST /v1/packages from a script of (answer, status, retry_after)."""

    def __init__(self, script: list[tuple[Any, int, float | None]]):
        self.script, self.asked = list(script), []  # type: ignore[var-annotated]

    def json_status(self, method: str, path: str, payload: Any = None, **query: Any) -> Any:
        self.asked.append((method, path, payload, query))
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]


def test_farm_package_asks_again_after_retry_after_until_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.cli import package_cmd

    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    monkeypatch.setattr(time, "sleep", sleep)
    pending = ({"status": "making"}, 202, 5.0)
    c = FakeClient([pending, (pending[0], 202, 10_000.0), ({"digest": PACKAGE}, 200, None)])
    assert package_cmd._made(c, "net:v1", 600) == {"digest": PACKAGE}
    # The service's Retry-After, within reason (a hostile one can't stall us for hours).
    assert slept == [5.0, 30.0] and [q["wait"] for *_x, q in c.asked] == ["30", "30", "30"]
    assert all(a[:3] == ("POST", "/v1/packages", {"ref": "net:v1"}) for a in c.asked)
    slept.clear()
    with pytest.raises(E.CompileTimeoutError) as e:
        package_cmd._made(FakeClient([(pending[0], 202, None)]), "net:v1", 12)
    assert e.value.code == "timeout" and "farm package net:v1" in (e.value.hint or "") and slept == [5.0, 5.0]
