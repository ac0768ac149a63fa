"""Releases: ``POST /v1/releases`` (submit) and ``GET /v1/releases/ID`` with its long poll (read)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from farm.api.deps import Caller, RegistryDep, RunnerDep, SettingsDep, read, submitter
from farm.api.longpoll import disconnected
from farm.api.schemas import BuildOut, ErrorResponse, ReleaseIn, ReleaseOut
from farm.core import errors as E
from farm.core.settings import Settings
from farm.pipeline import plan
from registry.index import Registry

router = APIRouter()


@router.post("/v1/releases", response_model=ReleaseOut, tags=["submit"],
             responses={429: {"model": ErrorResponse, "description": "quota-releases: this token has "
                                                                     "FARM_QUOTA_RELEASES releases in progress"},
                        409: {"model": ErrorResponse, "description": "no-worker: the embedded service (no broker) "
                                                                     "can't build an SDK it does not have; retrying "
                                                                     "will not change that"}})
def create_release(http: Request, body: ReleaseIn, settings: SettingsDep, reg: RegistryDep, runner: RunnerDep,
                   who: Annotated[Caller, submitter]) -> ReleaseOut | Response:
    """Queue a release owned by this token (only it or an admin cancels it); at most
    FARM_QUOTA_RELEASES of its releases may have builds queued or running (429 ``quota-releases``)."""
    from registry.index import resolve_model_ref

    request = plan.ReleaseRequest.parse(body.targets, body.sdks, body.options, allow_queue=body.allow_queue,
                                        retry_failed=body.retry_failed,
                                        require_full_offload=body.require_full_offload,
                                        min_psnr=body.min_psnr)
    with reg.db.session() as s:
        digest = resolve_model_ref(s, body.model)
    served, refusal = served_or_refusal(http, settings, reg, request)
    if refusal is not None:
        return refusal
    # Counted and queued as one step per token: two requests at once cannot both pass the quota.
    with reg.db.serialized("releases", who.token_id):
        with reg.db.session() as s:
            _check_quota(s, settings, who)
        st = plan.queue_release(settings, reg, digest, request, served=served, display=body.model,
                                dispatch=runner is None, owner=who.token_id)
    if runner is not None:
        runner.submit([b["build"] for b in st.builds])
    return release_out(st)


@router.get("/v1/releases/{release_id}", response_model=ReleaseOut, tags=["read"], dependencies=[read],
            responses={429: {"model": ErrorResponse, "description": "rate-limited: too many long polls waiting "
                                                                    "(per token or in all); see Retry-After"}})
async def get_release(request: Request, release_id: int, settings: SettingsDep, reg: RegistryDep,
                      wait: Annotated[float, Query(ge=0, le=60)] = 0) -> ReleaseOut:
    """``wait=S``: a long poll, answered once the release is done, once one of its builds
    changes state (woken by the executors' events), when the client hangs up, or after S
    seconds. A waiting poll holds no thread (``farm.api.longpoll``); too many waiting, per
    token or in all, is 429 ``rate-limited``."""
    from starlette.concurrency import run_in_threadpool

    release_id = plan.check_id(release_id, "release")
    if wait <= 0:
        return release_out(await run_in_threadpool(plan.release_status, settings, release_id, reg))
    polls = request.app.state.longpolls
    token = request.headers.get("authorization", "").partition(" ")[2].strip()
    return release_out(await polls.watch(release_id, wait, token, lambda: disconnected(request)))


def _check_quota(s: Any, settings: Settings, who: Caller) -> None:
    """FARM_QUOTA_RELEASES: this token's releases, not cancelled, with a build queued or running."""
    from sqlalchemy import func, select

    from registry.models import Build, Release, ReleaseBuild

    busy = s.scalar(select(func.count(func.distinct(Release.id)))
                    .join(ReleaseBuild, ReleaseBuild.release_id == Release.id)
                    .join(Build, Build.id == ReleaseBuild.build_id)
                    .where(Release.owner_token_id == who.token_id, Release.cancelled_at.is_(None),
                           Build.state.in_(("queued", "running")))) or 0
    if busy >= settings.quota_releases:
        raise E.QuotaReleasesError(f"this token has {busy} releases with builds queued or running "
                                   f"(FARM_QUOTA_RELEASES={settings.quota_releases})")


def served_or_refusal(http: Request, settings: Settings, reg: Registry, request: plan.ReleaseRequest
                      ) -> tuple[dict[tuple[str, str], list[str]], Response | None]:
    """The toolchains serving ``request`` (``request.check_served`` passed), or the embedded
    service's 409 ``no-worker`` for an SDK it does not have (``embedded_served``): not "try again
    later" (503), this service will never have it."""
    served = _served(settings, reg, request)
    if settings.embedded:
        try:
            embedded_served(request, served)
        except E.NoWorkerError as exc:
            from farm.api.errors import error_response, roots_of

            return served, error_response(exc, roots_of(http.app), status=409)
    request.check_served(served)
    return served, None


def _served(settings: Settings, reg: Registry, request: plan.ReleaseRequest) -> dict[tuple[str, str], list[str]]:
    if settings.embedded:
        # The service builds in-process: it serves the toolchains installed here.
        from workers.backends import get_runner

        out: dict[tuple[str, str], list[str]] = {}
        for t in request.targets:
            try:
                tc = get_runner(t.backend).toolchain()
            except E.FarmError:
                continue
            out[(tc.backend, tc.version)] = ["embedded"]
        return out
    return plan.served_toolchains(settings, reg)


def embedded_served(request: plan.ReleaseRequest, served: dict[tuple[str, str], list[str]]) -> None:
    """The embedded service builds with the toolchains installed beside it, and nothing else:
    asked for another SDK (or a backend it has none of), it says which it has and where the others
    are built. ``--allow-queue`` changes nothing here: without a broker no worker can take the
    build."""
    unserved: set[tuple[str, str]] = set()
    for t in request.targets:
        versions = list(request.sdks) or [v for (b, v) in served if b == t.backend] or ["(any version)"]
        unserved.update((t.backend, v) for v in versions if (t.backend, v) not in served)
    if not unserved:
        return
    have = ", ".join(f"{b.upper()} {v}" for b, v in _installed()) or "no toolchain"
    asked = ", ".join(f"{b.upper()} {v}" for b, v in sorted(unserved))
    raise E.NoWorkerError(
        f"this service builds in-process (no broker) with {have}, what is installed beside it; it can't build {asked}",
        hint="leave the SDK out (or ask for one it has); other SDKs build on a cluster, one worker per SDK "
             "(infra/farm-up.sh starts one here; docs/operations.md), where --allow-queue waits for a worker "
             "that is not up yet",
        details={"served": [f"{b}:{v}" for b, v in sorted(served)]})


def _installed() -> list[tuple[str, str]]:
    """(backend, version) of every toolchain installed beside this process."""
    from farm.core.catalog import BACKENDS
    from workers.backends import get_runner

    out = []
    for backend in BACKENDS:
        try:
            tc = get_runner(backend).toolchain()
        except E.FarmError:
            continue
        out.append((tc.backend, tc.version))
    return sorted(out)


def release_out(st: plan.ReleaseStatus) -> ReleaseOut:
    return ReleaseOut(release=st.release_id, model=st.model, done=st.done, ok=st.ok,
                      builds=[BuildOut(**b) for b in st.builds])
