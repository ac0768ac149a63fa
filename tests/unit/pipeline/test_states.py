"""The build state machine on a real SQLite index: every transition guarded, a late executor
changes nothing, attempts are capped, interruptions give the attempt back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from farm.core.errors import LeaseLostError
from farm.pipeline import states
from registry.index import artifact_for_build, get_build, insert_artifact
from registry.models import Artifact, Build
from tests.common.index_rows import add_model, digest, spec


@pytest.fixture
def model(db):
    with db.session() as s:
        return add_model(s, "m1", name="resnet").digest


def enqueue(db, build_spec, queue=None, **kw):
    with db.session() as s:
        return states.enqueue(s, build_spec, queue, **kw)


def claim(db, build_id, owner="a", lease=60.0, max_attempts=3):
    with db.session() as s:
        return states.claim(s, build_id, owner=owner, lease_seconds=lease, max_attempts=max_attempts)


def row(db, build_id) -> Build:
    with db.session() as s:
        return get_build(s, build_id)


def expire(db, build_id):
    """Make the holder's lease lapse, as if it died."""
    with db.session() as s:
        s.execute(update(Build).where(Build.id == build_id)
                  .values(lease_expires_at=states.now() - timedelta(seconds=1)))


def publish(db, lease, n=0):
    with db.session() as s:
        insert_artifact(s, lease.build_id, manifest_digest=digest(f"manifest-{n}"), manifest_size=1,
                        ctx_model="model_ctx.onnx",
                        files=[{"name": "model_ctx.onnx", "role": "ctx-model", "digest": digest(f"ctx-{n}"),
                                "size": 1, "mediaType": "x"}],
                        ep_sdk_version=None, compile_seconds=1.0, nodes_ep=1, nodes_cpu=0)
        states.succeed(s, lease, log="ok")


def test_enqueue_dedupes_on_the_build_key(db, model):
    first, queued = enqueue(db, spec(model), "compile.qnn.2.51.0")
    again, queued_again = enqueue(db, spec(model), "compile.qnn.2.51.0")
    assert (queued, queued_again, again) == (True, False, first)
    r = row(db, first)
    assert (r.state, r.attempts, r.queue) == ("queued", 0, "compile.qnn.2.51.0")


def test_claim_runs_once_then_busy(db, model):
    build_id, _ = enqueue(db, spec(model))
    a = claim(db, build_id, owner="a")
    b = claim(db, build_id, owner="b")
    assert a.action == "run" and a.lease is not None and a.lease.attempt == 1
    assert (b.action, b.lease) == ("busy", None)
    r = row(db, build_id)
    assert (r.state, r.attempts, r.lease_owner, r.worker) == ("running", 1, a.lease.owner, "a")


def test_a_late_executor_changes_nothing(db, model):
    """A's lease lapses, B takes over and publishes; A's late fail, requeue, publish and renew
    all find their guard false."""
    build_id, _ = enqueue(db, spec(model))
    a = claim(db, build_id, owner="a").lease
    expire(db, build_id)
    b = claim(db, build_id, owner="b").lease
    assert a is not None and b is not None and b.attempt == 2
    publish(db, b, n=1)
    with db.session() as s:
        assert states.fail(s, a, "toolchain-error", "late", None) is False
        assert states.requeue(s, a, "storage-error", "late", None, delay=0) is False
        assert states.release(s, a, "late") is False
        assert states.renew(s, a, 60) is False
    with pytest.raises(LeaseLostError):
        publish(db, a, n=2)  # the artifact insert rolls back with the refused transition
    r = row(db, build_id)
    assert (r.state, r.attempts, r.error_code) == ("succeeded", 2, None)
    with db.session() as s:
        art = artifact_for_build(s, build_id)
        assert art is not None and art.digest == digest("manifest-1")
        assert len(s.scalars(select(Artifact)).all()) == 1


def test_renew_keeps_a_live_lease(db, model):
    build_id, _ = enqueue(db, spec(model))
    lease = claim(db, build_id, lease=1.0).lease
    before = row(db, build_id).lease_expires_at
    with db.session() as s:
        assert states.renew(s, lease, 600) is True
    assert row(db, build_id).lease_expires_at > before


@pytest.mark.parametrize("code", ["invalid-model", "unsupported-ops", "bad-options", "resource-limit"])
def test_deterministic_failure_is_answered_from_the_index(db, model, code):
    build_id, _ = enqueue(db, spec(model))
    lease = claim(db, build_id).lease
    with db.session() as s:
        assert states.fail(s, lease, code, "no", "log")
    assert enqueue(db, spec(model)) == (build_id, False)
    assert claim(db, build_id).action == "done"
    assert enqueue(db, spec(model), retry_failed=True) == (build_id, True)
    assert row(db, build_id).state == "queued"


@pytest.mark.parametrize("code", ["toolchain-error", "worker-lost", "storage-error"])
def test_infra_failure_is_queued_again_with_a_fresh_budget(db, model, code):
    build_id, _ = enqueue(db, spec(model))
    lease = claim(db, build_id).lease
    with db.session() as s:
        assert states.fail(s, lease, code, "flaky", None)
    assert enqueue(db, spec(model)) == (build_id, True)
    r = row(db, build_id)
    assert (r.state, r.attempts, r.error_code) == ("queued", 0, None)


def test_requeue_keeps_the_error_and_holds_off_the_reconciler(db, model):
    build_id, _ = enqueue(db, spec(model), "q")
    lease = claim(db, build_id).lease
    with db.session() as s:
        assert states.requeue(s, lease, "storage-error", "S3 blinked", None, delay=300)
        assert states.take_orphans(s, ["q"], resend_after=0.0, pending=set()) == []
    r = row(db, build_id)
    assert (r.state, r.attempts, r.error_code) == ("queued", 1, "storage-error")


def test_a_retry_waits_the_set_backoff_doubled_each_attempt() -> None:
    from farm.core.errors import ConfigError
    from farm.core.settings import Settings
    from farm.pipeline.execute import backoff

    assert [backoff(a) for a in (1, 2, 3, 9)] == [5.0, 10.0, 20.0, 300.0]  # the default: 5 s, at most 300
    base = Settings.from_env({"FARM_HOME": "/nonexistent/ctxfarm", "FARM_RETRY_BACKOFF_SECONDS": "0.5"})
    assert [backoff(a, base.retry_backoff_seconds) for a in (1, 2)] == [0.5, 1.0]
    assert Settings.from_env({"FARM_HOME": "/nonexistent/ctxfarm"}).retry_backoff_seconds == 5.0
    assert Settings.from_env({"FARM_HOME": "/x", "FARM_RETRY_BACKOFF_SECONDS": "0"}).retry_backoff_seconds == 0.0
    with pytest.raises(ConfigError):
        Settings.from_env({"FARM_HOME": "/x", "FARM_RETRY_BACKOFF_SECONDS": "-1"})


def test_dead_executors_are_capped_then_worker_lost(db, model):
    build_id, _ = enqueue(db, spec(model))
    for attempt in (1, 2, 3):
        c = claim(db, build_id, owner=f"w{attempt}", max_attempts=3)
        assert c.action == "run" and c.lease.attempt == attempt
        expire(db, build_id)  # ... and the executor dies
    assert claim(db, build_id, max_attempts=3).action == "exhausted"
    r = row(db, build_id)
    assert (r.state, r.error_code, r.attempts) == ("failed", "worker-lost", 3)
    assert "gave up after 3 attempt(s)" in r.error_message


def test_interrupt_gives_the_attempt_back_and_frees_the_build_at_once(db, model):
    build_id, _ = enqueue(db, spec(model))
    lease = claim(db, build_id, max_attempts=1).lease
    with db.session() as s:
        assert states.release(s, lease, "signal 15")
    r = row(db, build_id)
    assert (r.state, r.attempts, r.error_code, r.lease_owner) == ("queued", 0, "interrupted", None)
    again = claim(db, build_id, owner="next", max_attempts=1)  # no waiting for a lease, budget intact
    assert again.action == "run" and again.lease.attempt == 1


def test_broken_artifact_is_rebuilt_and_replaced(db, model):
    build_id, _ = enqueue(db, spec(model))
    publish(db, claim(db, build_id).lease, n=1)
    assert enqueue(db, spec(model)) == (build_id, False)
    with db.session() as s:
        s.execute(update(Artifact).where(Artifact.build_id == build_id).values(status="broken"))
    assert enqueue(db, spec(model)) == (build_id, True)
    publish(db, claim(db, build_id).lease, n=2)
    with db.session() as s:
        art = artifact_for_build(s, build_id)
        assert (art.digest, art.status) == (digest("manifest-2"), "active")
        assert len(s.scalars(select(Artifact)).all()) == 1


def test_orphans_are_dead_leases_and_queued_builds_without_a_message(db, model):
    waiting, _ = enqueue(db, spec(model, target="SM8650"), "q")
    pending, _ = enqueue(db, spec(model, target="SM8750"), "q")
    dead, _ = enqueue(db, spec(model, target="SC8380XP"), "q")
    running, _ = enqueue(db, spec(model, target="SM8550"), "q")
    other_queue, _ = enqueue(db, spec(model, target="SM8450"), "elsewhere")
    claim(db, dead)
    expire(db, dead)
    claim(db, running)
    with db.session() as s:
        taken = states.take_orphans(s, ["q"], resend_after=0.0, pending={pending})
    assert sorted(taken) == sorted([(waiting, "q"), (dead, "q")])
    with db.session() as s:  # one reconciler of many sends each, once per window
        assert states.take_orphans(s, ["q"], resend_after=60.0, pending=set()) == []
    assert other_queue not in {b for b, _ in taken}


def test_job_dirs_of_dead_executors_are_swept(tmp_path):
    import os
    import subprocess
    import sys

    from farm.pipeline.execute import JOB_PREFIX, sweep_job_dirs

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f"{JOB_PREFIX}{int(dead.stdout)}-abc"
    mine = tmp_path / f"{JOB_PREFIX}{os.getpid()}-def"
    other = tmp_path / "ctxfarm-jobless"
    for d in (gone, mine, other):
        d.mkdir()
    assert sweep_job_dirs(tmp_path) == [gone]
    assert not gone.exists() and mine.exists() and other.exists()


def test_next_queued_is_the_oldest_ready_build_of_the_queue(db, model):
    """What a worker takes from the index after a build: its queue's oldest queued
    build, never one in backoff, running, on another queue, or a genai package's build."""
    from registry.models import GenaiPart

    first, _ = enqueue(db, spec(model, target="SM8650"), "q")
    second, _ = enqueue(db, spec(model, target="SM8750"), "q")
    backoff, _ = enqueue(db, spec(model, target="SC8380XP"), "q")
    package, _ = enqueue(db, spec(model, target="SM8550"), "q")
    elsewhere, _ = enqueue(db, spec(model, target="SM8450"), "elsewhere")
    with db.session() as s:
        s.add(GenaiPart(package_build_id=package, part=0, part_build_id=first))
        # enqueued_at orders them, not the id: the first is re-queued after the second
        s.execute(update(Build).where(Build.id == first).values(enqueued_at=states.now() - timedelta(seconds=5)))
        s.execute(update(Build).where(Build.id == second).values(enqueued_at=states.now() - timedelta(seconds=9)))
    lease = claim(db, backoff).lease
    with db.session() as s:
        states.requeue(s, lease, "storage-error", "S3 blinked", None, delay=300)
        assert states.next_queued(s, "q") == second
    claim(db, second)
    with db.session() as s:
        assert states.next_queued(s, "q") == first
    claim(db, first)
    with db.session() as s:
        assert states.next_queued(s, "q") is None  # the package's build waits for its parts' worker
        assert states.next_queued(s, "elsewhere") == elsewhere
        assert states.next_queued(s, "nobody's") is None


def test_a_twin_build_has_the_same_guarded_transitions_in_its_own_table(db, model):
    """A genai part's twin build (registry.models.TwinBuild): keyed apart from the builds, its
    lease names its table, and a late attempt changes nothing there either."""
    from registry.models import TwinBuild

    twin_spec = spec(model)
    with db.session() as s:
        twin_id, queued = states.enqueue(s, twin_spec, "compile.qnn.2.51.0.genai", table=TwinBuild)
        again, queued_again = states.enqueue(s, twin_spec, None, table=TwinBuild)
    assert queued and not queued_again and again == twin_id
    build_id, _ = enqueue(db, twin_spec)  # the builds table has its own key space
    with db.session() as s:
        a = states.claim(s, twin_id, owner="a", lease_seconds=60, max_attempts=3, table=TwinBuild).lease
    assert a is not None and a.table is TwinBuild
    with db.session() as s:
        s.execute(update(TwinBuild).where(TwinBuild.id == twin_id)
                  .values(lease_expires_at=states.now() - timedelta(seconds=1)))
    with db.session() as s:
        b = states.claim(s, twin_id, owner="b", lease_seconds=60, max_attempts=3, table=TwinBuild).lease
    assert b is not None and b.attempt == 2
    with db.session() as s:
        assert states.fail(s, a, "toolchain-error", "late", None) is False
        assert states.renew(s, b, 60) is True
        states.succeed(s, b, log="ok")
    with db.session() as s:
        t = s.get(TwinBuild, twin_id)
        assert (t.state, t.attempts) == ("succeeded", 2)
        assert s.get(Build, build_id).state == "queued"  # untouched
