"""The device client's ranged downloads against a real `farm serve` holding a real QNN build, its
blobs in SeaweedFS (presigned S3 GETs, ranges straight from the store) or in the embedded store
(the service's own blob route): ranges fetched, the whole verified; a re-install of an up-to-date
destination moves no byte (the client's counters, the service's ``bytes_served`` metric, the
requests a proxy saw); a download cut mid-range by the network resumes only what is missing.

Between the client and whatever serves the bytes sits a loopback TCP proxy (``_Proxy``) that
counts the bytes it forwards and can cut a connection after a given number: a real interruption
of a real transfer. For S3 the store's endpoint *is* the proxy, so presigned URLs point at it."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import farm.client.downloads
from farm.client import install
from farm.core.errors import FarmError
from farm.core.settings import Settings
from infra.devfarm.services import Service
from tests.common.onnx_models import matmul_add, save
from tests.common.service import serve, token

PART = 32 << 10


class _Proxy:
    """Forwards loopback connections to ``upstream`` (host, port), counting the bytes sent back;
    ``cut_after`` (when set) closes the connection that has sent that many bytes back, once."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.down = 0  # bytes forwarded to clients
        self.connections = 0
        self.cut_after: int | None = None
        self.cut = 0
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            upstream = socket.create_connection(self.upstream, timeout=30)
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if down:
                    with self.lock:
                        limit = self.cut_after
                        if limit is not None and sent + len(data) >= limit:
                            data = data[:limit - sent]
                            self.cut_after, self.cut = None, self.cut + 1
                            dst.sendall(data)
                            self.down += len(data)
                            raise ConnectionAbortedError  # cut: both sides closed below
                        self.down += len(data)
                sent += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.closed = True
        self.sock.close()


@pytest.fixture(params=["s3", "local"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`farm serve` with one real QNN build whose context binary is larger than a few ranges;
    the proxy in front of the store (s3: presigned GETs go through it) or of the service."""
    from farm.pipeline.plan import build

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(home)
    proxy = None
    if request.param == "s3":
        seaweed: Service = request.getfixturevalue("seaweedfs")
        host, port = seaweed.url.removeprefix("http://").split(":")
        proxy = _Proxy((host, int(port)))
        # compress=0: every blob as it is, so every GET of a blob is a presigned S3 GET.
        env["FARM_STORE_URL"] = (f"s3://ctxfarm-test/{os.urandom(6).hex()}?endpoint=http://127.0.0.1:{proxy.port}"
                                 "&compress=0")
    settings = Settings.from_env(env)
    proto = matmul_add(seed=33, size=512)  # 1 MiB of random weights: a binary of several ranges
    proto.ir_version = 8
    model = save(proto, home / "m.onnx")
    (outcome,) = build(settings, model, ["qnn:SM8650"], name="big", tag="stable").outcomes
    assert outcome.state == "built", outcome
    read = token(settings, "device", "read")
    port = _free_port()
    proc = serve(env, port, home / "serve.log")
    if proxy is None:
        proxy = _Proxy(("127.0.0.1", port))
        url = f"http://127.0.0.1:{proxy.port}"
    else:
        url = f"http://127.0.0.1:{port}"
    try:
        yield {"url": url, "service": f"http://127.0.0.1:{port}", "token": read, "proxy": proxy,
               "kind": request.param, "artifact": outcome.artifact}
    finally:
        proxy.close()
        proc.terminate()
        proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _served(service: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"{service}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("ctxfarm_blob_bytes_served_total"))


def _ranged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(farm.client.downloads, "RANGE_PART", PART)  # read where a download is planned
    monkeypatch.setattr(farm.client.downloads, "RANGED_FROM", 2 * PART)


def test_ranged_install_and_a_reinstall_that_moves_nothing(live: dict[str, Any], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _ranged(monkeypatch)
    proxy: _Proxy = live["proxy"]
    dest = tmp_path / "device" / "big"
    got = install(live["url"], live["token"], "big:stable", soc="SM8650", qnn="2.51.0", dest=dest, connections=4)
    sizes = {p.name: p.stat().st_size for p in got.files}
    biggest = max(sizes.values())
    assert biggest >= 4 * PART, sizes  # the binary comes in several ranges
    assert got.downloaded_bytes == got.bytes == sum(sizes.values()) and got.reused_bytes == 0
    assert proxy.down >= biggest and proxy.connections >= 4  # the bytes came through the proxy, in ranges
    for p in got.files:  # each file is what the manifest names (the client verified it; so do we)
        assert hashlib.sha256(p.read_bytes()).hexdigest() in {f.removeprefix("sha256:") for f in _digests(live)}
    served, down, conns = _served(live["service"]), proxy.down, proxy.connections
    before = {p: (os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in got.files}
    again = install(live["url"], live["token"], "big:stable", soc="SM8650", qnn="2.51.0", dest=dest, connections=4)
    assert again.downloaded_bytes == 0 and again.reused_bytes == again.bytes
    # The service streamed no file byte: the manifest at most (none where it redirects to S3).
    assert _served(live["service"]) - served <= _resolve(live)["manifest_size"] < biggest
    assert {p: (os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in again.files} == before
    # Through the proxy: the manifest (the service reads it from the store; the client asks for
    # it), the resolve answer where the proxy fronts the service; no file.
    assert proxy.down - down < 32 << 10 < biggest and proxy.connections - conns <= 4
    assert sorted(os.listdir(dest.parent)) == ["big"]


def _resolve(live: dict[str, Any]) -> dict[str, Any]:
    from farm.client import Client

    res: dict[str, Any] = Client(live["url"], live["token"]).json("GET", "/v1/resolve", model="big:stable",
                                                                  soc="SM8650", qnn="2.51.0")
    return res


def _digests(live: dict[str, Any]) -> list[str]:
    return [f["digest"] for f in _resolve(live)["files"]]


def test_a_ranged_download_cut_by_the_network_resumes(live: dict[str, Any], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _ranged(monkeypatch)
    proxy: _Proxy = live["proxy"]
    dest = tmp_path / "device" / "big"
    partial = dest.parent / ".big.ctxfarm-partial"
    proxy.cut_after = PART // 2 + 3000  # a connection cut in the middle of its (first) range
    with pytest.raises(FarmError) as exc:
        install(live["url"], live["token"], "big:stable", soc="SM8650", qnn="2.51.0", dest=dest, connections=2)
    assert proxy.cut == 1 and exc.value.code == "server-error" and "resumes" in (exc.value.hint or "")
    assert not dest.exists()
    kept = {p.name: farm.client.kept_bytes(p, 1 << 40) for p in partial.iterdir() if not p.name.endswith(".ranges")}
    assert any(kept.values()), kept
    got = install(live["url"], live["token"], "big:stable", soc="SM8650", qnn="2.51.0", dest=dest, connections=2)
    assert got.resumed_bytes == sum(kept.values()) and got.resumed_bytes > 0
    assert got.downloaded_bytes == got.bytes - got.resumed_bytes
    digests = {f.removeprefix("sha256:") for f in _digests(live)}
    assert all(hashlib.sha256(p.read_bytes()).hexdigest() in digests for p in got.files)
    assert sorted(os.listdir(dest.parent)) == ["big"]
