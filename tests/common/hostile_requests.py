"""Hostile HTTP requests against a real service: every route of the app, enumerated
from it (a route added later is covered without touching the tests), a path that matches it, a
body sent over a raw socket (declared or chunked) while the answer is read, and the service's
peak memory from /proc."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path
from typing import Any

# A value of the right shape for each path parameter of the service's routes.
PATH_VALUES = {"digest": "sha256:" + "0" * 64, "ref": "sha256:" + "0" * 64, "upload": "0" * 32, "name": "x",
               "tag": "t"}
CHUNK = 64 * 1024


def route_requests(app: Any) -> list[tuple[str, str]]:
    """(method, path) for every route and method of ``app`` (HEAD aside: GET covers it)."""
    from farm.api.deps import app_routes

    out: set[tuple[str, str]] = set()
    for route in app_routes(app):
        path = re.sub(r"\{(\w+)(:\w+)?\}", lambda m: PATH_VALUES.get(m.group(1), "1"), route.path)
        out.update((method, path) for method in route.methods or () if method != "HEAD")
    return sorted(out)


def send(port: int, method: str, path: str, headers: dict[str, str], size: int, *, chunked: bool,
         timeout: float = 60) -> tuple[int, bytes]:
    """Send the head, then up to ``size`` bytes of body (declared with Content-Length, or chunked),
    stopping as soon as the answer comes: (status, answer bytes); status 0: no answer."""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {size}\r\n"
    answered = threading.Event()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall((head + "\r\n").encode())

        def body() -> None:
            piece = b"{" * CHUNK  # JSON-ish, so a route that parses it has something to chew on
            sent = 0
            try:
                while sent < size and not answered.is_set():
                    n = min(CHUNK, size - sent)
                    sock.sendall(f"{n:x}\r\n".encode() + piece[:n] + b"\r\n" if chunked else piece[:n])
                    sent += n
                if chunked and not answered.is_set():
                    sock.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the service answered and closed: what we wanted

        sender = threading.Thread(target=body, daemon=True)
        sender.start()
        data = b""
        try:
            while True:
                got = sock.recv(65536)
                if not got:
                    break
                data += got
                front, sep, rest = data.partition(b"\r\n\r\n")
                length = re.search(rb"(?im)^content-length: *(\d+)", front)
                if sep:
                    answered.set()
                if sep and length and len(rest) >= int(length.group(1)):
                    break
        except OSError:
            pass
        answered.set()
        sender.join(timeout)
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", data)
    return (int(m.group(1)) if m else 0), data


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def reset_peak(pid: int) -> float:
    """Reset the process's peak RSS to its current RSS (``clear_refs`` 5); that value, MiB."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return peak_rss_mib(pid)
