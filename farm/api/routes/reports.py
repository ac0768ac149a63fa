"""Device reports (docs/evidence.md): ``POST /v1/reports`` (scope ``report``) records
what a device saw loading an artifact; ``GET /v1/reports?artifact=`` (read) sums them up;
``DELETE /v1/reports/{id}`` and ``DELETE /v1/reports?token=NAME`` (admin) strike reports.

The body is read up to ``MAX_BODY`` bytes before anything is parsed (413 ``too-large`` past it),
then validated whole (unknown fields, wrong types, far-future timestamps: 400 ``usage``); an
unknown artifact is 404 ``not-found``, an SoC the catalog lacks 400 ``unknown-target``. Each
token may send ``FARM_REPORTS_PER_MINUTE`` reports a minute, counted once for the whole service
(``farm.api.ratelimit``: in Redis with a broker) (429 ``rate-limited``).
A report that can't be device evidence for its artifact (``registry.resolve.admit``) is
422 ``not-device-evidence`` (the simulator's host), ``report-soc-mismatch`` or
``report-runtime-mismatch``. ``GET /v1/reports/quarantined`` and ``POST /v1/reports/lift`` (admin)
show and lift what independent reports withhold from resolve.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.routing import Route

from farm.api.deps import RegistryDep, admin, read, receive_body, request_identity, submit_before_body
from farm.core import errors as E

router = APIRouter(tags=["reports"])

MAX_BODY = 16 * 1024  # bytes: a report is a few hundred
FUTURE_SLACK = timedelta(minutes=10)  # device clocks drift; beyond this a timestamp is refused
PAST_LIMIT = timedelta(days=365)
IDENT = r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$"
# Free-text fields: printable, one line (farm.core.text.unprintable: no C0/C1 control incl. CR, LF,
# tab and a lone CSI, no format or bidi character, no line separator).
TEXT_FIELDS = ("device_model", "os", "driver", "error")


class ReportIn(BaseModel):
    """What a device reports after loading (or failing to load) an artifact."""

    model_config = ConfigDict(extra="forbid", strict=True)

    artifact: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", description="the manifest digest resolve answered")
    device_id: str = Field(min_length=1, max_length=128, pattern=IDENT,
                           description="a stable id of this device (e.g. a hash of an install id); one device counts "
                                       "once per artifact and runtime, however often it reports")
    device_model: str = Field(min_length=1, max_length=128)
    soc: str = Field(min_length=1, max_length=64, description="Build.SOC_MODEL / part name, e.g. SM8650")
    os: str = Field(min_length=1, max_length=128, description="e.g. Android 15")
    arch: str = Field(min_length=1, max_length=16,
                      description="the CPU architecture the runtime runs on (uname -m, an Android ABI: aarch64, "
                                  "arm64-v8a, armv7l, x86_64...); a QNN runtime on x86_64/x86 is the HTP simulator, "
                                  "never device evidence (422 not-device-evidence)")
    runtime_version: str = Field(pattern=r"^\d+(\.\d+){1,3}(\+[a-z0-9][a-z0-9-]{0,40})?$", max_length=64,
                                 description="the QNN SDK (or TensorRT) version the device runtime reports")
    onnxruntime: str = Field(min_length=1, max_length=32, pattern=IDENT)
    ep_package: str | None = Field(default=None, max_length=64, pattern=IDENT)
    ep_version: str | None = Field(default=None, max_length=32, pattern=IDENT)
    driver: str | None = Field(default=None, max_length=128)
    outcome: Literal["loads", "fails", "crashed"]
    error: str | None = Field(default=None, max_length=4000,
                              description="the runtime's error text (fails, crashed), printable on one line")
    load_ms: float | None = Field(default=None, ge=0, le=3_600_000)
    first_inference_ms: float | None = Field(default=None, ge=0, le=3_600_000)
    peak_memory_mb: float | None = Field(default=None, ge=0, le=1_048_576)
    fingerprint: str | None = Field(default=None, max_length=128, pattern=r"^[A-Za-z0-9:+/=_-]+$",
                                    description="e.g. sha256 of the first output")
    psnr_db: float | None = Field(default=None, ge=0, le=200)
    reported_at: datetime | None = Field(default=None, description="ISO 8601 with a zone; not in the future")

    @field_validator("load_ms", "first_inference_ms", "peak_memory_mb", "psnr_db", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        # JSON numbers only (strict mode refuses ints for floats): 12 and 12.5 are both fine.
        if isinstance(v, bool):
            raise ValueError("a number, not a boolean")
        if isinstance(v, int):
            return float(v)
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("a finite number")
        return v

    @field_validator(*TEXT_FIELDS)
    @classmethod
    def _printable(cls, v: Any) -> Any:
        from farm.core.text import unprintable

        if isinstance(v, str) and (bad := unprintable(v)) is not None:
            raise ValueError(f"not printable text ({bad}): control, format, bidi and line-break characters are refused")
        return v

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: str) -> str:
        from registry.reports import ARCHES, canonical_arch

        arch = canonical_arch(v)
        if arch is None:
            raise ValueError(f"an unknown CPU architecture (known: {', '.join(sorted(set(ARCHES.values())))})")
        return arch

    @field_validator("reported_at", mode="before")
    @classmethod
    def _when(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, str) or len(v) > 40:
            raise ValueError("an ISO 8601 timestamp with a zone, e.g. 2026-11-25T12:00:00Z")
        try:
            when = datetime.fromisoformat(v)
        except ValueError:
            raise ValueError("an ISO 8601 timestamp with a zone, e.g. 2026-11-25T12:00:00Z") from None
        if when.tzinfo is None:
            raise ValueError("the timestamp has no time zone (add Z or +00:00)")
        now = datetime.now(UTC)
        if when > now + FUTURE_SLACK:
            raise ValueError("the timestamp is in the future (check the device clock)")
        if when < now - PAST_LIMIT:
            raise ValueError("the timestamp is over a year old")
        return when


class _State:
    """Per-app state of this router (made on first use: the app factory needs no line for it)."""

    def __init__(self, request: Request):
        from prometheus_client import Counter

        registry = request.app.state.metrics.registry
        self.received = Counter("ctxfarm_reports", "Device reports accepted, by runtime and outcome",
                                ["runtime", "outcome"], registry=registry)
        self.refused = Counter("ctxfarm_reports_refused", "Device reports refused, by error code", ["code"],
                               registry=registry)
        from farm.api.ratelimit import ReportLimiter

        self.limiter = ReportLimiter(request.app.state.settings.broker_url)
        self.artifacts: OrderedDict[str, Any] = OrderedDict()  # digest -> registry.reports.ArtifactRef
        self._writer: Any = None

    def writer(self, reg: Any) -> Any:
        if self._writer is None:
            with _STATE_LOCK:
                if self._writer is None:
                    from registry.reports import ReportWriter

                    self._writer = ReportWriter(reg.db)
        return self._writer


_STATE_LOCK = threading.Lock()


def _state(request: Request) -> _State:
    st = getattr(request.app.state, "reports", None)
    if st is None:
        with _STATE_LOCK:
            st = getattr(request.app.state, "reports", None)
            if st is None:
                st = request.app.state.reports = _State(request)
    return st  # type: ignore[no-any-return]


async def _reporter(request: Request, authorization: Annotated[str | None, Header(max_length=300)] = None) -> int:
    """The id of a ``report`` (or ``admin``) token: 401 none/unknown/revoked, 403 any other scope.
    Async: a cached token costs no pool thread (``farm.api.auth``: only a miss reads the token, in
    one; a revocation holds at once, here as on every route)."""
    from registry.tokens import allows

    scheme, _, raw = (authorization or "").strip().partition(" ")
    raw = raw.strip()
    if scheme.lower() != "bearer" or not raw:
        raise E.UnauthorizedError("no token" if not authorization else "the Authorization header must be Bearer",
                                  hint="send Authorization: Bearer <report token>")
    found = await request_identity(request, raw)
    if found is None:
        raise E.UnauthorizedError("unknown or revoked token")
    token_id, scope = found
    if not allows(scope, "report"):
        raise E.ForbiddenError(f"a {scope} token can't report (needs a report token)",
                               hint="an admin makes one: farm token create NAME --scope report")
    return token_id


@router.post("/v1/reports", status_code=201, responses={201: {"description": "recorded"}, 429: {}})
async def post_report(request: Request, token_id: Annotated[int, Depends(_reporter)]) -> JSONResponse:
    """Record one device report (see ``ReportIn``). A device that reports the same artifact and
    runtime again replaces its report: it counts once. (Served by ``fast_route``, which ``include``
    puts first; this one documents it in the OpenAPI schema.)"""
    return await _handle(request, token_id)


async def _fast_post(request: Request) -> JSONResponse:
    """``POST /v1/reports`` as a plain Starlette route: the same checks and answer, without
    FastAPI's per-request dependency solving and its walk over every route (the fleet's hottest
    write: measured 1.7 -> 1.2 ms of service CPU per report)."""
    authorization = request.headers.get("authorization")
    if authorization is not None and len(authorization) > 300:
        raise E.UnauthorizedError("the Authorization header is too long")
    return await _handle(request, await _reporter(request, authorization))


async def _handle(request: Request, token_id: int) -> JSONResponse:
    from starlette.concurrency import run_in_threadpool

    # From app.state directly: FastAPI runs sync dependencies in pool threads, a hop each.
    reg, settings = request.app.state.registry, request.app.state.settings
    st = _state(request)
    try:
        if not await st.limiter.allow(token_id, settings.reports_per_minute):
            raise E.RateLimitedError(f"this token sent over {settings.reports_per_minute} reports this minute")
        raw = await _bounded_body(request)
        report = _parse(raw)
        if report.artifact in st.artifacts:  # known: no database read, no pool thread
            artifact_id, out, fields = _prepare(reg, st, report)
        else:
            artifact_id, out, fields = await run_in_threadpool(_prepare, reg, st, report)
        # Written by the batching writer (registry.reports.ReportWriter): no pool thread waits.
        out["report"] = await st.writer(reg).write(artifact_id, token_id, fields)
    except E.FarmError as exc:
        st.refused.labels(exc.code).inc()
        if isinstance(exc, E.RateLimitedError):
            from farm.api.errors import error_response

            resp = error_response(exc)
            resp.status_code = 429
            resp.headers["Retry-After"] = "60"
            return resp
        raise
    st.received.labels(f"{out['runtime']}", report.outcome).inc()
    return JSONResponse(out, status_code=201)


fast_route = Route("/v1/reports", _fast_post, methods=["POST"])


def include(app: Any) -> None:
    """The routes of this module on ``app``: the router (OpenAPI, reads, revocations, samples),
    and ``fast_route`` first of all routes."""
    app.include_router(router)
    app.router.routes.insert(0, fast_route)


async def _bounded_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise E.TooLargeError(f"a report is at most {MAX_BODY} bytes", hint="send one report per request")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise E.TooLargeError(f"a report is at most {MAX_BODY} bytes", hint="send one report per request")
    return bytes(body)


def _parse(raw: bytes) -> ReportIn:
    if not raw:
        raise E.UsageError("the report body is empty", hint="POST a JSON object (see /openapi.json: ReportIn)")
    try:
        return ReportIn.model_validate_json(raw)
    except ValidationError as exc:
        errors: list[Any] = list(exc.errors())
        first: dict[str, Any] = dict(errors[0]) if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        msg = str(first.get("msg", "invalid"))[:200]
        raise E.UsageError(f"report {where}: {msg}", hint="see /openapi.json (ReportIn)") from None


def _prepare(reg: Any, st: _State, report: ReportIn) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(artifact id, the answer without its report id, the row's fields): the artifact by digest
    (cached: artifacts are immutable), the SoC by the catalog, then ``registry.resolve.admit``:
    refused unless it can be device evidence for that artifact."""
    from farm.core.catalog import load_catalog
    from registry.lite import SessionRows
    from registry.reports import artifact_ref
    from registry.resolve import admit

    ref = st.artifacts.get(report.artifact)
    if ref is None:
        with reg.db.session() as s:
            ref = artifact_ref(SessionRows(s), report.artifact)
            if ref is None:
                raise E.NotFoundError(f"no artifact {report.artifact[:80]}",
                                      hint="report the artifact digest that resolve or install answered")
        st.artifacts[report.artifact] = ref  # artifacts are immutable by digest
        if len(st.artifacts) > 50_000:
            st.artifacts.popitem(last=False)
    target = load_catalog().get(report.soc, backend=ref.backend)
    admit(ref, target, report.runtime_version, report.arch)
    fields = report.model_dump(exclude={"artifact", "onnxruntime"})
    fields.update(soc=target.name, runtime_backend=ref.backend, ort_version=report.onnxruntime)
    return ref.id, {"report": 0, "artifact": report.artifact, "runtime": f"{ref.backend}:{report.runtime_version}",
                    "soc": target.name, "outcome": report.outcome}, fields


@router.get("/v1/reports", dependencies=[read])
def get_reports(reg: RegistryDep, artifact: Annotated[str, Query(pattern=r"^sha256:[0-9a-f]{64}$")]) -> dict[str, Any]:
    """What devices reported about an artifact: per runtime and SoC, distinct devices by outcome,
    load time p50/p90, first inference p50, peak memory."""
    from registry.lite import SessionRows
    from registry.reports import artifact_ref, summary

    with reg.db.session() as s:
        ref = artifact_ref(SessionRows(s), artifact)
        if ref is None:
            raise E.NotFoundError(f"no artifact {artifact}")
        return {"artifact": artifact, "devices": summary(s, [ref.id]).get(ref.id, [])}


@router.get("/v1/reports/quarantined", dependencies=[admin])
def get_quarantined(request: Request, reg: RegistryDep) -> dict[str, Any]:
    """What independent device reports withhold from resolve (docs/evidence.md): per artifact,
    runtime and SoC, the devices and tokens that failed and loaded, the last error, since when."""
    from registry.lite import SessionRows
    from registry.reports import quarantined

    with reg.db.session() as s:
        return {"quarantined": quarantined(SessionRows(s), request.app.state.settings.report_fail_devices)}


class LiftIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    artifact: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    soc: str = Field(min_length=1, max_length=64)
    runtime: str = Field(pattern=r"^\d+(\.\d+){1,3}(\+[a-z0-9][a-z0-9-]{0,40})?$", max_length=64,
                         description="the runtime version the quarantine is for, e.g. 2.51.0")


@router.post("/v1/reports/lift", dependencies=[admin])
def lift_quarantine(reg: RegistryDep, body: LiftIn) -> dict[str, Any]:
    """Lift a quarantine: strike the failed reports of (artifact, runtime, SoC); new independent
    failures quarantine it again."""
    from farm.core.catalog import load_catalog
    from registry.lite import SessionRows
    from registry.reports import artifact_ref, lift

    with reg.db.session() as s:
        ref = artifact_ref(SessionRows(s), body.artifact)
        if ref is None:
            raise E.NotFoundError(f"no artifact {body.artifact}")
        soc = load_catalog().get(body.soc, backend=ref.backend).name
        return {"lifted": lift(s, ref.id, ref.backend, body.runtime, soc)}


@router.delete("/v1/reports/{report_id}", dependencies=[admin])
def revoke_report(reg: RegistryDep, report_id: int) -> dict[str, Any]:
    from farm.pipeline.plan import check_id
    from registry.reports import revoke

    check_id(report_id, "report")
    with reg.db.session() as s:
        return {"revoked": revoke(s, report_id=report_id)}


@router.delete("/v1/reports", dependencies=[admin])
def revoke_token_reports(reg: RegistryDep, token: Annotated[str, Query(min_length=1, max_length=255)]
                         ) -> dict[str, Any]:
    """Strike every report a token sent (by the token's name). Revoke the token too
    (``farm token revoke``) to stop new ones."""
    from registry.reports import revoke

    with reg.db.session() as s:
        return {"revoked": revoke(s, token_name=token)}


def _samples_cap(_request: Request) -> int:
    from registry.evidence import MAX_SAMPLE_BYTES

    return MAX_SAMPLE_BYTES


@router.post("/v1/models/{digest}/samples", dependencies=[submit_before_body(_samples_cap)], tags=["submit"])
async def post_samples(request: Request, reg: RegistryDep, digest: str) -> dict[str, Any]:
    """The submitter's sample inputs for a model's accuracy checks (docs/evidence.md): an ``.npz``
    (``numpy.savez``) with one array per model input, checked against the model (names, dtypes,
    ranks, fixed dims; ``allow_pickle=False``; at most 64 MiB, expanded too). Replaces any
    earlier set; checks run from then on record the samples' digest as their inputs."""
    import tempfile
    from pathlib import Path

    from starlette.concurrency import run_in_threadpool

    from farm.core.keys import is_digest
    from registry.evidence import MAX_SAMPLE_BYTES

    if not is_digest(digest):
        raise E.UsageError(f"{digest[:80]!r} is not a model digest")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_SAMPLE_BYTES):
        raise E.TooLargeError(f"sample inputs are at most {MAX_SAMPLE_BYTES} bytes")
    with tempfile.TemporaryDirectory(prefix="ctxfarm-samples-") as tmp:
        path = Path(tmp) / "samples.npz"  # fixed name: never one from outside
        await receive_body(request, path, MAX_SAMPLE_BYTES, f"sample inputs are at most {MAX_SAMPLE_BYTES} bytes")
        return await run_in_threadpool(store_samples, reg, digest, path, Path(tmp))  # type: ignore[no-any-return]


def store_samples(reg: Any, model_digest: str, path: Any, work: Any) -> dict[str, Any]:
    """Check ``path`` against the stored model, store it as a blob, record it for the model."""
    from farm.core.groups import GROUP_FILE
    from registry.evidence import check_samples, record_samples
    from registry.models import Model
    from registry.store.base import download, put_file

    with reg.db.session() as s:
        model = s.get(Model, model_digest)
        if model is None or not model.files:
            raise E.NotFoundError(f"no model {model_digest}", hint="upload it first (POST /v1/models)")
        onnx_file = dict(model.files[0])
    if onnx_file.get("path") == GROUP_FILE or not str(onnx_file.get("path", "")).endswith(".onnx"):
        raise E.BadSamplesError(f"{model_digest} is not a single .onnx model (a graph group?): sample inputs are "
                                "one model's", hint="post each graph's samples to that graph's own model digest")
    graph = work / "model.onnx"  # the graph only: external data is not needed to read the inputs
    download(reg.store, onnx_file["digest"], graph, size=int(onnx_file["size"]))
    inputs = check_samples(path, graph)
    info = put_file(reg.store, path)
    with reg.db.session() as s:
        record_samples(s, model_digest, info.digest, info.size, inputs)
    return {"model": model_digest, "samples": info.digest, "size": info.size, "inputs": inputs}
