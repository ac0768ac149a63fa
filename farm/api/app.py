"""The HTTP service (``farm serve``): the front door devices and pipelines use.

Versioned under ``/v1``, OpenAPI at ``/openapi.json``. Every endpoint but ``/healthz``,
``/readyz`` and ``/metrics`` needs a bearer token: ``read`` (devices), ``submit`` (pipelines) or
``admin`` (ops); none or unknown is 401, too weak is 403. Errors are the CLI's codes, as
``{"error": {"code", "message", "hint"}}`` with an HTTP status per code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from farm.api.auth import RevocationVersion, TokenCache
from farm.api.deps import SESSION_COOKIE, SESSION_MAX_AGE, SessionRedirect
from farm.api.errors import STATUS, ErrorBoundary, error_response, roots_of, server_roots
from farm.api.schemas import ERRORS
from farm.core import errors as E
from farm.core.settings import Settings
from registry.index import Registry

__all__ = ["STATUS", "create_app", "error_response"]


def create_app(settings: Settings, registry: Registry | None = None) -> FastAPI:
    """The service on ``settings``: builds ``app.state`` (settings, registry, metrics, token
    cache, embedded runner) and includes one router per resource."""
    from farm.api.embedded import EmbeddedRunner
    from farm.api.longpoll import LongPolls
    from farm.api.metrics import Metrics
    from farm.api.routes import artifacts, blobs, builds, coverage, health, models, releases, reports, resolve, tags, workers

    reg = registry or Registry.open(settings)
    runner = EmbeddedRunner(settings, reg) if settings.embedded else None
    engine = getattr(getattr(reg, "db", None), "engine", None)
    loop_reader = resolve.LoopReader(engine.url) if engine is not None and engine.dialect.name == "postgresql" else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        import asyncio

        # Before the first request, not during it (farm.api.app.warm_up).
        await asyncio.get_running_loop().run_in_executor(None, warm_up, settings, app)
        await asyncio.get_running_loop().run_in_executor(None, resolve.warm, app.state, reg)
        if loop_reader is not None:
            await loop_reader.open()
        await app.state.revocations.open()
        yield
        await app.state.revocations.close()
        reader = getattr(app.state, "resolve_reader", None)  # resolve's own connections (routes/resolve.py)
        if reader is not None:
            reader.dispose()
        if loop_reader is not None:
            await loop_reader.close()
        app.state.longpolls.close()
        jobs = getattr(app.state, "package_jobs", None)  # made at the first package a worker makes
        if jobs is not None:
            jobs.close()
        if runner is not None:
            runner.shutdown()
        if registry is None:
            reg.close()

    app = Service(title="ctxfarm", version="1", description=__doc__, responses=ERRORS,  # type: ignore[arg-type]
                  lifespan=lifespan)
    app.state.settings = settings
    app.state.registry = reg
    app.state.resolve_loop_reader = loop_reader
    app.state.metrics = Metrics(settings, reg)
    app.state.tokens = TokenCache()
    app.state.revocations = RevocationVersion(engine)  # a cached token holds while it is unchanged
    app.state.runner = runner
    app.state.longpolls = LongPolls(settings, reg)
    app.state.metrics.watch_long_polls(app.state.longpolls)
    app.state.roots = server_roots(settings)
    app.add_middleware(ErrorBoundary)
    app.add_exception_handler(E.FarmError, _farm_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(SessionRedirect, _session)  # type: ignore[arg-type]

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    for module in (health, models, releases, builds, blobs, tags, coverage, workers, artifacts):
        app.include_router(module.router)
    resolve.include(app)  # its hot GET route first
    from farm.api.routes import cancel, upload_sessions

    app.include_router(cancel.router)  # farm cancel
    app.include_router(upload_sessions.router)  # resumable uploads
    reports.include(app)  # device reports (its hot POST route first)
    from farm.api.routes import groups

    app.include_router(groups.router)  # graph groups
    from farm.api.routes import packages

    app.include_router(packages.router)  # ORT model packages
    from farm.api.routes import genai

    app.include_router(genai.router)  # genai packages over HTTP
    from farm.api.routes import devices

    app.include_router(devices.router)  # the device lab: enrolled agents, verification jobs, promotions
    from farm.api.deps import guard_routes

    guard_routes(app)  # every route: the token before the body and the body within its cap
    app.take_first(resolve.fast_route, reports.fast_route)  # a device's poll and its report, served first
    return app


def serving(app: FastAPI) -> FastAPI:
    """``app`` about to serve for the life of its process (``farm serve``): what exists now (modules,
    routes, the catalog) lives as long as the process, so it leaves the collector's full passes,
    which otherwise walk it all again and again under load. Not in ``create_app``: a process that
    makes many apps (the tests) would keep each one's garbage for good."""
    import gc

    gc.freeze()
    return app


class Service(FastAPI):
    """FastAPI, with the device fleet's hottest routes (``take_first``) answered before its
    middleware stack and its walk over every router: a route taken here is the same Starlette
    route, behind the same ``RouteGuard`` (token, body caps), in ``ErrorBoundary`` (every failure
    the documented error body). Measured: the stack and the router cost a third of a cached
    resolve's service CPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first: dict[tuple[str, str], Any] = {}

    def take_first(self, *routes: Any) -> None:
        """Serve these plain routes (their method and exact path) ahead of everything else.
        Call it after ``guard_routes``: what is taken is each route's guarded handler."""
        from farm.api.deps import RouteGuard

        for route in routes:
            assert isinstance(route.handle, RouteGuard), "guard_routes first"
            for method in route.methods or ():
                self.first[(method, route.path)] = ErrorBoundary(route.handle)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            route = self.first.get((scope["method"], scope["path"]))
            if route is not None:
                scope["app"] = self
                await route(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def warm_up(settings: Settings, app: FastAPI | None = None) -> None:
    """What the first upload and the first release would otherwise load while their clients
    wait, loaded at start (the service answers once it is done): onnx and its checker (every
    upload is inspected, ~0.25 s to import), the upload's own modules, FastAPI's view of every
    route (FastAPI 0.16x builds an included router's routes at its first request: ~0.1 s of CPU
    measured on a first upload), and with a broker the Celery app, its Redis transport, a first
    connection (~0.45 s) and its result backend (read from package entry points by the first
    ``send_task``, ~0.05 s, although no result is kept). Six pipelines submitting at once to a
    fresh service waited on these, in turn, before the first build was queued. A broker that
    does not answer yet is no reason not to start: each release checks it again."""
    import logging

    try:
        import onnx.checker  # noqa: F401 - farm.core.bundle.inspect_model's
    except ImportError:
        pass
    import farm.api.uploads  # noqa: F401 - imported by the upload routes at their first call
    import farm.core.archives  # noqa: F401
    if app is not None:
        from starlette.routing import NoMatchFound

        try:  # a name no route has: FastAPI walks (and so builds) every router looking for it
            app.url_path_for("ctxfarm-warm-up")
        except NoMatchFound:
            pass
    if app is not None and getattr(app.state, "registry", None) is not None:
        try:
            _warm_index_and_store(settings, app.state.registry)
        except Exception as exc:  # noqa: BLE001 - each request opens what it needs, and says why
            logging.getLogger("ctxfarm.api").warning("index or store not warmed up at start: %s", exc)
    if settings.embedded:
        return
    from farm.pipeline.queues import check_broker, shared_app

    try:
        celery = shared_app(settings)
        check_broker(celery)
        celery.amqp.router  # noqa: B018 - built on first use: the first send_task's
        celery.backend  # noqa: B018 - the same
        with celery.producer_or_acquire() as producer:  # the producers' pool holds a channel to Redis now
            producer.connection.default_channel  # noqa: B018 - connected and opened on first use
    except Exception as exc:  # noqa: BLE001 - the release that needs the broker says why
        logging.getLogger("ctxfarm.api").warning("broker not warmed up at start: %s", exc)


WARM_CONNECTIONS = 4  # index connections opened at start: six clients' first requests each wanted one


def _warm_index_and_store(settings: Settings, reg: Registry) -> None:
    """What a fresh service's first upload and first release paid while their clients waited
    (measured in one process: 95 and 125 ms against 25 and 35 warm): the index's pooled
    connections (a PostgreSQL connection is a backend started), the plans of the statements
    every upload and release reads with (SQLAlchemy compiles each at its first use), and the
    store's client and connection. Reads only: nothing is written, no id is taken. PostgreSQL
    only (the embedded SQLite index has no pool, and its one file may be held by a writer)."""
    from farm.api.deps import Caller
    from farm.api.routes.releases import _check_quota
    from farm.pipeline.plan import served_toolchains
    from registry.index import artifact_for_build, release_builds, tags_of
    from registry.models import Model
    from registry.tokens import PREFIX, token_identity

    engine = reg.db.engine
    if engine.dialect.name != "postgresql":  # SQLite: one file, no pool to fill; a writer elsewhere would hold us
        return
    opened = [engine.connect() for _ in range(WARM_CONNECTIONS)]
    for c in opened:
        c.close()  # back to the pool, open
    nothing = "sha256:" + "0" * 64
    with reg.db.session() as s:
        token_identity(s, PREFIX + "warm-up")  # every request's token
        s.get(Model, nothing)  # an upload's model, its tags
        tags_of(s, nothing)
        try:  # a release's quota, its builds and their artifacts
            _check_quota(s, settings, Caller(token_id=-1, scope="submit"))
        except E.QuotaReleasesError:  # FARM_QUOTA_RELEASES=0: every release refused, the statement planned
            pass
        release_builds(s, 0)
        artifact_for_build(s, 0)
    served_toolchains(settings, reg)  # a release's toolchains (a session of its own: not inside the one above)
    try:
        reg.store.stat(nothing)
    except Exception:  # noqa: BLE001 - BlobNotFound, as expected; a store down says so at its first use
        pass


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, less the 422 it declares on every route with parameters: this
    service answers a bad parameter or body 400 ``usage`` in the documented error shape."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for item in doc.get("paths", {}).values():
            for op in item.values():
                if isinstance(op, dict) and op.get("responses", {}).pop("422", None) is not None:
                    op["responses"].setdefault("400", {"description": "usage: a bad parameter or body",
                                                       "content": {"application/json": {"schema": {
                                                           "$ref": "#/components/schemas/ErrorResponse"}}}})
        schemas = doc.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = doc
    return app.openapi_schema


async def _farm_error(request: Request, exc: E.FarmError) -> JSONResponse:
    return error_response(exc, roots_of(request.app))


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    what = "the body is not valid JSON" if first.get("type") == "json_invalid" else first.get("msg", "invalid")
    return error_response(E.UsageError(f"{where}: {what}"[:300], hint="see /openapi.json"), roots_of(request.app))


# What Starlette answers itself (no route, a method the route lacks), in the documented shape.
_HTTP_CODES = {404: ("not-found", "see /openapi.json for the routes"),
               405: ("usage", "see /openapi.json for the methods of this route")}


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code, hint = _HTTP_CODES.get(exc.status_code, ("usage" if exc.status_code < 500 else "internal-error", None))
    message = (f"no route {request.method} {request.url.path[:200]}" if exc.status_code == 404
               else f"{request.method} is not allowed on {request.url.path[:200]}" if exc.status_code == 405
               else str(exc.detail)[:300])
    err = E.error_for_code(code, message, hint=hint)
    return error_response(err, roots_of(request.app), status=exc.status_code, headers=dict(exc.headers or {}))


async def _session(_request: Request, exc: SessionRedirect) -> Response:
    # The token leaves the URL at once: the browser keeps it in a cookie only this page reads.
    resp = RedirectResponse(exc.location or "/coverage", status_code=303, headers={"Cache-Control": "no-store"})
    resp.set_cookie(SESSION_COOKIE, exc.token, max_age=SESSION_MAX_AGE, path="/coverage", httponly=True,
                    samesite="strict", secure=exc.secure)
    return resp


def app_from_env() -> FastAPI:
    """The service on the ``FARM_*`` environment: what each process of ``farm serve --workers N``
    runs (uvicorn imports it by name in every process it starts), each with its own pool and answer
    cache; the answers stay coherent because each is checked against the model's generation in the
    shared index (``farm.api.answers``)."""
    return serving(create_app(Settings.from_env()))
