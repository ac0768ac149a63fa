"""What routes depend on, provided through ``app.state`` and FastAPI ``Depends``: the settings,
the registry, the metrics, the embedded runner, and the token checks (``read``, ``submit``,
``admin``). ``create_app`` fills ``app.state``; routes never reach for globals."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer

from farm.api import auth
from farm.core import errors as E
from farm.core.settings import Settings
from registry.index import Registry
from registry.tokens import PREFIX as TOKEN_PREFIX


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


_CHECKED = "ctxfarm.token"  # the request's scope: (token, identity) once checked for this request


async def request_identity(request: Request, raw: str) -> auth.Identity | None:
    """(id, scope) of token ``raw`` as of this request's arrival (None: unknown or revoked),
    checked once per request (``farm.api.auth``: a revoked token is refused at once by every
    process); on the event loop."""
    checked = request.scope.get(_CHECKED)
    if checked is not None and checked[0] == raw:
        return checked[1]  # type: ignore[no-any-return]
    got = await auth.identity(request.app.state, raw)
    request.scope[_CHECKED] = (raw, got)
    return got


def token_identity(request: Request, raw: str) -> auth.Identity | None:
    """``request_identity`` from a thread (a sync dependency)."""
    checked = request.scope.get(_CHECKED)
    if checked is not None and checked[0] == raw:
        return checked[1]  # type: ignore[no-any-return]
    got = auth.identity_now(request.app.state, raw)
    request.scope[_CHECKED] = (raw, got)
    return got


def token_scope(request: Request, raw: str) -> str | None:
    """The scope of token ``raw`` (None: unknown or revoked)."""
    got = token_identity(request, raw)
    return None if got is None else got[1]


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


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the token's id (what it creates is owned by it) and scope."""

    token_id: int
    scope: str

    @property
    def admin(self) -> bool:
        return self.scope == "admin"


def _caller(request: Request, raw: str, needed: str) -> Caller:
    return _judged(token_identity(request, raw), needed)


def _judged(got: auth.Identity | None, needed: str) -> Caller:
    from registry.tokens import allows

    if needed == "enrollment":  # the device lab's enrollment route checks its single-use token itself
        return Caller(0, "enrollment")
    if got is None:
        raise E.UnauthorizedError("unknown or revoked token")
    if not allows(got[1], needed):
        raise E.ForbiddenError(f"a {got[1]} token can't do this (needs {needed})")
    return Caller(got[0], got[1])


def _allow(request: Request, raw: str, needed: str) -> str:
    return _caller(request, raw, needed).scope


def refuse_query_token(request: Request) -> None:
    """401 for a token in the URL: tokens in URLs end up in proxy logs and shell history, so only
    the coverage page takes one (``page_reader``). Checked for every route by ``RouteGuard``."""
    # A route may have a ``token`` parameter of its own, a token's name: that is no secret.
    if any(v.startswith(TOKEN_PREFIX) for v in request.query_params.getlist("token")):
        raise E.UnauthorizedError("a token in the URL (?token=) is accepted only by the /coverage page",
                                  hint="send it as a header: Authorization: Bearer <token>")


def bearer_token(request: Request, creds: HTTPAuthorizationCredentials | None) -> str | None:
    """The token of the Authorization header; 401 for another scheme or a token in the URL."""
    refuse_query_token(request)
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

    check.needed = needed  # type: ignore[attr-defined]  # RouteGuard checks it before the body
    return Depends(check)


def caller(needed: str) -> Any:
    """As ``scope(needed)``, answering the ``Caller`` (for routes that record or check an owner)."""

    def check(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Caller:
        raw = bearer_token(request, creds)
        if not raw:
            raise E.UnauthorizedError("no token")
        return _caller(request, raw, needed)

    check.needed = needed  # type: ignore[attr-defined]
    return Depends(check)


async def receive_body(request: Request, path: Path, limit: int, too_large: str, hasher: Any = None) -> int:
    """Stream the request body into ``path`` (a fixed name the caller chose), stopping with
    ``too-large`` (``too_large`` is its message) as soon as more than ``limit`` bytes came in;
    the number of bytes written. ``hasher`` (a ``hashlib`` object): fed the body on the way, so
    the file need not be read again to hash it."""
    size = 0
    with open(path, "wb") as f:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise E.TooLargeError(too_large)
            f.write(chunk)
            if hasher is not None:
                hasher.update(chunk)
    return size


def uploads_dir(settings: Any) -> Path:
    """``FARM_HOME/uploads``: where request bodies are received (each in a fresh temp dir)."""
    d = Path(settings.home) / "uploads"
    d.mkdir(parents=True, exist_ok=True)
    return d


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

    async def check(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Caller:
        try:
            raw = bearer_token(request, creds)
            if not raw:
                raise E.UnauthorizedError("no token")
            return _judged(await request_identity(request, raw), "submit")
        except (E.UnauthorizedError, E.ForbiddenError):
            await drain(request, limit_of(request))
            raise

    check.needed = "submit"  # type: ignore[attr-defined]
    check.body_limit = limit_of  # type: ignore[attr-defined]  # the route streams its body up to this
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


page_reader.page = True  # type: ignore[attr-defined]  # the one route that takes ?token= (once)
def enrollment_token() -> Any:
    """The bearer token of ``POST /v1/devices/enroll``: a device lab enrollment token (``cfe_``), not an
    API token. Required before the body is read, as every route's token is; the route checks it
    (``registry.devices.enroll``: single use, expiring)."""

    def check(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
        raw = bearer_token(request, creds)
        if not raw:
            raise E.UnauthorizedError("no token", hint="the enrollment token: Authorization: Bearer cfe_...")
        return raw

    check.needed = "enrollment"  # type: ignore[attr-defined]
    return Depends(check)


read, submit, admin = scope("read"), scope("submit"), scope("admin")
read_page = Depends(page_reader)
submitter = caller("submit")  # a submit token, as a Caller: routes that own what they create


# ---- every route: the token before the body, the body within its cap ---------------------------

JSON_MAX_BODY = 256 * 1024  # a JSON body (a release, a group of 64 graphs: a few KiB)
NO_BODY = 0  # a route that takes no body reads none


def _dependencies(route: Any) -> list[Any]:
    out, todo = [], list(getattr(getattr(route, "dependant", None), "dependencies", []))
    while todo:
        dep = todo.pop()
        out.append(dep.call)
        todo.extend(dep.dependencies)
    return out


class RouteGuard:
    """Pure ASGI, around one route: refuses a token in the URL (but on the coverage page), checks
    the route's token *before* a byte of the body is read (a refused one: its body drained up to
    the cap, then 401/403), refuses a declared size past the route's cap (413 ``too-large``,
    nothing read), and counts what the route then reads, stopping at the cap. A JSON body is read
    here, capped, and handed to FastAPI (which would otherwise read it whole before any
    dependency runs). ``guard_routes`` puts one around every route of the app."""

    def __init__(self, route: Any, inner: Any):
        from fastapi.routing import APIRoute

        calls = _dependencies(route)
        self.inner = inner
        self.methods = set(route.methods or ())
        self.page = any(getattr(c, "page", False) for c in calls)
        self.needed = next((c.needed for c in calls if hasattr(c, "needed")), getattr(route, "needed", None))
        streamed = next((c.body_limit for c in calls if hasattr(c, "body_limit")), getattr(route, "body_limit", None))
        self.buffered = streamed is None and isinstance(route, APIRoute) and route.body_field is not None
        # A plain Starlette route (the device reports' fast path; the API document) checks its own
        # token and declared size (reports: 16 KiB) in that order; here only what it reads is counted.
        # One that declares ``needed`` and ``body_limit`` (resolve's fast path) is checked here.
        self.own_checks = not isinstance(route, APIRoute) and self.needed is None
        if streamed is not None:
            self.limit_of: Any = streamed
        elif self.buffered or self.own_checks:
            self.limit_of = lambda _request: JSON_MAX_BODY
        else:
            self.limit_of = lambda _request: NO_BODY

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or (self.methods and scope["method"] not in self.methods):
            await self.inner(scope, receive, send)  # the route answers 405 itself
            return
        limit = int(self.limit_of(Request(scope, receive)))
        path = str(scope.get("path", ""))[:80]
        too_large = f"{scope['method']} {path} takes at most {limit} bytes of body"
        counted = _capped(receive, limit, too_large)
        request = Request(scope, counted)
        query = scope.get("query_string", b"")
        if not self.page and query and (b"token" in query or b"%" in query):  # else no ?token= can be there
            refuse_query_token(request)
        if self.needed is not None:
            try:
                await self._check(request, self.needed)
            except (E.UnauthorizedError, E.ForbiddenError):
                await drain(request, limit)
                raise
        if self.own_checks:
            await self.inner(scope, counted, send)
            return
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise E.TooLargeError(f"{too_large} ({declared[:20]} declared)")
        if limit == NO_BODY and declared is None and "transfer-encoding" in request.headers:
            raise E.TooLargeError(f"{scope['method']} {path} takes no body")  # nothing acts on it
        if self.buffered:
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
            await self.inner(scope, _replay(bytes(body), receive), send)
            return
        await self.inner(scope, counted, send)

    @staticmethod
    async def _check(request: Request, needed: str) -> Caller:
        header = (request.headers.get("authorization") or "").strip()
        if len(header) > 300:
            raise E.UnauthorizedError("the Authorization header is too long")
        scheme, _, raw = header.partition(" ")
        if not header:
            raise E.UnauthorizedError("no token")
        if scheme.lower() != "bearer" or not raw.strip():
            raise E.UnauthorizedError("the Authorization header must use the Bearer scheme",
                                      hint="send Authorization: Bearer <token>")
        return _judged(await request_identity(request, raw.strip()), needed)


def _capped(receive: Any, limit: int, too_large: str) -> Any:
    seen = 0

    async def wrapped() -> Any:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise E.TooLargeError(too_large)
        return message

    return wrapped


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def wrapped() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then the disconnect, when it comes

    return wrapped


def app_routes(app: Any) -> list[Any]:
    """Every route of ``app``, those of included routers too (FastAPI keeps an included router
    as one entry whose own router holds its routes)."""
    from starlette.routing import Route

    out, todo = [], list(app.router.routes)
    while todo:
        route = todo.pop(0)
        inner = getattr(route, "original_router", None)
        if inner is not None:
            todo[:0] = list(inner.routes)
        elif isinstance(route, Route):
            out.append(route)
    return out


def guard_routes(app: Any) -> None:
    """A ``RouteGuard`` around every route of ``app`` (its ``handle``, which the router calls
    for a direct route and an included one alike). Called once the routes are all included."""
    for route in app_routes(app):
        if not isinstance(route.handle, RouteGuard):
            route.handle = RouteGuard(route, route.handle)
