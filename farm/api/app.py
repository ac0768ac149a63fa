"""The HTTP service (``farm serve``): the front door devices and pipelines use.

Versioned under ``/v1``, OpenAPI at ``/openapi.json``. Every endpoint but ``/healthz``,
``/readyz`` and ``/metrics`` needs a bearer token: ``read`` (devices), ``submit`` (pipelines) or
``admin`` (ops); none or unknown is 401, too weak is 403. Errors are the CLI's codes, as
``{"error": {"code", "message", "hint"}}`` with an HTTP status per code.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from farm.core import errors as E
from farm.core.keys import is_digest
from farm.core.settings import Settings
from farm.pipeline import plan, states
from registry.index import Registry

STATUS = {
    "usage": 400, "bad-name": 400, "bad-options": 400, "unknown-target": 400, "invalid-model": 400,
    "bad-manifest": 400, "unsupported-ops": 400, "not-found": 404, "no-match": 404, "too-large": 413,
    "unauthorized": 401, "forbidden": 403, "no-worker": 503, "database-error": 503, "schema-mismatch": 503,
    "storage-unavailable": 503, "signature-invalid": 409, "unsigned": 409, "blob-not-found": 404,
    "digest-mismatch": 502, "storage-error": 503, "resource-limit": 400, "toolchain-error": 502, "worker-lost": 503,
    "timeout": 504, "interrupted": 503, "install-conflict": 409, "lease-lost": 409, "missing-extra": 501,
    "bad-config": 500, "internal-error": 500, "tag-conflict": 409,
}


TooLargeError, AuthError, ForbiddenError = E.TooLargeError, E.UnauthorizedError, E.ForbiddenError


# ---- request and response models --------------------------------------------------------------------

class ErrorBody(BaseModel):
    code: str
    message: str
    hint: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class ModelOut(BaseModel):
    digest: str
    size: int
    files: list[dict[str, Any]]
    tag: str | None = None
    tag_moved: dict[str, str] | None = Field(
        default=None, description='{"tag", "from", "to"} when force_tag moved NAME:TAG from another model')


class ReleaseIn(BaseModel):
    model: str = Field(description="a model digest, or NAME[:TAG]", max_length=300)
    targets: list[str] = Field(min_length=1, max_length=64)
    sdks: list[str] = Field(default_factory=list, max_length=16)
    options: dict[str, str] = Field(default_factory=dict)
    allow_queue: bool = False
    retry_failed: bool = False
    require_full_offload: bool = Field(
        default=False, description="answer unsupported-ops for builds that leave nodes on the CPU: a gate on the "
                                   "answer, not a build input (options.require_full_offload is the same)")


class BuildOut(BaseModel):
    build: int
    target: str
    toolchain: str
    state: str
    note: str | None = None
    attempts: int
    error_code: str | None = None
    error_message: str | None = None
    artifact: str | None = None
    compile_seconds: float | None = None
    worker: str | None = None
    log: str | None = None


class ReleaseOut(BaseModel):
    release: int
    model: str
    done: bool
    ok: bool
    builds: list[BuildOut]


class TagIn(BaseModel):
    digest: str = Field(max_length=300, description="an artifact id (tags its model), a model digest or prefix, "
                                                    "or another NAME:TAG")
    force: bool = Field(default=False, description="move the tag if it points at another model "
                                                   "(else 409 tag-conflict)")


ERRORS: dict[int | str, dict[str, Any]] = {
    c: {"model": ErrorResponse} for c in (400, 401, 403, 404, 409, 413, 503)}


# ---- the app ------------------------------------------------------------------------------------------

def create_app(settings: Settings, registry: Registry | None = None) -> FastAPI:
    from farm.api.metrics import Metrics

    reg = registry or Registry.open(settings)
    metrics = Metrics(settings, reg)
    runner = _EmbeddedRunner(settings, reg) if settings.embedded else None
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        if runner is not None:
            runner.shutdown()
        if registry is None:
            reg.close()

    app = FastAPI(title="ctxfarm", version="1", description=__doc__, responses=ERRORS,  # type: ignore[arg-type]
                  lifespan=lifespan)
    app.state.registry = reg
    app.state.settings = settings
    app.add_middleware(_ErrorBoundary)

    @app.exception_handler(E.FarmError)
    async def _errors(_request: Request, exc: E.FarmError) -> JSONResponse:
        return error_response(exc)

    from fastapi.exceptions import RequestValidationError

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"error": {"code": "usage", "message": f"{where}: {first.get('msg', 'invalid')}",
                                       "hint": "see /openapi.json"}}, status_code=400)

    def scope(needed: str):  # type: ignore[no-untyped-def]
        def check(authorization: Annotated[str | None, Header()] = None,
                  token: Annotated[str | None, Query(max_length=200, description="for browsers")] = None) -> str:
            from registry.tokens import allows, scope_of

            raw = (authorization or "").removeprefix("Bearer ").strip() or (token or "")
            if not raw:
                raise AuthError("no token")
            got = tokens.get(raw)
            if got is _MISS:
                with reg.db.session() as s:
                    got = scope_of(s, raw)
                tokens.put(raw, got)
            if got is None:
                raise AuthError("unknown or revoked token")
            if not allows(got, needed):
                raise ForbiddenError(f"a {got} token can't do this (needs {needed})")
            return got
        return Depends(check)

    tokens = _TokenCache(ttl=TOKEN_CACHE_S)
    read, submit, admin = scope("read"), scope("submit"), scope("admin")

    # -- health and metrics ---------------------------------------------------------------------

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/readyz", tags=["ops"])
    def readyz() -> JSONResponse:
        checks = metrics.readiness()
        return JSONResponse({"ready": all(checks.values()), "checks": checks},
                            status_code=200 if all(checks.values()) else 503)

    @app.get("/metrics", tags=["ops"])
    def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    # -- models and releases --------------------------------------------------------------------

    @app.post("/v1/models", response_model=ModelOut, tags=["submit"], dependencies=[submit])
    async def upload_model(request: Request, name: Annotated[str | None, Query(max_length=255)] = None,
                           tag: Annotated[str | None, Query(max_length=128)] = None,
                           force_tag: bool = False) -> ModelOut:
        """Stream a bundle in (a .onnx, or a tar/zip with external data); the digest is computed
        on the way. The same content twice is a no-op answering the same digest. NAME:TAG
        pointing at another model moves only with ``force_tag=true`` (else 409 tag-conflict)."""
        name_, tag_ = plan.check_name_tag(name, tag)
        limit = settings.max_upload_mb * 1024 * 1024
        work = Path(tempfile.mkdtemp(prefix="upload-", dir=_uploads_dir(settings)))
        try:
            raw = work / "upload"
            size = 0
            with open(raw, "wb") as f:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise TooLargeError(f"the upload is over {settings.max_upload_mb} MiB")
                    f.write(chunk)
            declared = request.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) != size:
                raise E.InvalidModelError(f"the upload was cut short ({size} of {declared} bytes)")
            return await _run(_accept_upload, settings, reg, raw, request.headers.get("content-type", ""),
                              work / "bundle", limit, name_, tag_, force_tag)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    @app.post("/v1/releases", response_model=ReleaseOut, tags=["submit"], dependencies=[submit])
    def create_release(body: ReleaseIn) -> ReleaseOut:
        from registry.index import resolve_model_ref

        request = plan.ReleaseRequest.parse(body.targets, body.sdks, body.options, allow_queue=body.allow_queue,
                                            retry_failed=body.retry_failed,
                                            require_full_offload=body.require_full_offload)
        with reg.db.session() as s:
            digest = resolve_model_ref(s, body.model)
        served = _served(settings, reg, request)
        request.check_served(served)
        st = plan.queue_release(settings, reg, digest, request, served=served, display=body.model)
        if runner is not None:
            runner.submit([b["build"] for b in st.builds])
        return _release_out(st)

    @app.get("/v1/releases/{release_id}", response_model=ReleaseOut, tags=["read"], dependencies=[read])
    def get_release(release_id: int, wait: Annotated[float, Query(ge=0, le=60)] = 0) -> ReleaseOut:
        """``wait=S``: a long poll, answered once the release is done, once one of its builds
        changes state (woken by the executors' events), or after S seconds."""
        return _release_out(plan.watch_release(settings, plan.check_id(release_id, "release"), wait=wait,
                                               registry=reg))

    @app.get("/v1/builds/{build_id}", response_model=BuildOut, tags=["read"], dependencies=[read])
    def get_build(build_id: int) -> BuildOut:
        from registry.index import artifact_for_build

        plan.check_id(build_id, "build")
        with reg.db.session() as s:
            b = states.get_build(s, build_id)
            art = artifact_for_build(s, b.id)
            return BuildOut(**plan.build_view(b, art), log=b.log)

    # -- devices -------------------------------------------------------------------------------

    @app.get("/v1/resolve", tags=["read"], dependencies=[read])
    def resolve(request: Request, model: Annotated[str, Query(max_length=300)],
                soc: Annotated[str | None, Query(max_length=64)] = None,
                qnn: Annotated[str | None, Query(max_length=64)] = None,
                gpu: Annotated[str | None, Query(max_length=64)] = None,
                trt: Annotated[str | None, Query(max_length=64)] = None,
                platform: Annotated[str, Query(max_length=64)] = "linux-x86-64",
                manifest: bool = True) -> dict[str, Any]:
        """The artifact this device should load: manifest, signatures, where to get each file.
        ``manifest=false`` leaves the manifest out (a device that fetches and verifies the
        manifest blob itself saves the service a store read)."""
        started = time.perf_counter()
        try:
            return _resolve(reg, str(request.base_url), model, soc, qnn, gpu, trt, platform, manifest)
        finally:
            metrics.resolve_seconds.observe(time.perf_counter() - started)

    @app.get("/v1/blobs/{digest}", tags=["read"], dependencies=[read],
             responses={200: {"content": {"application/octet-stream": {}}}, 206: {}, 304: {}, 307: {}})
    def get_blob(digest: str, range_: Annotated[str | None, Header(alias="range")] = None,
                 if_none_match: Annotated[str | None, Header()] = None,
                 accept_encoding: Annotated[str | None, Header()] = None) -> Response:
        if not is_digest(digest):
            raise E.UsageError(f"{digest[:80]!r} is not a sha256 digest")
        etag = f'"{digest}"'
        if if_none_match and etag in [t.strip() for t in if_none_match.split(",")]:
            return Response(status_code=304, headers={"ETag": etag})
        presign = getattr(reg.store, "presign", None)
        info = reg.store.stat(digest)
        # A blob the store holds compressed (one part at most: S3BlobStore) goes straight from S3
        # only to a client that takes that Content-Encoding, whole; any other gets it decoded here.
        if presign is not None and (info.encoding is None
                                    or (not range_ and _accepts(accept_encoding, info.encoding))):
            return RedirectResponse(presign(digest, 3600), status_code=307, headers={"ETag": etag})
        return _ranged(reg, digest, info.size, range_, etag, metrics)

    # -- tags (admin) --------------------------------------------------------------------------

    @app.get("/v1/tags/{name:path}/{tag}", tags=["admin"], dependencies=[admin])
    def get_tag(name: str, tag: str) -> dict[str, Any]:
        """Where NAME:TAG points (``digest`` null once deleted) and every change of it."""
        return _tag_view(reg, name, tag)

    @app.put("/v1/tags/{name:path}/{tag}", tags=["admin"], dependencies=[admin])
    def put_tag(name: str, tag: str, body: TagIn) -> dict[str, Any]:
        """Point NAME:TAG at a model (the same registry call as `farm tag`). Moving it from
        another model needs ``force: true``, else 409 ``tag-conflict`` and nothing changes;
        ``tag_moved`` says what moved."""
        from farm.core.names import check_name, check_tag
        from registry.index import set_tag, tag_source, tag_view

        check_name(name)
        check_tag(tag)
        with reg.db.session() as s:
            digest, _artifact = tag_source(s, body.digest)
            move = set_tag(s, name, tag, digest, force=body.force)
            return {**tag_view(s, name, tag), "tag_moved": move.as_move()}

    @app.delete("/v1/tags/{name:path}/{tag}", tags=["admin"], dependencies=[admin])
    def delete_tag(name: str, tag: str) -> dict[str, Any]:
        from farm.core.names import check_name, check_tag
        from registry.index import delete_tag as untag

        check_name(name)
        check_tag(tag)
        with reg.db.session() as s:
            digest = untag(s, name, tag)
        return {"deleted": f"{name}:{tag}", "digest": digest}

    # -- ops -----------------------------------------------------------------------------------

    @app.get("/v1/coverage", tags=["read"], dependencies=[read])
    def coverage_json(model: Annotated[list[str] | None, Query()] = None,
                      backend: Annotated[str | None, Query(pattern="^(qnn|trt)$")] = None) -> dict[str, Any]:
        return _coverage(reg, model, backend)

    @app.get("/coverage", response_class=HTMLResponse, tags=["read"], dependencies=[read])
    def coverage_page(model: Annotated[list[str] | None, Query()] = None,
                      soc: Annotated[str | None, Query(max_length=64)] = None,
                      sdk: Annotated[str | None, Query(max_length=64)] = None) -> HTMLResponse:
        from farm.api.page import render

        return HTMLResponse(render(_coverage(reg, model, None), soc=soc, sdk=sdk))

    @app.get("/v1/workers", tags=["read"], dependencies=[read])
    def workers() -> list[dict[str, Any]]:
        from registry.index import live_workers

        with reg.db.session() as s:
            return [{"name": w.name, "backend": w.backend, "toolchain": w.toolchain, "onnxruntime": w.ort_version,
                     "ep": w.ep_package, "ep_version": w.ep_version, "host": w.host, "queues": list(w.queues),
                     "jobs": w.jobs_done, "last_seen": w.last_seen.isoformat()}
                    for w in live_workers(s, stale_after=settings.worker_stale_after)]

    return app


def error_response(exc: BaseException) -> JSONResponse:
    err = E.translate(exc)
    status = STATUS.get(err.code, 500)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"code": err.code, "message": err.message, "hint": err.hint}},
                        status_code=status, headers=headers)


class _ErrorBoundary:
    """Pure ASGI middleware: any exception an endpoint raises (a library error, a bug) becomes a
    documented code in JSON, never a traceback on the wire; bugs are still logged."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            from starlette.requests import ClientDisconnect

            if started or isinstance(exc, ClientDisconnect):
                return
            import logging

            if not isinstance(exc, E.FarmError) and E.translate(exc).code == "internal-error":
                logging.getLogger("ctxfarm.api").exception("internal error")
            await error_response(exc)(scope, receive, send)


# ---- helpers --------------------------------------------------------------------------------------------

TOKEN_CACHE_S = 5.0  # a revoked token stops working within this many seconds
_MISS = object()


class _TokenCache:
    """Token -> scope (or None for unknown), for a few seconds: a device's resolve and its blob
    GETs cost one token lookup, not one each. Keyed by the token's sha256, bounded in size."""

    def __init__(self, ttl: float, size: int = 10_000):
        self.ttl, self.size = ttl, size
        self.items: OrderedDict[str, tuple[float, str | None]] = OrderedDict()
        self.lock = threading.Lock()

    @staticmethod
    def _key(token: str) -> str:
        import hashlib

        return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()

    def get(self, token: str) -> Any:
        with self.lock:
            hit = self.items.get(self._key(token))
        if hit is None or hit[0] < time.monotonic():
            return _MISS
        return hit[1]

    def put(self, token: str, scope: str | None) -> None:
        with self.lock:
            self.items[self._key(token)] = (time.monotonic() + self.ttl, scope)
            if len(self.items) > self.size:
                self.items.popitem(last=False)

async def _run(fn: Any, *args: Any) -> Any:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


def _uploads_dir(settings: Settings) -> Path:
    d = settings.home / "uploads"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _accept_upload(settings: Settings, reg: Registry, raw: Path, content_type: str, bundle_dir: Path, limit: int,
                   name: str | None, tag: str | None, force_tag: bool = False) -> ModelOut:
    from farm.api.uploads import unpack
    from farm.core.bundle import inspect_model

    bundle_dir.mkdir()
    model_path = unpack(raw, content_type, bundle_dir, max_bytes=limit)
    bundle = inspect_model(model_path)
    files = plan.store_snapshot(reg, bundle)
    with reg.db.session() as s:
        moved = plan.record_snapshot(s, bundle.digest, bundle.onnx.digest, bundle.size, files, name, tag, "upload",
                                     force_tag=force_tag)
    return ModelOut(digest=bundle.digest, size=bundle.size, files=files, tag=f"{name}:{tag}" if name else None,
                    tag_moved=moved)


def _served(settings: Settings, reg: Registry, request: plan.ReleaseRequest) -> dict[tuple[str, str], list[str]]:
    if settings.embedded:
        # The service builds in-process: it serves the toolchains installed here.
        from workers.runner import get_runner

        out: dict[tuple[str, str], list[str]] = {}
        for t in request.targets:
            try:
                tc = get_runner(t.backend).toolchain()
            except E.FarmError:
                continue
            out[(tc.backend, tc.version)] = ["embedded"]
        return out
    return plan.served_toolchains(settings, reg)


def _release_out(st: plan.ReleaseStatus) -> ReleaseOut:
    return ReleaseOut(release=st.release_id, model=st.model, done=st.done, ok=st.ok,
                      builds=[BuildOut(**b) for b in st.builds])


def _resolve(reg: Registry, base_url: str, model: str, soc: str | None, qnn: str | None, gpu: str | None,
             trt: str | None, platform: str, with_manifest: bool = True) -> dict[str, Any]:
    from farm.core.catalog import load_catalog
    from farm.core.names import check_name
    from registry.index import resolve_model_ref
    from registry.lite import SessionRows
    from registry.reads import model_ref_hit, signatures
    from registry.resolve import Device, describe
    from registry.resolve import resolve as resolve_artifact

    if gpu or trt:
        if not (gpu and trt):
            raise E.UsageError("a GPU device is described by gpu and trt")
        plan.check_versions([trt])
        check_name(platform)
        device = Device("trt", load_catalog().get(gpu, backend="trt"), f"{trt}+{platform}")
    else:
        if not (soc and qnn):
            raise E.UsageError("a device is described by soc and qnn (or gpu and trt)")
        plan.check_versions([qnn])
        device = Device("qnn", load_catalog().get(soc, backend="qnn"), qnn)
    with reg.db.session() as s:
        # Plain SQL, no ORM objects: four statements for a hit (registry.reads); a reference that
        # names nothing goes to resolve_model_ref, which explains the miss.
        rows = SessionRows(s)
        digest = model_ref_hit(rows, model) or resolve_model_ref(s, model)
        artifact, verdict = resolve_artifact(rows, digest, device, model_label=model)
        files = [{"name": f.name, "digest": f.digest, "size": f.size} for f in artifact.files
                 if f.role in ("ctx-model", "context")]
        sigs = [{"public_key": p, "signature": g} for p, g in signatures(rows, artifact.digest)]
        art_digest = artifact.digest
        manifest_size = next((f.size for f in artifact.files if f.role == "manifest"), 0)
        ctx_model = artifact.ctx_model
    manifest = _manifest(reg, art_digest) if with_manifest else None
    base = base_url.rstrip("/")
    for f in files:
        f["url"] = f"{base}/v1/blobs/{f['digest']}"
    return {**describe(artifact, verdict), "model": digest, "ctx_model": ctx_model,
            "manifest": manifest, "manifest_url": f"{base}/v1/blobs/{art_digest}", "manifest_size": manifest_size,
            "signatures": sigs,
            "files": files}


_MANIFESTS: OrderedDict[tuple[str, str], bytes] = OrderedDict()
_MANIFESTS_MAX = 4096


def _manifest(reg: Registry, digest: str) -> dict[str, Any]:
    """Manifests are content-addressed, hence immutable: cached by digest once verified."""
    from registry.store.base import read_bytes

    key = (reg.store.url, digest)
    data = _MANIFESTS.get(key)
    if data is None:
        data = read_bytes(reg.store, digest)
        _MANIFESTS[key] = data
        if len(_MANIFESTS) > _MANIFESTS_MAX:
            _MANIFESTS.popitem(last=False)
    return dict(json.loads(data))


def _accepts(accept_encoding: str | None, coding: str) -> bool:
    """Whether an Accept-Encoding header takes ``coding`` (named, or ``*``, with q above 0)."""
    for item in (accept_encoding or "").split(","):
        name, _, params = item.strip().partition(";")
        q = params.strip().removeprefix("q=").strip() if params.strip().startswith("q=") else "1"
        try:
            weight = float(q)
        except ValueError:
            continue
        if name.strip().lower() in (coding, "*") and weight > 0:
            return True
    return False


def _ranged(reg: Registry, digest: str, size: int, range_: str | None, etag: str, metrics: Any) -> Response:
    start, end = 0, size - 1
    status = 200
    if range_:
        spec = range_.strip().removeprefix("bytes=")
        first, _, last = spec.partition("-")
        try:
            if first:
                start = int(first)
                end = int(last) if last else size - 1
            else:
                start = max(size - int(last), 0)
            if start > end or start >= size:
                raise ValueError
        except ValueError:
            return Response(status_code=416, headers={"Content-Range": f"bytes */{size}", "ETag": etag})
        end = min(end, size - 1)
        status = 206

    def body() -> Iterator[bytes]:
        left = end - start + 1
        with reg.store.open(digest) as f:
            if start:
                seek = getattr(f, "seek", None)
                if seek is not None:
                    seek(start)
                else:
                    skip = start
                    while skip:
                        skip -= len(f.read(min(skip, 1 << 20)))
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
                metrics.bytes_served.inc(len(chunk))
                yield chunk

    headers = {"ETag": etag, "Accept-Ranges": "bytes", "Content-Length": str(end - start + 1)}
    if status == 206:
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return StreamingResponse(body(), status_code=status, media_type="application/octet-stream", headers=headers)


def _tag_view(reg: Registry, name: str, tag: str) -> dict[str, Any]:
    from farm.core.names import check_name, check_tag
    from registry.index import tag_view

    check_name(name)
    check_tag(tag)
    with reg.db.session() as s:
        return tag_view(s, name, tag)


def _coverage(reg: Registry, models: list[str] | None, backend: str | None) -> dict[str, Any]:
    """The JSON of `farm coverage --json` (farm/cli/schemas/coverage.json): one row per model digest."""
    from registry.coverage import coverage

    with reg.db.session() as s:
        return coverage(s, backend=backend, models=models or None).to_dict()


class _EmbeddedRunner:
    """Without a broker the service builds in-process, one build at a time, on the executor."""

    def __init__(self, settings: Settings, reg: Registry):
        self.settings, self.reg = settings, reg
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="build")
        self.lock = threading.Lock()
        self.executors: dict[str, Any] = {}

    def submit(self, build_ids: list[int]) -> None:
        for build_id in build_ids:
            self.pool.submit(self._run, build_id)

    def _run(self, build_id: int) -> None:
        from farm.pipeline.execute import Executor

        with self.reg.db.session() as s:
            backend = states.get_build(s, build_id).backend
        if backend not in self.executors:
            self.executors[backend] = Executor(self.settings, self.reg, backend=backend)
        for _ in range(self.settings.max_attempts + 1):
            r = self.executors[backend].execute(build_id)
            if r.outcome != "retry":
                return
            time.sleep(min(r.countdown, 30))

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

