"""Probes and metrics: ``/healthz``, ``/readyz``, ``/metrics`` (no token)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from farm.api.deps import MetricsDep

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz() -> dict[str, bool]:
    return {"ok": True}


@router.get("/readyz")
def readyz(metrics: MetricsDep) -> JSONResponse:
    checks = metrics.readiness()
    return JSONResponse({"ready": all(checks.values()), "checks": checks},
                        status_code=200 if all(checks.values()) else 503)


@router.get("/metrics")
def prometheus(metrics: MetricsDep) -> Response:
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)
