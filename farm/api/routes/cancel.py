"""Cancel: ``POST /v1/releases/ID/cancel`` and ``POST /v1/builds/ID/cancel`` (submit).

Queued builds fail at once with code ``cancelled``; a running one is stopped by its executor at
its next lease renewal (seconds), embedded or on a worker (``farm.pipeline.cancel``).

Only the token that submitted a release (or an admin) cancels it; to another token the release
does not exist (404 ``not-found``, as an unknown id: ids are sequential, so a 403 would tell one
token which ids another has). A build another live release wants is ``kept``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from farm.api.deps import Caller, RegistryDep, SettingsDep, submitter
from farm.pipeline import plan

router = APIRouter(tags=["submit"])


@router.post("/v1/releases/{release_id}/cancel")
async def cancel_release(release_id: int, settings: SettingsDep, reg: RegistryDep,
                         who: Annotated[Caller, submitter]) -> dict[str, Any]:
    """Every build of the release still queued or running: ``{"builds": [{"build", "was", "now"}]}``,
    ``now`` ``cancelled`` or the final state the build already had; a genai package's release
    adds its twin builds as ``{"twin_build", "was", "now"}``."""
    from farm.pipeline.cancel import cancel

    plan.check_id(release_id, "release")
    done = await run_in_threadpool(lambda: cancel(settings, release_id=release_id, registry=reg,
                                                  reason="POST /v1/releases/ID/cancel", caller=who.token_id,
                                                  admin=who.admin))
    return {"builds": [c.to_dict() for c in done]}


@router.post("/v1/builds/{build_id}/cancel")
async def cancel_build(build_id: int, settings: SettingsDep, reg: RegistryDep,
                       who: Annotated[Caller, submitter]) -> dict[str, Any]:
    """One build, as ``/v1/releases/ID/cancel`` answers: by an admin outright; by a submit token
    only a build of its own releases, ``kept`` while another token's release wants it."""
    from farm.pipeline.cancel import cancel

    plan.check_id(build_id, "build")
    done = await run_in_threadpool(lambda: cancel(settings, build_id=build_id, registry=reg,
                                                  reason="POST /v1/builds/ID/cancel", caller=who.token_id,
                                                  admin=who.admin))
    return {"builds": [c.to_dict() for c in done]}
