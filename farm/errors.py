"""Errors users see. A leaf module: it imports nothing from the project.

Every error carries a stable ``code`` (scripts match on it), a message and an optional hint.
The CLI maps them to exit codes in one place (``farm.cli``).

    FarmError
    ├── InvalidModelError        invalid-model      not ONNX, truncated, external data escaping
    ├── UnknownTargetError       unknown-target     not in the catalog (lists the known ones)
    ├── BadOptionsError          bad-options        unknown option, bad value, bad combination
    ├── UnsupportedOpsError      unsupported-ops    full offload required, ops left on CPU
    ├── NoWorkerError            no-worker          no toolchain installed / serving
    ├── ToolchainError           toolchain-error    the EP/SDK failed to compile or load
    ├── CompileTimeoutError      timeout            compile exceeded its time limit
    ├── WorkerLostError          worker-lost        the compiling process died
    ├── StorageError             storage-error      blob store unusable
    │   ├── BlobNotFound         blob-not-found
    │   ├── StorageUnavailable   storage-unavailable  store unreachable / refused credentials
    │   └── DigestMismatchError  digest-mismatch    content does not match its digest
    ├── NotFoundError            not-found          unknown artifact / model / build / tag
    ├── NoMatchError             no-match           resolve found nothing loadable
    ├── SignatureError           signature-invalid  signature missing a trusted key or not verifying
    │   └── UnsignedError        unsigned           no signature at all while one is required
    ├── ConfigError              bad-config         bad FARM_* setting
    └── MissingExtraError        missing-extra      optional dependency not installed
"""

from __future__ import annotations

from typing import Any


class FarmError(Exception):
    """Base of every error a user can cause or must act on."""

    code = "farm-error"
    exit_code = 1
    default_hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint or self.default_hint
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.hint:
            out["hint"] = self.hint
        if self.details:
            out["details"] = self.details
        return out

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class InvalidModelError(FarmError):
    code = "invalid-model"
    default_hint = "ctxfarm builds ONNX ModelProto files (.onnx), external data as relative files beside them"


class UnknownTargetError(FarmError):
    code = "unknown-target"
    default_hint = "`farm targets` lists the known targets"


class BadOptionsError(FarmError):
    code = "bad-options"
    default_hint = "see the options of each backend in the README (farm build --option key=value)"


class UnsupportedOpsError(FarmError):
    code = "unsupported-ops"
    default_hint = "drop require_full_offload=true to ship a partially offloaded model"


class NoWorkerError(FarmError):
    code = "no-worker"
    default_hint = "install the backend's toolchain (pip install 'ctxfarm[qnn]') or start a worker for it"


class ToolchainError(FarmError):
    code = "toolchain-error"
    default_hint = "the build log (farm show / farm status) holds the SDK's own message"


class CompileTimeoutError(FarmError):
    code = "timeout"
    default_hint = "raise FARM_COMPILE_TIMEOUT if the model legitimately needs longer"


class WorkerLostError(FarmError):
    code = "worker-lost"
    default_hint = "the compiling process died; the build log holds its last words"


class StorageError(FarmError):
    code = "storage-error"
    default_hint = "check FARM_STORE_URL and that the store is reachable and writable"


class BlobNotFound(StorageError):
    code = "blob-not-found"


class StorageUnavailable(StorageError):
    code = "storage-unavailable"
    default_hint = "the blob store did not answer: check FARM_STORE_URL, the endpoint and credentials"


class DigestMismatchError(StorageError):
    code = "digest-mismatch"
    default_hint = "the stored content was altered or corrupted: run `farm registry verify`"


class NotFoundError(FarmError):
    code = "not-found"
    default_hint = "`farm ls` lists artifacts; model refs are NAME:TAG, NAME or a digest"


class NoMatchError(FarmError):
    code = "no-match"
    exit_code = 3


class SignatureError(FarmError):
    code = "signature-invalid"
    default_hint = "the artifact is not signed by a key in FARM_TRUSTED_KEYS; do not install it"


class UnsignedError(SignatureError):
    code = "unsigned"
    default_hint = "sign it (farm keys sign ARTIFACT with FARM_SIGNING_KEY) or drop FARM_REQUIRE_SIGNATURE"


class ConfigError(FarmError):
    code = "bad-config"
    default_hint = "see the FARM_* settings in the README"


class MissingExtraError(FarmError):
    code = "missing-extra"


# Failure codes a build row may carry. Deterministic ones are answered from the index on
# re-submission (same inputs, same failure); the rest are infrastructure and are retried.
BUILD_FAILURE_CODES = (
    "invalid-model",
    "unsupported-ops",
    "bad-options",
    "no-worker",
    "toolchain-error",
    "timeout",
    "worker-lost",
    "storage-error",
)
DETERMINISTIC_FAILURES = frozenset({"invalid-model", "unsupported-ops", "bad-options"})

_BY_CODE: dict[str, type[FarmError]] = {
    cls.code: cls
    for cls in (
        InvalidModelError,
        UnsupportedOpsError,
        BadOptionsError,
        NoWorkerError,
        ToolchainError,
        CompileTimeoutError,
        WorkerLostError,
        StorageError,
    )
}


def error_for_code(code: str, message: str, *, hint: str | None = None) -> FarmError:
    """Rebuild a typed error from a stored failure code (e.g. a failed build row)."""
    return _BY_CODE.get(code, FarmError)(message, hint=hint)
