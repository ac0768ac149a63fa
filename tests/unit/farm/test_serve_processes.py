"""How many processes `farm serve` runs (issue 33): one per core with PostgreSQL, exactly one with
SQLite (one writer), the long-poll gauge under several processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.cli.service_cmd import available_cores, serve_processes
from farm.core.errors import UsageError
from farm.core.settings import Settings

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _settings(tmp_path: Path, db: str | None = None) -> Settings:
    return Settings.from_env({"FARM_HOME": str(tmp_path), **({"FARM_DATABASE_URL": db} if db else {})})


def test_postgres_defaults_to_the_cores(tmp_path: Path) -> None:
    s = _settings(tmp_path, PG)
    assert serve_processes(None, s, cores=6) == 6
    assert serve_processes(None, s) == available_cores() >= 1
    assert serve_processes(3, s, cores=6) == 3  # asked for: taken as asked


def test_sqlite_runs_one_process_and_refuses_more(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    assert serve_processes(None, s, cores=8) == 1
    assert serve_processes(1, s, cores=8) == 1
    with pytest.raises(UsageError) as e:
        serve_processes(4, s, cores=8)
    assert "SQLite" in e.value.message and "PostgreSQL" in (e.value.hint or "")


@pytest.mark.parametrize("asked", [0, -2])
def test_workers_below_one_is_a_usage_error(tmp_path: Path, asked: int) -> None:
    with pytest.raises(UsageError):
        serve_processes(asked, _settings(tmp_path, PG))


def test_cpu_quota_caps_the_cores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    real_open = builtins.open

    def fake_open(path: object, *a: object, **k: object) -> object:
        if path == "/sys/fs/cgroup/cpu.max":
            f = tmp_path / "cpu.max"
            f.write_text(quota)
            return real_open(f, *a, **k)  # type: ignore[call-overload]
        return real_open(path, *a, **k)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(16)))
    for quota, cores in (("max 100000\n", 16), ("200000 100000\n", 2), ("150000 100000\n", 2),
                         ("50000 100000\n", 1), ("garbage\n", 16)):
        assert available_cores() == cores, quota


def test_long_poll_gauge_is_written_on_change_under_several_processes(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.api.longpoll import LongPolls
    from farm.api.metrics import Metrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    settings = _settings(tmp_path)
    metrics = Metrics(settings, None)  # type: ignore[arg-type]
    polls = LongPolls(settings, None)  # type: ignore[arg-type]
    seen: list[int] = []
    metrics.watch_long_polls(polls)
    assert polls.on_count is not None
    polls.on_count = lambda n, set_=polls.on_count: (seen.append(n), set_(n))
    with polls.slot("tok"):
        with polls.slot("tok"):
            assert seen[-1] == 2
    assert seen == [1, 2, 1, 0]
    polls.close()
