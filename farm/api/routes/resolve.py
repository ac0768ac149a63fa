"""Device resolve: ``GET /v1/resolve`` (read), the artifact a device should load."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from farm.api.deps import MetricsDep, RegistryDep, read
from farm.core import errors as E
from farm.pipeline import plan
from registry.index import Registry

router = APIRouter(tags=["read"])


@router.get("/v1/resolve", dependencies=[read])
def resolve(request: Request, reg: RegistryDep, metrics: MetricsDep, model: Annotated[str, Query(max_length=300)],
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
