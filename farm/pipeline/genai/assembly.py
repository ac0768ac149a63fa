"""The fan-in of one target: the package build claimed once every part is final, the folder laid out
from the parts' artifacts (their context models and shared ``.bin`` under ``part<i>/``, the CPU
stages and tokenizer as they are, the generated ``genai_config.json``), checked as a device opens it,
and published in one transaction (no compile here)."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from farm.core.errors import FarmError, InvalidModelError
from farm.core.keys import sha256_bytes
from farm.core.names import inside
from farm.core.settings import Settings
from farm.pipeline.genai.bundle import CONFIG_NAME, DECODE, MEDIA, PREFILL, SOURCE_CONFIG, PackageBundle, part_dir
from farm.pipeline.genai.twin_record import twin_pending
from farm.pipeline.submission import BuildOutcome

log = logging.getLogger(__name__)


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
                check_genai_folder(folder, Path(tmp) / "check", parts=parts_files, described=layout.described,
                                   timeout=settings.accuracy_budget, memory_mb=settings.compile_memory_mb)
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
    # Each part's binary (its name in the folder) -> the QNN graphs its part build read from it
    # with the System API: the same bytes (by digest), so the folder check does not read them again.
    described: dict[str, list[str]] = field(default_factory=dict)


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
    described: dict[str, list[str]] = {}
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
        described.update(_described(art.description, renamed))
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
                  {"ep_nodes": ep, "cpu_nodes": cpu, "cpu_op_types": sorted(cpu_ops)}, seconds, ep, cpu, described)


def _described(description: Any, renamed: dict[str, str]) -> dict[str, list[str]]:
    """The part build's own reading of each binary (``artifacts.description``, written by the
    worker that compiled it: the QNN System API found exactly the requested graphs in it), by the
    binary's name in the folder; nothing for a part whose evidence is not that check's ``ok``."""
    if not isinstance(description, dict) or not str(description.get("check") or "").startswith("ok"):
        return {}
    out: dict[str, list[str]] = {}
    for g in description.get("graphs") or []:
        if not isinstance(g, dict):
            return {}
        for b in g.get("binaries") or []:
            if b in renamed:
                out.setdefault(renamed[b], []).extend(str(q) for q in g.get("qnn_graphs") or [])
    return {b: sorted(graphs) for b, graphs in out.items() if graphs}


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
    """The folder on disk, for the checks: every blob under its name. From a local store, a
    read-only hard link of each stored blob, verified once per blob (``registry.store.base.place``:
    the carried files every target's folder holds, and the binaries the parts just stored, are not
    read again per target); otherwise a verified copy. The parts' binaries their builds described
    (``layout.described``) are not laid out: nothing here reads them (``check_folder``, and the
    check child, take their graphs as described), and from S3 they are most of the package's bytes."""
    from registry.store.base import place

    folder.mkdir(parents=True)
    for f in layout.files:
        if f["name"] in layout.described:
            continue
        target = inside(folder, f["name"])
        target.parent.mkdir(parents=True, exist_ok=True)
        if f["digest"] in layout.blobs:
            target.write_bytes(layout.blobs[f["digest"]])
        else:
            place(reg.store, f["digest"], target, size=int(f["size"]))


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
            if not target.is_file() and ref not in layout.described:
                raise bad(f"{st['file']}: EPContext points at {ref}, which is not in the folder")
            users.setdefault(ref, set()).add(st["file"])
    for row in layout.parts:
        mine = {st["file"] for st in layout.stages if st.get("part") == row["part"]}
        for b in row["binaries"]:
            if users.get(b) != mine:
                raise bad(f"{b} (part {row['part']}) is used by {sorted(users.get(b) or [])}, not by exactly "
                          f"{sorted(mine)}")


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
