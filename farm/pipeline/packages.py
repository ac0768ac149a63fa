"""``farm package``: an ORT model package from a model's published builds (docs/packages.md).

``make_package`` reads the index (the model behind NAME:TAG, its active artifacts and their
manifests), and answers from the index when a package of exactly these inputs exists (the same
builds: nothing is made again). Otherwise it lays the needed blobs out once each (verified),
has the layout (``farm.core.packages.plan``) written and checked by onnxruntime's own API in a
child (``workers.ortpackage``), then publishes: ORT's ``manifest.json`` and the package record
go to the store (every other file is already there, by digest), one row in ``model_packages``
(its UNIQUE ``inputs`` settles a race: the loser answers with the winner's), and a signature
when a key is configured. ``install_package`` puts a package's files into a directory and swaps
it into place atomically, as for any artifact.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.core import packages as pk
from farm.core.errors import (
    BadNameError,
    DigestMismatchError,
    FarmError,
    ManifestError,
    MissingExtraError,
    PackageFilesMissingError,
    PackageUnsupportedError,
    StorageError,
    UsageError,
)
from farm.core.settings import Settings
from registry.index import Registry


def split_package_ref(ref: str) -> tuple[str, str]:
    """``NAME:TAG`` (or ``NAME``, meaning ``NAME:latest``): a package is named as it is published."""
    from farm.core.names import split_ref

    if not isinstance(ref, str) or ref.startswith("sha256:"):
        raise UsageError(f"farm package takes NAME:TAG, not {str(ref)[:80]!r}", hint="e.g. farm package mynet:stable")
    try:
        return split_ref(ref)
    except BadNameError as exc:
        raise BadNameError(f"{exc.message} (farm package takes NAME:TAG)", hint=exc.hint) from None


def _compat_metadata(path: Path) -> dict[str, str]:
    """A context model's metadata_props (the graph only, no external data)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - no metadata then: the variant carries no string
        return {}
    return {p.key: p.value for p in model.metadata_props}


@dataclass(frozen=True)
class Inputs:
    """What the package of NAME:TAG is made from, read from the index: the model, its files, its
    active builds (rows ``_build`` reads), its sample inputs, the inputs key, and the digest of
    the package of exactly these inputs when one was made (``made``)."""

    name: str
    tag: str
    model: str
    model_files: list[dict[str, Any]]
    rows: list[tuple[Any, ...]]
    sample: str | None
    key: str
    made: str | None


def package_inputs(reg: Registry, ref: str) -> Inputs:
    """NAME:TAG's package inputs (not-found, bad-name, usage for a bad ref); short reads only."""
    from sqlalchemy import select
    from sqlalchemy.orm import selectinload

    from registry.index import resolve_model_ref
    from registry.models import Artifact, Model, ModelPackageRow, ModelSample

    name, tag = split_package_ref(ref)
    with reg.db.session() as s:
        digest = resolve_model_ref(s, f"{name}:{tag}")
        model = s.get(Model, digest)
        assert model is not None
        model_files = [dict(f) for f in model.files]
        arts = list(s.scalars(select(Artifact).options(selectinload(Artifact.files))
                              .where(Artifact.model_digest == digest, Artifact.status == "active",
                                     Artifact.backend.in_(list(pk.EP_OF)))
                              .order_by(Artifact.id)))
        sample = s.get(ModelSample, digest)
        sample_digest = sample.digest if sample is not None else None
        key = pk.inputs_key(digest, name, tag, [a.digest for a in arts])
        have = s.scalar(select(ModelPackageRow.digest).where(ModelPackageRow.inputs == key))
        rows = [(a.digest, a.backend, a.target, a.toolchain, a.options_digest, a.ctx_model,
                 {f.name: f for f in a.files}) for a in arts]
        for a in arts:
            s.expunge(a)
    return Inputs(name, tag, digest, model_files, rows, sample_digest, key, have)


def check_packable(model_files: list[dict[str, Any]], ref: str) -> None:
    """``package-unsupported`` for a model no ORT model package holds here: an onnxruntime-genai
    package (a folder of stages a device opens with ``og.Model(dir)``). onnxruntime-genai 0.18's
    PyPI wheel exports ``OgaCreateConfigFromPackageEp`` (and ``og.Config.from_package_ep``), but
    answers every package "Model package support requires building onnxruntime-genai against ONNX
    Runtime with the OrtModelPackageApi experimental functions" (measured: docs/packages.md), so
    a package of one could not be opened by the runtime a device would use."""
    from farm.pipeline.genai import PACKAGE_FILE

    if model_files and model_files[0].get("path") == PACKAGE_FILE:
        raise PackageUnsupportedError(
            f"{ref} is an onnxruntime-genai package: no ORT model package is made of it (the onnxruntime-genai 0.18 "
            "wheel opens no model package: it is not built with ONNX Runtime's model package API)",
            hint=f"install its folder, resolved for the device: farm install --model {ref} --soc SOC --qnn VERSION "
                 "-d DIR (or farm fetch --model ...); og.Model(DIR) opens it")


def check_buildable(inputs: Inputs) -> None:
    """no-published-builds when the model has no build to package (read from the index alone:
    a service without onnxruntime says so itself); package-unsupported for a genai package."""
    check_packable(inputs.model_files, f"{inputs.name}:{inputs.tag}")
    if not inputs.rows:
        pk.plan(package_name=inputs.name, package_version=inputs.tag, model=inputs.model,
                model_files=inputs.model_files, group=None, builds=[])  # raises no-published-builds


def authors_here() -> bool:
    """Can this process write model packages itself (onnxruntime >= 1.32 installed here,
    ``workers.ortpackage.runtime``)? A service that cannot has a worker make them."""
    from workers.ortpackage import runtime

    try:
        runtime()
    except MissingExtraError:
        return False
    return True


def make_package(settings: Settings, reg: Registry, ref: str, *, signer: Any = None,
                 inputs: Inputs | None = None) -> dict[str, Any]:
    """The package of NAME:TAG's published builds: answered from the index when nothing new was
    published since, else made, checked and published. Returns the answer (``package_answer``).
    ``inputs``: read already by the caller (``package_inputs``)."""
    from farm.core.groups import GROUP_FILE

    got = inputs or package_inputs(reg, ref)
    name, tag, digest, model_files, rows, sample_digest, key = (
        got.name, got.tag, got.model, got.model_files, got.rows, got.sample, got.key)
    if got.made is not None:  # nothing new was published since: the index answers
        return package_answer(reg, got.made, cached=True)
    check_buildable(got)
    from workers.ortpackage import runtime

    runtime()  # missing-extra before a byte is fetched, where onnxruntime < 1.32
    with tempfile.TemporaryDirectory(prefix="ctxfarm-package-") as tmp:
        work = Path(tmp)
        blobs = work / "blobs"
        blobs.mkdir()
        group = None
        fetched: set[str] = set()

        def fetch(entry_digest: str, size: int, what: str) -> Path:
            from registry.store.base import check_digest, download

            path = blobs / check_digest(entry_digest).removeprefix("sha256:")
            if entry_digest not in fetched:
                try:
                    download(reg.store, entry_digest, path, size=size)
                except (StorageError, OSError) as exc:
                    message = exc.message if isinstance(exc, FarmError) else str(exc)
                    raise PackageFilesMissingError(f"{what}: {message}") from None
                fetched.add(entry_digest)
            return path

        for f in model_files:
            if not f.get("stored"):
                raise PackageFilesMissingError(f"the model snapshot of {name}:{tag} was never stored")
            fetch(f["digest"], int(f["size"]), f"the source model of {name}:{tag}")
        if model_files[0].get("path") == GROUP_FILE:
            from farm.core.groups import read_descriptor

            group = read_descriptor(blobs / model_files[0]["digest"].removeprefix("sha256:"))
        builds = [_build(reg, settings, row, fetch) for row in rows]
        layout = pk.plan(package_name=name, package_version=tag, model=digest, model_files=model_files,
                         group=group, builds=builds)
        sample_path = fetch(sample_digest, _blob_size(reg, sample_digest), "the sample inputs") \
            if sample_digest and group is None else None
        from workers.ortpackage import author

        root = work / "package"
        request = {**layout.to_request(), "root": str(root), "blobs": str(blobs),
                   "sample": str(sample_path) if sample_path else None,
                   "sample_digest": sample_digest if sample_path else None}
        (work / "child").mkdir()
        result = author(request, work / "child", timeout=settings.compile_timeout,
                        memory_mb=settings.compile_memory_mb)
        return _publish(reg, layout, root, key, result.get("evidence") or {}, f"{name}:{tag}", signer)


def _blob_size(reg: Registry, digest: str) -> int:
    return int(reg.store.stat(digest).size)


def _build(reg: Registry, settings: Settings, row: tuple[Any, ...], fetch: Any) -> pk.Build:
    """One published artifact as the layout needs it: its manifest read (checked against the
    index), its payload files fetched (each verified), its compatibility string."""
    from farm.core.catalog import load_catalog
    from registry import manifest as mf
    from registry.store.base import read_bytes

    artifact, backend, target, toolchain, options_digest, ctx_model, indexed = row
    what = f"artifact {artifact[7:19]} ({backend}:{target}, {toolchain})"
    try:
        manifest = mf.decode(read_bytes(reg.store, artifact), artifact)
    except (StorageError, ValueError) as exc:
        raise PackageFilesMissingError(f"{what}: its manifest can't be read: "
                                       f"{exc.message if isinstance(exc, FarmError) else exc}") from None
    try:
        from farm.core.untrusted import check_manifest

        check_manifest(manifest)
    except ManifestError as exc:
        raise PackageFilesMissingError(f"{what}: {exc.message}") from None
    payload = [f for f in manifest["files"] if f.get("name") in indexed]
    if {f["name"] for f in payload} != {n for n, f in indexed.items() if f.role in ("ctx-model", "context")} \
            or any(indexed[f["name"]].digest != f["digest"] for f in payload):
        raise PackageFilesMissingError(f"{what}: the index and the manifest disagree on its files",
                                       hint="run `farm registry verify --repair`")
    for f in payload:
        fetch(f["digest"], int(f["size"]), what)
    compat = pk.compatibility_string(backend, manifest, None)
    if compat is None and pk.EP_OF.get(backend):  # published before the manifest recorded it
        first_ctx = next(f for f in payload if f["name"] == manifest["ctxModel"])
        meta = _compat_metadata(Path(fetch(first_ctx["digest"], int(first_ctx["size"]), what)))
        compat = pk.compatibility_string(backend, manifest, meta)
    provider: dict[str, str] = {}
    graphs = manifest.get("graphs")
    if backend == "qnn":
        t = load_catalog().get(target, backend="qnn")
        ids = [t.soc_model] if t.soc_model is not None else list(t.soc_models or [])
        provider["soc_model"] = ",".join(str(i) for i in ids)
    cpu_ops = tuple(str(x) for x in (manifest.get("placement") or {}).get("cpu_op_types") or [])
    return pk.Build(artifact, backend, target, toolchain, options_digest, str(manifest["ctxModel"]),
                    tuple(pk.PackageFile(str(f["name"]), str(f["digest"]), int(f["size"])) for f in payload),
                    tuple(graphs) if isinstance(graphs, list) else None, compat, provider, cpu_ops)


def _publish(reg: Registry, layout: pk.Layout, root: Path, key: str, evidence: dict[str, Any], ref: str,
             signer: Any) -> dict[str, Any]:
    from sqlalchemy import select
    from sqlalchemy.exc import IntegrityError

    from farm.core.keys import canonical_json, sha256_bytes, sha256_file
    from registry.index import add_signature
    from registry.models import ModelPackageRow
    from registry.store.base import put_bytes, put_file

    manifest_path = root / pk.MANIFEST
    m_digest, m_size = sha256_file(manifest_path)
    files = [*layout.files(), {"path": pk.MANIFEST, "digest": m_digest, "size": m_size}]
    doc = pk.record(layout, inputs=key, files=files, evidence=evidence, ref=ref)
    data = canonical_json(doc)
    digest = sha256_bytes(data)
    put_file(reg.store, manifest_path, expected=m_digest)
    put_bytes(reg.store, data, expected=digest)
    size = sum(int(f["size"]) for f in files)
    try:
        with reg.db.session() as s:
            s.add(ModelPackageRow(digest=digest, inputs=key, model_digest=layout.model, ref=ref, size=size,
                                  files=[*files, {"path": "", "digest": digest, "size": len(data)}]))
            s.flush()
            if signer is not None:
                add_signature(s, digest, signer.public_b64, signer.sign(digest))
    except IntegrityError:
        with reg.db.session() as s:  # a concurrent `farm package` of the same inputs published first
            digest = s.scalar(select(ModelPackageRow.digest).where(ModelPackageRow.inputs == key)) or digest
        return package_answer(reg, digest, cached=True)
    return package_answer(reg, digest, cached=False)


def read_record(reg: Registry, digest: str) -> dict[str, Any]:
    from registry.store.base import read_bytes

    try:
        return pk.check_record(json.loads(read_bytes(reg.store, digest)))
    except ValueError:
        raise ManifestError(f"package record {digest[7:19]} is not JSON") from None


def package_answer(reg: Registry, digest: str, *, cached: bool) -> dict[str, Any]:
    """What ``farm package`` / ``POST /v1/packages`` answer: the package's digest, its record's
    size (a client fetches the record by digest, reading no more), its components and
    variants, its files, the evidence of its check, its signatures."""
    from sqlalchemy import select

    from registry.index import signatures_of
    from registry.models import ModelPackageRow

    with reg.db.session() as s:
        row = s.scalar(select(ModelPackageRow).where(ModelPackageRow.digest == digest))
        if row is None:
            from farm.core.errors import NotFoundError

            raise NotFoundError(f"no package {digest[:19]}")
        record_size = next(int(f["size"]) for f in row.files if f["path"] == "")
        sigs = signatures_of(s, digest)
        ref, size = row.ref, row.size
    doc = read_record(reg, digest)
    return {"digest": digest, "ref": ref, "model": doc["model"], "cached": cached, "record_size": record_size,
            "size": size, "artifacts": doc["artifacts"], "components": doc["components"],
            "directories": doc["directories"], "files": doc["files"], "evidence": doc["evidence"],
            "signatures": [{"public_key": k, "signature": v} for k, v in sigs],
            **({"left_out": doc["left_out"]} if doc.get("left_out") else {})}


def current_package(reg: Registry, ref: str) -> dict[str, Any]:
    """The newest package made of NAME:TAG's current model (``farm install --package``, ``GET
    /v1/packages?ref=``): made earlier, never here; not-found (with the command that makes one)
    when there is none."""
    from sqlalchemy import select

    from farm.core.errors import NotFoundError
    from registry.index import resolve_model_ref
    from registry.models import Model, ModelPackageRow

    name, tag = split_package_ref(ref)
    with reg.db.session() as s:
        model = resolve_model_ref(s, f"{name}:{tag}")
        row = s.get(Model, model)
        check_packable([dict(f) for f in (row.files if row is not None else [])][:1], f"{name}:{tag}")
        digest = s.scalar(select(ModelPackageRow.digest)
                          .where(ModelPackageRow.ref == f"{name}:{tag}", ModelPackageRow.model_digest == model)
                          .order_by(ModelPackageRow.id.desc()).limit(1))
    if digest is None:
        raise NotFoundError(f"no ORT model package of {name}:{tag} was made yet",
                            hint=f"make it (a submit token): farm package {name}:{tag}")
    return package_answer(reg, digest, cached=True)


def install_package(reg: Registry, answer: dict[str, Any], dest: Path) -> Path:
    """Every file of the package from the store into ``dest`` (each verified by size and
    sha256), swapped into place atomically; returns the package root (``dest``)."""
    from farm.core.names import inside
    from farm.core.placement import destination, staged
    from registry.store.base import download

    doc = read_record(reg, answer["digest"])
    out = destination(dest)
    with staged(out) as staging:
        for d in doc["directories"]:
            inside(staging, d).mkdir(parents=True, exist_ok=True)
        for f in doc["files"]:
            try:
                download(reg.store, f["digest"], inside(staging, f["path"]), size=int(f["size"]))
            except (StorageError, DigestMismatchError) as exc:
                raise PackageFilesMissingError(f"package file {f['path']}: {exc.message}") from None
    return out
