"""Cancel: ``POST /v1/releases/ID/cancel`` and ``POST /v1/builds/ID/cancel`` (submit).

Queued builds fail at once with code ``cancelled``; a running one is stopped by its executor at
its next lease renewal (seconds), embedded or on a worker (``farm.pipeline.cancel``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from farm.api.deps import RegistryDep, SettingsDep, submit
from farm.pipeline import plan

router = APIRouter(tags=["submit"])


@router.post("/v1/releases/{release_id}/cancel", dependencies=[submit])
async def cancel_release(release_id: int, settings: SettingsDep, reg: RegistryDep) -> dict[str, Any]:
    """Every build of the release still queued or running: ``{"builds": [{"build", "was", "now"}]}``,
    ``now`` ``cancelled`` or the final state the build already had."""
    from farm.pipeline.cancel import cancel

    plan.check_id(release_id, "release")
    done = await run_in_threadpool(lambda: cancel(settings, release_id=release_id, registry=reg,
                                                  reason="POST /v1/releases/ID/cancel"))
    return {"builds": [c.to_dict() for c in done]}


@router.post("/v1/builds/{build_id}/cancel", dependencies=[submit])
async def cancel_build(build_id: int, settings: SettingsDep, reg: RegistryDep) -> dict[str, Any]:
    """One build, as ``/v1/releases/ID/cancel`` answers."""
    from farm.pipeline.cancel import cancel

    plan.check_id(build_id, "build")
    done = await run_in_threadpool(lambda: cancel(settings, build_id=build_id, registry=reg,
                                                  reason="POST /v1/builds/ID/cancel"))
    return {"builds": [c.to_dict() for c in done]}
