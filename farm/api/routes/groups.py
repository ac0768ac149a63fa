"""Graph groups: ``POST /v1/groups`` (submit) records an ordered set of named graphs, each a
model the service already holds, as one model to release (farm.pipeline.groups); a release of
its digest (``POST /v1/releases``) compiles the graphs together into shared context binaries."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from farm.api.deps import RegistryDep, submit
from farm.core.groups import MAX_GRAPHS

router = APIRouter()


class GraphIn(BaseModel):
    name: str = Field(max_length=64, description="lowercase identifier, optionally dotted: prefill, part1.decode")
    model: str = Field(max_length=300, description="the graph's model: a digest the service holds, or NAME[:TAG]")


class GroupIn(BaseModel):
    graphs: list[GraphIn] = Field(min_length=2, max_length=MAX_GRAPHS, description="in compile order")
    name: str | None = Field(default=None, max_length=255)
    tag: str | None = Field(default=None, max_length=128)
    force_tag: bool = False


class GraphOut(BaseModel):
    name: str
    model: str


class GroupOut(BaseModel):
    digest: str = Field(description="the group's model digest: release it with POST /v1/releases")
    graphs: list[GraphOut]
    size: int
    tag_moved: dict[str, str] | None = None


@router.post("/v1/groups", response_model=GroupOut, tags=["submit"], dependencies=[submit])
def create_group(body: GroupIn, reg: RegistryDep) -> GroupOut:
    """Record a graph group from stored models (bad or repeated names: 400 ``bad-group``; a
    member not held: 404 ``not-found``). Idempotent: the same graphs give the same digest."""
    from farm.pipeline.groups import record_group

    out = record_group(reg, [(g.name, g.model) for g in body.graphs], name=body.name, tag=body.tag,
                       force_tag=body.force_tag)
    return GroupOut(digest=out["digest"], graphs=[GraphOut(**g) for g in out["graphs"]], size=out["size"],
                    tag_moved=out["tag_moved"])
