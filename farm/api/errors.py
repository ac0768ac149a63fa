"""Errors on the wire: every failure is ``{"error": {"code", "message", "hint"}}`` with an HTTP
status per code (the CLI's codes, ``farm.core.errors``), never a traceback."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi.responses import JSONResponse

from farm.core import errors as E

STATUS = {
    "sharing-unsupported": 400, "multi-soc-unsupported": 400, "bad-group": 400,  # graph groups, multi-SoC builds
    "usage": 400, "bad-name": 400, "bad-options": 400, "unknown-target": 400, "invalid-model": 400,
    "bad-manifest": 400, "unsupported-ops": 400, "not-found": 404, "no-match": 404, "too-large": 413,
    "unauthorized": 401, "forbidden": 403, "no-worker": 503, "database-error": 503, "schema-mismatch": 503,
    "storage-unavailable": 503, "signature-invalid": 409, "unsigned": 409, "blob-not-found": 404,
    "digest-mismatch": 502, "storage-error": 503, "resource-limit": 400, "toolchain-error": 502, "worker-lost": 503,
    "timeout": 504, "interrupted": 503, "install-conflict": 409, "lease-lost": 409, "missing-extra": 501,
    "bad-config": 500, "internal-error": 500, "tag-conflict": 409, "rate-limited": 429, "server-error": 502,
    "accuracy-below-threshold": 422, "accuracy-unverified": 422, "cancelled": 409,
    "no-published-builds": 404, "package-files-missing": 409, "package-verify-failed": 500,
    "not-device-evidence": 422, "report-soc-mismatch": 422, "report-runtime-mismatch": 422,  # device evidence
    "bad-samples": 400, "quota-uploads": 429, "quota-upload-bytes": 429, "quota-releases": 429,  # per-token quotas
    "package-unsupported": 409, "capability-missing": 409, "package-ambiguous-variants": 409,
    "enrollment-invalid": 401, "device-revoked": 403, "report-signature-invalid": 403, "report-replayed": 409,
    "tag-gated": 409, "promotion-unmet": 409,  # device lab
}

# Absolute paths of this host never reach a client (they tell an attacker the layout): the
# service's own roots, and anything that looks like a path under a usual top-level directory.
# A URL path (``/v1/...``) is not one: the lookbehind skips what follows a host or a word.
_PATHS = re.compile(r"(?<![\w:/.~-])/(?:tmp|home|work|var|usr|opt|root|srv|mnt|data|etc|proc|dev|run|private|"
                    r"Users|nix|lib|lib64|bin|sbin|snap|media|scratch|cache|app|ctxfarm)(?![\w.-])(?:/[^\s'\"),;:]*)?")
REDACTED = "<server path>"


def redact(text: str | None, roots: tuple[str, ...] = ()) -> str | None:
    """``text`` without this host's filesystem paths (each ``roots`` prefix, then any absolute
    path under a usual top-level directory)."""
    if not text:
        return text
    for root in sorted((r for r in roots if r and r != "/"), key=len, reverse=True):
        text = re.sub(re.escape(root) + r"(?:/[^\s'\"),;:]*)?", REDACTED, text)
    return _PATHS.sub(REDACTED, text)


def server_roots(settings: Any) -> tuple[str, ...]:
    """The paths of this service worth hiding: its home, temp dir, Python and the code."""
    import sys
    import tempfile
    from pathlib import Path

    roots = {str(settings.home), str(Path(settings.home).resolve()), tempfile.gettempdir(), sys.prefix,
             str(Path(__file__).resolve().parents[2])}
    # A local store or SQLite index may live outside the home: their directories too.
    for url, scheme in ((settings.store_url, "file://"), (settings.database_url, "sqlite:///")):
        if isinstance(url, str) and url.startswith(scheme):
            where = Path(url[len(scheme):].split("?", 1)[0])
            if where.is_absolute():
                roots.add(str(where.parent if scheme == "sqlite:///" else where))
    return tuple(r for r in roots if len(r) > 1)


def status_of(err: E.FarmError) -> int:
    return STATUS.get(err.code) or (400 if isinstance(err, E.UsageError) else 500)


def error_response(exc: BaseException, roots: tuple[str, ...] = (), *, status: int | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The documented error body for ``exc``, with no filesystem path of this host in it."""
    err = E.translate(exc)
    status = status or status_of(err)
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status == 429:
        headers.setdefault("Retry-After", "5")
    return JSONResponse({"error": {"code": err.code, "message": redact(err.message, roots),
                                   "hint": redact(err.hint, roots)}},
                        status_code=status, headers=headers or None)


def roots_of(app: Any) -> tuple[str, ...]:
    return getattr(getattr(app, "state", None), "roots", ()) or ()


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
            await error_response(exc, roots_of(scope.get("app")))(scope, receive, send)
