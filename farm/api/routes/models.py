"""Model uploads: ``POST /v1/models`` (submit)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from farm.api.deps import RegistryDep, SettingsDep, submit
from farm.api.schemas import ModelOut
from farm.core import errors as E
from farm.core.settings import Settings
from farm.pipeline import plan
from registry.index import Registry

router = APIRouter(tags=["submit"])


@router.post("/v1/models", response_model=ModelOut, dependencies=[submit])
async def upload_model(request: Request, settings: SettingsDep, reg: RegistryDep,
                       name: Annotated[str | None, Query(max_length=255)] = None,
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
                    raise E.TooLargeError(f"the upload is over {settings.max_upload_mb} MiB")
                f.write(chunk)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) != size:
            raise E.InvalidModelError(f"the upload was cut short ({size} of {declared} bytes)")
        return await run_in_threadpool(_accept_upload, settings, reg, raw, request.headers.get("content-type", ""),
                                       work / "bundle", limit, name_, tag_, force_tag)
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
