"""Errors on the wire: every failure is ``{"error": {"code", "message", "hint"}}`` with an HTTP
status per code (the CLI's codes, ``farm.core.errors``), never a traceback."""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import JSONResponse

from farm.core import errors as E

STATUS = {
    "usage": 400, "bad-name": 400, "bad-options": 400, "unknown-target": 400, "invalid-model": 400,
    "bad-manifest": 400, "unsupported-ops": 400, "not-found": 404, "no-match": 404, "too-large": 413,
    "unauthorized": 401, "forbidden": 403, "no-worker": 503, "database-error": 503, "schema-mismatch": 503,
    "storage-unavailable": 503, "signature-invalid": 409, "unsigned": 409, "blob-not-found": 404,
    "digest-mismatch": 502, "storage-error": 503, "resource-limit": 400, "toolchain-error": 502, "worker-lost": 503,
    "timeout": 504, "interrupted": 503, "install-conflict": 409, "lease-lost": 409, "missing-extra": 501,
    "bad-config": 500, "internal-error": 500, "tag-conflict": 409,
    "rate-limited": 429, "accuracy-below-threshold": 422, "accuracy-unverified": 422,
}


def error_response(exc: BaseException) -> JSONResponse:
    err = E.translate(exc)
    status = STATUS.get(err.code, 500)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"code": err.code, "message": err.message, "hint": err.hint}},
                        status_code=status, headers=headers)


class ErrorBoundary:
    """Pure ASGI middleware: any exception an endpoint raises (a library error, a bug) becomes a
    documented code in JSON, never a traceback on the wire; bugs are still logged."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            from starlette.requests import ClientDisconnect

            if started or isinstance(exc, ClientDisconnect):
                return
            if not isinstance(exc, E.FarmError) and E.translate(exc).code == "internal-error":
                logging.getLogger("ctxfarm.api").exception("internal error")
            await error_response(exc)(scope, receive, send)
