from __future__ import annotations

import pytest

from farm.core import errors
from farm.core.errors import (
    BUILD_FAILURE_CODES,
    DETERMINISTIC_FAILURES,
    FarmError,
    StorageError,
    error_for_code,
)

# Scripts match on these strings: changing one is a breaking change.
STABLE_CODES = {
    "InvalidModelError": "invalid-model",
    "UnknownTargetError": "unknown-target",
    "BadOptionsError": "bad-options",
    "UnsupportedOpsError": "unsupported-ops",
    "NoWorkerError": "no-worker",
    "ToolchainError": "toolchain-error",
    "CompileTimeoutError": "timeout",
    "WorkerLostError": "worker-lost",
    "StorageError": "storage-error",
    "BlobNotFound": "blob-not-found",
    "StorageUnavailable": "storage-unavailable",
    "DigestMismatchError": "digest-mismatch",
    "NotFoundError": "not-found",
    "TagConflictError": "tag-conflict",
    "NoMatchError": "no-match",
    "SignatureError": "signature-invalid",
    "UnsignedError": "unsigned",
    "ConfigError": "bad-config",
    "MissingExtraError": "missing-extra",
    "UsageError": "usage",
    "BadNameError": "bad-name",
    "ResourceLimitError": "resource-limit",
    "LeaseLostError": "lease-lost",
    "SchemaMismatchError": "schema-mismatch",
    "DatabaseError": "database-error",
    "ManifestError": "bad-manifest",
    "InstallConflictError": "install-conflict",
    "InterruptedBuildError": "interrupted",
    "InternalError": "internal-error",
    "UnauthorizedError": "unauthorized",
    "ForbiddenError": "forbidden",
    "TooLargeError": "too-large",
    "ServerError": "server-error",
}


@pytest.mark.parametrize("name,code", sorted(STABLE_CODES.items()))
def test_codes_are_stable(name, code):
    cls = getattr(errors, name)
    assert issubclass(cls, FarmError)
    assert cls.code == code


def test_every_error_class_is_listed():
    classes = {n for n, v in vars(errors).items()
               if isinstance(v, type) and issubclass(v, FarmError) and v is not FarmError}
    assert classes == set(STABLE_CODES)


def test_codes_are_unique():
    assert len(set(STABLE_CODES.values())) == len(STABLE_CODES)


def test_storage_errors_share_a_base():
    for name in ("BlobNotFound", "StorageUnavailable", "DigestMismatchError"):
        assert issubclass(getattr(errors, name), StorageError)


@pytest.mark.parametrize("code", BUILD_FAILURE_CODES)
def test_error_for_code_round_trips_build_failures(code):
    exc = error_for_code(code, "it broke", hint="try again")
    assert exc.code == code
    assert type(exc) is not FarmError
    assert exc.message == "it broke"
    assert exc.hint == "try again"
    assert exc.to_dict() == {"code": code, "message": "it broke", "hint": "try again"}


def test_error_for_unknown_code_is_a_plain_farm_error_keeping_the_code():
    exc = error_for_code("something-new", "??")  # e.g. from a newer service
    assert type(exc) is FarmError
    assert exc.code == "something-new"
    assert type(error_for_code("forbidden", "no")).__name__ == "ForbiddenError"


def test_deterministic_failures_are_build_failures():
    assert DETERMINISTIC_FAILURES <= set(BUILD_FAILURE_CODES)
    assert "timeout" not in DETERMINISTIC_FAILURES
    assert "worker-lost" not in DETERMINISTIC_FAILURES


def test_str_and_to_dict():
    exc = errors.NoMatchError("nothing loads")
    assert str(exc) == "[no-match] nothing loads"
    assert exc.to_dict() == {"code": "no-match", "message": "nothing loads"}  # no hint/details: left out
    assert exc.exit_code == 3
    assert errors.InvalidModelError("x").exit_code == 1
    exc = errors.NoMatchError("nothing loads", details={"nearest": [1]})
    assert exc.to_dict()["details"] == {"nearest": [1]}
