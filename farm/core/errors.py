"""Errors users see. A leaf module: it imports nothing from the project.

Every error carries a stable ``code`` (scripts match on it), a message and an optional hint.
The CLI maps them to exit codes in one place (``farm.cli``). This module is the one source of the
vocabulary: each class's ``code``, ``exit_code`` and ``summary`` make the "Errors" table of the docs (docs/errors.md)
and `farm help errors` (``markdown_table``; a test compares), and the CLI lets no other code out.

    FarmError
    ├── InvalidModelError        invalid-model      not ONNX, truncated, external data escaping
    ├── UnknownTargetError       unknown-target     not in the catalog (lists the known ones)
    ├── BadOptionsError          bad-options        unknown option, bad value, bad combination
    ├── SharingUnsupportedError  sharing-unsupported  weight sharing on a target below HTP v73 / with multi-SoC
    ├── MultiSocUnsupportedError multi-soc-unsupported  a multi-SoC build on QNN < 2.48 or another backend
    ├── UnsupportedOpsError      unsupported-ops    full offload required, ops left on CPU
    ├── NoWorkerError            no-worker          no toolchain installed / serving
    ├── ToolchainError           toolchain-error    the EP/SDK failed to compile or load
    ├── NotAContextError         not-a-context      load-check: a plain model, no EPContext node
    ├── TargetMismatchError      target-mismatch    load-check: built for another SoC (or by another EP)
    ├── RuntimeTooOldError       runtime-too-old    load-check: built with a newer SDK than the runtime
    ├── RuntimeCrashedError      runtime-crashed    load-check: the runtime died loading or running it
    ├── LoadUnverifiedError      load-unverified    load-check: checked what it can, cannot load it here (exit 4)
    ├── CompileTimeoutError      timeout            compile exceeded its time limit
    ├── WorkerLostError          worker-lost        the compiling process died
    ├── StorageError             storage-error      blob store unusable
    │   ├── BlobNotFound         blob-not-found
    │   ├── StorageUnavailable   storage-unavailable  store unreachable / refused credentials
    │   └── DigestMismatchError  digest-mismatch    content does not match its digest
    ├── NotFoundError            not-found          unknown artifact / model / build / tag
    ├── TagConflictError         tag-conflict       moving NAME:TAG to another model without --force
    ├── NoMatchError             no-match           resolve found nothing loadable
    ├── SignatureError           signature-invalid  signature missing a trusted key or not verifying
    │   └── UnsignedError        unsigned           no signature at all while one is required
    ├── ConfigError              bad-config         bad FARM_* setting (names the variable)
    ├── MissingExtraError        missing-extra      optional dependency not installed
    ├── UsageError               usage              a bad argument (exit 2): missing flag, bad version/name
    ├── BadNameError             bad-name           a model name or tag outside the name grammar (exit 2)
    ├── BadGroupError            bad-group          a graph group with a bad or repeated graph name (exit 2)
    ├── LocalOnlyError           local-only         a command with no remote form, in a shell with only FARM_SERVER (exit 2)
    ├── BadGenaiError            bad-genai          an LLM export folder that can't be mapped to a genai package (exit 2)
    ├── GenaiFolderError         genai-folder-invalid  a built genai folder failed its check (config, files, binaries)
    ├── ResourceLimitError       resource-limit     a compile went past its memory or time cap
    ├── LeaseLostError           lease-lost         another executor took the build over (internal)
    ├── SchemaMismatchError      schema-mismatch    index schema older/newer than this code
    ├── DatabaseError            database-error     the index database failed or is not one
    ├── ManifestError            bad-manifest       a manifest that is not a valid ctxfarm manifest
    ├── InstallConflictError     install-conflict   the install destination can't take the artifact
    ├── InterruptedBuildError    interrupted        SIGTERM/SIGINT while working (exit 130)
    ├── CancelledError           cancelled          the build was cancelled (farm cancel); not a verdict
    ├── UnauthorizedError        unauthorized       HTTP: no, unknown or revoked token
    ├── ForbiddenError           forbidden          HTTP: the token's scope does not allow it
    ├── ServerError              server-error       HTTP client: the service is unreachable or broken
    ├── AccuracyBelowThresholdError accuracy-below-threshold  an output's PSNR under --min-psnr
    ├── AccuracyUnverifiedError  accuracy-unverified --min-psnr, but no usable accuracy figure
    ├── TwinMismatchError        twin-mismatch      --require-twin: a genai package's twin missed a token
    ├── RateLimitedError         rate-limited       HTTP: too many device reports / waiting long polls (429)
    ├── NoPublishedBuildsError   no-published-builds  farm package: the model has no published build to package
    ├── PackageFilesMissingError package-files-missing  farm package: a build's files are missing in the store
    ├── PackageVerifyError       package-verify-failed  farm package: the package failed its check (not published)
    ├── PackageUnsupportedError  package-unsupported  farm package: a kind no ORT model package holds (a genai folder)
    ├── PackageAmbiguousError    package-ambiguous-variants  farm package: two SoCs' QNN builds ORT can't tell apart
    ├── CapabilityMissingError   capability-missing  no worker of that SDK can make it (a genai package: onnxruntime-genai)
    ├── NotDeviceEvidenceError   not-device-evidence  a device report from the farm's own kind of host (QNN on x86_64)
    ├── ReportSocMismatchError   report-soc-mismatch  a device report naming an SoC the artifact does not cover
    ├── ReportRuntimeMismatchError report-runtime-mismatch  a device report from a runtime the compatibility rule refuses
    ├── EnrollmentInvalidError   enrollment-invalid  an enrollment token unknown, used, expired or revoked
    ├── DeviceRevokedError       device-revoked     an enrolled device that was revoked (its reports are struck)
    ├── ReportSignatureError     report-signature-invalid  a verification report its device's key did not sign
    ├── ReportReplayedError      report-replayed    a verification report for a lease or nonce that is not the job's now
    ├── TagGatedError            tag-gated          moving a tag that `farm promote` moved (`farm tag --ungate` first)
    ├── PromotionUnmetError      promotion-unmet    `farm promote`: the evidence does not meet --require (exit 3)
    └── InternalError            internal-error     a bug: rerun with FARM_DEBUG=1 for the traceback
    (UsageError ─ TooLargeError  too-large          HTTP: an upload over FARM_MAX_UPLOAD_MB)
    (UsageError ─ BadSamplesError bad-samples       sample inputs that are not a readable .npz for the model)
    (RateLimitedError ─ QuotaUploadsError      quota-uploads       a token over FARM_QUOTA_UPLOADS open upload sessions)
    (RateLimitedError ─ QuotaUploadBytesError  quota-upload-bytes  a token's uploads over FARM_QUOTA_UPLOAD_MB)
    (RateLimitedError ─ QuotaReleasesError     quota-releases      a token over FARM_QUOTA_RELEASES releases in progress)
"""

from __future__ import annotations

from typing import Any


class FarmError(Exception):
    """Base of every error a user can cause or must act on."""

    # Abstract: never raised itself (a test checks); every subclass has a documented code.
    code = "farm-error"
    exit_code = 1
    summary = ""  # one line for docs/errors.md and `farm help errors`
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
    summary = "not ONNX, truncated, external data refused (see Security)"
    default_hint = "ctxfarm builds ONNX ModelProto files (.onnx), external data as relative files beside them"


class UnknownTargetError(FarmError):
    code = "unknown-target"
    summary = "a target or SoC not in the catalog (the hint lists the known ones)"
    exit_code = 2  # a bad argument, like usage
    default_hint = "`farm targets` lists the known targets"


class BadOptionsError(FarmError):
    code = "bad-options"
    summary = "unknown build option, bad value or combination"
    exit_code = 2  # a bad argument, like usage (a build that fails with it in a worker: exit 1)
    default_hint = "see the options of each backend in docs/usage.md (farm build --option key=value)"


class SharingUnsupportedError(FarmError):
    code = "sharing-unsupported"
    summary = "a weight-shared graph group for a target below HTP v73, or combined with a multi-SoC build"
    exit_code = 2  # a bad argument, like bad-options
    default_hint = "shared weights need HTP v73 or newer (SM8550, SC8380XP, SM8650, SM8750, ...), one SoC per build"


class MultiSocUnsupportedError(FarmError):
    code = "multi-soc-unsupported"
    summary = "a multi-SoC build (qnn:SM8650+SM8750) on a QNN SDK older than 2.48, or for another backend"
    exit_code = 2
    default_hint = "multi-SoC context binaries need QNN >= 2.48 (onnxruntime-qnn >= 2.5.0); or build each SoC alone"


class UnsupportedOpsError(FarmError):
    code = "unsupported-ops"
    summary = "full offload required and ops stay on the CPU (names them), or the EP took no node"
    default_hint = "drop --require-full-offload to use the partially offloaded artifact, or replace these ops"


class NoWorkerError(FarmError):
    code = "no-worker"
    summary = "no toolchain here / no live worker serves it, or the broker is unreachable"
    default_hint = "install the backend's toolchain (pip install 'ctxfarm[qnn]') or start a worker for it"


class ToolchainError(FarmError):
    code = "toolchain-error"
    summary = "the EP/SDK failed to compile or load (the build log holds its message)"
    default_hint = "the build log (farm show / farm status) holds the SDK's own message"


class NotAContextError(FarmError):
    code = "not-a-context"
    summary = "`load-check`: a plain ONNX model (no EPContext node), not a compiled context"
    default_hint = "check the model_ctx.onnx that farm install (or ctxfarm-install) wrote, not the source model"


class TargetMismatchError(FarmError):
    code = "target-mismatch"
    summary = "`load-check`: the context was built for another SoC (or by another EP) than `--target`"
    default_hint = "install the build for this device: farm install --model NAME:TAG --soc SOC --qnn VERSION"


class RuntimeTooOldError(FarmError):
    code = "runtime-too-old"
    summary = "`load-check`: the context was built with a newer SDK than the local runtime"
    default_hint = ("install the build for this runtime: farm install --model NAME:TAG --soc SOC --qnn VERSION "
                    "with the QNN version of this device's onnxruntime-qnn (farm targets lists the map)")


class RuntimeCrashedError(FarmError):
    code = "runtime-crashed"
    summary = "`load-check`: the runtime died (a signal) loading or running the context"
    default_hint = "only a run on the device itself can tell whether the context works there"


class LoadUnverifiedError(FarmError):
    code = "load-unverified"
    exit_code = 4
    summary = ("`load-check`: every check this runtime can make passed, but it cannot load the context (weight-shared "
               "or multi-SoC on the x86_64 simulator): no verdict, exit 4")
    default_hint = "load it on a device with the target SoC (og.Model(dir) for a genai package, docs/shipping-llm.md)"


class CompileTimeoutError(FarmError):
    code = "timeout"
    summary = "`submit --wait --timeout` ran out (the release keeps running)"
    default_hint = "raise FARM_COMPILE_TIMEOUT if the model legitimately needs longer"


class WorkerLostError(FarmError):
    code = "worker-lost"
    summary = "the compiling process died on every attempt (`FARM_MAX_ATTEMPTS`)"
    default_hint = "the compiling process died; the build log holds its last words"


class StorageError(FarmError):
    code = "storage-error"
    summary = "the blob store is unusable (path, permissions, space)"
    default_hint = "check FARM_STORE_URL and that the store is reachable and writable"


class BlobNotFound(StorageError):
    code = "blob-not-found"
    summary = "a blob the index names is missing from the store"


class StorageUnavailable(StorageError):
    code = "storage-unavailable"
    summary = "the blob store did not answer or refused the credentials"
    default_hint = "the blob store did not answer: check FARM_STORE_URL, the endpoint and credentials"


class DigestMismatchError(StorageError):
    code = "digest-mismatch"
    summary = "content that does not match its digest"
    default_hint = "the stored content was altered or corrupted: run `farm registry verify`"


class NotFoundError(FarmError):
    code = "not-found"
    summary = "unknown artifact, model, tag, build or release"
    default_hint = "`farm ls` lists artifacts; model refs are NAME:TAG, NAME or a digest"


class TagConflictError(FarmError):
    code = "tag-conflict"
    summary = ("NAME:TAG points at another model: move it with `--force` (`farm tag`) or `--force-tag` "
               "(build, submit)")
    default_hint = "tags move only on purpose: add --force (farm tag) or --force-tag (build, submit)"


class NoMatchError(FarmError):
    code = "no-match"
    summary = "resolve found nothing this device can load (explains why, nearest candidates)"
    exit_code = 3


class SignatureError(FarmError):
    code = "signature-invalid"
    summary = "no trusted signature verifies, or the manifest is not for what was asked"
    default_hint = "the artifact is not signed by a key in FARM_TRUSTED_KEYS; do not install it"


class UnsignedError(SignatureError):
    code = "unsigned"
    summary = "no signature at all while trusted keys are set"
    default_hint = "sign it (farm keys sign ARTIFACT with FARM_SIGNING_KEY) or drop FARM_REQUIRE_SIGNATURE"


class ConfigError(FarmError):
    code = "bad-config"
    summary = "a bad `FARM_*` setting (names the variable)"
    default_hint = "see the FARM_* settings in docs/settings.md"


class MissingExtraError(FarmError):
    code = "missing-extra"
    summary = "an optional dependency is not installed (the hint has the pip command)"


class UsageError(FarmError):
    code = "usage"
    summary = "a bad argument: missing or unknown flag, bad version, id or digest"
    exit_code = 2
    default_hint = "`farm COMMAND --help` lists the arguments"


class BadNameError(UsageError):
    code = "bad-name"
    summary = "a model name or tag outside the name grammar"
    default_hint = ("names are lowercase alphanumerics separated by '.', '_' or '-', with optional '/' "
                    "namespaces (e.g. vision/super-res); tags are [A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


class BadGroupError(UsageError):
    code = "bad-group"
    summary = "a graph group with a bad or repeated graph name, too few graphs, or an unreadable group file"
    default_hint = ("graph names are lowercase identifiers, optionally dotted (prefill, part1.decode), "
                    "unique within the group")


class LocalOnlyError(UsageError):
    code = "local-only"
    summary = "a command that needs the index itself, in a shell that has only a service (`FARM_SERVER`)"
    default_hint = ("run it where the index is (FARM_DATABASE_URL and FARM_STORE_URL set, e.g. on the service's "
                    "host), or unset FARM_SERVER to use this machine's own index")


class BadGenaiError(UsageError):
    code = "bad-genai"
    summary = "an LLM export folder that can't be mapped (unknown layout, missing or bad file, mismatched parts)"
    default_hint = ("give the folder an exporter left: Olive's QNN recipe (embeddings.onnx, context_<i>.onnx, "
                    "iterator_<i>.onnx, lm_head.onnx) or AI Hub's (prompt/token graphs per part), with its "
                    "genai_config.json and tokenizer files (docs/shipping-llm.md)")


class GenaiFolderError(FarmError):
    code = "genai-folder-invalid"
    summary = "a built genai folder failed its check: config, a file it names, an EPContext path or a part's binary"
    default_hint = "the build log names the file; the source export is the likely cause (farm build --genai)"


class ResourceLimitError(FarmError):
    code = "resource-limit"
    summary = "the compile went past `FARM_COMPILE_MEMORY_MB` or `FARM_COMPILE_TIMEOUT` (cached; `--retry-failed`)"
    default_hint = ("the compile went past FARM_COMPILE_MEMORY_MB or FARM_COMPILE_TIMEOUT; raise the cap if the "
                    "model legitimately needs more, then rebuild with --retry-failed")


class LeaseLostError(FarmError):
    code = "lease-lost"
    summary = "internal: a late executor whose build was taken over stops and changes nothing"
    default_hint = "another executor took this build over after our lease lapsed; nothing was changed"


class SchemaMismatchError(FarmError):
    code = "schema-mismatch"
    summary = "index schema older/newer than this ctxfarm: run `farm db upgrade`"
    default_hint = "run `farm db upgrade` with the newest ctxfarm that uses this database"


class DatabaseError(FarmError):
    code = "database-error"
    summary = "the index database is unreachable, refused us, or is not a database"
    default_hint = "check FARM_DATABASE_URL: the index database is unreachable, refused us, or is not a database"


class ManifestError(FarmError):
    code = "bad-manifest"
    summary = "a manifest that is malformed or lists unsafe file names"
    default_hint = "the artifact's manifest is malformed or unsafe; do not install it (farm registry verify)"


class InstallConflictError(FarmError):
    code = "install-conflict"
    summary = "`--dest` exists and is not a directory (nothing moved)"
    default_hint = "pick a --dest that is a directory (or does not exist yet)"


class InterruptedBuildError(FarmError):
    code = "interrupted"
    summary = "SIGTERM/SIGINT: the lease was released, the attempt recorded"
    exit_code = 130
    default_hint = "the lease was released and the attempt recorded; run the command again to continue"


class CancelledError(FarmError):
    code = "cancelled"
    summary = "the build was cancelled (`farm cancel`); submitting it again queues it again"
    default_hint = "submit the release again to build it (a cancel is not a verdict on the model)"


class EnrollmentInvalidError(FarmError):
    code = "enrollment-invalid"
    summary = "`ctxfarm-agent enroll`: the enrollment token is unknown, already used, expired or revoked"
    default_hint = "ask an admin for a new one: farm device enroll NAME (single use, expiring)"


class DeviceRevokedError(FarmError):
    code = "device-revoked"
    summary = "a device agent whose enrollment was revoked (`farm device revoke`): its reports are struck"
    default_hint = "enroll the device again under a new name (farm device enroll NAME)"


class ReportSignatureError(FarmError):
    code = "report-signature-invalid"
    summary = "a verification report whose signature does not verify with the key its device enrolled"
    default_hint = "reports are signed by the agent's own key (ctxfarm-agent keeps it in its --home)"


class ReportReplayedError(FarmError):
    code = "report-replayed"
    summary = ("a verification report for a job lease that is not the job's current one (a replay, a lease "
               "that ran out and went to another agent, another device's lease)")
    default_hint = "nothing is recorded; the agent takes a new job and reports on it"


class TagGatedError(FarmError):
    code = "tag-gated"
    summary = "`farm tag --force` on a tag `farm promote` moved: it moves only by promote, rollback or after --ungate"
    default_hint = ("farm promote NAME:FROM --to TAG (on evidence), farm promote --rollback NAME:TAG, or "
                    "farm tag --ungate NAME:TAG")


class PromotionUnmetError(FarmError):
    code = "promotion-unmet"
    summary = "`farm promote`: the device evidence does not meet `--require` (what is missing is listed per SoC)"
    exit_code = 3  # nothing moved, like a resolve that found nothing
    default_hint = "enroll and run more device agents (docs/device-lab.md), or wait with --wait --timeout S"


class InternalError(FarmError):
    code = "internal-error"
    summary = "a bug in ctxfarm (`FARM_DEBUG=1` adds the traceback)"
    exit_code = 70
    default_hint = "this is a ctxfarm bug: rerun with FARM_DEBUG=1 for the traceback and report it"


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
    "resource-limit",
    "interrupted",
    "cancelled",
    "genai-folder-invalid",
    "capability-missing",
    "internal-error",  # an exception no stage handled (a bug): the build ends instead of staying queued
)
# Same inputs, same failure: answered from the index until --retry-failed.
DETERMINISTIC_FAILURES = frozenset({"invalid-model", "unsupported-ops", "bad-options", "resource-limit",
                                    "genai-folder-invalid", "capability-missing"})

def _subclasses(cls: type[FarmError]) -> list[type[FarmError]]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def error_for_code(code: str, message: str, *, hint: str | None = None,
                   fallback: type[FarmError] | None = None) -> FarmError:
    """Rebuild a typed error from its code (a failed build row, a child's result, an HTTP error
    body). A code this ctxfarm does not document (a newer service's) becomes ``fallback``
    (default InternalError) naming it: nothing undocumented reaches a user."""
    for cls in _subclasses(FarmError):
        if cls.code == code and cls.__module__ == __name__:
            return cls(message, hint=hint)
    cls = fallback or InternalError
    return cls(f"[{str(code)[:60]}] {message}",
               hint=f"this ctxfarm does not know the code {str(code)[:60]!r}: is the other side newer? "
                    f"{hint or cls.default_hint or ''}".strip())


class UnauthorizedError(FarmError):
    code = "unauthorized"
    summary = "HTTP: no, unknown or revoked token"
    default_hint = "send Authorization: Bearer <token> (an admin makes one: farm token create --scope read NAME)"


class ForbiddenError(FarmError):
    code = "forbidden"
    summary = "HTTP: the token's scope does not allow it"
    default_hint = "this token's scope does not allow it (scopes: read < submit < admin)"


class TooLargeError(UsageError):
    code = "too-large"
    summary = "HTTP: an upload over `FARM_MAX_UPLOAD_MB`"
    default_hint = "the upload is over FARM_MAX_UPLOAD_MB"


class ServerError(FarmError):
    code = "server-error"
    summary = "HTTP client: the service is unreachable, broken, or answered a code this ctxfarm does not know"
    default_hint = "check FARM_SERVER / --server and that the service is up"


class AccuracyBelowThresholdError(FarmError):
    code = "accuracy-below-threshold"
    summary = "an output's PSNR against the CPU reference is under `--min-psnr` (the artifact is still published)"
    default_hint = "the artifact is built and published; lower --min-psnr or fix the model's numerics"


class AccuracyUnverifiedError(FarmError):
    code = "accuracy-unverified"
    summary = "`--min-psnr` asked, but no runtime here gave a figure (cannot load, crashed, over its time budget)"
    default_hint = "drop --min-psnr for artifacts only devices can verify"


class TwinMismatchError(FarmError):
    code = "twin-mismatch"
    summary = ("`--require-twin`: a genai package's twin (the parts compiled without sharing) did not generate every "
               "greedy token the CPU EP did, or could not run (the package is still published)")
    default_hint = ("the package is built and published; `farm show` has the twin's figures (tokens matched, first "
                    "step's logits PSNR); drop --require-twin to accept it unverified")


class RateLimitedError(FarmError):
    code = "rate-limited"
    summary = ("HTTP: a token over a limit: more device reports than `FARM_REPORTS_PER_MINUTE`, or too many "
               "long polls waiting (429, with Retry-After)")
    default_hint = "wait a minute and send again; reports of one device are counted once anyway"


class NoPublishedBuildsError(FarmError):
    code = "no-published-builds"
    summary = "`farm package`: the model has no published (active) build to put in an ORT model package"
    exit_code = 3  # nothing to answer with, like no-match
    default_hint = "build it first (farm build / farm submit), then package it"


class PackageFilesMissingError(FarmError):
    code = "package-files-missing"
    summary = "`farm package`: a published build's files are missing or corrupt in the store (nothing published)"
    default_hint = "run `farm registry verify --repair` (it marks the broken artifact), then package again"


class PackageVerifyError(FarmError):
    code = "package-verify-failed"
    summary = ("`farm package`: the package failed its check before publication (ORT could not open it, a file "
               "did not hash right, or the CPU variant was not selected or did not run); nothing was published")
    default_hint = "this is a ctxfarm or onnxruntime bug for this model: the message names the failed check"


class PackageUnsupportedError(FarmError):
    code = "package-unsupported"
    summary = ("`farm package` / `farm install --package`: the model is a kind no ORT model package holds here (an "
               "onnxruntime-genai folder: onnxruntime-genai 0.18's wheel opens no model package) (409)")
    default_hint = "install the artifact itself: farm install NAME:TAG (a genai package installs as its folder)"


class PackageAmbiguousError(FarmError):
    code = "package-ambiguous-variants"
    summary = ("`farm package`: two published builds of one EP for different targets whose compatibility strings "
               "ORT can't tell apart (QNN 2.47.0 writes none naming the SoC), so a device could select the other "
               "SoC's binary; nothing was published (409)")
    default_hint = ("install per device instead (farm install --model NAME:TAG --soc SOC --qnn VERSION -d DIR); a "
                    "package needs each SoC's QNN build from QNN >= 2.49.40, whose compatibility string names the SoC")


class CapabilityMissingError(FarmError):
    code = "capability-missing"
    summary = ("no worker of the SDK asked for can make it (a genai package needs onnxruntime-genai >= 0.18 beside "
               "the toolchain), or a target that can't hold it (`--genai` with a TensorRT target) (409)")
    exit_code = 2  # a refusal of what was asked, before anything is written, like sharing-unsupported
    default_hint = "`farm workers` shows what each worker makes; leave --sdk out to build where it can be made"
class NotDeviceEvidenceError(FarmError):
    code = "not-device-evidence"
    summary = ("a device report from a host the farm itself could be (QNN on x86_64/x86: the HTP simulator): "
               "never device evidence (422)")
    default_hint = "report from the device (aarch64/armv7); the farm's own probes already cover the simulator"
    exit_code = 2


class ReportSocMismatchError(FarmError):
    code = "report-soc-mismatch"
    summary = "a device report naming an SoC the artifact was not built for (a multi-SoC build: none of its SoCs) (422)"
    default_hint = "report the artifact your device resolved for its own SoC"
    exit_code = 2


class ReportRuntimeMismatchError(FarmError):
    code = "report-runtime-mismatch"
    summary = "a device report from a runtime the compatibility rule refuses for that build (e.g. older SDK) (422)"
    default_hint = "devices refine the rule, never override it: resolve for this runtime and report what it answered"
    exit_code = 2
class BadSamplesError(UsageError):
    code = "bad-samples"
    summary = ("sample inputs that are not a readable `.npz` of plain arrays for this model (too many members, "
               "a bad CRC, truncated, a group's digest)")
    default_hint = "np.savez('inputs.npz', **{input_name: array}) with one array per input of the one model"


class QuotaUploadsError(RateLimitedError):
    code = "quota-uploads"
    summary = "HTTP: the token holds `FARM_QUOTA_UPLOADS` open upload sessions (429)"
    default_hint = "complete or abandon this token's open uploads (they expire after FARM_UPLOAD_TTL_S)"


class QuotaUploadBytesError(RateLimitedError):
    code = "quota-upload-bytes"
    summary = ("HTTP: the token's open upload sessions and the blobs it sent that no model references yet would "
               "hold over `FARM_QUOTA_UPLOAD_MB` (429)")
    default_hint = ("complete this token's open uploads, or submit what its blobs were sent for, first (both count "
                    "for FARM_UPLOAD_TTL_S at most)")


class QuotaReleasesError(RateLimitedError):
    code = "quota-releases"
    summary = "HTTP: the token has `FARM_QUOTA_RELEASES` releases with builds still queued or running (429)"
    default_hint = "wait for this token's releases to finish (or cancel some), then submit again"


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by our SIGTERM/SIGINT handler while a build runs: it unwinds
    like Ctrl-C (killing the compile child, releasing the lease, removing temp dirs)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def translate(exc: BaseException) -> FarmError:
    """Any exception, as the error users see (every front door uses this one mapping; the codes
    are in the documented table). Library errors are recognised by module, not imported."""
    if isinstance(exc, FarmError):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return InterruptedBuildError(f"interrupted by signal {getattr(exc, 'signum', 2)}")
    mod = type(exc).__module__.split(".")[0]
    text = str(getattr(exc, "orig", None) or exc).strip()
    first = text.splitlines()[0][:300] if text else type(exc).__name__
    if mod in ("sqlalchemy", "psycopg", "sqlite3"):
        return DatabaseError(f"index database error: {first}")
    if mod in ("botocore", "boto3", "urllib3", "s3transfer"):
        return StorageUnavailable(f"blob store error: {first}")
    if mod in ("redis", "kombu", "celery", "amqp"):
        return NoWorkerError(f"broker error: {first}", hint="check FARM_BROKER_URL and that Redis is running")
    if isinstance(exc, MemoryError):
        return ResourceLimitError("out of memory")
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return StorageError(f"{exc.strerror or exc}{where}", hint="check the path, its permissions and free space")
    if isinstance(exc, (ValueError, OverflowError, UnicodeError)):
        return UsageError(f"bad input: {first}")
    return InternalError(f"{type(exc).__name__}: {first}")


# ---- the one vocabulary ---------------------------------------------------------------------------

def documented() -> list[type[FarmError]]:
    """Every error class users can see, in the order they are defined here. The
    "Errors" table of docs/errors.md and `farm help errors` are made from this list (a test compares them)."""
    seen = {c for c in _subclasses(FarmError) if c.__module__ == __name__}
    return [v for v in globals().values() if isinstance(v, type) and v in seen]


def codes() -> frozenset[str]:
    return frozenset(c.code for c in documented())


def table_rows() -> list[dict[str, Any]]:
    """One row per code: code, exit status, meaning, default hint."""
    return [{"code": c.code, "exit": c.exit_code, "meaning": c.summary, "hint": c.default_hint}
            for c in documented()]


def markdown_table() -> str:
    """The table of docs/errors.md (`farm help errors --markdown`)."""
    lines = ["| code | exit | meaning |", "|---|---|---|"]
    lines += [f"| `{r['code']}` | {r['exit']} | {r['meaning']} |" for r in table_rows()]
    return "\n".join(lines) + "\n"
