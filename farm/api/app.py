"""The HTTP service (``farm serve``): the front door devices and pipelines use.

Versioned under ``/v1``, OpenAPI at ``/openapi.json``. Every endpoint but ``/healthz``,
``/readyz`` and ``/metrics`` needs a bearer token: ``read`` (devices), ``submit`` (pipelines) or
``admin`` (ops); none or unknown is 401, too weak is 403. Errors are the CLI's codes, as
``{"error": {"code", "message", "hint"}}`` with an HTTP status per code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from farm.api.deps import TOKEN_CACHE_S, TokenCache
from farm.api.errors import STATUS, ErrorBoundary, error_response
from farm.api.schemas import ERRORS
from farm.core import errors as E
from farm.core.settings import Settings
from registry.index import Registry

__all__ = ["STATUS", "create_app", "error_response"]


def create_app(settings: Settings, registry: Registry | None = None) -> FastAPI:
    """The service on ``settings``: builds ``app.state`` (settings, registry, metrics, token
    cache, embedded runner) and includes one router per resource."""
    from farm.api.embedded import EmbeddedRunner
    from farm.api.metrics import Metrics
    from farm.api.routes import artifacts, blobs, builds, coverage, health, models, releases, reports, resolve, tags, workers

    reg = registry or Registry.open(settings)
    runner = EmbeddedRunner(settings, reg) if settings.embedded else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        if runner is not None:
            runner.shutdown()
        if registry is None:
            reg.close()

    app = FastAPI(title="ctxfarm", version="1", description=__doc__, responses=ERRORS,  # type: ignore[arg-type]
                  lifespan=lifespan)
    app.state.settings = settings
    app.state.registry = reg
    app.state.metrics = Metrics(settings, reg)
    app.state.tokens = TokenCache(ttl=TOKEN_CACHE_S)
    app.state.runner = runner
    app.add_middleware(ErrorBoundary)
    app.add_exception_handler(E.FarmError, _farm_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]

    for module in (health, models, releases, builds, resolve, blobs, tags, coverage, workers, artifacts):
        app.include_router(module.router)
    from farm.api.routes import cancel

    app.include_router(cancel.router)  # issue 22: farm cancel
    app.include_router(reports.router)  # issue 23: device reports
    return app


async def _farm_error(_request: Request, exc: E.FarmError) -> JSONResponse:
    return error_response(exc)


async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    return JSONResponse({"error": {"code": "usage", "message": f"{where}: {first.get('msg', 'invalid')}",
                                   "hint": "see /openapi.json"}}, status_code=400)
