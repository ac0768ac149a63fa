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
    "NotAContextError": "not-a-context",
    "TargetMismatchError": "target-mismatch",
    "RuntimeTooOldError": "runtime-too-old",
    "RuntimeCrashedError": "runtime-crashed",
    "LoadUnverifiedError": "load-unverified",
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
    "AccuracyBelowThresholdError": "accuracy-below-threshold",
    "AccuracyUnverifiedError": "accuracy-unverified",
    "TwinMismatchError": "twin-mismatch",
    "RateLimitedError": "rate-limited",
    "NoPublishedBuildsError": "no-published-builds",  # farm package
    "PackageFilesMissingError": "package-files-missing",
    "PackageVerifyError": "package-verify-failed",
    "CancelledError": "cancelled",
    "SharingUnsupportedError": "sharing-unsupported",
    "MultiSocUnsupportedError": "multi-soc-unsupported",
    "BadGroupError": "bad-group",
    "LocalOnlyError": "local-only",
    "NotDeviceEvidenceError": "not-device-evidence",  # device evidence
    "ReportSocMismatchError": "report-soc-mismatch",
    "ReportRuntimeMismatchError": "report-runtime-mismatch",
    "BadSamplesError": "bad-samples",  # bounded inputs, per-token quotas
    "QuotaUploadsError": "quota-uploads",
    "QuotaUploadBytesError": "quota-upload-bytes",
    "QuotaReleasesError": "quota-releases",
    "BadGenaiError": "bad-genai",
    "GenaiFolderError": "genai-folder-invalid",
    "PackageUnsupportedError": "package-unsupported",
    "PackageAmbiguousError": "package-ambiguous-variants",
    "CapabilityMissingError": "capability-missing",
    "EnrollmentInvalidError": "enrollment-invalid",
    "DeviceRevokedError": "device-revoked",
    "ReportSignatureError": "report-signature-invalid",
    "ReportReplayedError": "report-replayed",
    "TagGatedError": "tag-gated",
    "PromotionUnmetError": "promotion-unmet",
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


def test_error_for_an_unknown_code_is_a_documented_one_naming_it():
    exc = error_for_code("something-new", "??")  # e.g. from a newer worker
    assert exc.code == "internal-error" and "something-new" in exc.message and "newer" in (exc.hint or "")
    from_service = error_for_code("something-new", "??", fallback=errors.ServerError)
    assert from_service.code == "server-error" and "[something-new] ??" == from_service.message
    assert type(error_for_code("forbidden", "no")).__name__ == "ForbiddenError"


def test_every_code_has_a_meaning_and_the_table_lists_each_once():
    rows = errors.table_rows()
    assert [r["code"] for r in rows] == sorted({r["code"] for r in rows}, key=[r["code"] for r in rows].index)
    assert {r["code"] for r in rows} == set(STABLE_CODES.values()) == errors.codes()
    assert all(r["meaning"] and "\n" not in r["meaning"] and "|" not in r["meaning"] for r in rows)
    assert "farm-error" not in errors.codes()  # the base class is abstract


def test_usage_like_errors_exit_2():
    """Bad arguments (a bad flag, version, SoC, option, digest, name) exit 2; no-match 3."""
    for code in ("usage", "bad-name", "unknown-target", "bad-options", "too-large", "local-only"):
        assert errors.error_for_code(code, "x").exit_code == 2, code
    assert errors.error_for_code("no-match", "x").exit_code == 3


def test_the_base_error_is_never_raised_itself():
    """Every raise names a subclass: a bare FarmError would print the undocumented farm-error."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    offenders = []
    for package in ("farm", "registry", "workers"):
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "FarmError":
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders


def test_the_documented_table_is_the_one_made_from_this_module():
    """docs/errors.md shows errors.markdown_table() (`farm help errors --markdown`), filled in at build time."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    assert "<!-- gen:errors -->" in (root / "docs" / "errors.md").read_text()
    sys.path.insert(0, str(root / "docs" / "gen"))
    try:
        import render
    finally:
        sys.path.remove(str(root / "docs" / "gen"))
    assert render.errors() == errors.markdown_table()


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
