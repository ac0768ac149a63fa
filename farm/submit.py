"""Submission: validate everything up front, dedupe on the build key, compile what is missing.

Embedded mode compiles in a child process of this one and publishes straight into the
registry. The order is what keeps the registry consistent:

1. inspect the model, parse targets, normalize options: any error here writes nothing;
2. claim the build row (UNIQUE build key): one compile per key, whoever inserts it;
3. compile in a fresh temp dir;
4. upload every blob (context files, log, manifest), each verified by digest;
5. one transaction inserts the artifact rows and marks the build succeeded.
A crash between 4 and 5 leaves only unreferenced blobs, which ``farm registry gc`` sweeps.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.bundle import ModelBundle
from farm.catalog import Target, parse_target
from farm.config import Settings
from farm.errors import FarmError, NoWorkerError, StorageError
from farm.keys import build_key, options_digest, sha256_file
from farm.options import normalize, parse_pairs

Progress = Callable[[str, str, dict[str, Any]], None]  # (event, target ref, info)

LEASE_MARGIN_S = 120.0


@dataclass
class PlannedBuild:
    target: Target
    toolchain: Any  # workers.runner.Toolchain
    options: dict[str, Any]
    options_digest: str
    build_key: str


@dataclass
class BuildOutcome:
    target: str
    toolchain: str
    state: str  # built | cached | failed
    build_id: int
    artifact: str | None = None  # manifest digest
    compile_seconds: float | None = None
    wall_seconds: float | None = None
    size: int | None = None
    nodes_ep: int | None = None
    nodes_cpu: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    cached_failure: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class BuildReport:
    model_digest: str
    name: str
    tag: str | None
    outcomes: list[BuildOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.state != "failed" for o in self.outcomes)


def _noop(_event: str, _target: str, _info: dict[str, Any]) -> None:
    return None


def load_bundle(registry: Any, model_path: Path) -> ModelBundle:
    """The bundle for ``model_path``; a model already in the index is recognized by its bytes
    (sha256 of the .onnx and of each recorded data file) without parsing it again."""
    from farm.bundle import BundleFile, inspect_model
    from registry.index import find_model_by_onnx

    if model_path.is_file():
        onnx_digest, onnx_size = sha256_file(model_path)
        with registry.db.session() as s:
            known = [(m.digest, m.files) for m in find_model_by_onnx(s, onnx_digest)]
        for digest, files in known:
            external = []
            for f in files[1:]:
                p = model_path.parent / f["path"]
                if not p.is_file() or sha256_file(p)[0] != f["digest"]:
                    break
                external.append(BundleFile(f["path"], f["digest"], int(f["size"])))
            else:
                return ModelBundle(path=model_path.resolve(), digest=digest,
                                   onnx=BundleFile("", onnx_digest, onnx_size), external=tuple(external))
    return inspect_model(model_path)


def plan(model_path: Path, target_refs: Sequence[str], option_pairs: Sequence[str]) -> list[PlannedBuild]:
    """Parse targets and options and find a toolchain for each backend; writes nothing."""
    from workers.runner import get_runner

    if not target_refs:
        raise FarmError("no target given", hint="add --target qnn:SM8650 (see `farm targets`)")
    raw = parse_pairs(option_pairs)
    targets: list[Target] = []
    for ref in target_refs:
        t = parse_target(ref)
        if t not in targets:
            targets.append(t)
    planned = []
    for t in targets:
        opts = normalize(t.backend, raw, t)
        try:
            toolchain = get_runner(t.backend).toolchain()
        except FarmError as exc:
            raise NoWorkerError(f"cannot build {t.ref} here: {exc.message}", hint=exc.hint) from None
        planned.append(PlannedBuild(t, toolchain, opts, options_digest(opts), ""))
    return planned


def build(settings: Settings, model: str | Path, target_refs: Sequence[str], option_pairs: Sequence[str] = (),
          *, name: str | None = None, tag: str | None = None, progress: Progress = _noop,
          registry: Any = None, retry_failed: bool = False) -> BuildReport:
    """Embedded build: compile every missing (model, target, toolchain, options) here."""
    from registry.index import Registry, record_model, set_tag

    model_path = Path(model)
    own = registry is None
    reg = registry or Registry.open(settings)
    try:
        planned = plan(model_path, target_refs, option_pairs)
        signer = signer_for(settings)
        bundle = load_bundle(reg, model_path)
        display = name or bundle.stem
        with reg.db.session() as s:
            record_model(s, digest=bundle.digest, onnx_digest=bundle.onnx.digest, size=bundle.size,
                         files=bundle.files_json(), name=display)
            if name:
                set_tag(s, name, tag or "latest", bundle.digest)
        report = BuildReport(bundle.digest, display, (tag or "latest") if name else None)
        for p in planned:
            p.build_key = build_key(bundle.digest, p.target.backend, p.target.name, p.toolchain.version,
                                    p.options_digest)
            report.outcomes.append(_build_one(settings, reg, bundle, display, p, progress, signer, retry_failed))
        return report
    finally:
        if own:
            reg.close()


def signer_for(settings: Settings) -> Any:
    """The configured manifest signer, or None (FARM_SIGNING_KEY unset)."""
    if not settings.signing_key:
        return None
    from registry.signing import load_signer

    return load_signer(settings.signing_key)


def _build_one(settings: Settings, reg: Any, bundle: ModelBundle, stem: str, p: PlannedBuild,
               progress: Progress, signer: Any = None, retry_failed: bool = False) -> BuildOutcome:
    from registry.index import BuildSpec, claim_build

    spec = BuildSpec(p.build_key, bundle.digest, p.target.backend, p.target.name, p.toolchain.version,
                     p.options, p.options_digest)
    lease = settings.compile_timeout + LEASE_MARGIN_S
    ref = p.target.ref
    while True:
        with reg.db.session() as s:
            claim = claim_build(s, spec, lease_seconds=lease, retry_failed=retry_failed)
        retry_failed = False  # once: a busy wait must not re-run what the other process just failed
        if claim.action != "busy":
            break
        # Another process is compiling this key: wait for its row rather than compile twice.
        progress("waiting", ref, {"build_id": claim.build_id})
        time.sleep(0.5)
    if claim.action == "done":
        return _outcome_from_row(reg, claim.build_id, ref, cached=True)
    progress("compiling", ref, {"toolchain": p.toolchain.version, "attempt": claim.attempt})
    outcome = _compile_and_publish(settings, reg, bundle, stem, p, claim.build_id, signer)
    progress("finished", ref, outcome.to_dict())
    return outcome


def _compile_and_publish(settings: Settings, reg: Any, bundle: ModelBundle, stem: str, p: PlannedBuild,
                         build_id: int, signer: Any = None) -> BuildOutcome:
    from registry.index import fail_build
    from workers.runner import CompileJob, get_runner

    runner = get_runner(p.target.backend)
    job = CompileJob(bundle.path, p.target, p.options, stem, settings.compile_timeout)
    try:
        with tempfile.TemporaryDirectory(prefix="ctxfarm-build-") as tmp:
            out = runner.compile(job, Path(tmp))
            published = publish(reg, build_id, p, bundle.digest, out, signer)
    except FarmError as exc:
        log = exc.details.get("log")
        # Build rows carry the design's failure codes; every store trouble is storage-error.
        code = "storage-error" if isinstance(exc, StorageError) else exc.code
        with reg.db.session() as s:
            fail_build(s, build_id, code, exc.message, log)
        return BuildOutcome(p.target.ref, p.toolchain.version, "failed", build_id,
                            error_code=code, error_message=exc.message)
    except BaseException:
        # A bug or Ctrl-C: release the row so the next run retries instead of waiting out the lease.
        with reg.db.session() as s:
            fail_build(s, build_id, "worker-lost", "the compiling process was interrupted", None)
        raise
    return BuildOutcome(p.target.ref, p.toolchain.version, "built", build_id, artifact=published["digest"],
                        compile_seconds=out.compile_seconds, wall_seconds=out.wall_seconds,
                        size=published["size"], nodes_ep=out.placement["ep_nodes"],
                        nodes_cpu=out.placement["cpu_nodes"])


def publish(reg: Any, build_id: int, p: PlannedBuild, model_digest: str, out: Any,
            signer: Any = None) -> dict[str, Any]:
    """Blobs first (each verified), then the index rows (and signature) in one transaction."""
    from datetime import UTC, datetime

    from registry import manifest as mf
    from registry.index import add_signature, publish_artifact
    from registry.store.base import put_bytes, put_file

    try:
        files = []
        for f in out.files:
            digest, size = sha256_file(f.path)
            put_file(reg.store, f.path, expected=digest)
            files.append({"name": f.name, "role": f.role, "digest": digest, "size": size, "mediaType": f.media_type})
        log_bytes = out.log.encode("utf-8")
        log_info = put_bytes(reg.store, log_bytes)
        target = {"ref": p.target.ref, "name": p.target.name, "soc_model": p.target.soc_model,
                  "htp_arch": p.target.htp_arch, "compute_capability": p.target.compute_capability}
        manifest = mf.make_manifest(
            model_digest=model_digest, build_key=p.build_key, backend=p.target.backend, target=target,
            toolchain=out.toolchain.to_dict(), options=p.options, options_digest=p.options_digest,
            ctx_model=out.ctx_model, files=files, epcontext=out.epcontext, placement=out.placement,
            compile_seconds=out.compile_seconds, built_at=datetime.now(UTC).isoformat(timespec="seconds"),
            log={"digest": log_info.digest, "size": log_info.size, "mediaType": "text/plain"},
        )
        data, manifest_digest = mf.encode(manifest)
        put_bytes(reg.store, data, expected=manifest_digest)
        all_files = [*files, {"name": "build.log", "role": "log", "digest": log_info.digest,
                              "size": log_info.size, "mediaType": "text/plain; charset=utf-8"}]
        ep_sdk = next((n.get("ep_sdk_version") for n in out.epcontext if n.get("ep_sdk_version")), None)
        with reg.db.session() as s:
            art = publish_artifact(s, build_id, manifest_digest=manifest_digest, manifest_size=len(data),
                                   ctx_model=out.ctx_model, files=all_files, ep_sdk_version=ep_sdk,
                                   compile_seconds=out.compile_seconds, nodes_ep=out.placement["ep_nodes"],
                                   nodes_cpu=out.placement["cpu_nodes"], log=out.log)
            if signer is not None:
                add_signature(s, manifest_digest, signer.public_b64, signer.sign(manifest_digest))
            return {"digest": art.digest, "size": art.size, "artifact_id": art.id}
    except FarmError:
        raise
    except OSError as exc:
        raise StorageError(f"publishing the artifact failed: {exc}") from None


def _outcome_from_row(reg: Any, build_id: int, ref: str, *, cached: bool) -> BuildOutcome:
    from registry.index import artifact_for_build, get_build

    with reg.db.session() as s:
        b = get_build(s, build_id)
        if b.state == "succeeded":
            a = artifact_for_build(s, build_id)
            assert a is not None, "succeeded build without artifact"
            return BuildOutcome(ref, b.toolchain, "cached" if cached else "built", b.id, artifact=a.digest,
                                compile_seconds=a.compile_seconds, size=a.size, nodes_ep=a.nodes_ep,
                                nodes_cpu=a.nodes_cpu)
        return BuildOutcome(ref, b.toolchain, "failed", b.id, error_code=b.error_code,
                            error_message=b.error_message, cached_failure=cached)
