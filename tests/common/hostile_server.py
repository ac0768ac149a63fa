"""A hostile ctxfarm service for device-client tests: a stdlib ``http.server`` on 127.0.0.1 that
answers ``/v1/resolve`` and ``/v1/blobs/<digest>`` from a ``Scenario`` a test (or a case of the
corpus in ``tests/common/hostile_answers.py``) has crafted, or ``/v1/packages`` and the blobs of
an ORT model package from a ``PackageScenario``. It is consistent where a real attacker
would be: a manifest it changed gets its new digest and size in the answer unless a case says
otherwise, so each case tests the one check it is about."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CTX = b"ctx-model " * 300
BIN = bytes(range(256)) * 40
MODEL = "sha256:" + "ab" * 32
SOC, QNN, TOOLCHAIN = "SM8650", "2.51.0", "2.51.0"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass
class Raw:
    """A response sent as is: status, headers, body; ``length`` False sends no Content-Length
    (the body ends when the connection closes)."""

    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    length: bool = True


@dataclass
class Slow:
    """A response that waits ``stall`` seconds before its status line, then sends its body one
    byte every ``per_byte`` seconds (at most ``limit`` seconds in all: the server thread ends)."""

    body: bytes = b"{}"
    stall: float = 0.0
    per_byte: float = 0.0
    limit: float = 10.0


@dataclass
class Scenario:
    """What the hostile service answers. ``manifest`` and ``answer`` are plain data a case
    mutates; ``manifest_bytes`` (when set) replaces the encoded manifest; ``routes`` maps a path
    (``/v1/resolve`` or ``/v1/blobs/<digest>``) to a ``Raw`` or a function of the request."""

    files: dict[str, bytes] = field(default_factory=lambda: {"model_ctx.onnx": CTX, "model_ctx_qnn.bin": BIN})
    manifest: dict[str, Any] = field(default_factory=dict)
    answer: dict[str, Any] = field(default_factory=dict)
    manifest_bytes: bytes | None = None
    blobs: dict[str, bytes] = field(default_factory=dict)
    routes: dict[str, Raw | Slow | Callable[[BaseHTTPRequestHandler], Raw]] = field(default_factory=dict)
    keep_answer_digest: bool = False  # a case that lies about the manifest digest on purpose
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.manifest:
            self.manifest = {
                "schemaVersion": 1, "model": MODEL, "backend": "qnn",
                "target": {"name": SOC, "backend": "qnn"}, "toolchain": {"version": TOOLCHAIN},
                "options": {}, "ctxModel": "model_ctx.onnx",
                "files": [{"name": n, "digest": sha(d), "size": len(d)} for n, d in sorted(self.files.items())],
            }
        for d in self.files.values():
            self.blobs[sha(d)] = d
        if not self.answer:
            data = canonical(self.manifest)
            self.answer = {"artifact": sha(data), "model": MODEL, "backend": "qnn", "target": SOC,
                           "toolchain": TOOLCHAIN, "verdict": "loads", "source": "rule", "reason": "same SoC",
                           "probed_at": None, "manifest_size": len(data), "signatures": [], "files": []}

    def seal(self) -> None:
        """The manifest as bytes under its digest, the answer pointing at it (after a case's
        mutations: a consistent liar)."""
        data = self.manifest_bytes if self.manifest_bytes is not None else canonical(self.manifest)
        if not isinstance(self.answer, dict):
            return
        if not self.keep_answer_digest:
            self.answer["artifact"], self.answer["manifest_size"] = sha(data), len(data)
        if isinstance(self.answer.get("artifact"), str):
            self.blobs[self.answer["artifact"]] = data

    def digest_of(self, name: str) -> str:
        return sha(self.files[name])

    def answer_at(self, path: str, host: str | None) -> Any:
        """The JSON answer at ``path`` (``NOTHING`` where this scenario has none)."""
        if path != "/v1/resolve":
            return NOTHING
        answer = self.answer
        if isinstance(answer, dict) and isinstance(answer.get("artifact"), str) and "manifest_url" not in answer:
            # What a real service adds: URLs the client must not need to trust.
            base = f"http://{host}"
            answer = {**answer, "manifest_url": f"{base}/v1/blobs/{answer['artifact']}",
                      "files": [{**f, "url": f"{base}/v1/blobs/{f.get('digest')}"}
                                for f in self.manifest.get("files", []) if isinstance(f, dict)]
                      if isinstance(self.manifest, dict) and isinstance(self.manifest.get("files"), list)
                      else []}
        return answer


NOTHING = object()
PACKAGE_KIND = "ctxfarm.ort-model-package.v1"


@dataclass
class PackageScenario:
    """An ORT model package as ``GET /v1/packages?ref=`` and the blobs serve it: ``record`` (the
    package record, fetched by its digest) and ``answer`` are plain data a case mutates, sealed
    as ``Scenario``'s are (the answer names the record's new digest and size unless
    ``keep_answer_digest``)."""

    files: dict[str, bytes] = field(default_factory=lambda: {
        "manifest.json": b'{"name": "pk", "components": {}}', "c0/cpu/model.onnx": CTX,
        "c0/v0/model_ctx_qnn.bin": BIN})
    record: dict[str, Any] = field(default_factory=dict)
    answer: dict[str, Any] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    routes: dict[str, Raw | Slow | Callable[[BaseHTTPRequestHandler], Raw]] = field(default_factory=dict)
    keep_answer_digest: bool = False
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        listed = [{"path": n, "digest": sha(d), "size": len(d)} for n, d in sorted(self.files.items())]
        if not self.record:
            self.record = {"kind": PACKAGE_KIND, "mediaType": "application/vnd.ctxfarm.ort-model-package.v1+json",
                           "layoutVersion": 1, "ref": "pk:v1", "model": MODEL, "inputs": "0" * 64, "artifacts": [],
                           "components": [], "directories": ["c0/cpu", "c0/v0"], "files": listed, "evidence": {}}
        for d in self.files.values():
            self.blobs[sha(d)] = d
        if not self.answer:
            data = canonical(self.record)
            self.answer = {"digest": sha(data), "ref": "pk:v1", "model": MODEL, "cached": True,
                           "record_size": len(data), "size": sum(len(d) for d in self.files.values()),
                           "artifacts": [], "components": [], "directories": ["c0/cpu", "c0/v0"], "files": listed,
                           "evidence": {}, "signatures": []}

    def seal(self) -> None:
        data = canonical(self.record)
        if not isinstance(self.answer, dict):
            return
        if not self.keep_answer_digest:
            self.answer["digest"], self.answer["record_size"] = sha(data), len(data)
        if isinstance(self.answer.get("digest"), str):
            self.blobs[self.answer["digest"]] = data

    def answer_at(self, path: str, host: str | None) -> Any:
        return self.answer if path == "/v1/packages" else NOTHING


def ranged(request: BaseHTTPRequestHandler, data: bytes) -> Raw:
    """What an honest server answers a GET of ``data``: 206 with the range asked
    (``bytes=A-B`` or ``bytes=A-``), 200 with everything without one (or for a range past the end)."""
    m = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("Range", "") or "")
    if m and int(m.group(1)) < len(data):
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        return Raw(206, [("Content-Range", f"bytes {start}-{end}/{len(data)}")], data[start:end + 1])
    return Raw(200, [], data)


def _handler(scenario: Scenario | PackageScenario) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            scenario.seen.append((path, {k.lower(): v for k, v in self.headers.items()}))
            route = scenario.routes.get(path)
            if route is not None:
                self._send(route(self) if callable(route) else route)
            elif (answer := scenario.answer_at(path, self.headers.get("Host"))) is not NOTHING:
                self._send(Raw(200, [("Content-Type", "application/json")], json.dumps(answer).encode()))
            elif path.startswith("/v1/blobs/") and path[len("/v1/blobs/"):] in scenario.blobs:
                self._blob(scenario.blobs[path[len("/v1/blobs/"):]])
            else:
                self._send(Raw(404, [("Content-Type", "application/json")],
                               b'{"error": {"code": "not-found", "message": "no such thing"}}'))

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            """As a GET of the same path (a case routes it), the request body read and dropped."""
            length = self.headers.get("Content-Length") or "0"
            self.rfile.read(int(length) if length.isdigit() else 0)
            self.do_GET()

        def _blob(self, data: bytes) -> None:
            self._send(ranged(self, data))

        def _send(self, raw: Raw | Slow) -> None:
            if isinstance(raw, Slow):
                self._slow(raw)
                return
            self.send_response(raw.status)
            for k, v in raw.headers:
                self.send_header(k, v)
            if raw.length:
                self.send_header("Content-Length", str(len(raw.body)))
            else:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            try:
                self.wfile.write(raw.body)
            except (BrokenPipeError, ConnectionResetError):  # the client stopped reading: that's its right
                pass

        def _slow(self, slow: Slow) -> None:
            start = time.monotonic()
            time.sleep(slow.stall)
            try:
                self.send_response(200)
                self.send_header("Content-Length", str(len(slow.body)))
                self.end_headers()
                for i in range(len(slow.body)):
                    if time.monotonic() - start > slow.limit:
                        break
                    self.wfile.write(slow.body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(slow.per_byte)
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

    return Handler


@contextmanager
def hostile_service(scenario: Scenario | PackageScenario) -> Iterator[str]:
    """Serve ``scenario`` on a free loopback port; yields the base URL."""
    scenario.seal()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(scenario))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def fresh() -> Scenario:
    return copy.deepcopy(Scenario())
