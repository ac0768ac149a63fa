"""A cached `farm submit` (farm.pipeline.cached.resubmit) on a real PostgreSQL: the unit suite,
written against SQLite, run again here with the release recorded over psycopg2 and over psycopg 3
(JSON matrix, timestamptz, RETURNING), then the CLI from the shell on this index."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from farm.core.settings import Settings
from tests.common.cli import farm, heavy, modules

# The same tests as on SQLite (collected here too: the `settings` below points them at PostgreSQL).
from tests.unit.pipeline.test_cached import (  # noqa: F401
    TARGETS,
    instant_runner,
    live_worker,
    test_resubmit_answers_force_tag_allow_queue_and_the_gate_as_submit_release,
    test_resubmit_raises_what_submit_release_raises,
    test_resubmit_records_what_submit_release_records,
    test_resubmit_steps_aside_and_writes_nothing_unless_every_build_is_final,
)


@pytest.fixture(params=["psycopg2", "psycopg"])
def settings(request: pytest.FixtureRequest, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A fresh PostgreSQL database (local blob dir); the fast path's bare connection on ``driver``."""
    import registry.lite

    monkeypatch.setattr(registry.lite, "open_index", functools.partial(registry.lite.open_index, driver=request.param))
    return Settings.from_env({"FARM_HOME": str(tmp_path / "farm-home"), "FARM_DATABASE_URL": pg_url})


def test_cached_submit_from_the_shell_on_postgres(pg_url: str, tmp_path: Path) -> None:
    from farm.cli.cluster_cmd import release_json
    from farm.pipeline import plan
    from tests.common.onnx_models import matmul_add, save

    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "farm-home"), "FARM_DATABASE_URL": pg_url})
    model = save(matmul_add(seed=3), tmp_path / "m.onnx")
    plan.build(settings, model, TARGETS, name="vision/m", tag="stable")  # the instant runner
    live_worker(settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_HOME=str(settings.home), FARM_DATABASE_URL=pg_url)
    args = ["submit", str(model), *sum((["-t", t] for t in TARGETS), []), "--name", "vision/m", "--tag", "stable"]
    fast = farm(env, *args, "--wait", "--json", check=False, importtime=True)
    assert fast.returncode == 0, fast.stderr[-2000:]
    found = modules(fast.stderr)
    assert "farm.pipeline.cached" in found and "psycopg2" in found
    assert heavy(found) == [] and not {"celery", "kombu", "redis"} & found
    doc = json.loads(fast.stdout)
    full = plan.submit_release(settings, model, TARGETS, [], name="vision/m", tag="stable")
    assert doc == {**release_json(full.release_id, full.model, full.builds), "release": doc["release"]}
    again = plan.release_status(settings, doc["release"])
    assert release_json(again.release_id, again.model, again.builds) == doc
