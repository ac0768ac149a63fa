"""Model uploads: ``POST /v1/models`` (submit)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request

from farm.api.deps import MetricsDep, RegistryDep, SettingsDep, drain, receive_body, submit, submit_before_body, uploads_dir
from farm.api.schemas import HeldFilesIn, ModelOut
from farm.core import errors as E
from farm.core.settings import Settings
from farm.pipeline import plan
from registry.index import Registry

router = APIRouter(tags=["submit"])
# Unpacking, hashing and storing an upload is CPU and disk work of up to FARM_MAX_UPLOAD_MB: it
# runs on threads of its own, so uploads queue behind each other, never in front of resolve.
UNPACKERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="unpack")


def _upload_limit(request: Request) -> int:
    return int(request.app.state.settings.max_upload_mb) * 1024 * 1024


@router.post("/v1/models", response_model=ModelOut, dependencies=[submit_before_body(_upload_limit)])
async def upload_model(request: Request, settings: SettingsDep, reg: RegistryDep, metrics: MetricsDep,
                       name: Annotated[str | None, Query(max_length=255)] = None,
                       tag: Annotated[str | None, Query(max_length=128)] = None,
                       force_tag: bool = False) -> ModelOut:
    """Stream a bundle in (a .onnx, or a tar/zip with external data); the digest is computed
    on the way. The same content twice is a no-op answering the same digest. NAME:TAG
    pointing at another model moves only with ``force_tag=true`` (else 409 tag-conflict).
    The token is checked before the body is read; archives are bounded while they unpack
    (``farm.api.uploads``), and the work stops when the client goes away."""
    limit = _upload_limit(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        # Refused on its declared size, before a byte is read (a client that sent
        # Expect: 100-continue never sends the body at all).
        raise E.TooLargeError(f"the upload is over {settings.max_upload_mb} MiB ({declared} bytes declared)")
    try:
        name_, tag_ = plan.check_name_tag(name, tag)
    except E.FarmError:
        await drain(request, limit)
        raise
    work = Path(tempfile.mkdtemp(prefix="upload-", dir=uploads_dir(settings)))
    try:
        raw = work / "upload"
        size = await receive_body(request, raw, limit, f"the upload is over {settings.max_upload_mb} MiB")
        metrics.bytes_received.inc(size)
        if declared.isdigit() and int(declared) != size:
            raise E.InvalidModelError(f"the upload was cut short ({size} of {declared} bytes)")
        gone = threading.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(request, gone))
        try:
            return await asyncio.get_running_loop().run_in_executor(
                UNPACKERS, _accept_upload, settings, reg, raw, request.headers.get("content-type", ""),
                work / "bundle", limit, name_, tag_, force_tag, gone)
        finally:
            watcher.cancel()
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _watch_disconnect(request: Request, gone: threading.Event) -> None:
    """Sets ``gone`` when the client hangs up while its upload is being unpacked (the body is
    read whole by then, so the next ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


def _accept_upload(settings: Settings, reg: Registry, raw: Path, content_type: str, bundle_dir: Path, limit: int,
                   name: str | None, tag: str | None, force_tag: bool = False,
                   cancelled: threading.Event | None = None) -> ModelOut:
    from farm.api.uploads import unpack
    from farm.core.bundle import inspect_model

    bundle_dir.mkdir()
    model_path = unpack(raw, content_type, bundle_dir, max_bytes=limit, cancelled=cancelled)
    if cancelled is not None and cancelled.is_set():
        raise E.InvalidModelError("the upload was abandoned by the client")
    bundle = inspect_model(model_path)
    plan.check_tag_free(reg, bundle.digest, name, tag, force_tag)  # refused: no blob left behind
    files = plan.store_snapshot(reg, bundle)
    with reg.db.session() as s:
        moved = plan.record_snapshot(s, bundle.digest, bundle.onnx.digest, bundle.size, files, name, tag, "upload",
                                     force_tag=force_tag)
    return ModelOut(digest=bundle.digest, size=bundle.size, files=files, tag=f"{name}:{tag}" if name else None,
                    tag_moved=moved)


# ---- hash first: the client asks whether the content is held before it sends any of it ---------

@router.head("/v1/models/{digest}", response_model=ModelOut, dependencies=[submit],
             operation_id="held_model_head", summary="Held Model (HEAD)")
@router.get("/v1/models/{digest}", response_model=ModelOut, dependencies=[submit])
def held_model(digest: str, reg: RegistryDep) -> ModelOut:
    """200 with the model's snapshot listing when the service holds this bundle whole (the
    model recorded, every file's blob in the store), else 404 ``not-found``: as an OCI registry
    answers ``HEAD /v2/…/blobs/DIGEST`` before a push. ``farm submit --server`` asks first and
    sends no model bytes when the answer is 200."""
    return _held(reg, digest)


@router.post("/v1/models/{digest}", response_model=ModelOut, dependencies=[submit])
async def claim_model(digest: str, settings: SettingsDep, reg: RegistryDep, body: HeldFilesIn | None = None,
                      name: Annotated[str | None, Query(max_length=255)] = None,
                      tag: Annotated[str | None, Query(max_length=128)] = None, force_tag: bool = False) -> ModelOut:
    """An upload with no model bytes for a bundle the service holds (404 ``not-found`` when it
    does not: then send it with ``POST /v1/models``): NAME:TAG is set as an upload sets it.

    With a body ``{"files": [{"path", "digest", "size"}, ...]}`` (the .onnx first, then its
    external data under the names it gives them), a bundle not recorded yet is recorded from
    blobs the service holds (``PUT /v1/blobs/DIGEST`` each one it lacks): laid out, inspected
    as an upload is, and its digest must be ``digest`` (else 400 ``invalid-model``). So a data
    file several graphs share goes up once. A file not held is 404 ``not-found`` naming it;
    names are checked as an archive's members are (``invalid-model``); the files together are
    capped at FARM_MAX_UPLOAD_MB, as an upload (413 ``too-large``)."""
    from starlette.concurrency import run_in_threadpool

    name_, tag_ = plan.check_name_tag(name, tag)
    if body is not None:
        try:
            await run_in_threadpool(_held, reg, digest)
        except E.NotFoundError:
            return await asyncio.get_running_loop().run_in_executor(
                UNPACKERS, _record_from_blobs, settings, reg, digest, [f.model_dump() for f in body.files],
                name_, tag_, force_tag)
    held = await run_in_threadpool(_held, reg, digest)
    if not name_ or not tag_:
        return held
    moved = await run_in_threadpool(_tag_held, reg, held, name_, tag_, force_tag)
    return held.model_copy(update={"tag": f"{name_}:{tag_}", "tag_moved": moved})


def _tag_held(reg: Registry, held: ModelOut, name: str, tag: str, force_tag: bool) -> dict[str, str] | None:
    with reg.db.session() as s:
        return plan.record_snapshot(s, held.digest, "", held.size, None, name, tag, "upload", force_tag=force_tag)


def _record_from_blobs(settings: Settings, reg: Registry, digest: str, files: list[dict[str, object]],
                       name: str | None, tag: str | None, force_tag: bool) -> ModelOut:
    """A bundle whose every file the store holds, recorded as an upload of it would be: laid out
    in a work dir (each name checked, each blob verified as it comes), inspected (every check of
    an upload), its digest bound to the one asked for."""
    from farm.core.bundle import inspect_model
    from farm.pipeline.bundles import lay_out_blobs

    limit = int(settings.max_upload_mb) * 1024 * 1024
    work = Path(tempfile.mkdtemp(prefix="upload-", dir=uploads_dir(settings)))
    try:
        listing = [(str(f["path"]), str(f["digest"]), int(str(f["size"]))) for f in files]
        if not listing or not listing[0][0].endswith(".onnx") or "/" in listing[0][0]:
            raise E.InvalidModelError("the first file must be the model's .onnx, at the top level",
                                      hint='{"files": [{"path": "model.onnx", ...}, {"path": "weights.data", ...}]}')
        lay_out_blobs(reg.store, listing, work / "bundle", max_bytes=limit, error=E.InvalidModelError,
                      too_large=f"the files are over {settings.max_upload_mb} MiB together (FARM_MAX_UPLOAD_MB)")
        bundle = inspect_model(work / "bundle" / listing[0][0])
        if bundle.digest != digest:
            raise E.InvalidModelError(f"the files make model {bundle.digest}, not {digest}",
                                      hint="list the .onnx first, then each external-data file under the name "
                                           "the .onnx gives it")
        plan.check_tag_free(reg, bundle.digest, name, tag, force_tag)
        stored = plan.store_snapshot(reg, bundle)  # every blob is held: nothing is written twice
        with reg.db.session() as s:
            moved = plan.record_snapshot(s, bundle.digest, bundle.onnx.digest, bundle.size, stored, name, tag,
                                         "upload", force_tag=force_tag)
        return ModelOut(digest=bundle.digest, size=bundle.size, files=stored, tag=f"{name}:{tag}" if name else None,
                        tag_moved=moved)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _held(reg: Registry, digest: str) -> ModelOut:
    from farm.core.errors import BlobNotFound
    from farm.core.keys import is_digest
    from registry.models import Model

    if not is_digest(digest):
        raise E.UsageError(f"{digest[:80]!r} is not a model digest", hint="sha256: and 64 lowercase hex digits")
    with reg.db.session() as s:
        m = s.get(Model, digest)
        listing = None if m is None else [dict(f) for f in m.files]
        size = 0 if m is None else int(m.size)
    missing = E.NotFoundError(f"the service does not hold model {digest}", hint="upload it: POST /v1/models")
    if not listing or not all(f.get("stored") for f in listing):
        raise missing
    for f in listing:
        try:
            if reg.store.stat(str(f["digest"])).size != int(f["size"]):
                raise missing
        except BlobNotFound:
            raise missing from None
    return ModelOut(digest=digest, size=size, files=listing)
