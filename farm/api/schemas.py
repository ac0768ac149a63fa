"""Request and response bodies of the HTTP service (pydantic): what ``/openapi.json`` declares."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


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


DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"


class HeldFile(BaseModel):
    path: str = Field(max_length=1024, description="its name in the bundle (the .onnx first)")
    digest: str = Field(pattern=DIGEST_PATTERN)
    size: int = Field(ge=0)


class HeldFilesIn(BaseModel):
    files: list[HeldFile] = Field(min_length=1, max_length=1024,
                                  description="the bundle's files, each a blob the service holds: the .onnx first")


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
    min_psnr: float | None = Field(
        default=None, ge=0, le=200,
        description="accuracy gate (docs/evidence.md): each build's context is run on the HTP simulator against "
                    "the CPU EP; a build with an output below this PSNR (dB) is answered accuracy-below-threshold "
                    "(its artifact stays published); it stays running until its check has run")


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
    # The artifact's placement: nodes left on the CPU (> 0: a partial offload) and their op types.
    nodes_cpu: int | None = None
    cpu_op_types: list[str] | None = None
    # In a genai package's release: "package", or the part the build compiles ("part0", ...).
    part: str | None = None


class BuildDetailOut(BuildOut):
    """``GET /v1/builds/ID``: a build as `farm status --build` shows it, with its key, model,
    options, queue and where the last attempt's time went (``phases``: ms, counts named as such)."""

    key: str | None = None
    model: str | None = None
    options: dict[str, Any] | None = None
    queue: str | None = None
    phases: dict[str, Any] | None = None


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
