"""The device lab over HTTP: enrolled agents, their verification jobs, promotions.

- ``POST /v1/devices/enroll`` (the single-use enrollment token as the bearer) takes the agent's
  public key and facts, answers its own bearer token (docs/device-lab.md).
- ``POST /v1/device-jobs/lease`` (an enrolled device's token): one job, or 204 after ``wait_s``.
- ``POST /v1/device-jobs/{id}/renew`` (the same token): keep the lease while the job runs.
- ``POST /v1/device-jobs/{id}/report`` (the same token): the signed report (``registry.verification``).
- ``GET /v1/devices``, ``POST /v1/devices``, ``DELETE /v1/devices/{name}`` (admin).
- ``POST /v1/device-jobs`` (admin): ``farm device verify``, jobs on every SDK's artifact of a model.
- ``POST /v1/promotions`` (admin): ``farm promote`` (409 ``promotion-unmet`` with ``account``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from farm.api.deps import Caller, RegistryDep, SettingsDep, admin, caller, enrollment_token

router = APIRouter(tags=["devices"])
_TIMES_LOCK = threading.Lock()
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0)


class _Unbounded:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *_exc: object) -> None:
        return None


def _lab_gate(request: Request, settings: Any) -> Any:
    """FARM_DEVICE_LAB_CONCURRENCY leases and reports at once in this process: agents are batch
    work that can wait, while a device's resolve waits on every thread and core the lab holds
    (bench/agents.py measures both). The wait is not the service's time per step."""
    gate = getattr(request.app.state, "device_lab_gate", None)
    if gate is None:  # made on the event loop's thread: no race between two first requests
        n = int(settings.device_lab_concurrency)
        gate = request.app.state.device_lab_gate = asyncio.Semaphore(n) if n > 0 else _Unbounded()
    return gate


def _step_seconds(request: Request) -> Any:
    """``ctxfarm_device_job_seconds{step=lease|report}``: the service's own time per lease taken
    (one attempt, not a long poll's wait) and per signed report recorded (made on first use)."""
    hist = getattr(request.app.state, "device_job_seconds", None)
    if hist is None:
        with _TIMES_LOCK:
            hist = getattr(request.app.state, "device_job_seconds", None)
            if hist is None:
                from prometheus_client import Histogram

                hist = request.app.state.device_job_seconds = Histogram(
                    "ctxfarm_device_job_seconds", "Device lab: the service's time per lease taken and per report "
                    "recorded", ["step"], registry=request.app.state.metrics.registry, buckets=STEP_BUCKETS)
    return hist
device_caller = caller("read")
LEASE_WAIT_MAX_S = 25.0
LEASE_LOOK_S = 1.0  # a waiting lease looks again this often (an await: no pool thread is held)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnrollIn(_Strict):
    public_key: str = Field(max_length=64)
    soc: str = Field(max_length=64)
    facts: dict[str, str | None] = Field(default_factory=dict)


class EnrollmentIn(_Strict):
    name: str = Field(max_length=255)
    expires: str = Field(default="24h", max_length=16)


class LeaseIn(_Strict):
    socs: list[str] | None = Field(default=None, max_length=64)
    kinds: list[Literal["context", "group", "genai-package"]] | None = Field(
        default=None, max_length=3, description="the kinds of artifact the agent runs (default: context)")
    runtime: str | None = Field(default=None, max_length=64)
    wait_s: float = Field(default=0.0, ge=0.0, le=LEASE_WAIT_MAX_S)


class RenewIn(_Strict):
    nonce: str = Field(max_length=64)


class ReportIn(_Strict):
    body: str = Field(max_length=16 * 1024)
    signature: str = Field(max_length=128)


class SdkJobsIn(_Strict):
    model: str = Field(max_length=300, description="NAME:TAG, NAME or a model digest")
    devices: int = Field(default=2, ge=1, le=16, description="jobs per SoC and SDK, each done by a distinct device")


class PromotionIn(_Strict):
    model: str = Field(max_length=255, description="NAME:FROM (or, with rollback, NAME:TAG)")
    to: str | None = Field(default=None, max_length=128)
    require: str | None = Field(default=None, max_length=500)
    allow_simulator: bool = False
    rollback: bool = False


@router.post("/v1/devices/enroll", status_code=201)
def enroll(body: EnrollIn, reg: RegistryDep, token: Annotated[str, enrollment_token()]) -> dict[str, Any]:
    """Spend the enrollment token (the bearer: ``Authorization: Bearer cfe_...``): the device's key and
    facts recorded, its own bearer token answered once."""
    from registry.devices import enroll as use

    with reg.db.session() as s:
        device, bearer = use(s, token, body.public_key, body.soc, dict(body.facts))
        return {"name": device.name, "token": bearer, "soc": device.soc, "simulator": device.simulator,
                "key_id": device.key_id}


@router.post("/v1/device-jobs/lease", responses={204: {"description": "no job for this device"}})
async def lease(body: LeaseIn, reg: RegistryDep, settings: SettingsDep, who: Annotated[Caller, device_caller],
                request: Request) -> Any:
    """One verification job this device may run (its SoC; any SoC for a simulator, ``socs`` narrowing
    it), leased to it with a fresh nonce; 204 when none came within ``wait_s``. An agent that hung up
    ends its wait at the next look: a stopped agent leaves no request behind for a shutdown to wait
    on, and takes no lease it would never run."""
    from farm.core.catalog import load_catalog
    from registry.devices import device_of_token
    from registry.verification import lease as take

    socs = [load_catalog().get(s, backend="qnn").name for s in body.socs] if body.socs else None

    times = _step_seconds(request)

    def attempt() -> dict[str, Any] | None:
        started = time.perf_counter()
        with reg.db.session() as s:
            got = take(s, device_of_token(s, who.token_id), socs, runtime=body.runtime, lease_s=settings.device_lease_s,
                       prefer_fastest=settings.resolve_prefer_fastest,
                       kinds=list(body.kinds) if body.kinds else None)
            out = got.to_dict() if got is not None else None
        if out is not None:
            times.labels("lease").observe(time.perf_counter() - started)
        return out

    deadline = time.monotonic() + body.wait_s
    gate = _lab_gate(request, settings)
    while True:
        async with gate:
            got = await run_in_threadpool(attempt)
        if got is not None:
            return got
        left = deadline - time.monotonic()
        if left <= 0:
            return Response(status_code=204)
        await asyncio.sleep(min(LEASE_LOOK_S, left))
        if await request.is_disconnected():
            return Response(status_code=204)


@router.post("/v1/device-jobs/{job_id}/renew")
def renew(job_id: int, body: RenewIn, reg: RegistryDep, settings: SettingsDep,
          who: Annotated[Caller, device_caller]) -> dict[str, Any]:
    """Keep the lease of a job this device is running (409 ``lease-lost`` when it is not its own)."""
    from registry.devices import device_of_token
    from registry.verification import renew as extend

    with reg.db.session() as s:
        until = extend(s, device_of_token(s, who.token_id), job_id, body.nonce, lease_s=settings.device_lease_s)
    return {"job": job_id, "lease_until": until.isoformat()}


@router.post("/v1/device-jobs/{job_id}/report", status_code=201)
async def report(job_id: int, body: ReportIn, reg: RegistryDep, settings: SettingsDep,
                 who: Annotated[Caller, device_caller], response: Response, request: Request) -> dict[str, Any]:
    """Record the signed report that closes job ``job_id`` (201); the same signed report again: 200."""
    from registry.devices import device_of_token
    from registry.verification import accept, view

    times = _step_seconds(request)

    def record() -> dict[str, Any]:
        started = time.perf_counter()
        with reg.db.session() as s:
            device = device_of_token(s, who.token_id)
            row, created = accept(s, device, job_id, body.body, body.signature)
            if not created:
                response.status_code = 200
            out = {**view(row, device.name), "created": created}
        times.labels("report").observe(time.perf_counter() - started)
        return out

    async with _lab_gate(request, settings):
        return await run_in_threadpool(record)


@router.get("/v1/devices", dependencies=[admin])
def list_devices(reg: RegistryDep) -> dict[str, Any]:
    from registry.devices import list_devices as rows

    with reg.db.session() as s:
        return {"devices": rows(s)}


@router.post("/v1/devices", status_code=201)
def create_enrollment(body: EnrollmentIn, reg: RegistryDep, who: Annotated[Caller, caller("admin")]) -> dict[str, Any]:
    """``farm device enroll NAME`` over HTTP: the enrollment token, shown once."""
    from registry.devices import create_enrollment as create
    from registry.devices import parse_duration, token_name

    with reg.db.session() as s:
        got = create(s, body.name, expires_s=parse_duration(body.expires), by=token_name(s, who.token_id))
    return {"name": got.name, "token": got.token, "expires": got.expires.isoformat()}


@router.delete("/v1/devices/{name}", dependencies=[admin])
def revoke(name: str, reg: RegistryDep) -> dict[str, Any]:
    from registry.devices import revoke_device

    with reg.db.session() as s:
        struck = revoke_device(s, name)
    return {"revoked": name, "struck": struck}


@router.post("/v1/device-jobs", status_code=201)
def sdk_jobs(body: SdkJobsIn, reg: RegistryDep, settings: SettingsDep,
             who: Annotated[Caller, caller("admin")]) -> dict[str, Any]:
    """``farm device verify``: jobs on the artifact each SDK's runtime is answered, per SoC, so the
    lab times every SDK of the model (speed per SDK, docs/device-lab.md)."""
    from registry.promotion import sdk_jobs as make

    with reg.db.session() as s:
        rows = make(s, body.model, body.devices, prefer_fastest=settings.resolve_prefer_fastest)
    return {"model": body.model, "jobs": rows}


@router.post("/v1/promotions")
def promotions(body: PromotionIn, reg: RegistryDep, settings: SettingsDep,
               who: Annotated[Caller, caller("admin")]) -> Any:
    """``farm promote``: 200 with the move, or 409 ``promotion-unmet`` with the per-SoC ``account``."""
    from farm.core.errors import UsageError
    from farm.core.names import check_tag, split_ref
    from registry.devices import token_name
    from registry.promotion import promote, rollback, unmet

    name, tag = split_ref(body.model)
    if body.rollback:
        with reg.db.session() as s:
            return rollback(s, name, tag, by=token_name(s, who.token_id))
    if not body.to or not body.require:
        raise UsageError("a promotion needs to and require", hint='{"model": "m:candidate", "to": "stable", '
                                                                  '"require": "devices>=2 per soc"}')
    check_tag(body.to)
    with reg.db.session() as s:
        out = promote(s, name, tag, body.to, body.require, allow_simulator=body.allow_simulator,
                      by=token_name(s, who.token_id), prefer_fastest=settings.resolve_prefer_fastest)
    if out["met"]:
        return out
    err = unmet(out, body.model)
    return JSONResponse({"error": {"code": err.code, "message": err.message, "hint": err.hint},
                         "account": out["account"]}, status_code=409)
