"""The real HTTP service in this process (create_app under uvicorn, in a thread), with a
counting middleware in front: what reached each route, in requests and body bytes."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from farm.core.settings import Settings
from tests.common.service import token


class Counting:
    """ASGI middleware: requests and body bytes per (method, path); a digest or an upload
    session id in the path is counted as ``DIGEST`` or ``ID``."""

    def __init__(self, app: Any):
        self.app = app
        self.hits: dict[tuple[str, str], int] = {}
        self.bytes: dict[tuple[str, str], int] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path.startswith("/v1/models/sha256:"):
            path = "/v1/models/DIGEST"
        elif path.startswith("/v1/uploads/"):  # an upload session: /v1/uploads/ID[/complete]
            path = "/v1/uploads/ID" + path[len("/v1/uploads/") + 32:]
        key = (scope["method"], path)
        self.hits[key] = self.hits.get(key, 0) + 1

        async def counted() -> Any:
            msg = await receive()
            if msg["type"] == "http.request":
                self.bytes[key] = self.bytes.get(key, 0) + len(msg.get("body", b""))
            return msg

        return await self.app(scope, counted, send)


@contextmanager
def running_service(settings: Settings) -> Iterator[dict[str, Any]]:
    """``{"url", "counting", "token"}`` (a submit token) while the service runs."""
    import uvicorn

    from farm.api.app import create_app

    counting = Counting(create_app(settings))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(counting, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "counting": counting,
               "token": token(settings, "ci", "submit")}
    finally:
        server.should_exit = True
        t.join(10)
        # The service's embedded runner warmed compile hosts in this process (pool_for): end them
        # with the service, so a host sized by this service's compiles (its standby's learned
        # heap) is not what the next test's jobs fork from.
        from workers.host import shutdown

        shutdown()
