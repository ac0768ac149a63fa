"""Build events inside one process (no broker): a waiter subscribed before it reads the state
is woken by a change made after the read, and only by changes to its builds."""

from __future__ import annotations

import threading

from farm.pipeline.events import Publisher, Subscription


def test_an_event_between_the_read_and_the_wait_is_not_missed() -> None:
    with Subscription(None) as sub:
        # ... the waiter reads the release here; the build finishes before it starts waiting:
        Publisher(None).publish(41, "succeeded")
        assert sub.wait({41}, timeout=60)
        assert sub.wakeups == 1


def test_a_waiter_is_woken_by_its_builds_only() -> None:
    with Subscription(None) as sub:
        Publisher(None).publish(7, "running")  # someone else's build
        assert not sub.wait({8, 9}, timeout=0.05)
        t = threading.Timer(0.05, Publisher(None).publish, args=(9, "succeeded"))
        t.start()
        try:
            assert sub.wait({8, 9}, timeout=60)
        finally:
            t.join()


def test_a_broker_that_cannot_be_reached_falls_back_to_local_events() -> None:
    with Subscription("redis://127.0.0.1:1/0") as sub:  # nothing listens on port 1
        Publisher("redis://127.0.0.1:1/0").publish(5, "failed")  # logs, never raises
        # A failed subscription reports a wake-up (read the state again) and is retried.
        assert sub.wait({5}, timeout=60)


def test_the_service_long_poll_answers_when_a_build_changes(db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from farm.core.settings import Settings
    from farm.pipeline import states
    from farm.pipeline.plan import watch_release
    from registry.index import Registry, insert_artifact
    from registry.models import Release, ReleaseBuild
    from tests.common.index_rows import add_model, digest, spec
    from tests.common.store import InMemoryBlobStore

    settings = Settings.from_env({"FARM_HOME": str(tmp_path)})
    reg = Registry(db, InMemoryBlobStore())  # type: ignore[arg-type]
    with db.session() as s:
        model = add_model(s, "m1")
        build_id, _ = states.enqueue(s, spec(model.digest), "compile.qnn.2.51.0")
        rel = Release(model_digest=model.digest, label="m1", matrix={})
        s.add(rel)
        s.flush()
        s.add(ReleaseBuild(release_id=rel.id, build_id=build_id))
        release_id = rel.id
    answers: list[str] = []
    t = threading.Thread(target=lambda: answers.append(
        watch_release(settings, release_id, wait=3600, registry=reg).builds[0]["state"]), daemon=True)
    t.start()
    # The executor's transitions, each published after its commit (whatever the watcher has read
    # by then, one of them comes after its subscription, or it read the final state).
    with db.session() as s:
        lease = states.claim(s, build_id, owner="w", lease_seconds=60, max_attempts=3).lease
    assert lease is not None
    Publisher(None).publish(build_id, "running")
    with db.session() as s:
        insert_artifact(s, build_id, manifest_digest=digest("manifest"), manifest_size=1, ctx_model="m_ctx.onnx",
                        files=[{"name": "m_ctx.onnx", "role": "ctx-model", "digest": digest("ctx"), "size": 1,
                                "mediaType": "x"}], ep_sdk_version=None, compile_seconds=1.0, nodes_ep=1,
                        nodes_cpu=0)
        states.succeed(s, lease, log="ok")
    Publisher(None).publish(build_id, "succeeded")
    t.join(60)  # liveness bound only: without an event the long poll would hold for an hour
    assert not t.is_alive() and answers and answers[0] in ("running", "succeeded")


def test_next_events_names_the_builds_that_changed() -> None:
    with Subscription(None) as sub:
        Publisher(None).publish(7, "running")
        Publisher(None).publish(9, "succeeded")
        assert sub.next_events(0.0) == {7, 9}
        assert sub.next_events(0.05) == set()  # none came
        t = threading.Timer(0.05, Publisher(None).publish, args=(3, "failed"))
        t.start()
        try:
            assert sub.next_events(60) == {3}
        finally:
            t.join()
