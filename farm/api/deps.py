"""What routes depend on, provided through ``app.state`` and FastAPI ``Depends``: the settings,
the registry, the metrics, the embedded runner, and the token checks (``read``, ``submit``,
``admin``). ``create_app`` fills ``app.state``; routes never reach for globals."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer

from farm.core import errors as E
from farm.core.settings import Settings
from registry.index import Registry
from registry.tokens import PREFIX as TOKEN_PREFIX

TOKEN_CACHE_S = 5.0  # a revoked token stops working within this many seconds
_MISS = object()


class TokenCache:
    """Token -> scope (or None for unknown), for a few seconds: a device's resolve and its blob
    GETs cost one token lookup, not one each. Keyed by the token's sha256, bounded in size."""

    def __init__(self, ttl: float, size: int = 10_000):
        self.ttl, self.size = ttl, size
        self.items: OrderedDict[str, tuple[float, str | None]] = OrderedDict()
        self.lock = threading.Lock()

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()

    def get(self, token: str) -> Any:
        with self.lock:
            hit = self.items.get(self._key(token))
        if hit is None or hit[0] < time.monotonic():
            return _MISS
        return hit[1]

    def put(self, token: str, scope: str | None) -> None:
        with self.lock:
            self.items[self._key(token)] = (time.monotonic() + self.ttl, scope)
            if len(self.items) > self.size:
                self.items.popitem(last=False)


# Async (they only read app.state): a sync dependency would take a thread of the shared pool.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def get_registry(request: Request) -> Registry:
    return request.app.state.registry  # type: ignore[no-any-return]


async def get_metrics(request: Request) -> Any:
    return request.app.state.metrics


async def get_runner(request: Request) -> Any:
    """The embedded runner, or None when builds go to a broker."""
    return request.app.state.runner


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
MetricsDep = Annotated[Any, Depends(get_metrics)]
RunnerDep = Annotated[Any, Depends(get_runner)]


def token_scope(request: Request, raw: str) -> str | None:
    """The scope of token ``raw`` (None: unknown or revoked), cached a few seconds."""
    from registry.tokens import scope_of

    cache: TokenCache = request.app.state.tokens
    got = cache.get(raw)
    if got is _MISS:
        reg: Registry = request.app.state.registry
        with reg.db.session() as s:
            got = scope_of(s, raw)
        cache.put(raw, got)
    return got  # type: ignore[no-any-return]


# OpenAPI: components.securitySchemes.bearer, and ``security: [{"bearer": []}]`` on every route
# that takes a token. The scheme name is matched case-insensitively (RFC 9110).
bearer = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="a ctxfarm token: `farm token create NAME --scope read|submit|admin`")
# The coverage page only: a browser keeps its token in this cookie (HttpOnly, SameSite=Strict,
# Path=/coverage), got once from ``/coverage?token=...`` which then redirects to a URL without it.
SESSION_COOKIE = "ctxfarm_session"
SESSION_MAX_AGE = 12 * 3600
session_cookie = APIKeyCookie(name=SESSION_COOKIE, auto_error=False, scheme_name="coverage-session",
                              description="set by /coverage?token=... (HttpOnly, SameSite=Strict), read only by /coverage")


def _allow(request: Request, raw: str, needed: str) -> str:
    from registry.tokens import allows

    got = token_scope(request, raw)
    if got is None:
        raise E.UnauthorizedError("unknown or revoked token")
    if not allows(got, needed):
        raise E.ForbiddenError(f"a {got} token can't do this (needs {needed})")
    return got


def bearer_token(request: Request, creds: HTTPAuthorizationCredentials | None) -> str | None:
    """The token of the Authorization header; 401 for another scheme or a token in the URL."""
    if any(v.startswith(TOKEN_PREFIX) for v in request.query_params.getlist("token")):
        # Tokens in URLs end up in proxy logs and shell history: only the page takes one. (A
        # route may have a ``token`` parameter of its own, a token's name: that is no secret.)
        raise E.UnauthorizedError("a token in the URL (?token=) is accepted only by the /coverage page",
                                  hint="send it as a header: Authorization: Bearer <token>")
    if creds is not None:
        return creds.credentials.strip() or None
    header = (request.headers.get("authorization") or "").strip()
    if header and header.lower() != "bearer":
        raise E.UnauthorizedError("the Authorization header must use the Bearer scheme",
                                  hint="send Authorization: Bearer <token>")
    return None


def scope(needed: str) -> Any:
    """A dependency that lets through a bearer token of scope ``needed`` or above: none or
    unknown is 401 ``unauthorized``, too weak is 403 ``forbidden``."""

    def check(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
        raw = bearer_token(request, creds)
        if not raw:
            raise E.UnauthorizedError("no token")
        return _allow(request, raw, needed)

    return Depends(check)


async def receive_body(request: Request, path: Path, limit: int, too_large: str) -> int:
    """Stream the request body into ``path`` (a fixed name the caller chose), stopping with
    ``too-large`` (``too_large`` is its message) as soon as more than ``limit`` bytes came in;
    the number of bytes written."""
    size = 0
    with open(path, "wb") as f:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise E.TooLargeError(too_large)
            f.write(chunk)
    return size


async def drain(request: Request, limit: int) -> None:
    """Read and drop a request body we refuse, up to ``limit`` bytes: a client that sends its
    whole body before reading (urllib does) then reads our answer instead of a connection reset."""
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return  # too much to read for nothing: answer now
    if request.headers.get("expect", "").lower() == "100-continue":
        return  # the client waits for our word before it sends: the answer is that word (curl)
    seen = 0
    try:
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                return
    except (ClientDisconnect, RuntimeError):
        return


def submit_before_body(limit_of: Any) -> Any:
    """``submit`` for a route that streams its body: the token is checked before a byte of the
    body is read; when it is refused, the body is drained (up to the upload cap) so the client
    sees the 401/403."""

    async def check(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
        from starlette.concurrency import run_in_threadpool

        try:
            raw = bearer_token(request, creds)
            if not raw:
                raise E.UnauthorizedError("no token")
            return await run_in_threadpool(_allow, request, raw, "submit")
        except (E.UnauthorizedError, E.ForbiddenError):
            await drain(request, limit_of(request))
            raise

    return Depends(check)


class SessionRedirect(Exception):
    """Raised by ``page_reader`` for ``/coverage?token=...``: answered with a 303 to the same
    page without the token, setting the session cookie (``app`` handles it)."""

    def __init__(self, location: str, token: str, secure: bool):
        super().__init__(location)
        self.location, self.token, self.secure = location, token, secure


def page_reader(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
                cookie: Annotated[str | None, Depends(session_cookie)],
                token: Annotated[str | None, Query(max_length=200, description="a read token, exchanged at once for "
                                                   "a session cookie (a 303 to this page without it)")] = None) -> str:
    """The coverage page's reader: a bearer token, the session cookie, or ``?token=`` once."""
    from urllib.parse import urlencode

    if token is not None:
        _allow(request, token, "read")
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        location = request.url.path + (f"?{urlencode(rest)}" if rest else "")
        raise SessionRedirect(location, token, request.url.scheme == "https")
    if creds is not None and creds.credentials.strip():
        return _allow(request, creds.credentials.strip(), "read")
    if cookie:
        return _allow(request, cookie, "read")
    raise E.UnauthorizedError("no token", hint="open /coverage?token=<read token> once (the page keeps it in a "
                                               "session cookie), or send Authorization: Bearer <token>")


read, submit, admin = scope("read"), scope("submit"), scope("admin")
read_page = Depends(page_reader)
