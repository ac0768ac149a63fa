"""The CLI's fast paths on the real stacks (SQLite + local dir; PostgreSQL + SeaweedFS) with real
QNN compiles: a cached `farm build` and `farm resolve` answer from the index over a bare
connection (psycopg2 on PostgreSQL, no SQLAlchemy, no onnx), a changed model is compiled again,
and an index at another schema revision still says schema-mismatch."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from alembic import command

from farm.core.settings import Settings
from registry.db import Database, alembic_config
from registry.lite import open_index
from registry.resolve import Device, resolve
from tests.common import cli
from tests.common.cli import heavy, modules
from tests.common.onnx_models import conv_relu_add


def farm(env: dict[str, str], *args: str, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    return cli.farm(env, *args, check=False, importtime=importtime)


def test_cached_build_and_resolve_from_the_shell(cluster_settings: Settings, cluster_env: dict[str, str],
                                                 tmp_path: Path) -> None:
    model = conv_relu_add(tmp_path / "net.onnx", seed=11, external=True)
    args = ["build", str(model), "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--name", "net", "--tag", "stable", "--json"]
    first = farm(cluster_env, *args)
    assert first.returncode == 0, first.stderr
    built = json.loads(first.stdout)["builds"]
    assert [b["state"] for b in built] == ["built", "built"]

    again = farm(cluster_env, *args, importtime=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert [(b["state"], b["artifact"]) for b in json.loads(again.stdout)["builds"]] == [
        ("cached", b["artifact"]) for b in built]
    found = modules(again.stderr)
    assert "farm.pipeline.cached" in found and heavy(found) == []
    postgres = cluster_settings.database_url.startswith("postgresql")
    assert ("psycopg2" in found) == postgres and ("sqlite3" in found) == (not postgres)

    res = farm(cluster_env, "resolve", "-m", "net:stable", "--soc", "SM8750", "--qnn", built[1]["toolchain"], "--json",
               importtime=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["artifact"] == built[1]["artifact"]
    assert heavy(modules(res.stderr)) == []

    # The same file name, other weights (the external data file rewritten): compiled again.
    conv_relu_add(tmp_path / "net.onnx", seed=12, external=True)
    changed = farm(cluster_env, *args[:-3], "--json")
    assert changed.returncode == 0, changed.stderr
    rebuilt = json.loads(changed.stdout)["builds"]
    assert [b["state"] for b in rebuilt] == ["built", "built"]
    assert {b["artifact"] for b in rebuilt}.isdisjoint(b["artifact"] for b in built)


def test_cached_submit_from_the_shell_records_the_release(cluster_settings: Settings, cluster_env: dict[str, str],
                                                           tmp_path: Path) -> None:
    """A release whose builds the index answers whole: `farm submit` records it over a bare
    connection (no SQLAlchemy, boto3, Celery), and it reads back as the full path's does."""
    from farm.cli.cluster_cmd import release_json
    from farm.pipeline.plan import release_status, submit_release
    from registry.index import Registry, register_worker
    from workers.runner import Toolchain

    model = conv_relu_add(tmp_path / "net.onnx", seed=13)
    built = farm(cluster_env, "build", str(model), "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--name", "net",
                 "--tag", "stable", "--json")
    assert built.returncode == 0, built.stderr
    sdk = json.loads(built.stdout)["builds"][0]["toolchain"]
    reg = Registry.open(cluster_settings)
    try:
        with reg.db.session() as s:  # a live worker for the toolchain (no broker needed: nothing is sent)
            register_worker(s, name="w1", host="h", pid=1, queues=["q"],
                            toolchain=Toolchain("qnn", sdk, "1", "onnxruntime-qnn", "1"))
    finally:
        reg.close()
    args = ["submit", str(model), "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--name", "net", "--tag", "stable"]
    fast = farm(cluster_env, *args, "--wait", "--json", importtime=True)
    assert fast.returncode == 0, fast.stderr[-2000:]
    doc = json.loads(fast.stdout)
    found = modules(fast.stderr)
    assert "farm.pipeline.cached" in found and heavy(found) == [] and "celery" not in found
    full = submit_release(cluster_settings, model, ["qnn:SM8650", "qnn:SM8750"], [], name="net", tag="stable")
    assert doc == {**release_json(full.release_id, full.model, full.builds), "release": doc["release"]}
    assert doc["ok"] and [b["state"] for b in doc["builds"]] == ["succeeded", "succeeded"]
    again = release_status(cluster_settings, doc["release"])  # through the ORM: the rows are well formed
    assert release_json(again.release_id, again.model, again.builds) == doc
    status = farm(cluster_env, "status", str(doc["release"]), "--json")
    assert status.returncode == 0 and json.loads(status.stdout) == doc

    unserved = farm(cluster_env, *args, "--sdk", "2.47.0")
    assert unserved.returncode != 0 and "error[no-worker]" in unserved.stderr and "Traceback" not in unserved.stderr


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
def test_both_postgres_drivers_read_the_same(pg_url: str, tmp_path: Path, driver: str) -> None:
    from farm.core.catalog import parse_target
    from farm.pipeline.plan import build

    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home"), "FARM_DATABASE_URL": pg_url})
    report = build(settings, conv_relu_add(tmp_path / "m.onnx", seed=13), ["qnn:SM8650"], name="m")
    device = Device("qnn", parse_target("qnn:SM8650"), report.outcomes[0].toolchain)
    index = open_index(pg_url, driver=driver)
    assert index is not None
    try:
        art, verdict = resolve(index, report.model_digest, device)
    finally:
        index.close()
    db = Database(pg_url)
    try:
        with db.session() as s:
            expected, expected_verdict = resolve(s, report.model_digest, device)
    finally:
        db.dispose()
    assert art == expected and verdict == expected_verdict and art.digest == report.outcomes[0].artifact


def test_an_older_postgres_schema_is_schema_mismatch(pg_url: str, tmp_path: Path) -> None:
    import os

    db = Database(pg_url, check=False)
    try:
        command.downgrade(alembic_config(db.engine), "0004")
    finally:
        db.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_HOME=str(tmp_path / "home"), FARM_DATABASE_URL=pg_url)
    assert open_index(pg_url) is None
    for args in (["resolve", "-m", "m:stable", "--soc", "SM8650", "--qnn", "2.51.0"],
                 ["build", str(conv_relu_add(tmp_path / "m.onnx")), "-t", "qnn:SM8650"]):
        proc = farm(env, *args)
        assert proc.returncode != 0 and "error[schema-mismatch]" in proc.stderr and "farm db upgrade" in proc.stderr, (
            args, proc.stderr)
