"""Builds: ``GET /v1/builds/ID`` (read), one build with its log, key, options and phases."""

from __future__ import annotations

from fastapi import APIRouter

from farm.api.deps import RegistryDep, read
from farm.api.schemas import BuildDetailOut
from farm.pipeline import plan, states

router = APIRouter(tags=["read"])


@router.get("/v1/builds/{build_id}", response_model=BuildDetailOut, dependencies=[read])
def get_build(build_id: int, reg: RegistryDep) -> BuildDetailOut:
    from registry.index import artifact_for_build

    plan.check_id(build_id, "build")
    with reg.db.session() as s:
        b = states.get_build(s, build_id)
        art = artifact_for_build(s, b.id)
        return BuildDetailOut(**plan.build_view(b, art), log=b.log, key=b.build_key, model=b.model_digest,
                              options=b.options, queue=b.queue, phases=b.phases)
