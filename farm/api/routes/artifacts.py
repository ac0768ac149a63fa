"""Artifacts: ``GET /v1/artifacts`` (read), the list `farm ls` prints, and ``GET /v1/artifacts/ID``
(read), the document `farm show` prints (registry.views makes both, for either door)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from farm.api.deps import RegistryDep, read

router = APIRouter(tags=["read"])


@router.get("/v1/artifacts", dependencies=[read])
def list_artifacts(reg: RegistryDep, model: Annotated[str | None, Query(max_length=300)] = None,
                   target: Annotated[str | None, Query(max_length=80)] = None,
                   limit: Annotated[int, Query(ge=1, le=100_000)] = 200) -> list[dict[str, Any]]:
    """Artifacts, newest first (schema: farm/cli/schemas/ls.json); ``model`` a NAME (every tag of
    it), NAME:TAG or digest; ``target`` e.g. ``qnn:SM8650``."""
    from registry.views import ls_rows

    with reg.db.session() as s:
        return ls_rows(s, model=model, target=target, limit=limit)


@router.get("/v1/artifacts/{ref:path}", dependencies=[read])
def show_artifact(ref: Annotated[str, Path(max_length=300)], reg: RegistryDep,
                  target: Annotated[str | None, Query(max_length=80)] = None) -> dict[str, Any]:
    """One artifact by its id (6+ hex digits) or manifest digest, or the one artifact of a model
    (NAME:TAG, NAME or model digest; ``target`` narrows it, e.g. ``qnn:SM8650``); a model with
    several is 400 ``usage`` listing their ids (schema: farm/cli/schemas/show.json)."""
    from registry.views import artifact_document

    with reg.db.session() as s:
        return artifact_document(s, reg.store, ref, target)
