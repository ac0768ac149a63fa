"""`farm install --report`: a report that can't be sent, or won't be (this
x86_64 host is the simulator), never turns a good install into a failure: the exit status and
stdout stay as without --report, a warning on stderr says why."""

from __future__ import annotations

import socket
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.cli import main


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """``farm.client.install`` answering a good install (the install itself is tested elsewhere)."""
    import farm.client

    ctx = tmp_path / "dest" / "model_ctx.onnx"

    def install(*_a: Any, **_k: Any) -> Any:
        return types.SimpleNamespace(artifact="sha256:" + "a" * 64, ctx_model=ctx, files=[ctx], bytes=10,
                                     resumed_bytes=0, signed_by=None, downloaded_bytes=10, reused_bytes=0,
                                     stages=[])

    monkeypatch.setattr(farm.client, "install", install)
    return ctx


@pytest.fixture
def hanging_server() -> Iterator[str]:
    """Accepts connections and reads, never answers (a report endpoint that hangs)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()


ARGS = ["install", "--model", "m:v1", "--soc", "SM8650", "--qnn", "2.51.0", "--token", "cfk_read"]


def test_a_hanging_report_endpoint_is_a_warning(installed: Path, hanging_server: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
                                                ) -> None:
    import farm.cli.report_cmd as report_cmd
    from farm.client_report import make_report, send

    def install_report(args: Any, result: Any, qnn: str | None) -> dict[str, Any]:
        # The real client against the hanging endpoint (the load check is the runner's, tested there).
        body = make_report(artifact=result.artifact, soc="SM8650", runtime_version="2.51.0", outcome="loads",
                           onnxruntime="1.31.1", device="d1", arch="aarch64")
        return send(args.server, "cfk_report", body, timeout=0.5)

    monkeypatch.setattr(report_cmd, "install_report", install_report)
    base = [*ARGS, "--server", hanging_server, "--dest", str(tmp_path / "dest")]
    assert main(base) == 0
    plain = capsys.readouterr()
    started = time.monotonic()
    assert main([*base, "--report"]) == 0
    got = capsys.readouterr()
    assert time.monotonic() - started < 10
    assert got.out == plain.out == f"{installed}\n"
    assert "warning: the report was not sent (server-error)" in got.err
    assert main([*base, "--report", "--json"]) == 0
    assert '"report"' not in capsys.readouterr().out


def test_on_the_simulator_host_install_says_it_wont_report(installed: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import farm.client_report

    monkeypatch.setattr(farm.client_report.platform, "machine", lambda: "x86_64")
    assert main([*ARGS, "--server", "http://127.0.0.1:9", "--dest", str(tmp_path / "d"), "--report"]) == 0
    got = capsys.readouterr()
    assert got.out == f"{installed}\n"
    assert "not reporting: this host is x86_64" in got.err and "simulator" in got.err
