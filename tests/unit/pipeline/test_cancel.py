"""Cancelling builds (farm.pipeline.cancel, states.cancel) and the lease that holds a long
compile: a short lease with a slow compile child (tests.common.fake_child) renewed throughout,
and a running compile stopped by a cancel from outside."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from farm.core.errors import LeaseLostError, UsageError
from farm.core.settings import Settings
from farm.pipeline import plan, states
from farm.pipeline.cancel import cancel
from registry.index import Registry
from registry.models import Build
from tests.common.fake_runner import InstantRunner
from tests.common.index_rows import add_model, spec
from tests.common.onnx_models import matmul_add, save
from workers.runner import CompileJob, CompileOutput, run_child


class SlowChildRunner(InstantRunner):
    """Compiles in a real child process (the fake backend child) that sleeps ``seconds``, under
    the job's cancel flag, then writes what InstantRunner writes."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.child_started = threading.Event()

    def compile(self, job: CompileJob, work_dir: Path) -> CompileOutput:
        work_dir.mkdir(parents=True, exist_ok=True)
        self.child_started.set()
        run_child("tests.common.fake_child", "compile", {"action": "sleep", "seconds": self.seconds}, work_dir,
                  timeout=120, cancel=job.cancel)
        return super().compile(job, work_dir)


def use(monkeypatch: pytest.MonkeyPatch, runner: Any) -> None:
    monkeypatch.setattr("workers.backends.get_runner", lambda backend: runner)


def build_row(settings: Settings, build_id: int) -> Build:
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            b = states.get_build(s, build_id)
            s.expunge(b)
            return b
    finally:
        reg.close()


def test_cancel_a_queued_build_then_its_message_is_dropped_and_a_new_submit_queues_it(db) -> None:
    with db.session() as s:
        model = add_model(s, "m1", name="resnet").digest
    with db.session() as s:
        build_id, _ = states.enqueue(s, spec(model), "compile.qnn.2.51.0")
    with db.session() as s:
        assert states.cancel(s, build_id, "test") == "cancelled"
    with db.session() as s:
        b = states.get_build(s, build_id)
        assert (b.state, b.error_code) == ("failed", "cancelled") and "while queued" in (b.error_message or "")
        assert states.cancel(s, build_id, "again") == "failed"  # final: nothing changes
    with db.session() as s:
        # The broker message a worker takes later finds the row final.
        assert states.claim(s, build_id, owner="w", lease_seconds=60, max_attempts=3).action == "done"
    with db.session() as s:
        assert states.enqueue(s, spec(model), "compile.qnn.2.51.0") == (build_id, True)  # not a verdict


def test_cancel_a_running_attempt_takes_its_lease(db) -> None:
    with db.session() as s:
        model = add_model(s, "m1", name="resnet").digest
    with db.session() as s:
        build_id, _ = states.enqueue(s, spec(model), None)
    with db.session() as s:
        lease = states.claim(s, build_id, owner="a", lease_seconds=60, max_attempts=3).lease
    assert lease is not None
    with db.session() as s:
        assert states.cancel(s, build_id, "test") == "cancelled"
    with db.session() as s:
        assert states.renew(s, lease, 60) is False  # the keeper stops the compile
        with pytest.raises(LeaseLostError):
            states.succeed(s, lease, log="late")
        assert states.fail(s, lease, "toolchain-error", "late", None) is False
        b = states.get_build(s, build_id)
        assert (b.state, b.error_code) == ("failed", "cancelled") and "running, attempt 1" in (b.error_message or "")


def test_a_short_lease_is_renewed_through_a_slow_compile(settings: Settings, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Lease 0.6 s, compile 2.5 s (four leases long): the build succeeds on its first attempt."""
    runner = SlowChildRunner(2.5)
    use(monkeypatch, runner)
    short = dataclasses.replace(settings, lease_seconds=0.6)
    report = plan.build(short, save(matmul_add(seed=7), tmp_path / "m.onnx"), ["qnn:SM8650"])
    o = report.outcomes[0]
    assert o.state == "built"
    b = build_row(short, o.build_id)  # type: ignore[arg-type]
    assert (b.state, b.attempts) == ("succeeded", 1)


def test_cancel_stops_a_running_compile(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = SlowChildRunner(60)
    use(monkeypatch, runner)
    short = dataclasses.replace(settings, lease_seconds=1.5)  # renewals every 0.5 s
    result: list[plan.BuildReport] = []
    t = threading.Thread(target=lambda: result.append(
        plan.build(short, save(matmul_add(seed=8), tmp_path / "m.onnx"), ["qnn:SM8650"])))
    t.start()
    assert runner.child_started.wait(30)
    reg = Registry.open(short)
    try:
        with reg.db.session() as s:
            build_id = s.query(Build.id).one()[0]
    finally:
        reg.close()
    start = time.monotonic()
    done = cancel(short, build_id=build_id)
    assert [c.to_dict() for c in done] == [{"build": build_id, "was": "running", "now": "cancelled"}]
    t.join(30)
    assert not t.is_alive() and time.monotonic() - start < 10  # the 60 s child was killed
    o = result[0].outcomes[0]
    assert (o.state, o.error_code) == ("failed", "cancelled")
    assert cancel(short, build_id=build_id)[0].now == "failed"  # already final


def test_cancel_needs_one_release_or_build(settings: Settings) -> None:
    with pytest.raises(UsageError):
        cancel(settings)
    from farm.core.errors import NotFoundError

    with pytest.raises(NotFoundError):
        cancel(settings, release_id=999)
