"""ORT model packages (docs/packages.md): ``POST /v1/packages`` (submit) makes, or finds in the index, the
package of NAME:TAG's published builds; ``GET /v1/packages/{digest}`` and ``GET
/v1/packages?ref=NAME:TAG`` (read) answer one made earlier. The package's record and every file
are then fetched by digest from ``/v1/blobs`` (``farm package --server -d DIR`` and ``farm
install --package`` do, verifying each)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from farm.api.deps import RegistryDep, SettingsDep, read, submit
from farm.api.schemas import ErrorResponse
from farm.core.settings import Settings
from registry.index import Registry

router = APIRouter()

DEFAULT_WAIT_S = 30.0  # how long a POST waits for a worker's package before answering 202
LOOK_EVERY_S = 5.0  # a waiting POST looks at the index and the board at least this often (the worker's
# package event wakes it at once; events are at-most-once)


class PackageIn(BaseModel):
    ref: str = Field(max_length=400, description="the published model: NAME:TAG (NAME means NAME:latest)")


class PackagePending(BaseModel):
    ref: str
    status: str = Field(description='"making": a worker is making the package')
    retry_after: int = Field(description="seconds to wait before asking again (also the Retry-After header)")
    message: str


@router.post("/v1/packages", tags=["submit"], dependencies=[submit], responses={
    202: {"model": PackagePending, "description": "a worker is making it (a cluster whose service has no onnxruntime "
                                                  ">= 1.32): POST the same again after Retry-After"},
    404: {"model": ErrorResponse, "description": "not-found (no such NAME:TAG), no-published-builds"},
    409: {"model": ErrorResponse, "description": "package-files-missing; package-ambiguous-variants: two SoCs' "
                                                  "builds ORT can't tell apart (QNN 2.47.0); package-unsupported: an "
                                                  "onnxruntime-genai package (install its folder: farm install --model "
                                                  "NAME:TAG)"},
    500: {"model": ErrorResponse, "description": "package-verify-failed"},
    501: {"model": ErrorResponse, "description": "missing-extra: no onnxruntime >= 1.32 here and no broker"},
    503: {"model": ErrorResponse, "description": "no-worker: no live worker with onnxruntime >= 1.32 to make it"}})
async def create_package(request: Request, body: PackageIn, reg: RegistryDep, settings: SettingsDep,
                         wait: Annotated[float, Query(ge=0, le=60, description="seconds to wait for a package a "
                                                      "worker makes before answering 202")] = DEFAULT_WAIT_S
                         ) -> Any:
    """The package of ``ref``'s published builds (schema: farm/cli/schemas/package.json):
    answered from the index (``cached: true``) unless a build was published since the last one,
    else made, verified with onnxruntime's own API and published.

    Where it is made: here when this service has onnxruntime >= 1.32 (the embedded service).
    Otherwise, in a cluster (a broker), by a live worker that has it (the QNN 2.49.40 / 2.51.0
    workers): the request waits up to ``wait`` seconds for it, holding no thread, and answers
    it (``cached: false`` when it was made while this request waited), the worker's error (its
    code and status, as here), or 202 with ``Retry-After`` while it is being made (POST the same
    again: one worker makes it, however many ask). Errors: 404 ``not-found`` (no such NAME:TAG),
    404 ``no-published-builds``, 409 ``package-files-missing``, 409 ``package-ambiguous-variants`` (two
    SoCs' builds whose compatibility strings ORT can't tell apart), 409 ``package-unsupported`` (a genai
    package: no ORT model package is made of one), 500 ``package-verify-failed``, 501
    ``missing-extra`` (no onnxruntime >= 1.32 here and no broker), 503 ``no-worker`` (no live
    worker can make it)."""
    from starlette.concurrency import run_in_threadpool

    answer = await run_in_threadpool(_here, settings, reg, body.ref)
    if answer is not None:
        return answer
    polls = request.app.state.longpolls
    jobs = _jobs(request.app, settings, reg)
    answer = await polls.read(jobs.step, body.ref)
    waited = answer is None
    if answer is None and wait > 0:
        from farm.api.longpoll import disconnected
        from farm.pipeline.events import PACKAGE_EVENT

        token = request.headers.get("authorization", "").partition(" ")[2].strip()
        # A waiting POST counts as a long poll (their caps); the worker's package event wakes it.
        answer = await polls.until(lambda got: got is not None, jobs.step, body.ref, wait=wait, token=token,
                                   disconnected=lambda: disconnected(request), events=frozenset({PACKAGE_EVENT}),
                                   every=LOOK_EVERY_S)
    if answer is not None:
        # Made while this request waited: new to its asker, as a package made here would be.
        return {**answer, "cached": answer["cached"] and not waited}
    from farm.pipeline.package_jobs import RETRY_AFTER_S

    pending = PackagePending(ref=body.ref, status="making", retry_after=RETRY_AFTER_S,
                             message="a worker is making the package; POST the same again after Retry-After")
    return JSONResponse(pending.model_dump(), status_code=202, headers={"Retry-After": str(RETRY_AFTER_S)})


def _here(settings: Settings, reg: Registry, ref: str) -> dict[str, Any] | None:
    """The answer when the index holds it or this process can make it (or no worker could:
    no broker); None when a worker must make it."""
    from farm.pipeline.execute import signer_for
    from farm.pipeline.packages import authors_here, check_buildable, make_package, package_inputs

    inputs = package_inputs(reg, ref)
    if inputs.made is None and settings.broker_url:
        check_buildable(inputs)
        if not authors_here():
            return None
    return make_package(settings, reg, ref, signer=signer_for(settings), inputs=inputs)


def _jobs(app: Any, settings: Settings, reg: Registry) -> Any:
    """This service's PackageJobs (the broker's Redis as the board), made at the first use."""
    jobs = getattr(app.state, "package_jobs", None)
    if jobs is None:
        from farm.pipeline.package_jobs import PackageJobs, RedisPackageBoard, celery_dispatch

        assert settings.broker_url
        jobs = app.state.package_jobs = PackageJobs(settings, reg, RedisPackageBoard(settings.broker_url),
                                                    celery_dispatch(settings))
    return jobs


@router.get("/v1/packages", tags=["read"], dependencies=[read], responses={
    409: {"model": ErrorResponse, "description": "package-unsupported: an onnxruntime-genai package"}})
def newest_package(ref: Annotated[str, Query(max_length=400)], reg: RegistryDep) -> dict[str, Any]:
    """The newest package made of ``ref``'s current model (``farm install --package``): made
    earlier by ``POST /v1/packages``, never here (404 ``not-found`` names the command; 409
    ``package-unsupported`` for a genai package, whose folder installs as an artifact)."""
    from farm.pipeline.packages import current_package

    return current_package(reg, ref)


@router.get("/v1/packages/{digest}", tags=["read"], dependencies=[read])
def get_package(digest: Annotated[str, Path(pattern=r"^sha256:[0-9a-f]{64}$")], reg: RegistryDep) -> dict[str, Any]:
    """A package made earlier, by its digest (404 ``not-found`` otherwise)."""
    from farm.pipeline.packages import package_answer

    return package_answer(reg, digest, cached=True)
