"""onnxruntime-genai packages (docs/shipping-llm.md): an exported static decoder pipeline becomes one folder
a device opens with ``og.Model(dir)``, built part by part.

The shape of an export (which file is which part's prefill or decode, the CPU stages, the
tokenizer, the generated ``genai_config.json``) is ``farm.core.genai``'s; this module is what the
farm does with it:

- **the package as a model snapshot**: ``genai.json`` first (what the package is: each part's
  graph group by digest, each CPU stage by role, the tokenizer files), then the CPU stages and
  tokenizer files under fixed names. Each part's prefill and decode are a graph group of their
  own (``farm.core.groups``), recorded as a model like any group. The package digest covers the
  parts' group digests and every other file's digest.
- **fan out**: each part is one weight-shared group build (the group build path, unchanged);
  the parts build in parallel in one pool (embedded) and each is admitted like any build.
- **fan in**: the package's own build row (key: package digest x target x toolchain x options)
  is claimed once every part is final, then assembled (no compile): the parts' context models
  and their shared ``.bin`` under ``part<i>/``, the CPU stages and tokenizer as they are, the
  generated ``genai_config.json``; the folder checks run on the laid-out folder; then one
  publication (manifest with each stage's role under ``genai``). A part that failed fails the
  package with the part's code, the message naming the part.
- **the twin**: the same parts compiled without sharing and generated from on the simulator
  against the CPU EP (``workers.backends.genai_twin``), budgeted like the accuracy check. It is
  evidence that follows publication: the package is published with ``description["twin"]``
  ``pending`` and the twin's figures replace it when it is done (``verify_twin``: the embedded
  command runs it after it answered, a worker right after it published); the shared artifact
  stays unverified by load with the reason.

Every blob stays content-addressed: a part's context model and binary are the very blobs of the
part's group artifact, a tokenizer or CPU stage shared by packages for several SoCs or SDKs is
one blob.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from farm.core.bundle import BundleFile
from farm.core.errors import FarmError, InvalidModelError
from farm.core.genai import TWIN_MIN_PSNR
from farm.core.keys import bundle_digest, canonical_json, sha256_bytes
from farm.core.names import inside
from farm.core.settings import Settings
from farm.pipeline.submission import BuildOutcome, BuildReport, Progress, no_progress

PACKAGE_FILE = "genai.json"
PACKAGE_KIND = "ctxfarm.genai-package.v1"
CONFIG_NAME = "genai_config.json"
PREFILL, DECODE = "prefill", "decode"
MEDIA = {".json": "application/json", ".onnx": "application/octet-stream"}
log = logging.getLogger(__name__)


def part_dir(index: int) -> str:
    return f"part{index}"


# ---- the package as a model snapshot --------------------------------------------------------------

SOURCE_CONFIG = "source/genai_config.json"  # the exporter's config, in the snapshot (not the folder)


@dataclass(frozen=True)
class PackageBundle:
    """An export as one model snapshot (the interface of ``ModelBundle`` that submission uses:
    digest, onnx, size, stem, files_json, sources), plus its parts' groups. The carried files
    (CPU stages, their data, tokenizer) keep the plain names ``farm.core.genai`` checked."""

    parts: tuple[Any, ...]  # farm.core.groups.GroupBundle, one per part, in order
    carried: tuple[tuple[str, Path, BundleFile], ...]  # (name in the folder, path here, digest/size)
    export: Any  # farm.core.genai.GenaiExport
    descriptor: bytes
    digest: str
    onnx: BundleFile  # genai.json's entry
    display: str
    _dir: Path = field(repr=False, compare=False, default=Path("."))

    @property
    def stem(self) -> str:
        return self.display

    @property
    def path(self) -> Path:
        return self._dir / PACKAGE_FILE

    @property
    def size(self) -> int:
        return len(self.descriptor) + sum(f.size for _, _, f in self.carried)

    def files_json(self) -> list[dict[str, Any]]:
        return [entry for entry, _ in self.sources()]

    def cleanup(self) -> None:
        """Remove the temporary directories of genai.json and of each part's group.json (the
        caller's ``finally``: success, refusal or Ctrl-C leave nothing in TMPDIR)."""
        for g in self.parts:
            g.cleanup()
        if self._dir.name.startswith("ctxfarm-genai-"):
            shutil.rmtree(self._dir, ignore_errors=True)

    def sources(self) -> list[tuple[dict[str, Any], Path]]:
        out: list[tuple[dict[str, Any], Path]] = [
            ({"path": PACKAGE_FILE, "digest": self.onnx.digest, "size": self.onnx.size}, self.path)]
        out += [({"path": name, "digest": f.digest, "size": f.size}, path) for name, path, f in self.carried]
        return out


def descriptor(export: Any, parts: Sequence[Any], carried: Sequence[tuple[str, Path, BundleFile]]) -> dict[str, Any]:
    """genai.json: the kind, the layout, each stage's name/role/file in pipeline order, each
    part's group digest, the carried files by name and digest (the exporter's config among
    them, as ``source/genai_config.json``): any change is another package."""
    from farm.core import genai

    roles = genai.roles(export)
    return {"kind": PACKAGE_KIND, "layout": export.layout,
            "stages": [{"name": s.name, "role": roles[s.name], "file": s.graph.file} for s in export.stages],
            "parts": [{"part": i, "group": g.digest, "graphs": g.names} for i, g in enumerate(parts)],
            "carried": [{"path": n, "digest": f.digest} for n, _, f in carried]}


def inspect_package(settings: Settings, export_dir: str | Path, *, display: str | None = None) -> PackageBundle:
    """Read the export (``farm.core.genai.read_export``: a folder it can't map is ``bad-genai``
    naming the file), inspect each part as a graph group (``farm.pipeline.groups.load_group``:
    a group the index holds is recognized without reading its weights again) and hash the
    carried files (remembered by stat: ``farm.core.digests``). Nothing is written to the registry
    here."""
    from farm.core import genai
    from farm.core.digests import file_digests, memo_path
    from farm.pipeline.groups import load_group

    export = genai.read_export(Path(export_dir))
    label = display or export.root.name or "genai"
    parts = tuple(load_group(settings, export.group_members(i), display=f"{label}.{part_dir(i)}")
                  for i in range(len(export.parts)))
    carried: list[tuple[str, Path, BundleFile]] = []
    names = [*export.carried_files(), genai.CONFIG_FILE]
    # Remembered by stat, as each part's graphs are (load_group): an unchanged CPU stage's data
    # is not read again; on the service, the blobs it verified as it laid the folder out.
    digests = file_digests([export.path(n) for n in names], memo_path(settings.home))
    for name, (digest, size) in zip(names, digests, strict=True):
        path = export.path(name)
        shown = SOURCE_CONFIG if name == genai.CONFIG_FILE else name
        carried.append((shown, path, BundleFile(shown, digest, size)))
    desc = canonical_json(descriptor(export, parts, carried))
    entry = BundleFile("", sha256_bytes(desc), len(desc))
    digest = bundle_digest(entry.digest, [(n, f.digest) for n, _, f in carried])
    tmp = Path(tempfile.mkdtemp(prefix="ctxfarm-genai-"))
    (tmp / PACKAGE_FILE).write_bytes(desc)
    return PackageBundle(parts, tuple(carried), export, desc, digest, entry, label, tmp)


def read_package(files: list[dict[str, Any]], store: Any) -> dict[str, Any] | None:
    """genai.json of a recorded model (its listing ``files``), or None when the model is not a
    genai package."""
    from registry.store.base import read_bytes

    if not files or files[0].get("path") != PACKAGE_FILE:
        return None
    doc = json.loads(read_bytes(store, files[0]["digest"]))
    if not isinstance(doc, dict) or doc.get("kind") != PACKAGE_KIND:
        raise InvalidModelError("genai.json is not a ctxfarm genai package")
    return doc


# ---- the report ---------------------------------------------------------------------------------

@dataclass
class PackageReport:
    """One answer for the package: its outcome per target, and each part's group report."""

    package: BuildReport
    parts: list[BuildReport]

    @property
    def ok(self) -> bool:
        return self.package.ok


# ---- embedded: fan out, fan in ------------------------------------------------------------------

def build_package(settings: Settings, export_dir: str | Path, target_refs: Sequence[str],
                  option_pairs: Sequence[str] = (), *, name: str | None = None, tag: str | None = None,
                  progress: Progress = no_progress, part_progress: Callable[[int], Progress] | None = None,
                  retry_failed: bool = False, force_tag: bool = False, twin: bool = True,
                  require_twin: bool = False,
                  published: Callable[[PackageReport], None] | None = None) -> PackageReport:
    """Embedded ``farm build --genai``: validate everything, record the package (and NAME:TAG),
    build the parts' groups in one pool, then assemble, check and publish the package per
    target. Published is not verified: the package is final (resolvable, installable) once its
    folder check passes, a ``published`` progress event says when, and ``published`` is called
    with the answer as it stands then (the twin ``pending``). ``twin``: then the twin runs in
    this call (budgeted) and is recorded on the artifact, evidence on a published package, never
    a failed build; also for a cached package whose twin is missing or still pending (built with
    --no-twin, or a command interrupted during its twin). ``require_twin``: the returned answer is
    gated on it (a twin that did not match every token, or could not run, is ``twin-mismatch``;
    the artifact stays published)."""
    from farm.core.capabilities import check_genai_backends, check_here
    from farm.pipeline import states
    from farm.pipeline.execute import Executor, interruptible, wait_until_final_or_free
    from farm.pipeline.plan import (
        _spec,
        build_many,
        check_support,
        outcome_from_row,
        parse_build_request,
        record_snapshot,
        store_snapshot,
    )
    from registry.index import Registry
    from workers.backends import get_runner
    from workers.capabilities import here

    req = parse_build_request(target_refs, option_pairs, name, tag, False)
    check_genai_backends([t.backend for t in req.targets])
    for backend in dict.fromkeys(t.backend for t in req.targets):  # before anything is read, recorded or compiled
        check_here(backend, get_runner(backend).toolchain().version, here(backend))
    pkg = inspect_package(settings, export_dir, display=name)
    reg = Registry.open(settings)
    try:
        versions = {t.backend: Executor(settings, reg, get_runner(t.backend)).toolchain.version
                    for t in req.targets}
        check_support([(t, versions[t.backend]) for t in req.targets], group=True, llm=True)
        files = store_snapshot(reg, cast(Any, pkg))  # a snapshot like a model's (digest, sources)
        planned = []
        with reg.db.session() as s:
            moved = record_snapshot(s, pkg.digest, pkg.onnx.digest, pkg.size, files, req.name, req.tag,
                                    pkg.stem, force_tag=force_tag)
            for t in req.targets:
                spec = _spec(pkg.digest, t, versions[t.backend], req.options[t])
                build_id, _ = states.enqueue(s, spec, None, retry_failed=retry_failed)
                planned.append((t, spec, build_id))
        report = BuildReport(pkg.digest, req.name or pkg.stem, req.tag, tag_moved=moved)
        with reg.db.session() as s:
            final = all(states.get_build(s, b).state in states.FINAL for _, _, b in planned)
        if final:
            # Answered by the index: nothing compiled, nothing assembled.
            for t, _, build_id in planned:
                o = _with_twin(reg, outcome_from_row(reg, build_id, t.ref, cached=True), False)
                progress("finished", t.ref, o.to_dict())
                report.outcomes.append(o)
            return _then_twin(settings, reg, PackageReport(report, []), planned, Path(export_dir), twin=twin,
                              require=require_twin, progress=progress, published=published)
        listen = [part_progress(i) if part_progress else no_progress for i in range(len(pkg.parts))]
        with interruptible():
            parts = build_many(settings, list(pkg.parts), target_refs, option_pairs, progress=listen,
                               registry=reg, retry_failed=retry_failed)
        with reg.db.session() as s:
            for k, (_, _, build_id) in enumerate(planned):
                link_parts(s, build_id, [p.outcomes[k].build_id for p in parts])
        for k, (t, spec, build_id) in enumerate(planned):
            progress("assembling", t.ref, {"parts": len(parts)})
            start = time.perf_counter()
            ran = False
            while True:
                def hear(event: str, info: dict[str, Any], ref: str = t.ref) -> None:
                    progress(event, ref, info)

                ran = assemble(settings, reg, pkg, spec, build_id, [p.outcomes[k] for p in parts],
                               Path(export_dir), twin=twin, progress=hear) or ran
                with reg.db.session() as s:
                    if states.get_build(s, build_id).state in states.FINAL:
                        break
                # Another process assembles it: wait until it is done or its lease lapses.
                progress("waiting", t.ref, {"build_id": build_id})
                wait_until_final_or_free(reg, build_id)
            o = outcome_from_row(reg, build_id, t.ref, cached=not ran)
            o.wall_seconds = time.perf_counter() - start
            o.compile_seconds = sum(p.outcomes[k].compile_seconds or 0.0 for p in parts) or o.compile_seconds
            o = _with_twin(reg, o, False)
            progress("finished", t.ref, o.to_dict())
            report.outcomes.append(o)
        return _then_twin(settings, reg, PackageReport(report, parts), planned, Path(export_dir), twin=twin,
                          require=require_twin, progress=progress, published=published)
    finally:
        pkg.cleanup()
        reg.close()


def _then_twin(settings: Settings, reg: Any, result: PackageReport, planned: Sequence[tuple[Any, Any, int]],
               export_dir: Path, *, twin: bool, require: bool, progress: Progress,
               published: Callable[[PackageReport], None] | None) -> PackageReport:
    """After publication (every outcome final): say so, hand the answer to ``published``, then
    run each published package's twin that is missing or pending, record it, and gate the
    answer on it with ``require``. The command waits on this twin, so it runs at nice 0."""
    for (t, _, _), o in zip(planned, result.package.outcomes, strict=True):
        if o.state != "failed" and o.artifact:
            progress("published", t.ref, {"artifact": o.artifact, "at": datetime.now(UTC).isoformat(timespec="seconds"),
                                          "twin": twin_status(_description(reg, o.artifact))})
    if published is not None:
        published(result)
    for (t, spec, _), o in zip(planned, result.package.outcomes, strict=True):
        if twin and o.state != "failed" and o.artifact and twin_status(_description(reg, o.artifact)) in (
                None, "pending"):
            progress("checking", t.ref, {"what": "twin"})
            tw = verify_twin(settings, reg, o.artifact, spec, export_dir, nice=0)
            progress("twin", t.ref, {"artifact": o.artifact, **tw})
    result.package.outcomes = [_with_twin(reg, o, require) for o in result.package.outcomes]
    return result


def _with_twin(reg: Any, o: BuildOutcome, require: bool) -> BuildOutcome:
    """The twin's figures on the outcome (``o.accuracy`` carries them as ``{"twin": ...}``) and,
    with ``require``, the gate: every compared token matched, else ``twin-mismatch``."""
    if o.state == "failed" or not o.artifact:
        return o
    from registry.index import find_artifact

    with reg.db.session() as s:
        desc = find_artifact(s, o.artifact).description or {}
    tw = desc.get("twin")
    o.accuracy = {"twin": tw} if tw is not None else None
    if require:
        refusal = twin_refusal(tw, o.artifact)
        if refusal is not None:
            o.state, o.error_code, o.error_message = "failed", refusal.code, refusal.message
    return o


def _description(reg: Any, artifact: str) -> dict[str, Any] | None:
    from registry.index import find_artifact

    with reg.db.session() as s:
        return find_artifact(s, artifact).description


def twin_pending() -> dict[str, Any]:
    """The twin of a package published before its twin ran (``farm show``: ``twin pending``)."""
    return {"status": "pending", "since": datetime.now(UTC).isoformat(timespec="seconds"),
            "detail": "published; the twin (the parts compiled without sharing, run on the simulator) runs after "
                      "publication: farm build --genai of the same export runs it if none is running"}


def twin_status(description: dict[str, Any] | None) -> str | None:
    """``pending``, ``ok``, ``unverified``, ``runtime-crashed``; None: no twin was asked for."""
    tw = twin_of(description)
    return str(tw.get("status")) if tw is not None else None


def verify_twin(settings: Settings, reg: Any, artifact: str, spec: Any, export_dir: Path, *,
                nice: int = 10) -> dict[str, Any]:
    """The twin of a published package, run and recorded on its artifact (never a verdict on
    the build: a twin that fails or mismatches is recorded evidence). A twin that raises (a bug)
    is recorded ``unverified`` with what it raised: never left ``pending`` with the cause lost."""
    try:
        tw = run_twin(settings, spec, export_dir, nice=nice)
    except Exception as exc:  # noqa: BLE001 - recorded on the artifact and logged, never lost
        import logging

        logging.getLogger("ctxfarm.genai").error("the twin of %s raised", artifact[7:19], exc_info=True)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        tw = {"status": "unverified", "detail": f"internal-error: {type(exc).__name__}: {first}"}
    record_twin(reg, artifact, tw)
    return tw


def record_twin(reg: Any, artifact: str, tw: dict[str, Any]) -> None:
    """The twin's figures on a published package (its description's ``twin``)."""
    from registry.index import find_artifact

    with reg.db.session() as s:
        art = find_artifact(s, artifact)
        art.description = {**(art.description or {}), "twin": tw}


def twin_refusal(tw: dict[str, Any] | None, artifact: str, *, min_psnr: float = TWIN_MIN_PSNR) -> FarmError | None:
    """The --require-twin gate: None when every compared token matched and every output of every
    part's check (``parts``: prefill and one decode step on the simulator against the CPU EP) is
    at or above ``min_psnr`` dB; the refusal names the part and the output (checked first: it
    says where a mismatch of the tokens comes from). A twin recorded
    before the part checks existed (no ``parts``) is gated on its tokens."""
    from farm.core.errors import TwinMismatchError

    if not tw or tw.get("status") != "ok":
        why = (tw or {}).get("detail") or "no twin check ran"
        return TwinMismatchError(f"artifact {artifact[7:19]}: no twin figures to gate on ({why})")
    for part in tw.get("parts") or []:
        index = part.get("part") if isinstance(part, dict) else None
        if not isinstance(part, dict) or part.get("status") != "ok":
            why = (part.get("detail") if isinstance(part, dict) else None) or "no figures"
            return TwinMismatchError(f"artifact {artifact[7:19]}: the twin's check of part {index} did not run "
                                     f"({str(why)[:300]})")
        for phase in ("prefill", "decode"):
            for output, psnr in (part.get(phase) or {}).items():
                if not isinstance(psnr, int | float) or psnr < min_psnr:
                    return TwinMismatchError(
                        f"artifact {artifact[7:19]}: part {index}'s {phase} graph on the simulator: output {output!r} "
                        f"at {psnr} dB PSNR against the CPU EP, below {min_psnr:g} dB",
                        hint="the package is built and published; the HTP runs float graphs in fp16: check that "
                             "part for values beyond fp16's range (65,504); drop --require-twin to accept it")
    if not tw.get("tokens_compared") or tw.get("tokens_matched") != tw.get("tokens_compared"):
        return TwinMismatchError(f"artifact {artifact[7:19]}: the twin matched {tw.get('tokens_matched')} of "
                                 f"{tw.get('tokens_compared')} greedy tokens against the CPU EP")
    return None


def assemble(settings: Settings, reg: Any, pkg: PackageBundle, spec: Any, build_id: int,
             parts: Sequence[BuildOutcome], export_dir: Path | None, *, twin: bool = True,
             progress: Callable[[str, dict[str, Any]], None] = lambda e, i: None, owner: str | None = None) -> bool:
    """The fan-in of one target: claim the package build, lay out the folder from the parts'
    artifacts, check it, publish (or fail with the first failed part's code). ``twin``: the
    artifact is published with its twin ``pending`` (the caller runs it after: ``verify_twin``).
    Returns whether this call ran it (False: it was final already, or another executor holds
    it). The lease is renewed while the checks run; a cancel (the lease taken) publishes nothing."""
    from farm.pipeline import states
    from farm.pipeline.execute import LeaseKeeper

    with reg.db.session() as s:
        c = states.claim(s, build_id, owner=owner or states.owner_base(), lease_seconds=settings.lease_seconds,
                         max_attempts=settings.max_attempts)
    if c.action != "run" or c.lease is None:
        return False
    lease = c.lease
    failed = [(i, p) for i, p in enumerate(parts) if p.state == "failed" or not p.artifact]
    if failed:
        i, p = failed[0]
        _fail(reg, lease, p.error_code or "toolchain-error",
              f"part {i} ({part_dir(i)}: prefill + decode) failed: {p.error_code}: {(p.error_message or '')[:1500]}")
        return True
    try:
        with LeaseKeeper(reg, lease, settings.lease_seconds) as keeper:
            layout = _layout(reg, pkg, spec, parts)
            with tempfile.TemporaryDirectory(prefix="ctxfarm-genai-folder-") as tmp:
                folder = Path(tmp) / "package"
                _materialize(reg, layout, folder)
                progress("checking", {"what": "folder"})
                check_folder(folder, layout)  # genai-folder-invalid, naming the file
                from workers.backends import check_genai_folder

                # As a device opens it: og.Config, and each binary's own graphs (QNN System API).
                parts_files = [[st["file"] for st in layout.stages if st.get("part") == row["part"]]
                               for row in layout.parts]
                check_genai_folder(folder, Path(tmp) / "check", parts=parts_files, timeout=settings.accuracy_budget,
                                   memory_mb=settings.compile_memory_mb)
            keeper.check()
            # Published is not verified: the twin is evidence that follows (verify_twin).
            _publish(reg, lease, spec, layout, twin_pending() if twin and export_dir is not None else None)
    except FarmError as exc:
        if exc.code != "lease-lost":
            _fail(reg, lease, exc.code, exc.message)
    except Exception as exc:
        # A bug: the package ends failed with internal-error (not a deterministic verdict: the
        # next submission assembles it again), never queued for a run nothing would start.
        log.error("build %s: assembling the package raised", build_id, exc_info=True)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        _fail(reg, lease, "internal-error", f"assembling the package raised {type(exc).__name__}: {first}")
    except BaseException:
        # An interruption is no verdict on the package: the row goes back to queued at once (the
        # next run assembles it), not held until its lease runs out.
        with reg.db.session() as s:
            states.release(s, lease, "interrupted while assembling the package")
        raise
    return True


def _fail(reg: Any, lease: Any, code: str, message: str) -> None:
    from farm.pipeline import states

    with reg.db.session() as s:
        states.fail(s, lease, code, message[:4000], None)


@dataclass
class Layout:
    """The folder as blobs: every file (name, role, digest, size, mediaType), the stages with
    their roles in pipeline order, the parts' artifacts, and the blobs made here (the config,
    each part's context models with their binary's new name)."""

    files: list[dict[str, Any]]
    stages: list[dict[str, Any]]
    parts: list[dict[str, Any]]
    blobs: dict[str, bytes]
    toolchain: dict[str, Any]
    epcontext: list[dict[str, Any]]
    placement: dict[str, Any]
    compile_seconds: float
    nodes_ep: int
    nodes_cpu: int


def _layout(reg: Any, pkg: PackageBundle, spec: Any, parts: Sequence[BuildOutcome]) -> Layout:
    """Each part's group artifact under the exporter's names (``context_0.onnx`` compiles to
    ``context_0_ctx.onnx``, its shared binary becomes ``context_0_ctx_qnn.bin``: the context
    models are rewritten to point at it; the binary is the group artifact's blob), the carried
    files as they are, and the generated genai_config.json."""
    from farm.core import genai
    from registry.index import find_artifact
    from registry.install import read_manifest
    from registry.store.base import read_bytes

    export = pkg.export
    roles = genai.roles(export)
    files: list[dict[str, Any]] = []
    blobs: dict[str, bytes] = {}
    names: dict[str, str] = {}  # stage name -> file in the folder
    part_rows: list[dict[str, Any]] = []
    epcontext: list[dict[str, Any]] = []
    toolchain: dict[str, Any] = {}
    seconds = 0.0
    ep = cpu = 0
    cpu_ops: set[str] = set()  # what the parts left on the CPU: the package's placement says it too
    taken = {n for n, _, _ in pkg.carried}
    layout_names = genai.package_layout(export)  # the one naming of the folder (farm.core.genai)

    def add(name: str, digest: str, size: int, media: str, role: str = "context") -> None:
        if name in taken:
            raise InvalidModelError(f"the package would hold two files named {name!r}",
                                    hint="rename the export's file that clashes with a compiled part's")
        taken.add(name)
        files.append({"name": name, "role": role, "digest": digest, "size": size, "mediaType": media})

    for i, p in enumerate(parts):
        with reg.db.session() as s:
            art = find_artifact(s, p.artifact or "")
            manifest = read_manifest(reg.store, art)
            s.expunge_all()
        toolchain = manifest["toolchain"]
        seconds += float(manifest.get("compileSeconds") or 0.0)
        ep += art.nodes_ep
        cpu += art.nodes_cpu
        cpu_ops.update(str(o) for o in (manifest.get("placement") or {}).get("cpu_op_types") or [])
        part = export.parts[i]
        graphs = {g.get("name"): g for g in manifest.get("graphs") or [] if isinstance(g, dict)}
        by_name = {f["name"]: f for f in manifest["files"]}
        bins = sorted({b for g in graphs.values() for b in (g.get("contexts") or [])})
        renamed = {b: genai.part_binary(export, i, k) for k, b in enumerate(bins)}
        for b, new in renamed.items():
            f = by_name[b]
            add(new, f["digest"], int(f["size"]), f.get("mediaType") or "application/octet-stream")
        for kind, stage in ((PREFILL, part.prefill), (DECODE, part.decode)):
            g = graphs.get(kind) or {}
            ctx = g.get("ctxModel")
            if not isinstance(ctx, str) or ctx not in by_name:
                raise InvalidModelError(f"part {i}: its group artifact {art.short_id} names no {kind} context model")
            data = rename_contexts(read_bytes(reg.store, by_name[ctx]["digest"]), renamed)
            digest = sha256_bytes(data)
            blobs[digest] = data
            names[stage.name] = layout_names[stage.name]
            add(names[stage.name], digest, len(data), by_name[ctx].get("mediaType") or "application/octet-stream")
        part_rows.append({"part": i, "artifact": art.digest, "build": p.build_id, "binaries": list(renamed.values())})
        epcontext += [{**n, "part": i} for n in manifest.get("epcontext") or []]
    for name, _, f in pkg.carried:
        if name == SOURCE_CONFIG:
            continue
        files.append({"name": name, "role": "context", "digest": f.digest, "size": f.size,
                      "mediaType": MEDIA.get(Path(name).suffix, "application/octet-stream")})
    for st in export.cpu:
        names[st.name] = st.graph.file
    config = genai.config_bytes(genai.genai_config(export, names))
    config_digest = sha256_bytes(config)
    blobs[config_digest] = config
    add(CONFIG_NAME, config_digest, len(config), "application/json", role="ctx-model")
    stages = [{"name": st.name, "role": roles[st.name], "file": names[st.name],
               **({"part": st.part} if st.part is not None else {})} for st in export.stages]
    return Layout(files, stages, part_rows, blobs, toolchain, epcontext,
                  {"ep_nodes": ep, "cpu_nodes": cpu, "cpu_op_types": sorted(cpu_ops)}, seconds, ep, cpu)


def rename_contexts(data: bytes, renamed: dict[str, str]) -> bytes:
    """A context model whose EPContext nodes point at ``renamed``'s new binary names (an
    embedded context, or a name not in ``renamed``, is left as it is)."""
    import onnx

    model = onnx.load_from_string(data)
    changed = False
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        for a in node.attribute:
            if a.name == "ep_cache_context" and a.type == onnx.AttributeProto.STRING:
                old = a.s.decode("utf-8", "replace")
                if old in renamed:
                    a.s = renamed[old].encode()
                    changed = True
    return model.SerializeToString() if changed else data


def _materialize(reg: Any, layout: Layout, folder: Path) -> None:
    """The folder on disk, for the checks: every blob under its name."""
    from registry.store.base import download

    folder.mkdir(parents=True)
    for f in layout.files:
        target = inside(folder, f["name"])
        target.parent.mkdir(parents=True, exist_ok=True)
        if f["digest"] in layout.blobs:
            target.write_bytes(layout.blobs[f["digest"]])
        else:
            download(reg.store, f["digest"], target, size=int(f["size"]))


def check_folder(folder: Path, layout: Layout) -> None:
    """The laid-out folder before it is published: its genai_config.json names exactly the
    stage files, each of them there; every EPContext points at a file inside the folder; each
    part's binary is used by exactly that part's prefill and decode context models. Raises
    ``genai-folder-invalid`` naming the file."""
    from farm.core.errors import GenaiFolderError
    from workers.epcontext import read_epcontext

    def bad(msg: str) -> GenaiFolderError:
        return GenaiFolderError(f"the assembled genai folder is not valid: {msg}")

    try:
        doc = json.loads((folder / CONFIG_NAME).read_bytes())
        stages = doc["model"]["decoder"]["pipeline"][0]
        named = [st["filename"] for st in stages.values()]
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise bad(f"{CONFIG_NAME} has no decoder pipeline of stage files ({type(exc).__name__}: {exc})") from None
    want = [st["file"] for st in layout.stages]
    if sorted(named) != sorted(want):
        raise bad(f"{CONFIG_NAME} names {sorted(named)}, the package's stages are {sorted(want)}")
    for name in named:
        if not inside(folder, name).is_file():
            raise bad(f"{CONFIG_NAME} names {name}, which is not in the folder")
    users: dict[str, set[str]] = {}
    for st in layout.stages:
        if "part" not in st:
            continue
        path = inside(folder, st["file"])
        nodes, _ = read_epcontext(path)
        if not nodes:
            raise bad(f"{st['file']} ({st['role']}) has no EPContext node")
        for n in nodes:
            if n.get("embed_mode", 1) != 0 or not n.get("ep_cache_context"):
                # Embedded, or a node whose graph lives in the main node's binary (main_context 0:
                # a part the QNN EP split around a CPU op).
                continue
            ref = str(n.get("ep_cache_context") or "")
            try:
                target = inside(folder, ref)
            except Exception:  # noqa: BLE001 - UnsafePathError and anything a tampered name gives
                raise bad(f"{st['file']}: EPContext points outside the folder ({ref[:120]!r})") from None
            if not target.is_file():
                raise bad(f"{st['file']}: EPContext points at {ref}, which is not in the folder")
            users.setdefault(ref, set()).add(st["file"])
    for row in layout.parts:
        mine = {st["file"] for st in layout.stages if st.get("part") == row["part"]}
        for b in row["binaries"]:
            if users.get(b) != mine:
                raise bad(f"{b} (part {row['part']}) is used by {sorted(users.get(b) or [])}, not by exactly "
                          f"{sorted(mine)}")


def run_twin(settings: Settings, spec: Any, export_dir: Path, *, nice: int = 10) -> dict[str, Any]:
    """The twin (``workers.backends.genai_twin``) under the accuracy budget
    (``FARM_ACCURACY_BUDGET``); a twin that can't run is recorded as ``unverified`` with the
    reason, never a failed package: the twin is evidence, not the artifact."""
    from farm.core.catalog import load_catalog
    from workers.backends import genai_twin

    target = load_catalog().get(spec.target, backend=spec.backend)
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="ctxfarm-genai-twin-") as work:
            result = genai_twin(export_dir, target, spec.options, Path(work), timeout=settings.accuracy_budget,
                                memory_mb=settings.compile_memory_mb, nice=nice)
    except FarmError as exc:
        result = {"status": "unverified", "detail": f"{exc.code}: {exc.message[:1000]}"}
    result = dict(result)
    result.setdefault("wall_seconds", round(time.perf_counter() - start, 3))
    return result


UNVERIFIED = ("a weight-shared context: the x86_64 HTP simulator cannot load it (it crashes on load); "
              "the twin's figures come from the same parts compiled without sharing; devices verify it")


def _publish(reg: Any, lease: Any, spec: Any, layout: Layout, twin: dict[str, Any] | None) -> None:
    """Config and manifest blobs, then one transaction: the artifact rows and running ->
    succeeded (guarded)."""
    from farm.pipeline import states
    from registry import manifest as mf
    from registry.index import insert_artifact
    from registry.store.base import put_bytes

    genai_section = {"config": CONFIG_NAME, "stages": layout.stages, "parts": layout.parts}
    manifest = mf.make_manifest(
        model_digest=spec.model_digest, build_key=spec.build_key, backend=spec.backend,
        target=_target_json(spec), toolchain=layout.toolchain, options=spec.options,
        options_digest=spec.options_digest, ctx_model=CONFIG_NAME,
        files=[{k: f[k] for k in ("name", "role", "digest", "size", "mediaType")} for f in layout.files],
        epcontext=layout.epcontext, placement=layout.placement, compile_seconds=layout.compile_seconds,
        built_at=datetime.now(UTC).isoformat(timespec="seconds"), log=None)
    manifest["genai"] = genai_section
    data, digest = mf.encode(manifest)
    for blob_digest, blob in layout.blobs.items():
        put_bytes(reg.store, blob, expected=blob_digest)
    put_bytes(reg.store, data, expected=digest)
    description = {"genai": genai_section, "unverified": UNVERIFIED}
    if twin is not None:
        description["twin"] = twin
    with reg.db.session() as s:
        insert_artifact(s, lease.build_id, manifest_digest=digest, manifest_size=len(data), ctx_model=CONFIG_NAME,
                        files=layout.files, ep_sdk_version=None, compile_seconds=layout.compile_seconds,
                        nodes_ep=layout.nodes_ep, nodes_cpu=layout.nodes_cpu, description=description,
                        cpu_op_types=layout.placement["cpu_op_types"])
        states.succeed(s, lease, log=None)


def _target_json(spec: Any) -> dict[str, Any]:
    from farm.core.catalog import load_catalog

    t = load_catalog().get(spec.target, backend=spec.backend)
    return {"ref": t.ref, "name": t.name, "soc_model": t.soc_model, "htp_arch": t.htp_arch,
            "compute_capability": t.compute_capability}


# ---- what readers show ------------------------------------------------------------------------------

def twin_of(description: dict[str, Any] | None) -> dict[str, Any] | None:
    """The twin's figures of an artifact (None: not a genai package, or no twin ran)."""
    if not isinstance(description, dict):
        return None
    tw = description.get("twin")
    return tw if isinstance(tw, dict) else None


# ---- the link between a package's build and its parts' builds --------------------------------------

def link_parts(s: Any, package_build_id: int, part_build_ids: Sequence[int]) -> None:
    """In the caller's transaction: the package build is assembled from these part builds."""
    from registry.models import GenaiPart

    for i, b in enumerate(part_build_ids):
        s.merge(GenaiPart(package_build_id=package_build_id, part=i, part_build_id=int(b)))


def packages_of(s: Any, part_build_id: int) -> list[int]:
    """The package builds that use this part build."""
    from sqlalchemy import select

    from registry.models import GenaiPart

    return [int(p) for p in s.scalars(select(GenaiPart.package_build_id)
                                      .where(GenaiPart.part_build_id == part_build_id))]


def ready_packages(s: Any, part_build_id: int) -> list[tuple[int, str]]:
    """(package build id, queue) of queued package builds using this part build whose parts are
    all final now: the fan-in's messages to send."""
    from farm.pipeline import states
    from registry.models import Build

    out = []
    for pkg_id in packages_of(s, part_build_id):
        b = s.get(Build, pkg_id)
        if b is None or b.state != states.BuildState.QUEUED or not b.queue:
            continue
        parts = states.part_builds(s, pkg_id) or []
        if all(s.get(Build, p) is not None and s.get(Build, p).state in states.FINAL for p in parts):
            out.append((int(pkg_id), str(b.queue)))
    return out


# ---- cluster: parts to the workers, the package when its parts are final -------------------------------

def submit_package(settings: Settings, export_dir: str | Path, target_refs: Sequence[str], sdks: Sequence[str] = (),
                   option_pairs: Sequence[str] | Mapping[str, Any] = (), *, name: str | None = None,
                   tag: str | None = None, allow_queue: bool = False, retry_failed: bool = False,
                   force_tag: bool = False, registry: Any = None, app: Any = None,
                   served: dict[tuple[str, str], list[str]] | None = None, dispatch: bool = True,
                   owner: int | None = None, fleet: Any = None, warn: Callable[[str], None] | None = None) -> Any:
    """Cluster (``farm submit --genai``; ``POST /v1/genai`` runs it on the folder it laid out
    from the blobs it was sent): each part a group release (its builds sent to the workers of
    each toolchain: parts build on different workers at once, each admitted by its worker's
    memory planner); the package's builds queued on the same queues, linked to their parts, and
    sent when the last part is final (``after_part``, on the worker that finished it). One
    release holds the package's builds and every part's: status, progress per part, cancel
    (``farm cancel RELEASE``) and one answer. ``dispatch=False``: no broker, the caller runs the
    release's builds itself (the embedded service: ``EmbeddedRunner`` does the fan-in).
    ``owner``: the token that submitted it through the service (the package's release is its:
    its quota, its cancel). ``served``: the toolchains that build (default: the live workers').
    ``fleet``: what each toolchain's workers make (default: their announcements; the embedded
    service: this environment): an SDK that can't make the package is left out, parts and all,
    with one warning (``warn``, and the answer's ``warnings``), or refused when named with
    ``sdks`` (``capability-missing``); the package builds go to the genai queue of their SDK,
    which only workers that make them serve."""
    from sqlalchemy import select

    from farm.core.capabilities import genai_matrix
    from farm.core.options import parse_pairs
    from farm.pipeline import states
    from farm.pipeline.capabilities import fleet_here, fleet_of
    from farm.pipeline.plan import (
        _spec,
        _status,
        check_support,
        queue_release,
        record_snapshot,
        served_toolchains,
        store_snapshot,
    )
    from farm.pipeline.queues import COMPILE_TASK, check_broker, genai_queue, send, shared_app
    from farm.pipeline.submission import ReleaseRequest
    from registry.index import Registry, release_builds
    from registry.models import Build, Release, ReleaseBuild

    own = registry is None
    reg = registry or Registry.open(settings)
    pkg: PackageBundle | None = None
    try:
        options = dict(option_pairs) if isinstance(option_pairs, Mapping) else parse_pairs(option_pairs)
        request = ReleaseRequest.parse(target_refs, sdks, options, name, tag, allow_queue, retry_failed, force_tag)
        served = served if served is not None else served_toolchains(settings, reg)
        fan = genai_matrix([t.backend for t in request.targets], request.sdks, list(served),
                           fleet if fleet is not None else fleet_of(settings, reg) if dispatch else fleet_here(served))
        request.check_served(served)
        matrix = [(t, v) for t, v in request.matrix(served) if v in fan.versions.get(t.backend, ())]
        check_support(matrix, group=True, llm=True)
        warning = fan.warning()
        if warning and warn is not None:
            warn(warning)
        pkg = inspect_package(settings, export_dir, display=request.name)
        if dispatch:
            app = app or shared_app(settings)
            check_broker(app)
        # Parts first: each one release of its own group (recorded, stored, sent).
        # The parts build for exactly the package's SDKs: none for an SDK left out.
        part_sdks = list(sdks) or sorted({v for _, v in matrix})
        part_request = ReleaseRequest.parse(target_refs, part_sdks, options, None, None, allow_queue, retry_failed)
        part_releases: list[int] = []
        for g in pkg.parts:
            def store(g: Any = g) -> list[dict[str, Any]]:
                return store_snapshot(reg, g)

            part_releases.append(queue_release(settings, reg, g.digest, part_request, served=served, app=app,
                                               store=store, display=g.stem, onnx_digest=g.onnx.digest, size=g.size,
                                               dispatch=dispatch).release_id)
        files = store_snapshot(reg, cast(Any, pkg))  # a snapshot like a model's (digest, sources)
        to_send: list[tuple[int, str]] = []
        with reg.db.session() as s:
            moved = record_snapshot(s, pkg.digest, pkg.onnx.digest, pkg.size, files, request.name, request.tag,
                                    pkg.stem, force_tag=request.force_tag)
            label = f"{request.name}:{request.tag}" if request.name else pkg.stem[:255]
            release = Release(model_digest=pkg.digest, label=label, owner_token_id=owner,
                              matrix={"targets": [t.ref for t, _ in matrix], "toolchains": [v for _, v in matrix],
                                      "options": request.raw_options, "genai": True,
                                      # Made for this package only: cancelled with it (farm.pipeline.cancel).
                                      "part_releases": part_releases})
            s.add(release)
            s.flush()
            for t, version in matrix:
                spec = _spec(pkg.digest, t, version, request.options[t])
                queue = genai_queue(t.backend, version)
                build_id, _ = states.enqueue(s, spec, queue, retry_failed=request.retry_failed)
                # Each part's build of this (target, toolchain, options): by its key, as queued above.
                parts = [int(s.scalar(select(Build.id).where(
                    Build.build_key == _spec(g.digest, t, version, part_request.options[t]).build_key)) or 0)
                    for g in pkg.parts]
                link_parts(s, build_id, parts)
                for b in (build_id, *parts):
                    s.merge(ReleaseBuild(release_id=release.id, build_id=b))
                pb = s.get(Build, build_id)
                if dispatch and pb is not None and pb.state == states.BuildState.QUEUED and all(
                        states.get_build(s, p).state in states.FINAL for p in parts):
                    to_send.append((build_id, queue))
            release_id = release.id
        for build_id, queue in to_send:  # every part answered already (cached): assemble now
            send(app, COMPILE_TASK, [build_id], queue)
        with reg.db.session() as s:
            out = _status(s, release_id, release_builds(s, release_id), reg.store)
        out.tag_moved = moved
        out.warnings = [warning] if warning else []
        return out
    finally:
        if pkg is not None:
            pkg.cleanup()
        if own:
            reg.close()


def after_part(settings: Settings, reg: Any, build_id: int, app: Any) -> list[int]:
    """A worker, after a build's final outcome: send each package build whose last part this
    was (to its toolchain's queue: any worker of it assembles). Returns the ids sent."""
    from farm.pipeline.queues import COMPILE_TASK, send

    with reg.db.session() as s:
        ready = ready_packages(s, build_id)
    for pkg_id, queue in ready:
        send(app, COMPILE_TASK, [pkg_id], queue)
    return [p for p, _ in ready]


def execute_package(executor: Any, build_id: int) -> Any:
    """``Executor.execute`` of a package build (None: ``build_id`` is not one): nothing to
    compile; with every part final, the package is assembled from the parts' artifacts here,
    its export laid out again from the stored snapshots (the config generator and the twin read
    it), and published; then this worker runs the twin and records it (the release already
    sees the package final). A part not final yet: ``waiting`` (the row stays queued,
    unclaimed; the last part's worker sends it again)."""
    from farm.pipeline import states
    from farm.pipeline.execute import Result
    from farm.pipeline.plan import outcome_from_row

    reg, settings = executor.registry, executor.settings
    with reg.db.session() as s:
        parts = states.part_builds(s, build_id)
        if parts is None:
            return None
        b = states.get_build(s, build_id)
        if b.state in states.FINAL:
            return Result("done", build_id)
        if not all(states.get_build(s, p).state in states.FINAL for p in parts):
            return Result("waiting", build_id)
        spec = states.BuildSpec(b.build_key, b.model_digest, b.backend, b.target, b.toolchain, dict(b.options),
                                b.options_digest)
        from registry.models import Model

        model = s.get(Model, b.model_digest)
        files = [dict(f) for f in (model.files if model else [])]
    refusal = _capability_refusal(spec)
    if refusal is not None:  # a release routes around it; this is a queue served by mistake
        with reg.db.session() as s:
            c = states.claim(s, build_id, owner=executor.owner, lease_seconds=settings.lease_seconds,
                             max_attempts=settings.max_attempts)
        if c.lease is not None:
            _fail(reg, c.lease, refusal.code, refusal.message)
        return Result("failed", build_id)
    outcomes = [outcome_from_row(reg, p, f"{spec.backend}:{spec.target}", cached=False) for p in parts]
    with tempfile.TemporaryDirectory(prefix="ctxfarm-genai-export-") as tmp:
        try:
            pkg = package_from_snapshot(settings, reg, files, Path(tmp) / "export")
        except FarmError as exc:
            with reg.db.session() as s:
                c = states.claim(s, build_id, owner=executor.owner, lease_seconds=settings.lease_seconds,
                                 max_attempts=settings.max_attempts)
            if c.lease is not None:
                _fail(reg, c.lease, exc.code, f"the package's export could not be laid out again: {exc.message}")
            return Result("failed", build_id)
        executor.events.publish(build_id, states.BuildState.RUNNING.value)
        ran = assemble(settings, reg, pkg, spec, build_id, outcomes, pkg.export.root, owner=executor.owner)
        with reg.db.session() as s:
            final = states.get_build(s, build_id)
            state = str(final.state)
            from registry.index import artifact_for_build

            art = artifact_for_build(s, build_id)
            art_digest = art.digest if art is not None else None
        executor.events.publish(build_id, state)
        if ran and art_digest and twin_status(_description(reg, art_digest)) == "pending":
            # The release answered at publication (the row is final); this worker runs the twin
            # right after, on the export it laid out, and records it on the artifact. Whatever
            # befalls it is no verdict on the build: it stays pending, a later build runs it.
            try:
                verify_twin(settings, reg, art_digest, spec, pkg.export.root)
            except Exception:  # noqa: BLE001 - logged; the published build's result stands
                import logging

                logging.getLogger("ctxfarm.genai").warning("the twin of build %s was not recorded", build_id,
                                                           exc_info=True)
    if not ran:
        return Result("busy", build_id)
    return Result("succeeded" if state == states.BuildState.SUCCEEDED else "failed", build_id,
                  artifact_id=art.id if art is not None else None)


def _capability_refusal(spec: Any) -> FarmError | None:
    """``capability-missing`` when this environment can't assemble the package (no usable
    onnxruntime-genai for its folder check): a deterministic failure, answered again from the
    index until ``--retry-failed``, not a toolchain-error found after the checks started."""
    from farm.core.capabilities import check_here
    from workers.capabilities import here

    try:
        check_here(spec.backend, spec.toolchain, here(spec.backend))
    except FarmError as exc:
        return exc
    return None


def package_from_snapshot(settings: Settings, reg: Any, files: list[dict[str, Any]], dest: Path) -> PackageBundle:
    """A recorded package as ``inspect_package`` saw it, from the store: the carried files under
    their names, each part's graphs and data from its group's snapshot under the exporter's
    names (from genai.json), then ``farm.core.genai.read_export`` of that folder (the same
    checks; the same description)."""
    from farm.core import genai
    from farm.core.groups import member_dir, member_onnx
    from farm.pipeline.bundles import download_bundle
    from registry.models import Model
    from registry.store.base import download

    doc = read_package(files, reg.store)
    if doc is None:
        raise InvalidModelError("the model is not a genai package")
    dest.mkdir(parents=True)
    for f in files[1:]:
        name = genai.CONFIG_FILE if f["path"] == SOURCE_CONFIG else genai.check_file_name(f["path"], "package")
        download(reg.store, f["digest"], inside(dest, name), size=int(f["size"]))
    files_of = {st["role"]: st["file"] for st in doc.get("stages") or []}
    carried = [(f["path"], dest / (genai.CONFIG_FILE if f["path"] == SOURCE_CONFIG else f["path"]),
                BundleFile(f["path"], f["digest"], int(f["size"]))) for f in files[1:]]
    for part in doc.get("parts") or []:
        i = int(part["part"])
        with reg.db.session() as s:
            m = s.get(Model, part["group"])
            listing = [dict(f) for f in (m.files if m else [])]
        if not listing:
            raise InvalidModelError(f"part {i}'s group {str(part['group'])[:19]} is not recorded here")
        work = dest.parent / f"group{i}"
        download_bundle(reg.store, listing, work)
        for k, kind in enumerate((PREFILL, DECODE)):
            name = genai.check_file_name(files_of.get(f"part{i}.{kind}"), "package")
            inside(work, member_onnx(k)).replace(inside(dest, name))
            for data in inside(work, member_dir(k)).iterdir():
                if data.is_file() and not (dest / data.name).exists():
                    data.replace(inside(dest, genai.check_file_name(data.name, "package")))
    export = genai.read_export(dest)
    return PackageBundle((), tuple(carried), export, b"", "", BundleFile("", files[0]["digest"], int(files[0]["size"])),
                         "")
