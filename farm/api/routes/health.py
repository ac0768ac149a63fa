"""Probes and metrics: ``/healthz``, ``/readyz``, ``/metrics`` (no token).

They never wait in the thread pool the synchronous routes share: ``/healthz`` runs on the
event loop, ``/readyz`` and ``/metrics`` (which read the index) on two threads of their own, so
a busy service still answers its orchestrator's probes.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from farm.api.deps import MetricsDep

router = APIRouter(tags=["ops"])
_PROBES = ThreadPoolExecutor(max_workers=2, thread_name_prefix="probe")


@router.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


@router.get("/readyz")
async def readyz(metrics: MetricsDep) -> JSONResponse:
    checks = await asyncio.get_running_loop().run_in_executor(_PROBES, metrics.readiness)
    return JSONResponse({"ready": all(checks.values()), "checks": checks},
                        status_code=200 if all(checks.values()) else 503)


@router.get("/metrics")
async def prometheus(metrics: MetricsDep) -> Response:
    body, content_type = await asyncio.get_running_loop().run_in_executor(_PROBES, metrics.render)
    return Response(body, media_type=content_type)
