"""ORT model packages: the shape of one, made from a model's published builds (docs/packages.md).

An ONNX Runtime model package (onnxruntime >= 1.32: ``onnxruntime.ModelPackage`` authors one,
``ModelPackageContext(dir).select_component(name, ModelPackageOptions(session_options))`` picks
the variant that fits the machine) is a folder: ``manifest.json``, one **component** per model
(per graph for a graph group), and under each component one **variant** per way to run it:

- one per published QNN build (SoC x SDK), EP ``QNNExecutionProvider``, device ``npu``, with
  the build's ``compatibility_string`` (its ``ep_compatibility_info.QNNExecutionProvider``) where
  that string names the build's SoC (``identifies_soc``; QNN 2.47.0's does not: left out), and
  the provider options the farm's own probe loads it with (``soc_model``). Two variants of one EP
  for different targets that ORT can't tell apart are refused (``package-ambiguous-variants``);
- one per TensorRT build, EP ``TensorrtExecutionProvider``, device ``gpu``;
- one CPU variant: the source model, EP ``CPUExecutionProvider``, device ``cpu``.

Files that several variants use are **shared assets**, stored once under
``shared_assets/sha256-<hex>/`` (ORT's content address of a directory: ``asset_uri``):

- a model's external data (its weights) is an asset; the CPU variant points ONNX Runtime at it
  with ``session.model_external_initializers_file_folder_path`` = ``sha256:<hex>``, so graphs
  of a group that share a weights file share one asset;
- a graph group's build (every ``g<i>_ctx.onnx`` and the context binaries they share) is one
  asset; each graph's variant names its own model inside it (``model_file`` =
  ``sha256:<hex>/g<i>_ctx.onnx``), so the shared binary is stored once.

Nothing in a path comes from a name: components live in ``c<i>/``, variants in ``c<i>/cpu`` and
``c<i>/v<j>``, file names are the farm's fixed stems (``model.onnx``, ``model_ctx.onnx``, ...)
or a model's external-data names (checked when the model was recorded, and again here). Names
(graph names, targets, toolchains) appear only inside the manifest.

This module is data only: no onnxruntime (the package is written by ORT's own API in a worker
child, ``workers.ortpackage``), no database, no store.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from farm.core.errors import InvalidModelError, NoPublishedBuildsError, PackageAmbiguousError
from farm.core.keys import canonical_json, sha256_bytes
from farm.core.names import safe_relative

PACKAGE_KIND = "ctxfarm.ort-model-package.v1"
MEDIA_PACKAGE = "application/vnd.ctxfarm.ort-model-package.v1+json"
# Bumped when the layout rules change: a package made by older rules is then made again.
LAYOUT_VERSION = 2  # 2: a QNN compatibility string that does not name the build's SoC is left out
MANIFEST = "manifest.json"
SINGLE_COMPONENT = "model"  # the component of a model that is not a group

CPU_EP = "CPUExecutionProvider"
EP_OF = {"qnn": "QNNExecutionProvider", "trt": "TensorrtExecutionProvider"}
DEVICE_OF = {"qnn": "npu", "trt": "gpu"}
COMPAT_PREFIX = "ep_compatibility_info."
EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
SHARE_EP_CONTEXTS = "ep.share_ep_contexts"
CPU_MODEL_FILE = "model.onnx"

# What this farm cannot check about a variant, said in the package's evidence.
UNCHECKED = {
    "qnn": ("selection not exercised here: ORT asks the QNN EP's compatibility check "
            "(ValidateCompiledModelCompatibilityInfo) with the variant's compatibility_string, which needs an "
            "NPU; on this x86_64 host the QNN EP offers only a CPU-type device (the HTP simulator), so no "
            "variant with device npu is selectable. Its files were checked (present, sha256)."),
    "trt": ("selection not exercised here: the farm's machines have no NVIDIA GPU, so the TensorRT EP "
            "offers no device. Its files were checked (present, sha256)."),
}


@dataclass(frozen=True)
class PackageFile:
    """A file as the package holds it: ``path`` relative to its directory (a variant's or an
    asset's), and the digest and size of its bytes in the store."""

    path: str
    digest: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class Asset:
    """A shared asset: a directory of files, addressed by ORT's directory hash (``uri``)."""

    uri: str
    files: tuple[PackageFile, ...]

    @property
    def directory(self) -> str:
        return "shared_assets/" + self.uri.replace(":", "-", 1)


@dataclass
class Variant:
    name: str  # the manifest's key: cpu, qnn-SM8650-2.51.0, ...
    directory: str  # fixed stem: c<i>/cpu, c<i>/v<j>
    ep: str
    device: str
    model_file: str  # relative to the directory, or sha256:<hex>/<file> inside an asset
    files: tuple[PackageFile, ...]  # in the variant's directory
    compatibility_string: str | None = None
    session_options: dict[str, str] = field(default_factory=dict)
    provider_options: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)  # additional_metadata.ctxfarm
    backend: str = "cpu"

    def body(self) -> dict[str, Any]:
        """The variant body ``ModelPackage.set_variant`` takes (executor_info goes separately)."""
        out: dict[str, Any] = {"variant_directory": self.directory, "ep": self.ep, "device": self.device}
        if self.compatibility_string:
            out["compatibility_string"] = self.compatibility_string
        out["additional_metadata"] = {"ctxfarm": self.metadata}
        return out

    def ort_info(self) -> dict[str, Any]:
        """``executor_info["ort"]``: the model file, session and provider options."""
        out: dict[str, Any] = {"model_file": self.model_file}
        if self.session_options:
            out["session_options"] = dict(self.session_options)
        if self.provider_options:
            out["provider_options"] = dict(self.provider_options)
        return out


@dataclass
class Component:
    name: str  # the manifest's key: model, or a group's graph name
    directory: str  # c<i>
    variants: list[Variant]

    @property
    def cpu(self) -> Variant:
        return next(v for v in self.variants if v.ep == CPU_EP)


@dataclass
class Layout:
    package_name: str
    package_version: str
    model: str  # the model digest
    components: list[Component]
    assets: dict[str, Asset]  # by uri: each stored once
    artifacts: list[str]  # the artifact digests it was made from
    left_out: list[dict[str, str]] = field(default_factory=list)  # builds it can't hold, and why

    def files(self) -> list[dict[str, Any]]:
        """Every file of the package but ``manifest.json`` (ORT writes that): path under the
        package root, digest, size; sorted by path. Each asset's files once."""
        out = [{"path": f"{a.directory}/{f.path}", "digest": f.digest, "size": f.size}
               for a in self.assets.values() for f in a.files]
        out += [{"path": f"{v.directory}/{f.path}", "digest": f.digest, "size": f.size}
                for c in self.components for v in c.variants for f in v.files]
        return sorted(out, key=lambda f: f["path"])

    def directories(self) -> list[str]:
        """Every variant directory (an asset-backed variant's is empty, and must still exist)."""
        return sorted({v.directory for c in self.components for v in c.variants})

    def to_request(self) -> dict[str, Any]:
        """What the authoring child needs, as JSON."""
        return {
            "package_name": self.package_name, "package_version": self.package_version,
            "assets": [{"uri": a.uri, "directory": a.directory, "files": [f.to_dict() for f in a.files]}
                       for a in self.assets.values()],
            "components": [{"name": c.name, "directory": c.directory, "variants": [
                {"name": v.name, "backend": v.backend, "directory": v.directory, "body": v.body(),
                 "ort": v.ort_info(), "files": [f.to_dict() for f in v.files]} for v in c.variants]}
                for c in self.components],
            "metadata": {"ctxfarm": {"model": self.model, "artifacts": self.artifacts}},
        }

    def summary(self) -> list[dict[str, Any]]:
        """Components and their variants, for answers and the package record."""
        return [{"name": c.name, "variants": [
            {"name": v.name, "ep": v.ep, "device": v.device, "compatibility_string": v.compatibility_string,
             **{k: v.metadata[k] for k in ("artifact", "target", "toolchain", "cpu_op_types") if k in v.metadata}}
            for v in c.variants]} for c in self.components]


def asset_uri(files: list[PackageFile] | tuple[PackageFile, ...]) -> str:
    """ORT's content address of a directory (``ModelPackage.compute_directory_hash``; the
    model_package library's README): sha256 of the lines ``<sha256 hex>  <relative path>\\n``
    sorted by path. Computed from the digests, so the layout knows each asset's address before
    any byte is read; the authoring child hands it to ORT as the expected one (ORT checks)."""
    lines = sorted((f.path, f.digest.removeprefix("sha256:")) for f in files)
    text = "".join(f"{hexd}  {path}\n" for path, hexd in lines)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def compatibility_string(backend: str, manifest: dict[str, Any], metadata: dict[str, str] | None) -> str | None:
    """The build's own compatibility string: the manifest's ``compatibility`` (recorded by the
    farm, ``{"<EP>": "<string>"}``) where it has one, else the compiled model's metadata
    ``ep_compatibility_info.<EP>`` (``metadata``: the context model's metadata_props)."""
    ep = EP_OF.get(backend)
    if ep is None:
        return None
    recorded = manifest.get("compatibility")
    if isinstance(recorded, dict) and isinstance(recorded.get(ep), str) and recorded[ep]:
        return str(recorded[ep])[:1024]
    value = (metadata or {}).get(COMPAT_PREFIX + ep)
    return str(value)[:1024] if value else None


def identifies_soc(compat: str | None, soc_model: str) -> bool:
    """Whether a QNN compatibility string names the build's SoC: a v2 string
    (``v2:<backend>:<sdk>:<api>:<arch>:<soc models>:...``, QNN >= 2.49.40) whose SoC field is the
    build's ``soc_model`` ids. QNN 2.47.0 writes ``6:2.47.0:5.47.0:0.0.0:68:0`` for SM8650 and
    SM8750 alike (measured; docs/packages.md): a device's QNN EP can't tell those builds apart."""
    parts = (compat or "").split(":")
    wanted = {int(x) for x in re.findall(r"\d+", soc_model)}
    return len(parts) > 5 and parts[0] == "v2" and bool(wanted) and \
        {int(x) for x in re.findall(r"\d+", parts[5])} == wanted


def variant_compatibility(build: Build) -> str | None:
    """The compatibility string a variant carries: the build's own, never altered; left out
    (None) for a QNN build of one SoC whose string does not name that SoC. ORT then asks the EP
    nothing and scores the variant by its EP and device alone (model_package_variant_selector.cc)."""
    soc = build.provider_options.get("soc_model", "")
    if build.backend == "qnn" and "," not in soc and not identifies_soc(build.compatibility, soc):
        return None
    return build.compatibility


def distinguishable(builds: list[Build]) -> tuple[list[Build], list[dict[str, str]]]:
    """The builds a package can hold, and those it leaves out (each with why): variants of one EP
    for different targets that would carry the same compatibility string (or, for QNN, none) are
    left out, every one of them: ORT scores such variants alike (the EP's check reads only that
    string; ``provider_options`` such as ``soc_model`` take no part in selection) and breaks the
    tie by declaration order, so a device could be handed the other SoC's binary. A device whose
    runtime needs one of them installs its build directly (``farm install --model``).
    ``package-ambiguous-variants`` when nothing else is left."""
    groups: dict[tuple[str, str | None], list[Build]] = {}
    for b in sorted(builds, key=lambda b: (b.backend, b.target, b.toolchain, b.artifact)):
        compat = variant_compatibility(b)
        if compat is None and b.backend != "qnn":
            continue  # not measured for other EPs: a TensorRT build records no string today
        groups.setdefault((b.backend, compat), []).append(b)
    ambiguous = {k: bs for k, bs in groups.items() if len({b.target for b in bs}) > 1}
    out = {b.artifact for bs in ambiguous.values() for b in bs}
    kept = [b for b in builds if b.artifact not in out]
    left_out = []
    for (_, compat), bs in sorted(ambiguous.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        said = f"the same compatibility string {compat[:80]!r}" if compat else \
            "no compatibility string that names their SoC"
        targets = ", ".join(f"{b.backend}:{b.target} ({b.toolchain})" for b in bs)
        why = (f"{targets} have {said}: a device's ONNX Runtime can't tell these variants apart and could select "
               "another SoC's binary")
        left_out += [{"artifact": b.artifact, "target": f"{b.backend}:{b.target}", "toolchain": b.toolchain,
                      "why": why} for b in bs]
    if not kept:
        raise PackageAmbiguousError(f"{left_out[0]['why']}; no package was made")
    return kept, left_out


def inputs_key(model: str, name: str, tag: str, artifacts: list[str]) -> str:
    """What a package is made from: the model, the NAME:TAG it is published as and every
    artifact. A new build is a new key (the package is made again); nothing new, the same key
    (the index answers). Sample inputs uploaded later are not part of it: they change what the
    next package is checked with, not the package."""
    return sha256_bytes(canonical_json({"kind": PACKAGE_KIND, "layout": LAYOUT_VERSION, "model": model,
                                        "name": name, "tag": tag, "artifacts": sorted(artifacts)})).removeprefix("sha256:")


@dataclass(frozen=True)
class Build:
    """A published build as the layout needs it (read from the index and its manifest)."""

    artifact: str  # manifest digest
    backend: str
    target: str
    toolchain: str
    options_digest: str
    ctx_model: str
    files: tuple[PackageFile, ...]  # payload files: ctx models and context binaries
    graphs: tuple[dict[str, Any], ...] | None  # a group's graphs (name, ctxModel, contexts)
    compatibility: str | None
    provider_options: dict[str, str]
    cpu_op_types: tuple[str, ...] = ()


def _file(entry: dict[str, Any]) -> PackageFile:
    path = str(entry.get("path") or entry.get("name") or "")
    safe_relative(path)  # raises UnsafePathError (a ValueError): a tampered row never becomes a path
    return PackageFile(path, str(entry["digest"]), int(entry["size"]))


def source_members(model_files: list[dict[str, Any]], group: dict[str, Any] | None) -> list[tuple[str, PackageFile,
                                                                                                  list[PackageFile]]]:
    """(component name, the graph's .onnx, its external data) per component, from a model's
    recorded snapshot: a single model's ``model.onnx`` and data files, or each graph of a
    group (``group``: its group.json) with the files under its ``g<i>/``."""
    files = [_file(f) for f in model_files]
    if group is None:
        head, rest = files[0], files[1:]
        return [(SINGLE_COMPONENT, head, list(rest))]
    out = []
    for i, g in enumerate(group["graphs"]):
        prefix = f"g{i}/"
        onnx = next((f for f in files if f.path == f"g{i}/g{i}.onnx"), None)
        if onnx is None:
            raise InvalidModelError(f"the recorded group lists no file for graph {i}")
        data = [PackageFile(f.path[len(prefix):], f.digest, f.size) for f in files
                if f.path.startswith(prefix) and f.path != onnx.path]
        out.append((str(g["name"]), onnx, data))
    return out


def variant_name(build: Build, taken: set[str]) -> str:
    """``qnn-SM8650-2.51.0`` (``trt-sm_89-10.14.1``); a second build of the same target and
    toolchain (other options) gets its options digest appended."""
    base = f"{build.backend}-{build.target}-{build.toolchain}"
    name = base if base not in taken else f"{base}-{build.options_digest.removeprefix('sha256:')[:12]}"
    taken.add(name)
    return name


def plan(*, package_name: str, package_version: str, model: str, model_files: list[dict[str, Any]],
         group: dict[str, Any] | None, builds: list[Build]) -> Layout:
    """The package of a model's published ``builds``: see the module docstring. Raises
    ``no-published-builds`` when there is none (a CPU-only package is not what was asked)."""
    if not builds:
        raise NoPublishedBuildsError(f"{package_name}:{package_version} ({model[:19]}) has no published build to "
                                     "package", hint=f"build it first: farm build MODEL.onnx -t qnn:SM8650 --name "
                                                     f"{package_name} --tag {package_version}")
    builds, left_out = distinguishable(builds)
    members = source_members(model_files, group)
    assets: dict[str, Asset] = {}

    def asset(files: list[PackageFile]) -> str:
        uri = asset_uri(files)
        assets.setdefault(uri, Asset(uri, tuple(sorted(files, key=lambda f: f.path))))
        return uri

    components = []
    for i, (name, onnx, data) in enumerate(members):
        cdir = f"c{i}"
        session: dict[str, str] = {}
        if data:
            session[EXTERNAL_DATA_FOLDER] = asset(data)
        cpu = Variant("cpu", f"{cdir}/cpu", CPU_EP, "cpu", CPU_MODEL_FILE,
                      (PackageFile(CPU_MODEL_FILE, onnx.digest, onnx.size),), session_options=session,
                      metadata={"source": model, "graph": name} if group else {"source": model})
        variants: list[Variant] = []
        taken = {"cpu"}
        for j, b in enumerate(sorted(builds, key=lambda b: (b.backend, b.target, b.toolchain, b.artifact))):
            meta: dict[str, Any] = {"artifact": b.artifact, "target": f"{b.backend}:{b.target}",
                                    "toolchain": b.toolchain, "cpu_op_types": list(b.cpu_op_types)}
            vdir = f"{cdir}/v{j}"
            compat = variant_compatibility(b)
            if b.compatibility and compat is None:  # kept as evidence, never given to ORT to score with
                meta["ep_compatibility_not_naming_soc"] = b.compatibility
            if group is None:
                model_file, files = b.ctx_model, b.files
            else:
                # One asset per group build: every graph's variant points into it, the shared
                # binaries stored once.
                graph = next((g for g in b.graphs or () if g.get("name") == name), None)
                if graph is None:
                    raise InvalidModelError(f"build {b.artifact[:19]} has no graph {name!r}")
                ctx = str(graph["ctxModel"])
                safe_relative(ctx)
                model_file, files = f"{asset(list(b.files))}/{ctx}", ()
                meta["graph"] = name
                meta["cpu_op_types"] = list((graph.get("placement") or {}).get("cpu_op_types") or [])
            # A group's graphs share context binaries: each session must say so, as the farm's
            # group docs tell a device (onnxruntime-genai sets it itself).
            shared = {SHARE_EP_CONTEXTS: "1"} if group is not None and b.backend == "qnn" else {}
            variants.append(Variant(variant_name(b, taken), vdir, EP_OF[b.backend], DEVICE_OF[b.backend], model_file,
                                    tuple(files), compat, session_options=shared,
                                    provider_options=dict(b.provider_options), metadata=meta, backend=b.backend))
        # The CPU variant last: ORT breaks a tie by declaration order, and the CPU EP is the
        # first (only) EP of CPU-only session options, so it is chosen there and only there.
        components.append(Component(name, cdir, [*variants, cpu]))
    return Layout(package_name, package_version, model, components, assets,
                  sorted(b.artifact for b in builds), left_out)


def record(layout: Layout, *, inputs: str, files: list[dict[str, Any]], evidence: dict[str, Any],
           ref: str) -> dict[str, Any]:
    """The package's own record (canonical JSON, a blob; its digest is the package's id, which
    a signature covers): what it was made from, every file with its digest, and the evidence of
    the check it passed before publication."""
    return {"kind": PACKAGE_KIND, "mediaType": MEDIA_PACKAGE, "layoutVersion": LAYOUT_VERSION, "ref": ref,
            "model": layout.model, "inputs": inputs, "artifacts": layout.artifacts,
            "components": layout.summary(), "directories": layout.directories(),
            "files": sorted(files, key=lambda f: f["path"]), "evidence": evidence,
            **({"left_out": layout.left_out} if layout.left_out else {})}


def check_record(doc: Any) -> dict[str, Any]:
    """A package record read back (from the store or a server): the kind, and every path safe.
    Raises ManifestError."""
    from farm.core.errors import ManifestError
    from farm.core.keys import is_digest
    from farm.core.names import UnsafePathError

    if not isinstance(doc, dict) or doc.get("kind") != PACKAGE_KIND:
        raise ManifestError("not a ctxfarm ORT model package record")
    files, dirs = doc.get("files"), doc.get("directories")
    if not isinstance(files, list) or not isinstance(dirs, list) or len(files) > 100_000 or len(dirs) > 100_000:
        raise ManifestError("the package record lists no files")
    seen: set[str] = set()
    try:
        for f in files:
            if not isinstance(f, dict) or not is_digest(str(f.get("digest"))) or type(f.get("size")) is not int \
                    or f["size"] < 0 or not isinstance(f.get("path"), str):
                raise ManifestError("a package file entry is malformed")
            safe_relative(f["path"])
            if f["path"] in seen:
                raise ManifestError(f"the package lists {f['path'][:80]!r} twice")
            seen.add(f["path"])
        for d in dirs:
            if not isinstance(d, str):
                raise ManifestError("a package directory is not a path")
            safe_relative(d)
    except UnsafePathError as exc:
        raise ManifestError(f"the package record holds an unsafe path: {exc}") from None
    names = {f["path"] for f in files}
    prefixes = {"/".join(p.split("/")[:k]) for p in names for k in range(1, p.count("/") + 1)}
    if names & prefixes or names & set(dirs) or MANIFEST not in names:
        raise ManifestError("the package record names a path both as a file and a directory, or has no manifest")
    return doc
