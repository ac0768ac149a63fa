"""Publication: every blob uploaded at once, then ONE transaction (artifact, files, self-probe
verdict, worker count, running -> succeeded with the phases); a failed upload writes no row."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from sqlalchemy import event, func, select

from farm.core.catalog import load_catalog
from farm.core.errors import LeaseLostError, StorageUnavailable
from farm.pipeline import states
from farm.pipeline.execute import BuildRow, Phases, publish
from registry.index import Registry, register_worker
from registry.models import Artifact, ArtifactFile, Build, CompatVerdict, Worker
from registry.store.base import BlobInfo, read_bytes
from tests.common.index_rows import add_model, spec
from tests.common.store import FailingBlobStore, InMemoryBlobStore
from workers.runner import CompileOutput, OutputFile, Toolchain

TOOLCHAIN = Toolchain("qnn", "2.51.0", "1.31.1", "onnxruntime-qnn", "2.7.0")


class BarrierStore(InMemoryBlobStore):
    """Every put waits until ``n`` puts are in flight at once: uploads one after another would
    break the barrier (BrokenBarrierError after its timeout)."""

    def __init__(self, n: int):
        super().__init__()
        self.barrier = threading.Barrier(n, timeout=30)
        self.threads: set[str] = set()

    def put_stream(self, stream: BinaryIO, *, expected: str | None = None) -> BlobInfo:
        data = stream.read()
        self.threads.add(threading.current_thread().name)
        self.barrier.wait()
        return super().put_stream(io.BytesIO(data), expected=expected)


def running_build(db: Any) -> tuple[states.Lease, BuildRow, int]:
    with db.session() as s:
        model = add_model(s, "m1", name="resnet")
        sp = spec(model.digest)
        build_id, _ = states.enqueue(s, sp, "compile.qnn.2.51.0")
        worker_id = register_worker(s, name="w1", host="h", pid=1, toolchain=TOOLCHAIN, queues=[])
    with db.session() as s:
        c = states.claim(s, build_id, owner="w1", lease_seconds=60, max_attempts=3)
        assert c.lease is not None
    row = BuildRow(sp.backend, sp.target, sp.toolchain, sp.options, sp.options_digest, sp.build_key,
                   sp.model_digest, [])
    return c.lease, row, worker_id


def output(tmp: Path) -> CompileOutput:
    out = tmp / "out"
    out.mkdir()
    (out / "model_ctx.onnx").write_bytes(b"ctx model bytes")
    (out / "model_ctx_qnn.bin").write_bytes(b"context binary" * 100)
    files = [OutputFile("model_ctx.onnx", out / "model_ctx.onnx", "ctx-model", "application/x-ctx"),
             OutputFile("model_ctx_qnn.bin", out / "model_ctx_qnn.bin", "context", "application/x-qnn")]
    return CompileOutput(out, "model_ctx.onnx", files, 1.25, 1.5, [{"ep_sdk_version": "2.51.0"}],
                         {"ep_nodes": 1, "cpu_nodes": 0, "cpu_op_types": []}, TOOLCHAIN, "compile log",
                         self_load={"ok": True, "load_seconds": 0.01})


def test_blobs_go_up_at_once_then_one_transaction_writes_everything(db: Any, tmp_path: Path) -> None:
    store = BarrierStore(4)  # 2 files + log + manifest, all in flight together
    reg = Registry(db, store)  # type: ignore[arg-type]
    lease, row, worker_id = running_build(db)
    target = load_catalog().get("SM8650", backend="qnn")
    commits: list[int] = []
    event.listen(db.engine, "commit", lambda conn: commits.append(1))
    ph = Phases()
    art_id, manifest_digest = publish(reg, lease, row, target, output(tmp_path), phases=ph,
                                      probe_version="2.51.0", worker_id=worker_id)
    assert len(commits) == 1
    assert len(store.threads) == 4
    with db.session() as s:
        b = s.get(Build, lease.build_id)
        assert b.state == "succeeded"
        assert b.phases is not None and set(b.phases["uploads"]) == {
            "model_ctx.onnx", "model_ctx_qnn.bin", "build.log", "manifest.json"}
        assert {"hash", "upload", "sql", "total"} <= set(b.phases)
        art = s.get(Artifact, art_id)
        assert art.digest == manifest_digest and {f.name for f in art.files} == {
            "model_ctx.onnx", "model_ctx_qnn.bin", "build.log", "manifest.json"}
        v = s.scalar(select(CompatVerdict).where(CompatVerdict.artifact_id == art_id))
        assert (v.runtime_version, v.verdict, v.source) == ("2.51.0", "loads", "probe")
        assert s.get(Worker, worker_id).jobs_done == 1
    for f in art.files:
        read_bytes(store, f.digest)  # every indexed blob is in the store, whole


def test_a_failed_upload_leaves_no_artifact_row(db: Any, tmp_path: Path) -> None:
    inner = InMemoryBlobStore()
    reg = Registry(db, FailingBlobStore(inner, fail_on_put=2))  # type: ignore[arg-type]
    lease, row, worker_id = running_build(db)
    target = load_catalog().get("SM8650", backend="qnn")
    with pytest.raises(StorageUnavailable):
        publish(reg, lease, row, target, output(tmp_path), probe_version="2.51.0", worker_id=worker_id)
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(Artifact)) == 0
        assert s.scalar(select(func.count()).select_from(ArtifactFile)) == 0
        assert s.scalar(select(func.count()).select_from(CompatVerdict)) == 0
        assert s.get(Build, lease.build_id).state == "running"  # the executor's failure path decides
        assert s.get(Worker, worker_id).jobs_done == 0


def test_a_lost_lease_rolls_the_whole_publication_back(db: Any, tmp_path: Path) -> None:
    reg = Registry(db, InMemoryBlobStore())  # type: ignore[arg-type]
    lease, row, worker_id = running_build(db)
    target = load_catalog().get("SM8650", backend="qnn")
    late = states.Lease(lease.build_id, "someone-else", lease.attempt)
    with pytest.raises(LeaseLostError):
        publish(reg, late, row, target, output(tmp_path), probe_version="2.51.0", worker_id=worker_id)
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(Artifact)) == 0
        assert s.scalar(select(func.count()).select_from(CompatVerdict)) == 0
        assert s.get(Worker, worker_id).jobs_done == 0
        assert s.get(Build, lease.build_id).phases is None


class GatedStore(InMemoryBlobStore):
    """Puts wait while ``gate`` is clear (a slow store)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def put_stream(self, stream: BinaryIO, *, expected: str | None = None) -> BlobInfo:
        if not self.gate.wait(60):
            raise TimeoutError("the test never opened the gate")
        return super().put_stream(stream, expected=expected)


def two_queued_builds(db: Any, store: Any) -> list[int]:
    from registry.index import record_model

    info = store.put_stream(io.BytesIO(b"an onnx model, as far as this test goes"))
    with db.session() as s:
        m = record_model(s, digest=info.digest, onnx_digest=info.digest, size=info.size, name="m",
                         files=[{"path": "model.onnx", "digest": info.digest, "size": info.size, "stored": True}])
        return [states.enqueue(s, spec(m.digest, target=t), "compile.qnn.2.51.0")[0] for t in ("SM8650", "SM8750")]


def test_a_worker_compiles_its_next_build_while_the_last_one_publishes(db: Any, tmp_path: Path) -> None:
    from farm.core.settings import Settings
    from farm.pipeline.execute import Executor, Result
    from tests.common.fake_runner import InstantRunner

    store = GatedStore()
    b1, b2 = two_queued_builds(db, store)
    runner = InstantRunner()
    ex = Executor(Settings.from_env({"FARM_HOME": str(tmp_path / "home")}), Registry(db, store),  # type: ignore[arg-type]
                  runner, background_publish=True)
    done: list[Result] = []
    seen: list[str] = []

    def open_gate_once_b2_compiles() -> None:
        assert runner.compiling.wait(60)
        with db.session() as s:
            seen.append(s.get(Build, b1).state)  # build 1 still publishing while build 2 compiles
        store.gate.set()

    store.gate.clear()
    assert ex.execute(b1, then=done.append).outcome == "publishing"
    runner.compiling.clear()
    t = threading.Thread(target=open_gate_once_b2_compiles)
    t.start()
    assert ex.execute(b2, then=done.append).outcome == "publishing"
    t.join()
    ex.drain()
    assert seen == ["running"]
    assert [(r.build_id, r.outcome) for r in done] == [(b1, "succeeded"), (b2, "succeeded")]
    with db.session() as s:
        rows = [s.get(Build, b) for b in (b1, b2)]
        assert [b.state for b in rows] == ["succeeded", "succeeded"]
        assert all(b.lease_owner is None and "critical" in b.phases for b in rows)
        assert s.scalar(select(func.count()).select_from(Artifact)) == 2


def test_a_failed_background_publication_requeues_the_build(db: Any, tmp_path: Path) -> None:
    from farm.core.settings import Settings
    from farm.pipeline.execute import Executor, Result
    from tests.common.fake_runner import InstantRunner

    inner = InMemoryBlobStore()
    b1, _ = two_queued_builds(db, inner)
    ex = Executor(Settings.from_env({"FARM_HOME": str(tmp_path / "home")}),
                  Registry(db, FailingBlobStore(inner, fail_on_put=1)), InstantRunner(),  # type: ignore[arg-type]
                  background_publish=True)
    done: list[Result] = []
    assert ex.execute(b1, then=done.append).outcome == "publishing"
    ex.drain()
    assert [r.outcome for r in done] == ["retry"]
    with db.session() as s:
        b = s.get(Build, b1)
        assert (b.state, b.error_code, b.lease_owner) == ("queued", "storage-error", None)
        assert s.scalar(select(func.count()).select_from(Artifact)) == 0


def test_phases_keep_child_seconds_in_ms_and_counts_as_counts() -> None:
    from types import SimpleNamespace

    ph = Phases()
    out = SimpleNamespace(compile_seconds=0.5, self_load={"ok": True, "load_seconds": 0.01}, wall_seconds=0.52,
                          timings={"fork_seconds": 0.002, "job_seconds": 0.515, "page_faults": 4566.0})
    ph.compile(out, 0.53)  # type: ignore[arg-type]
    assert ph.ms["ep_compile"] == 500.0 and ph.ms["self_probe"] == 10.0 and ph.ms["child_start"] == 10.0
    assert ph.ms["child.fork"] == 2.0 and ph.ms["child.job"] == 515.0
    assert ph.ms["child.page_faults"] == 4566 and isinstance(ph.ms["child.page_faults"], int)

