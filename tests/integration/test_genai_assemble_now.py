"""The worker that publishes a genai package's last part assembles the package at once, on a
thread of its own (``workers.tasks.assemble_now``); the package's message, sent to the genai
queue at the same time, is only the fallback. No Celery worker runs here, so nothing consumes
that queue: the package is published by the thread alone, which then takes its message off the
broker list, and the message a worker would take anyway finds the build final and drops it.

Real parts (the tiny export of tests/common/genai.py compiled by QNN 2.51.0 in this process's
executor), the real Redis broker (a database of its own, flushed), SQLite index. The twin that
follows publication is another test's subject (test_genai_cluster, test_genai_twin_builds):
here it is only recorded as started, on the same thread."""

from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from farm.core.settings import Settings
from tests.common.genai import make_export

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnxruntime_qnn")
pytest.importorskip("celery")

BROKER = "redis://127.0.0.1:6379/13"  # no other test uses it (the cluster tests use 15)


@pytest.fixture
def broker() -> Any:
    import redis

    client = redis.Redis.from_url(BROKER, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def test_the_last_parts_worker_assembles_the_package_and_the_fallback_message_is_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broker: Any) -> None:
    import farm.pipeline.genai as genai
    from farm.pipeline.capabilities import fleet_here
    from farm.pipeline.execute import Executor
    from farm.pipeline.genai.release import submit_package
    from farm.pipeline.queues import compile_queue, genai_queue, make_app, pending_build_ids
    from registry.index import Registry
    from registry.models import Build, GenaiPart

    home = tmp_path / "home"
    settings = Settings.from_env({"FARM_HOME": str(home), "FARM_BROKER_URL": BROKER})
    gq, cq = genai_queue("qnn", "2.51.0"), compile_queue("qnn", "2.51.0")
    # workers.tasks builds its Celery app from the environment at import (no connection made);
    # a worker that serves the genai queue says so in CTXFARM_GENAI_QUEUES (workers.main).
    monkeypatch.setenv("FARM_HOME", str(home))
    monkeypatch.setenv("FARM_BROKER_URL", BROKER)
    monkeypatch.setenv("CTXFARM_GENAI_QUEUES", gq)
    tasks = importlib.import_module("workers.tasks")
    app = make_app(settings)
    monkeypatch.setattr(tasks, "settings", settings)  # in case another test imported it first
    monkeypatch.setattr(tasks, "app", app)
    monkeypatch.setattr(tasks, "_brokers", {})
    reg = Registry.open(settings)
    ex = Executor(settings, reg, owner="last-part-worker")
    monkeypatch.setattr(tasks, "_executors", {os.getpid(): ex})

    # Who runs execute_package, and when: the assembling thread waits until the test has seen
    # the package's message in the broker, untaken, with the build still queued.
    real = genai.execute_package
    calls: list[tuple[str, int, str | None]] = []
    seen = threading.Event()

    def execute_package(executor: Any, build_id: int) -> Any:
        if threading.current_thread().name.startswith("assemble-"):
            assert seen.wait(60)
        result = real(executor, build_id)
        calls.append((threading.current_thread().name, build_id, result.outcome if result else None))
        return result

    monkeypatch.setattr(genai, "execute_package", execute_package)
    twins: list[tuple[str, int]] = []
    monkeypatch.setattr("farm.pipeline.genai.release.twin_after",
                        lambda executor, build_id, *rest: twins.append((threading.current_thread().name, build_id)))
    try:
        served = {("qnn", "2.51.0"): ["this-process"]}
        submit_package(settings, make_export(tmp_path / "export"), ["qnn:SM8650"], registry=reg, app=app,
                       served=served, fleet=fleet_here(served))
        with reg.db.session() as s:
            (pkg,) = {int(p) for p, in s.query(GenaiPart.package_build_id)}
            parts = [int(p) for p, in s.query(GenaiPart.part_build_id).order_by(GenaiPart.part)]
        assert len(parts) == 2 and pending_build_ids(BROKER, [cq]) == set(parts)
        first = ex.execute(parts[0])
        assert first.outcome == "succeeded"
        tasks._finish(ex, cq, first)  # not the last part: nothing sent for the package
        assert pkg not in pending_build_ids(BROKER, [gq]) and not calls

        last = ex.execute(parts[1])
        assert last.outcome == "succeeded"
        tasks._finish(ex, cq, last)  # what the worker does after the build's final outcome
        (thread,) = [t for t in threading.enumerate() if t.name == f"assemble-{pkg}"]
        assert pending_build_ids(BROKER, [gq]) == {pkg}  # the fallback message waits, untaken
        with reg.db.session() as s:
            assert s.get(Build, pkg).state == "queued"
        seen.set()
        thread.join(180)
        assert not thread.is_alive()

        # The thread published it: its executor claimed it (one attempt), the twin followed on
        # the same thread, and its message was taken off the broker list.
        assert calls == [(f"assemble-{pkg}", pkg, "succeeded")]
        assert twins == [(f"assemble-{pkg}", pkg)]
        with reg.db.session() as s:
            b = s.get(Build, pkg)
            assert (b.state, b.attempts, b.worker) == ("succeeded", 1, "last-part-worker")
            finished = b.finished_at
        assert pkg not in pending_build_ids(BROKER, [gq])

        # The fallback message, taken anyway (a worker that got it before it was taken off the
        # list): the task finds the build final and drops it; nothing runs, nothing changes.
        assert tasks.compile_model.apply(args=[pkg]).get() == "done"
        assert calls[1:] == [("MainThread", pkg, "done")] and len(twins) == 1
        with reg.db.session() as s:
            b = s.get(Build, pkg)
            assert (b.state, b.attempts, b.finished_at) == ("succeeded", 1, finished)
    finally:
        seen.set()
        ex.drain()
        reg.close()
