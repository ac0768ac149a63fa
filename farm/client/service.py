"""``Client``: one service's HTTP API as a device or a pipeline uses it (the transport, its
uploads and its downloads on one connection setting), and ``wait_release``, the pipeline's
long poll of a release."""

from __future__ import annotations

import time
from typing import Any

from farm.client import shapes
from farm.client.downloads import Downloads
from farm.client.transport import HINT_SERVER
from farm.client.uploads import Uploads
from farm.core.errors import ServerError


class Client(Uploads, Downloads):
    """``Client(server, token, timeout=60.0)``: see ``Transport``, ``Uploads``, ``Downloads``."""


def wait_release(client: Client, release_id: int, *, timeout: float | None = None, poll: float = 1.0,
                 long_poll: float = 25.0, on_change: Any = None) -> Any:
    """Until the release is done. Each request is a long poll (``?wait=``): the service answers
    when a build changes, so nothing sleeps between answers; ``poll`` paces only a service that
    answers at once without change (one that predates the long poll)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: Any = None
    while True:
        wait = long_poll if deadline is None else max(min(long_poll, deadline - time.monotonic()), 0.0)
        asked = time.monotonic()
        st = shapes.conform(client.json("GET", f"/v1/releases/{release_id}", wait=f"{wait:.1f}"), shapes.RELEASE,
                            f"the answer for release {release_id}", ServerError, HINT_SERVER)
        if on_change is not None:  # every answer: the caller shows what changed (farm submit --wait)
            on_change(st)
        if st.get("done"):
            return st
        if deadline is not None and time.monotonic() > deadline:
            from farm.core.errors import CompileTimeoutError

            raise CompileTimeoutError(f"release {release_id} not finished after {timeout:g} s")
        seen = [(b.get("build"), b.get("state"), b.get("attempts")) for b in st["builds"]]
        if seen == last and time.monotonic() - asked < min(poll, wait):
            time.sleep(poll)
        last = seen
