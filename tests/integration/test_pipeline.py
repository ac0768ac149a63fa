"""The one pipeline for real: embedded builds interrupted and killed, the claim race on two real
PostgreSQL connections, SQLite transactions, first use of a fresh FARM_HOME under concurrency,
schema policy, and broken artifacts rebuilt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from farm.core.settings import Settings
from farm.pipeline import states
from farm.pipeline.plan import build
from registry.db import Database
from registry.index import Registry, find_artifact, record_model, set_tag
from registry.models import Build, Model, Tag
from tests.common.cli import farm
from tests.common.index_rows import add_model, spec
from tests.common.onnx_models import conv_relu_add, light
from tests.common.procs import alive, compile_children, recorded_states, wait_for


def row_of(settings: Settings) -> dict[str, object]:
    from sqlalchemy import select

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            rows = [(b.id, b.state, b.attempts, b.error_code, b.started_at) for b in s.scalars(select(Build))]
    finally:
        reg.close()
    if not rows:
        return {}
    (bid, state, attempts, code, started) = rows[0]
    return {"id": bid, "state": state, "attempts": attempts, "code": code, "started": started}


def start_build(env: dict[str, str], model: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "farm.cli", "build", str(model), "-t", "qnn:SM8650"], env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def test_sigterm_of_farm_build_releases_and_the_next_build_takes_over_at_once(settings: Settings,
                                                                               farm_env: dict[str, str],
                                                                               tmp_path: Path) -> None:
    proc = start_build(farm_env, light("vgg19"), tmp_path / "first.log")
    children = wait_for(lambda: compile_children(proc.pid), 60)
    assert children, (tmp_path / "first.log").read_text()
    (child,) = children
    # The compile starts before the build is recorded (farm.pipeline.early): once it is claimed.
    assert wait_for(lambda: recorded_states(settings.home) == ["running"], 60)
    work_dir = Path(os.readlink(f"/proc/{child}/cwd"))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 130
    out = (tmp_path / "first.log").read_text()
    assert "error[interrupted]" in out and "Traceback" not in out
    assert wait_for(lambda: not alive(child), 5), "the compile child outlived farm build"
    assert not work_dir.exists(), "the temp dir was left behind"
    row = row_of(settings)
    assert (row["state"], row["attempts"], row["code"]) == ("queued", 0, "interrupted")
    # The next build starts compiling at once: no lease to wait out.
    t0 = time.monotonic()
    nxt = start_build(farm_env, light("vgg19"), tmp_path / "second.log")
    assert wait_for(lambda: row_of(settings)["state"] == "running", 30)
    took = time.monotonic() - t0
    assert took < 10, f"the next build waited {took:.1f} s"
    assert nxt.wait(timeout=180) == 0, (tmp_path / "second.log").read_text()
    assert row_of(settings)["state"] == "succeeded" and row_of(settings)["attempts"] == 1


def test_sigkill_of_farm_build_kills_its_compile_and_the_lease_lapses(settings: Settings, farm_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    env = {**farm_env, "FARM_LEASE_SECONDS": "3"}
    proc = start_build(env, light("vgg19"), tmp_path / "first.log")
    (child,) = wait_for(lambda: compile_children(proc.pid), 60)
    assert wait_for(lambda: recorded_states(settings.home) == ["running"], 60)  # claimed
    proc.kill()
    proc.wait()
    assert wait_for(lambda: not alive(child), 5), "the compile child outlived its killed parent"
    time.sleep(3.5)  # the lease lapses: nobody renews it
    status = farm(env, "status", "--build", str(row_of(settings)["id"])).stdout
    assert "lease expired, waiting for a worker" in status
    again = farm(env, "build", str(light("vgg19")), "-t", "qnn:SM8650", "--json", timeout=240)
    out = json.loads(again.stdout)
    assert out["builds"][0]["state"] == "built"
    assert row_of(settings)["attempts"] == 2


def test_claim_race_on_two_real_postgresql_connections(pg_url: str) -> None:
    """Two executors on their own connections enqueue and claim the same key at the same time:
    exactly one inserts, exactly one runs (no monkeypatching: the UNIQUE key and the guarded
    UPDATE decide)."""
    db = Database(pg_url)
    try:
        with db.session() as s:
            model = add_model(s, "race").digest
        barrier = threading.Barrier(2)
        results: dict[str, list[object]] = {"enqueue": [], "claim": []}

        def racer(name: str) -> None:
            barrier.wait()
            with db.session() as s:
                results["enqueue"].append(states.enqueue(s, spec(model), "q"))
            build_id = results["enqueue"][-1][0]  # type: ignore[index]
            barrier.wait()
            with db.session() as s:
                results["claim"].append(states.claim(s, build_id, owner=name, lease_seconds=60, max_attempts=3).action)

        threads = [threading.Thread(target=racer, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        ids = {bid for bid, _ in results["enqueue"]}  # type: ignore[misc]
        assert len(ids) == 1
        assert sorted(q for _, q in results["enqueue"]) == [False, True]  # type: ignore[misc]
        assert sorted(results["claim"]) == ["busy", "run"]  # type: ignore[type-var]
    finally:
        db.dispose()


def test_sqlite_rollback_undoes_savepoints_too(settings: Settings) -> None:
    """With the driver's own transaction handling a SAVEPOINT committed on RELEASE; with the
    documented recipe, rolling the session back removes the model recorded in it."""
    from sqlalchemy import func, select

    from tests.common.index_rows import digest

    db = Database(settings.database_url)
    try:
        with pytest.raises(RuntimeError), db.session() as s:
            record_model(s, digest=digest("rolled"), onnx_digest=digest("rolled.onnx"), size=1, files=[], name="r")
            set_tag(s, "r", "latest", digest("rolled"))
            raise RuntimeError("abort the transaction")
        with db.session() as s:
            assert s.scalar(select(func.count()).select_from(Model)) == 0
            assert s.scalar(select(func.count()).select_from(Tag)) == 0
    finally:
        db.dispose()


def test_sixteen_commands_on_a_fresh_farm_home(tmp_path: Path, farm_env: dict[str, str]) -> None:
    env = {**farm_env, "FARM_HOME": str(tmp_path / "fresh")}
    procs = [subprocess.Popen([sys.executable, "-m", "farm.cli", "ls", "--json"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL) for _ in range(16)]
    outs = [(p.wait(timeout=120), p.stdout.read().decode(), p.stderr.read().decode()) for p in procs]  # type: ignore[union-attr]
    failed = [o for o in outs if o[0] != 0]
    assert not failed, failed[:2]
    assert all(json.loads(o[1]) == [] for o in outs)


def test_postgresql_is_never_migrated_implicitly(tmp_path: Path, pg_server: str, farm_env: dict[str, str]) -> None:
    import uuid

    import psycopg

    name = f"ctxfarm_s_{uuid.uuid4().hex[:10]}"
    admin = pg_server.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {**farm_env, "FARM_DATABASE_URL": f"{pg_server}/{name}"}
        stale = farm(env, "ls", check=False)
        assert stale.returncode == 1 and "error[schema-mismatch]" in stale.stderr and "farm db upgrade" in stale.stderr
        assert "Traceback" not in stale.stderr
        with psycopg.connect(admin.rsplit("/", 1)[0] + f"/{name}") as conn:
            tables = conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema='public'").fetchone()
        assert tables == (0,), "a command created tables on PostgreSQL"
        from registry.db import SCHEMA_HEAD

        assert f"schema at {SCHEMA_HEAD}" in farm(env, "db", "upgrade").stdout
        assert farm(env, "ls", "--json").stdout.strip() == "[]"
        again = farm(env, "db", "upgrade").stdout  # at head: nothing to do
        assert f"schema at {SCHEMA_HEAD} (head {SCHEMA_HEAD})" in again and "was" not in again, again
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_newer_schema_is_refused(settings: Settings, farm_env: dict[str, str]) -> None:
    from sqlalchemy import text

    db = Database(settings.database_url)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    db.dispose()
    proc = farm(farm_env, "ls", check=False)
    assert proc.returncode == 1 and "error[schema-mismatch]" in proc.stderr and "newer" in proc.stderr


def test_broken_artifact_is_rebuilt_and_repair_clears_a_restored_one(settings: Settings, farm_env: dict[str, str],
                                                                     tmp_path: Path) -> None:
    model = conv_relu_add(tmp_path / "m.onnx", seed=11)
    (first,) = build(settings, model, ["qnn:SM8650"], name="m").outcomes
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            art = find_artifact(s, first.artifact or "")
            bin_digest = next(f.digest for f in art.files if f.role == "context")
        blob = reg.store.path_of(bin_digest)  # type: ignore[attr-defined]
        good = blob.read_bytes()
        blob.chmod(0o644)
        blob.write_bytes(b"corrupt" + good[7:])
        assert farm(farm_env, "registry", "verify", "--repair", check=False).returncode == 1
        # Restored blob: repair clears the mark, resolve serves it again.
        blob.write_bytes(good)
        out = farm(farm_env, "registry", "verify", "--repair").stdout
        assert "cleared the broken mark of 1 artifact" in out
        assert farm(farm_env, "resolve", "--model", "m", "--soc", "SM8650", "--qnn", "2.51.0").returncode == 0
        # Broken again and not restored: the next build compiles and replaces it.
        blob.write_bytes(b"corrupt" + good[7:])
        farm(farm_env, "registry", "verify", "--repair", check=False)
        assert farm(farm_env, "resolve", "--model", "m", "--soc", "SM8650", "--qnn", "2.51.0",
                    check=False).returncode == 3
        (second,) = build(settings, model, ["qnn:SM8650"], name="m").outcomes
        assert second.state == "built" and second.build_id == first.build_id
        res = json.loads(farm(farm_env, "resolve", "--model", "m", "--soc", "SM8650", "--qnn", "2.51.0",
                              "--json").stdout)
        assert res["artifact"] == second.artifact != first.artifact
        assert farm(farm_env, "registry", "verify").returncode == 0
    finally:
        reg.close()
