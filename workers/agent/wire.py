"""The agent's HTTP: JSON requests to the service with the device's bearer token, bounded reads,
and blob downloads checked against their digest and size. The service is untrusted: every answer
is read up to a cap and its shape checked by the caller; an error body becomes its documented code."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from farm.core.errors import DigestMismatchError, FarmError, ServerError, UsageError, error_for_code

MAX_ANSWER = 1024 * 1024
MAX_ERROR = 16 * 1024
CHUNK = 1024 * 1024


def check_server(server: str) -> str:
    parts = urllib.parse.urlsplit(server or "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--server {str(server)[:80]!r} is not an http(s) URL", hint="e.g. --server http://farm:8080")
    return server.rstrip("/")


def _request(server: str, path: str, token: str | None, payload: Any = None, method: str = "POST") -> Any:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(check_server(server) + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data is not None else {})
    if token:
        req.add_unredirected_header("Authorization", f"Bearer {token}")  # never to a redirect's host
    return req


def call(server: str, path: str, token: str | None, payload: Any = None, *, method: str = "POST",
         timeout: float = 60.0) -> tuple[int, Any]:
    """(status, parsed JSON or None) of a 2xx; a documented error for the rest."""
    try:
        with urllib.request.urlopen(_request(server, path, token, payload, method), timeout=timeout) as resp:
            body = resp.read(MAX_ANSWER + 1)
            status = int(resp.status)
    except urllib.error.HTTPError as exc:
        raise _error_of(exc) from None
    except (OSError, ValueError) as exc:
        raise ServerError(f"{server}: {type(exc).__name__}: {str(exc)[:300]}") from None
    if len(body) > MAX_ANSWER:
        raise ServerError(f"the answer to {path} is over {MAX_ANSWER} bytes")
    if not body:
        return status, None
    try:
        return status, json.loads(body)
    except ValueError:
        raise ServerError(f"the answer to {path} is not JSON") from None


def _error_of(exc: urllib.error.HTTPError) -> FarmError:
    try:
        err = json.loads(exc.read(MAX_ERROR)).get("error")
    except (ValueError, AttributeError, OSError):
        err = None
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        return ServerError(f"HTTP {exc.code} from the service")
    message = str(err.get("message") or "")[:1000]
    hint = str(err.get("hint"))[:1000] if err.get("hint") else None
    if exc.code >= 500:
        return ServerError(f"the service failed (HTTP {exc.code}, {err['code'][:60]}): {message}")
    return error_for_code(str(err["code"])[:60], message, hint=hint, fallback=ServerError)


def download(server: str, token: str, digest: str, size: int, dest: Path, *, timeout: float = 60.0) -> None:
    """``GET /v1/blobs/DIGEST`` into ``dest``: at most ``size`` bytes read, sha256 checked."""
    h = hashlib.sha256()
    seen = 0
    try:
        with urllib.request.urlopen(_request(server, f"/v1/blobs/{digest}", token, method="GET"),
                                    timeout=timeout) as resp, open(dest, "wb") as f:
            while chunk := resp.read(min(CHUNK, size - seen + 1)):
                seen += len(chunk)
                if seen > size:
                    raise DigestMismatchError(f"blob {digest} is longer than its {size} bytes")
                h.update(chunk)
                f.write(chunk)
    except urllib.error.HTTPError as exc:
        raise _error_of(exc) from None
    except OSError as exc:
        raise ServerError(f"downloading {digest}: {type(exc).__name__}: {str(exc)[:300]}") from None
    if seen != size or "sha256:" + h.hexdigest() != digest:
        raise DigestMismatchError(f"blob {digest}: got {seen} bytes with another digest")
