"""A genai package as a model snapshot: ``genai.json`` first (what the package is: each part's
graph group by digest, each CPU stage by role, the tokenizer files), then the CPU stages and tokenizer
files under fixed names; read from an export folder (``inspect_package``) or laid out again from the
store (``package_from_snapshot``); and the one answer for a package (``PackageReport``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.core.bundle import BundleFile
from farm.core.errors import InvalidModelError
from farm.core.keys import bundle_digest, canonical_json, sha256_bytes
from farm.core.names import inside
from farm.core.settings import Settings
from farm.pipeline.submission import BuildReport

PACKAGE_FILE = "genai.json"


PACKAGE_KIND = "ctxfarm.genai-package.v1"


CONFIG_NAME = "genai_config.json"
PREFILL, DECODE = "prefill", "decode"


MEDIA = {".json": "application/json", ".onnx": "application/octet-stream"}




def part_dir(index: int) -> str:
    return f"part{index}"


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
    parts = _load_parts(settings, export, label, load_group)
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


def _load_parts(settings: Settings, export: Any, label: str, load_group: Any) -> tuple[Any, ...]:
    """Each part's group (``load_group``), the parts at once: hashing a part's weights (hashlib
    and reads release the GIL) is most of it, and the parts' files are disjoint. The first part
    in order that fails raises, as one after the other would; the groups already made are
    cleaned up then."""
    from concurrent.futures import ThreadPoolExecutor

    n = len(export.parts)
    if n <= 1:
        return tuple(load_group(settings, export.group_members(i), display=f"{label}.{part_dir(i)}")
                     for i in range(n))
    with ThreadPoolExecutor(max_workers=min(n, os.cpu_count() or 1, 4), thread_name_prefix="inspect") as pool:
        futures = [pool.submit(load_group, settings, export.group_members(i), display=f"{label}.{part_dir(i)}")
                   for i in range(n)]
        done: list[Any] = []
        try:
            for f in futures:
                done.append(f.result())
        except BaseException:
            for f in futures:
                f.cancel()
            for f in futures:
                if not f.cancelled() and f.exception() is None:
                    f.result().cleanup()
            raise
    return tuple(done)


def store_package(reg: Any, pkg: PackageBundle) -> list[dict[str, Any]]:
    """Store the package's snapshot and each part's group snapshot at once
    (``farm.pipeline.plan.store_snapshot``: every blob verified by the store as it is written);
    returns the package's listing. The parts' weights are most of the bytes and their files are
    disjoint: stored side by side, not one after the other (``build_many`` then finds each part's
    blobs stored). Nothing is recorded here: a blob without a row is unreferenced, never
    published."""
    from concurrent.futures import ThreadPoolExecutor

    from farm.pipeline.plan import store_snapshot

    snapshots: list[Any] = [pkg, *pkg.parts]
    with ThreadPoolExecutor(max_workers=min(len(snapshots), os.cpu_count() or 1, 4),
                            thread_name_prefix="store") as pool:
        futures = [pool.submit(store_snapshot, reg, b) for b in snapshots]
        listings = [f.result() for f in futures]
    return listings[0]


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


def package_from_snapshot(settings: Settings, reg: Any, files: list[dict[str, Any]], dest: Path, *,
                          weights: bool = True) -> PackageBundle:
    """A recorded package as ``inspect_package`` saw it, from the store: the carried files under
    their names, each part's graphs and data from its group's snapshot under the exporter's
    names (from genai.json), then ``farm.core.genai.read_export`` of that folder (the same
    checks; the same description). ``weights=False``: the parts' graphs without their external
    data (the assembly reads no weight: at the default LLM size that is 3.2 GiB fetched and
    verified before publication for nothing); the twin, which runs the graphs on the CPU EP, lays
    the package out again with them."""
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
        graphs = {member_onnx(k) for k in range(2)}
        download_bundle(reg.store, listing if weights else [f for f in listing if f["path"] in graphs], work)
        for k, kind in enumerate((PREFILL, DECODE)):
            name = genai.check_file_name(files_of.get(f"part{i}.{kind}"), "package")
            inside(work, member_onnx(k)).replace(inside(dest, name))
            for data in inside(work, member_dir(k)).iterdir():
                if data.is_file() and not (dest / data.name).exists():
                    data.replace(inside(dest, genai.check_file_name(data.name, "package")))
    export = genai.read_export(dest, weights=weights)
    return PackageBundle((), tuple(carried), export, b"", "", BundleFile("", files[0]["digest"], int(files[0]["size"])),
                         "")


@dataclass
class PackageReport:
    """One answer for the package: its outcome per target, and each part's group report."""

    package: BuildReport
    parts: list[BuildReport]

    @property
    def ok(self) -> bool:
        return self.package.ok
