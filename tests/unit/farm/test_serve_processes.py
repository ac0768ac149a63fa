"""How many processes `farm serve` runs: one per core with PostgreSQL, exactly one with
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


def test_shared_listener_gives_connections_tcp_nodelay() -> None:
    """The processes' shared listener: its accepted connections get TCP_NODELAY from
    asyncio, so a kept-alive answer is not held for the client's delayed ACK (a socket made
    with protocol 0, as uvicorn's own bind_socket makes it, gets none: Kludex/uvicorn#3149)."""
    import asyncio
    import socket

    from farm.cli.service_cmd import listener

    async def nodelay_of(sock: socket.socket) -> int:
        got: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                s = transport.get_extra_info("socket")
                got.set_result(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        port = sock.getsockname()[1]
        _r, w = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(got, 10)
        finally:
            w.close()
            server.close()

    sock = listener("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    assert asyncio.run(nodelay_of(sock)) != 0
    bare = socket.socket(socket.AF_INET)  # what uvicorn.run binds for --workers N
    bare.bind(("127.0.0.1", 0))
    assert asyncio.run(nodelay_of(bare)) == 0  # the defect the listener avoids


def test_a_port_in_use_is_a_clear_error() -> None:
    from farm.cli.service_cmd import listener
    from farm.core.errors import ConfigError

    held = listener("127.0.0.1", 0)
    held.listen()
    with pytest.raises(ConfigError) as e:
        listener("127.0.0.1", held.getsockname()[1])
    assert "can't listen" in e.value.message
    held.close()
