"""Coverage: ``GET /v1/coverage`` (JSON) and the ``/coverage`` page (read)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse

from farm.api.deps import RegistryDep, read
from registry.index import Registry

router = APIRouter(tags=["read"])


@router.get("/v1/coverage", dependencies=[read])
def coverage_json(reg: RegistryDep, model: Annotated[list[str] | None, Query()] = None,
                  backend: Annotated[str | None, Query(pattern="^(qnn|trt)$")] = None) -> dict[str, Any]:
    return coverage_of(reg, model, backend)


@router.get("/coverage", response_class=HTMLResponse, dependencies=[read])
def coverage_page(reg: RegistryDep, model: Annotated[list[str] | None, Query()] = None,
                  soc: Annotated[str | None, Query(max_length=64)] = None,
                  sdk: Annotated[str | None, Query(max_length=64)] = None) -> HTMLResponse:
    from farm.api.page import render

    return HTMLResponse(render(coverage_of(reg, model, None), soc=soc, sdk=sdk))


def coverage_of(reg: Registry, models: list[str] | None, backend: str | None) -> dict[str, Any]:
    """The JSON of `farm coverage --json` (farm/cli/schemas/coverage.json): one row per model digest."""
    from registry.coverage import coverage

    with reg.db.session() as s:
        return coverage(s, backend=backend, models=models or None).to_dict()
