"""Coverage: ``GET /v1/coverage`` (JSON) and the ``/coverage`` page (read)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse

from farm.api.deps import RegistryDep, read, read_page
from registry.index import Registry

router = APIRouter(tags=["read"])


@router.get("/v1/coverage", dependencies=[read])
def coverage_json(reg: RegistryDep, model: Annotated[list[str] | None, Query()] = None,
                  backend: Annotated[str | None, Query(pattern="^(qnn|trt)$")] = None) -> dict[str, Any]:
    return coverage_of(reg, model, backend)


@router.get("/coverage", response_class=HTMLResponse, dependencies=[read_page])
def coverage_page(reg: RegistryDep, model: Annotated[list[str] | None, Query(max_length=20)] = None,
                  soc: Annotated[str | None, Query(max_length=64)] = None,
                  sdk: Annotated[str | None, Query(max_length=64)] = None,
                  tag: Annotated[str | None, Query(max_length=128)] = None,
                  prefix: Annotated[str | None, Query(max_length=255)] = None,
                  state: Annotated[str | None, Query(pattern="^(|built|building|broken|failed|missing)$")] = None,
                  cursor: Annotated[str | None, Query(max_length=600)] = None) -> HTMLResponse:
    """The summary first (SoC x SDK), the legend, then one page of models (farm.api.page)."""
    from farm.api.page import render_page

    # A form submits empty fields: an empty filter is no filter.
    model = [m for m in model or [] if m.strip()] or None
    with reg.db.session() as s:
        return HTMLResponse(render_page(s, tag=tag or None, prefix=prefix or None, model=model, soc=soc or None,
                                        sdk=sdk or None, state=state or None, cursor=cursor or None))


def coverage_of(reg: Registry, models: list[str] | None, backend: str | None) -> dict[str, Any]:
    """The JSON of `farm coverage --json` (farm/cli/schemas/coverage.json): one row per model digest."""
    from registry.coverage import coverage

    with reg.db.session() as s:
        return coverage(s, backend=backend, models=models or None).to_dict()


# -- the summary and the paged drill-down: what ops read at any size ------------------------------

ScopeQuery = Annotated[str | None, Query(max_length=255)]


@router.get("/v1/coverage/summary", dependencies=[read])
def coverage_summary(reg: RegistryDep, tag: Annotated[str | None, Query(max_length=128)] = None,
                     prefix: ScopeQuery = None, model: Annotated[list[str] | None, Query(max_length=20)] = None,
                     backend: Annotated[str | None, Query(pattern="^(qnn|trt)$")] = None) -> dict[str, Any]:
    """SoC x SDK counts (built, building, broken, failed, missing, probe- and device-verified) for
    the whole farm (kept up to date as builds finish) or a tag, a name prefix, models."""
    from registry.coverage import scope, summary

    with reg.db.session() as s:
        return summary(s, scope(s, tag=tag, prefix=prefix, models=model, backend=backend)).to_dict()


@router.get("/v1/coverage/models", dependencies=[read])
def coverage_models(reg: RegistryDep, tag: Annotated[str | None, Query(max_length=128)] = None,
                    prefix: ScopeQuery = None, model: Annotated[list[str] | None, Query(max_length=20)] = None,
                    backend: Annotated[str | None, Query(pattern="^(qnn|trt)$")] = None,
                    target: Annotated[str | None, Query(max_length=80)] = None,
                    toolchain: Annotated[str | None, Query(max_length=64)] = None,
                    state: Annotated[str | None, Query(pattern="^(built|building|broken|failed|missing)$")] = None,
                    cursor: Annotated[str | None, Query(max_length=600)] = None,
                    limit: Annotated[int, Query(ge=1, le=200)] = 20) -> dict[str, Any]:
    """One page of models (by name) with their cells; ``next`` is the cursor of the page after."""
    from registry.coverage import models_page, scope

    with reg.db.session() as s:
        return models_page(s, scope(s, tag=tag, prefix=prefix, models=model, backend=backend), target=target,
                           toolchain=toolchain, state=state, cursor=cursor, limit=limit).to_dict()
