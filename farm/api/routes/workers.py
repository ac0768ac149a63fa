"""Workers: ``GET /v1/workers`` (read), the live workers and what they serve."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from farm.api.deps import RegistryDep, SettingsDep, read

router = APIRouter(tags=["read"])


@router.get("/v1/workers", dependencies=[read])
def workers(settings: SettingsDep, reg: RegistryDep) -> list[dict[str, Any]]:
    from registry.index import live_workers

    with reg.db.session() as s:
        return [{"name": w.name, "backend": w.backend, "toolchain": w.toolchain, "onnxruntime": w.ort_version,
                 "ep": w.ep_package, "ep_version": w.ep_version, "host": w.host, "queues": list(w.queues),
                 "jobs": w.jobs_done, "last_seen": w.last_seen.isoformat()}
                for w in live_workers(s, stale_after=settings.worker_stale_after)]
