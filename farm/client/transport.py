"""The wire to one service: requests through an opener that knows only http(s), redirects that
never downgrade and never carry the token, request bodies streamed from files, answers read up
to a cap and a deadline, and HTTP error answers turned into the documented error they name.

Nothing here reads a field of an answer: ``Transport.json`` hands back parsed JSON, which the
caller holds to its shape (``farm.client.shapes``) before using any of it.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from farm.core.errors import FarmError, ServerError, UsageError, error_for_code
from farm.core.untrusted import clean_text, shown

CHUNK = 1024 * 1024
MAX_ANSWER_BYTES = 4 << 20  # a resolve answer is a few KiB
MAX_ERROR_BYTES = 64 << 10
MAX_REDIRECTS = 5
# Errors a service may relay to a client as themselves: a 4xx with a documented code, and the 5xx
# that answer for the request rather than for the service's health (a 503 no-worker keeps the
# service's hint: which SDKs it has). Its own failures (a bug, its configuration, its store, an
# interruption) are the service's problem, shown as server-error.
_RELAYED_BELOW = 500
_RELAYED_5XX = frozenset({"no-worker", "toolchain-error", "worker-lost", "timeout"})
_NOT_RELAYED = frozenset({"internal-error", "farm-error", "interrupted", "lease-lost", "bad-config", "missing-extra"})
# An answer with no error body (a HEAD's, a proxy's) still says what went wrong by its status.
_BY_STATUS = {401: "unauthorized", 403: "forbidden", 404: "not-found", 413: "too-large", 429: "rate-limited"}
# What a device can do about an answer it refused: it can't repair the service.
HINT_SERVER = "nothing was installed; the service sent an answer this client refuses: tell the service's operators"
HINT_RESUME = "run the install again: it resumes where this one stopped"
# Failures of the connection or of the peer's HTTP (too many or too long headers, a body cut
# short): the service is unreachable or broken, never a bug of ours.
WIRE_ERRORS = (OSError, http.client.HTTPException, ValueError)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Blob GETs redirect to presigned S3 URLs: follow http(s) only, never from https down to
    http, a bounded number of times; the bearer token must not follow (it is not for the store,
    and S3 refuses a request with two kinds of authentication)."""

    max_redirections = MAX_REDIRECTS
    max_repeats = 2

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        old, new_scheme = urllib.parse.urlsplit(req.full_url).scheme, urllib.parse.urlsplit(newurl).scheme
        if new_scheme not in ("http", "https") or (old == "https" and new_scheme == "http"):
            raise ServerError(f"the service redirected to {shown(newurl)}: only http(s) redirects are followed "
                              "(never from https to http)", hint=HINT_SERVER)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.remove_header("Authorization")
        return new


def _opener() -> urllib.request.OpenerDirector:
    """http and https only: no file:, ftp: or data: handler is installed at all."""
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), urllib.request.HTTPHandler(),
                    urllib.request.HTTPSHandler(), urllib.request.HTTPDefaultErrorHandler(), _Redirects(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


OPENER = _opener()


class Stream:
    """A request body read from byte strings and files in 1 MiB pieces (http.client sends an
    iterable piece by piece; from a file object it reads 8 KiB at a time). ``sent`` counts what
    went out. A file that shrank since it was measured stops the upload: its length was promised."""

    def __init__(self, parts: list[tuple[bytes | None, Path | None, int]], skip: int = 0):
        self.parts, self.sent, self.skip = parts, 0, skip

    def __iter__(self) -> Iterator[bytes]:
        skip = self.skip  # a resumed upload: the first ``skip`` bytes were sent before
        for data, path, size in self.parts:
            if skip >= size:
                skip -= size
                continue
            if data is not None:
                piece, skip = data[skip:], 0
                self.sent += len(piece)
                yield piece
                continue
            assert path is not None
            left = size - skip
            with open(path, "rb") as f:
                f.seek(skip)
                skip = 0
                while left > 0 and (chunk := f.read(min(CHUNK, left))):
                    left -= len(chunk)
                    self.sent += len(chunk)
                    yield chunk
            if left:
                raise ServerError(f"{path.name} shrank while it was being uploaded")


class Transport:
    """Requests to one service (``server``, an http(s) URL) with its bearer token, each waiting
    at most ``timeout`` seconds. ``received``/``requests`` count what blob downloads cost
    (payload bytes, requests: an up-to-date destination costs neither), ``sent`` what uploads
    cost (request-body bytes)."""

    def __init__(self, server: str, token: str | None, *, timeout: float = 60.0):
        if not isinstance(server, str) or not server.startswith(("http://", "https://")):
            raise UsageError(f"server {shown(server)} is not an http(s) URL", hint="e.g. --server http://127.0.0.1:8080")
        self.server, self.token, self.timeout = server.rstrip("/"), token, timeout
        self.received = self.requests = self.sent = 0
        self._counted = threading.Lock()

    def _request(self, method: str, path: str, *, body: Any = None, headers: dict[str, str] | None = None,
                 query: dict[str, Any] | None = None) -> Any:
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None}, doseq=True)
        h = {"Accept": "application/json", **(headers or {})}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=body, headers=h, method=method)
        try:
            return OPENER.open(req, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise error_of(exc) from None
        except urllib.error.URLError as exc:
            raise ServerError(f"cannot reach {self.server}: {clean_text(str(exc.reason), 200)}") from None
        except WIRE_ERRORS as exc:
            raise ServerError(f"cannot reach {self.server}: {clean_text(str(exc) or type(exc).__name__, 200)}") from None
        finally:
            if isinstance(body, Stream):
                self.sent += body.sent

    def _get_range(self, url: str, with_token: bool, rng: tuple[int, int]) -> Any:
        """GET bytes ``rng`` (start, end exclusive) of ``url`` through the guarded opener; the
        token only to the service itself."""
        headers = {"Accept": "*/*", "Range": f"bytes={rng[0]}-{rng[1] - 1}"}
        if with_token and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, headers=headers, method="GET")
        self._count(0, request=True)
        try:
            return OPENER.open(req, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise error_of(exc) from None
        except urllib.error.URLError as exc:
            raise ServerError(f"cannot reach {shown(urllib.parse.urlsplit(url).netloc)}: "
                              f"{clean_text(str(exc.reason), 200)}", hint=HINT_RESUME) from None
        except WIRE_ERRORS as exc:
            raise ServerError(f"cannot reach {shown(urllib.parse.urlsplit(url).netloc)}: "
                              f"{clean_text(str(exc) or type(exc).__name__, 200)}", hint=HINT_RESUME) from None

    def json(self, method: str, path: str, payload: Any = None, **query: Any) -> Any:
        """A JSON answer, at most ``MAX_ANSWER_BYTES`` read; anything else is server-error. The
        caller holds it to its shape before it reads a field."""
        return self.json_status(method, path, payload, **query)[0]

    def json_status(self, method: str, path: str, payload: Any = None, **query: Any) -> tuple[Any, int, float | None]:
        """``json``'s answer with its status (a 2xx) and its Retry-After in seconds (None
        without one, or not a number of seconds)."""
        body = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else None
        what = f"the answer to {method} {path}"
        with self._request(method, path, body=body, headers=headers, query=query) as resp:
            data = read_capped(resp, MAX_ANSWER_BYTES, what, deadline=time.monotonic() + 2 * self.timeout)
            status, retry = int(resp.status), (resp.headers.get("Retry-After") or "").strip()
        return (parse_json(data, what, ServerError), status,
                float(retry) if retry.isdigit() and len(retry) < 6 else None)

    def _count(self, n: int, *, request: bool = False) -> None:
        with self._counted:
            self.received += n
            self.requests += request


def check_length(resp: Any, expected: int, digest: str) -> None:
    """A Content-Length other than the bytes the manifest declares is refused before reading."""
    raw = resp.headers.get("Content-Length")
    if raw is None:
        return
    if not raw.strip().isdigit() or int(raw) != expected:
        raise ServerError(f"blob {digest[7:19]}: the service sends {shown(raw, 30)} bytes, "
                          f"{expected} were declared", hint=HINT_SERVER)


def read_capped(resp: Any, cap: int, what: str, *, deadline: float, stop: bool = False) -> bytes:
    """At most ``cap`` bytes of ``resp``. More is server-error, unless ``stop``: then reading
    simply stops at ``cap`` (a blob's declared size). A body that trickles past ``deadline``
    is server-error too (a slow peer can't hold a device forever)."""
    raw = resp.headers.get("Content-Length")
    if not stop and raw is not None and raw.strip().isdigit() and int(raw) > cap:
        raise ServerError(f"{what} is {int(raw)} bytes, over the {cap} this client reads", hint=HINT_SERVER)
    buf = bytearray()
    limit = cap if stop else cap + 1
    try:
        while len(buf) < limit:
            # read1: whatever has arrived, so a trickling body meets its deadline between bytes
            chunk = resp.read1(min(CHUNK, limit - len(buf)))
            if not chunk:
                break
            buf += chunk
            if time.monotonic() > deadline:
                raise ServerError(f"{what} did not arrive in time", hint=HINT_SERVER)
    except WIRE_ERRORS as exc:
        raise ServerError(f"{what} broke off: {clean_text(str(exc) or type(exc).__name__, 200)}") from None
    if len(buf) > cap:
        raise ServerError(f"{what} is over the {cap} bytes this client reads", hint=HINT_SERVER)
    return bytes(buf)


def parse_json(data: bytes, what: str, error: type[FarmError]) -> Any:
    """``data`` as JSON, or ``error`` (no NaN or Infinity, nothing nested past the stack)."""
    try:
        return json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, NaN, nested past the stack
        raise error(f"{what} is not JSON", hint=HINT_SERVER) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def error_of(exc: urllib.error.HTTPError) -> FarmError:
    """An HTTP error answer as the error it documents: a 4xx with a known code is relayed (its
    text cleaned and cut); the service's own failures and anything else are server-error."""
    try:
        body = exc.read(MAX_ERROR_BYTES + 1) if exc.fp is not None else b""
    except WIRE_ERRORS:
        body = b""
    err: Any = None
    if len(body) <= MAX_ERROR_BYTES:
        try:
            err = json.loads(body).get("error")
        except (ValueError, RecursionError, AttributeError):
            err = None
    status = int(exc.code) if isinstance(exc.code, int) else 0
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        reason = clean_text(str(exc.reason), 200)
        if status in _BY_STATUS:
            return error_for_code(_BY_STATUS[status], f"HTTP {status} from the service: {reason}")
        return ServerError(f"HTTP {status} from the service: {reason}")
    code, message = clean_text(err["code"], 60), clean_text(err.get("message"), 1000)
    hint = clean_text(err.get("hint"), 1000) or None
    if code in _NOT_RELAYED or (status >= _RELAYED_BELOW and code not in _RELAYED_5XX):
        return ServerError(f"the service failed (HTTP {status}, {code}): {message}",
                           hint="nothing was changed here; try again later, or tell the service's operators")
    if code == "no-match" and hint:
        # The service explains what its operators could build; a device can only ask for it.
        hint = f"nothing loads on this device yet: ask the service's operators for a build ({hint})"
    return error_for_code(code, message, hint=hint, fallback=ServerError)
