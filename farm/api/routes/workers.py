"""Workers: ``GET /v1/workers`` (read), the live workers and what they serve; ``?all=true`` also
the stopped and dead ones. The same document as `farm workers --json` (registry.views)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from farm.api.deps import RegistryDep, SettingsDep, read

router = APIRouter(tags=["read"])


@router.get("/v1/workers", dependencies=[read])
def workers(settings: SettingsDep, reg: RegistryDep, all: bool = False) -> list[dict[str, Any]]:
    from registry.views import worker_rows

    with reg.db.session() as s:
        return worker_rows(s, stale_after=settings.worker_stale_after, include_all=all)
