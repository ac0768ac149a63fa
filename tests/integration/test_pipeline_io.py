"""Pipeline I/O for real: a release waiter woken by the executor's Redis event (its fallback poll
set to an hour), the per-build phases, and the bundle cache across builds of one model."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from farm.core.settings import Settings
from farm.pipeline import states
from farm.pipeline.events import Subscription
from farm.pipeline.execute import Executor
from farm.pipeline.plan import ReleaseStatus, submit_release, wait_release
from infra.devfarm.services import start_redis
from registry.index import Registry
from tests.common.onnx_models import light

HOUR = 3600.0


def test_wait_release_is_woken_by_the_build_event_not_by_polling(tmp_path: Path) -> None:
    redis = start_redis(tmp_path / "redis")  # its own: the messages sent here reach no worker
    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home"), "FARM_BROKER_URL": redis.url})
    reg = Registry.open(settings)
    try:
        st = submit_release(settings, light("squeezenet"), ["qnn:SM8650", "qnn:SM8750"], ["2.51.0"],
                            allow_queue=True, registry=reg)
        assert [b["state"] for b in st.builds] == ["queued", "queued"]
        first_read = threading.Event()
        result: dict[str, Any] = {}

        def waiter() -> None:
            try:
                with Subscription(settings.broker_url) as sub:
                    result["status"] = wait_release(settings, st.release_id, poll=HOUR, timeout=HOUR,
                                                    on_change=lambda _: first_read.set(), events=sub)
                    result["wakeups"] = sub.wakeups
            except BaseException as exc:
                result["error"] = exc

        t = threading.Thread(target=waiter, daemon=True)
        t.start()
        assert first_read.wait(60), "the waiter never read the release"
        # This process is the executor here (as a worker would be): each transition it commits
        # is published on the broker.
        ex = Executor(settings, reg)
        outcomes = [ex.execute(b["build"]).outcome for b in st.builds]
        assert outcomes == ["succeeded", "succeeded"]
        t.join(300)  # liveness bound only: polling alone would have taken an hour
        assert not t.is_alive() and "error" not in result, result
        final: ReleaseStatus = result["status"]
        assert final.done and final.ok
        assert result["wakeups"] >= 1

        with reg.db.session() as s:
            phases: list[dict[str, Any]] = [dict(states.get_build(s, b["build"]).phases or {}) for b in st.builds]
        # One model, two builds, one executor: the bundle came from the store once.
        assert [p["bundle_cache"] for p in phases] == ["miss", "hit"]
        for p in phases:
            assert {"claim", "queued", "dispatch", "bundle_fetch", "child_start", "ep_compile", "self_probe",
                    "collect", "hash", "upload", "sql", "total", "outside_compile"} <= set(p), p
            assert set(p["uploads"]) == {"model_ctx.onnx", "model_ctx_qnn.bin", "build.log", "manifest.json"}
            assert p["outside_compile"] == round(p["total"] - p["ep_compile"], 1)
    finally:
        reg.close()
        redis.stop()


def test_next_events_names_the_builds_published_on_the_broker(redis_server: str) -> None:
    """The service's long-poll feed reads which builds changed (farm.api.longpoll wakes only
    their releases' waiters): every id published on the broker, in one batch when they come
    together; a dropped subscription is None (every waiter reads again)."""
    from farm.pipeline.events import Publisher

    with Subscription(redis_server) as sub:
        assert sub.next_events(0.05) == set()
        pub = Publisher(redis_server)
        pub.publish(11, "running")
        pub.publish(12, "succeeded")
        got: set[int] = set()
        while got != {11, 12}:
            ids = sub.next_events(60)
            assert ids is not None and ids
            got |= ids
        import redis

        redis.Redis.from_url(redis_server).client_kill_filter(_type="pubsub")  # the connection drops
        assert sub.next_events(5) is None
        assert sub.next_events(5) is None  # subscribed again: what happened meanwhile is unknown
        pub.publish(13, "failed")
        assert sub.next_events(60) == {13}
