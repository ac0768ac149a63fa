"""Real services for integration tests: SeaweedFS (S3) started on free loopback ports,
PostgreSQL (the machine's, or our own when none runs), Redis likewise. Every process we start
is stopped by its PID at the end of the session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.core.settings import Settings
from infra.devfarm.services import Service, reachable, start_postgres, start_redis, start_seaweedfs


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session", autouse=True)
def _aws_credentials() -> Iterator[None]:
    # SeaweedFS without an IAM config accepts any key pair; boto3 insists on having one.
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ["AWS_ACCESS_KEY_ID"] = "ctxfarm-test"
    os.environ["AWS_SECRET_ACCESS_KEY"] = "ctxfarm-test-secret"
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    yield svc
    svc.stop()


@pytest.fixture
def s3_url(seaweedfs: Service) -> str:
    """A fresh prefix per test in one bucket (SeaweedFS gives every bucket its own volumes: a
    bucket per test would run a small disk out of volume slots)."""
    return f"s3://ctxfarm-test/{uuid.uuid4().hex[:12]}?endpoint={seaweedfs.url}"


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (no database) of a PostgreSQL: the machine's on 5432, or one we start."""
    if reachable("127.0.0.1", 5432):
        yield "postgresql+psycopg://postgres@127.0.0.1:5432"
        return
    svc = start_postgres(tmp_path_factory.mktemp("pg"))
    yield svc.url.rsplit("/", 1)[0]
    svc.stop()


class PgDatabases:
    """Test databases on one PostgreSQL server: each a copy of a template migrated to head once
    (``CREATE DATABASE ... TEMPLATE``: 0.1-0.4 s, where running the migrations on each test's
    database took 1.2-1.8 s), each dropped on a thread of its own (a DROP waits 1-2 s for the
    server's writes, which the next test need not wait for); every drop is done by ``close``."""

    def __init__(self, server: str):
        from concurrent.futures import Future, ThreadPoolExecutor

        from registry.db import migrate

        self.server = server
        self.admin = server.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
        self.template = f"ctxfarm_tmpl_{uuid.uuid4().hex[:12]}"
        self._sql(f'CREATE DATABASE "{self.template}"')
        # PostgreSQL is never migrated implicitly: the operator's `farm db upgrade` step.
        migrate(f"{server}/{self.template}")
        self._dropper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-drop")
        self._drops: list[Future[None]] = []

    def _sql(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(statement)

    def create(self) -> str:
        name = f"ctxfarm_t_{uuid.uuid4().hex[:12]}"
        self._sql(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return name

    def drop_later(self, name: str) -> None:
        self._drops.append(self._dropper.submit(self._sql, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        self._dropper.shutdown(wait=True)
        self._sql(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
        for done in self._drops:
            done.result()  # a drop that failed says so: a database left behind


@pytest.fixture(scope="session")
def pg_databases(pg_server: str) -> Iterator[PgDatabases]:
    dbs = PgDatabases(pg_server)
    try:
        yield dbs
    finally:
        dbs.close()


@pytest.fixture
def pg_url(pg_databases: PgDatabases) -> Iterator[str]:
    """A fresh database per test, at the migrations' head, dropped afterwards."""
    name = pg_databases.create()
    yield f"{pg_databases.server}/{name}"
    pg_databases.drop_later(name)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private redis-server (own port) so tests never touch the machine's data."""
    svc = start_redis(tmp_path_factory.mktemp("redis"))
    yield svc.url
    svc.stop()


@pytest.fixture(params=["sqlite+local", "postgres+s3"])
def cluster_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """The same registry code on the embedded stack and on PostgreSQL + S3 (SeaweedFS)."""
    env = {"FARM_HOME": str(tmp_path / "farm-home")}
    if request.param == "postgres+s3":
        env["FARM_DATABASE_URL"] = request.getfixturevalue("pg_url")
        env["FARM_STORE_URL"] = request.getfixturevalue("s3_url")
    return Settings.from_env(env)


@pytest.fixture
def cluster_env(cluster_settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(cluster_settings.home)
    env["FARM_DATABASE_URL"] = cluster_settings.database_url
    env["FARM_STORE_URL"] = cluster_settings.store_url
    return env
