"""onnxruntime-genai packages through the service (docs/shipping-llm.md): ``POST /v1/genai`` (submit) names
every file of an export folder by digest, each a blob the service holds (``HEAD`` then ``PUT
/v1/blobs/DIGEST`` for those it lacks: a file goes up once per digest, a data file the prefill
and decode graphs share included). The service lays the folder out again under its own
FARM_HOME (each name checked: a plain file name, ``farm.core.genai.check_file_name``; never a
path made from an unchecked name), reads it with the checks ``farm build --genai`` runs, and
queues what ``farm submit --genai`` queues on a cluster (``farm.pipeline.genai.submit_package``):
each part's weight-shared group build, then the package's build once its parts are final. The
embedded service (no broker) builds them in-process, the fan-in on its runner."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from farm.api.deps import Caller, RegistryDep, RunnerDep, SettingsDep, submitter
from farm.api.schemas import DIGEST_PATTERN, ErrorResponse, ReleaseOut
from farm.core import errors as E
from farm.core.settings import Settings
from farm.pipeline import plan
from registry.index import Registry

router = APIRouter()

MAX_FILES = 512  # an export of 64 parts (two graphs and their data each), its CPU stages and tokenizer


class GenaiFile(BaseModel):
    name: str = Field(max_length=128, description="its plain file name in the export folder (no directory)")
    digest: str = Field(pattern=DIGEST_PATTERN, description="a blob the service holds (PUT /v1/blobs/DIGEST)")
    size: int = Field(ge=0)


class GenaiIn(BaseModel):
    files: list[GenaiFile] = Field(
        min_length=1, max_length=MAX_FILES,
        description="every file of the export folder: genai_config.json, each part's prefill and decode graphs and "
                    "their external data, the CPU stages and their data, the tokenizer files")
    targets: list[str] = Field(min_length=1, max_length=64)
    sdks: list[str] = Field(default_factory=list, max_length=16)
    options: dict[str, str] = Field(default_factory=dict, max_length=64)
    name: str | None = Field(default=None, max_length=255)
    tag: str | None = Field(default=None, max_length=128)
    allow_queue: bool = False
    retry_failed: bool = False
    force_tag: bool = False


class GenaiOut(ReleaseOut):
    tag_moved: dict[str, str] | None = Field(
        default=None, description='{"tag", "from", "to"} when force_tag moved NAME:TAG from another model')
    warnings: list[str] = Field(
        default_factory=list, description="e.g. an SDK left out of the release because none of its workers can make a "
                                          "genai package (one line each; nothing is built for it)")


@router.post("/v1/genai", response_model=GenaiOut, tags=["submit"],
             responses={400: {"model": ErrorResponse, "description": "bad-genai: the folder can't be mapped to a "
                                                                     "genai package (the message names the file); "
                                                                     "usage, bad-options, sharing-unsupported"},
                        404: {"model": ErrorResponse, "description": "not-found: a listed file's blob is not held "
                                                                     "(send it: PUT /v1/blobs/DIGEST)"},
                        413: {"model": ErrorResponse, "description": "too-large: the files together are over what "
                                                                     "uploading each graph could bring "
                                                                     "(FARM_MAX_UPLOAD_MB per graph)"},
                        429: {"model": ErrorResponse, "description": "quota-releases: this token has "
                                                                     "FARM_QUOTA_RELEASES releases in progress"},
                        409: {"model": ErrorResponse, "description": "no-worker: the embedded service (no broker) "
                                                                     "can't build an SDK it does not have; "
                                                                     "capability-missing: no worker of the SDK named "
                                                                     "(or none at all) can make a genai package, or "
                                                                     "a non-QNN target"}})
async def create_genai(http: Request, body: GenaiIn, settings: SettingsDep, reg: RegistryDep, runner: RunnerDep,
                       who: Annotated[Caller, submitter]) -> GenaiOut | Response:
    """Queue a genai package release owned by this token (its quota and cancel, as ``POST
    /v1/releases``): one release holding the package's builds and every part's. The answer is
    that release (``GET /v1/releases/ID`` follows it); a package the index holds is answered
    from it, nothing built."""
    from starlette.concurrency import run_in_threadpool

    from farm.api.routes.models import UNPACKERS
    from farm.api.routes.releases import served_or_refusal

    # Everything a bad request can be refused for, before a byte is copied.
    request = plan.ReleaseRequest.parse(body.targets, body.sdks, body.options, body.name, body.tag,
                                        body.allow_queue, body.retry_failed, body.force_tag)
    from farm.core.capabilities import check_genai_backends

    check_genai_backends([t.backend for t in request.targets])
    served, refusal = await run_in_threadpool(served_or_refusal, http, settings, reg, request)
    if refusal is not None:
        return refusal
    st = await asyncio.get_running_loop().run_in_executor(
        UNPACKERS, _submit, settings, reg, body, served, runner is None, who)
    if runner is not None:
        runner.submit([b["build"] for b in st.builds])
    return GenaiOut(release=st.release_id, model=st.model, done=st.done, ok=st.ok, builds=st.builds,
                    tag_moved=getattr(st, "tag_moved", None), warnings=list(getattr(st, "warnings", None) or []))


def _submit(settings: Settings, reg: Registry, body: GenaiIn, served: dict[tuple[str, str], list[str]],
            dispatch: bool, who: Caller) -> Any:
    from farm.api.routes.releases import _check_quota
    from farm.core import genai
    from farm.core.digests import memo_path, remember
    from farm.pipeline.bundles import lay_out_blobs
    from farm.pipeline.genai import submit_package

    files = [(f.name, f.digest, f.size) for f in body.files]
    if genai.CONFIG_FILE not in {n for n, _, _ in files}:
        raise E.BadGenaiError(f"the files hold no {genai.CONFIG_FILE}", hint=genai.HINT)
    # As much as sending each graph (with its data) as an upload of its own could bring.
    graphs = len({d for n, d, _ in files if n.endswith(".onnx")})
    limit = int(settings.max_upload_mb) * 1024 * 1024
    from farm.api.deps import uploads_dir

    work = Path(tempfile.mkdtemp(prefix="upload-genai-", dir=uploads_dir(settings)))
    try:
        export = work / "genai"
        placed = lay_out_blobs(reg.store, files, export, max_bytes=limit * max(graphs, 1), error=E.BadGenaiError,
                               too_large=f"the export's files are over {settings.max_upload_mb} MiB per graph "
                                         "together (FARM_MAX_UPLOAD_MB)",
                               check_name=lambda n: genai.check_file_name(n, "files"))
        # Each blob was hashed as it was copied: reading the folder (inspect_package) takes those
        # digests by stat and does not hash the export a second time.
        remember(memo_path(settings.home), placed)
        # Counted and queued as one step per token: two requests at once cannot both pass the quota.
        with reg.db.serialized("releases", who.token_id):
            with reg.db.session() as s:
                _check_quota(s, settings, who)
            # Recording the parts and the package frees their blobs from every token's bytes quota
            # (registry.index.record_model).
            return submit_package(settings, export, body.targets, body.sdks, body.options, name=body.name,
                                  tag=body.tag, allow_queue=body.allow_queue, retry_failed=body.retry_failed,
                                  force_tag=body.force_tag, registry=reg, served=served, dispatch=dispatch,
                                  owner=who.token_id)
    finally:
        shutil.rmtree(work, ignore_errors=True)
