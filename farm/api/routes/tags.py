"""Tags: ``GET``/``PUT``/``DELETE /v1/tags/NAME/TAG`` (admin)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from farm.api.deps import RegistryDep, admin
from farm.api.schemas import TagIn

router = APIRouter(tags=["admin"])


@router.get("/v1/tags/{name:path}/{tag}", dependencies=[admin])
def get_tag(name: str, tag: str, reg: RegistryDep) -> dict[str, Any]:
    """Where NAME:TAG points (``digest`` null once deleted) and every change of it."""
    from farm.core.names import check_name, check_tag
    from registry.index import tag_view
    from registry.promotion import history

    check_name(name)
    check_tag(tag)
    with reg.db.session() as s:
        return {**tag_view(s, name, tag), "promotions": history(s, name, tag)}


@router.put("/v1/tags/{name:path}/{tag}", dependencies=[admin])
def put_tag(name: str, tag: str, body: TagIn, reg: RegistryDep) -> dict[str, Any]:
    """Point NAME:TAG at a model (the same registry call as `farm tag`). Moving it from
    another model needs ``force: true``, else 409 ``tag-conflict`` and nothing changes;
    ``tag_moved`` says what moved."""
    from farm.core.names import check_name, check_tag
    from registry.index import set_tag, tag_source, tag_view

    check_name(name)
    check_tag(tag)
    with reg.db.session() as s:
        digest, artifact = tag_source(s, body.digest)
        move = set_tag(s, name, tag, digest, force=body.force)
        # What `farm tag --json` prints (schema tag.json), and tag_moved.
        return {**tag_view(s, name, tag), "previous": move.previous if move.moved else None, "moved": move.moved,
                "changed": move.changed, "artifact": artifact, "tag_moved": move.as_move()}


@router.delete("/v1/tags/{name:path}/{tag}", dependencies=[admin])
def delete_tag(name: str, tag: str, reg: RegistryDep) -> dict[str, Any]:
    from farm.core.names import check_name, check_tag
    from registry.index import delete_tag as untag

    check_name(name)
    check_tag(tag)
    with reg.db.session() as s:
        digest = untag(s, name, tag)
    return {"deleted": f"{name}:{tag}", "digest": digest}
