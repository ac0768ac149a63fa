"""Graph groups: an ordered set of named ONNX graphs compiled together into shared context
binaries (an LLM's ``prefill`` and ``decode`` sharing one set of weights).

A group travels through the pipeline as one model snapshot: ``group.json`` first (what the
group is: each graph's name and model digest, in order), then each member's bundle under a fixed
directory ``g<i>/`` with its .onnx as ``g<i>/g<i>.onnx``. Nothing in a path comes from a graph
name: the names are checked against ``GRAPH_NAME_RE`` and live only inside ``group.json`` and
the manifest. The group's digest is the bundle digest of that listing, so it covers the members'
digests, names and order: the same group is the same build everywhere.

Uses ``onnx`` only (farm.core.bundle), never onnxruntime.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.core.bundle import BundleFile, ModelBundle, inspect_model
from farm.core.errors import BadGroupError, InvalidModelError
from farm.core.keys import bundle_digest, canonical_json, sha256_bytes
from farm.core.names import inside

GROUP_FILE = "group.json"
GROUP_KIND = "ctxfarm.graph-group.v1"
# Dotted lowercase identifiers: prefill, decode, part1.prefill, part4.decode (at most 64 chars).
GRAPH_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,31}(?:\.[a-z0-9][a-z0-9_]{0,31}){0,3}")
MAX_GRAPHS = 64
NAME_HINT = ("graph names are lowercase identifiers, optionally dotted: prefill, decode, part1.prefill "
             "(at most 64 characters, unique within the group)")


def member_dir(index: int) -> str:
    return f"g{index}"


def member_onnx(index: int) -> str:
    """The member's .onnx inside the snapshot: its own name, so each graph compiles from a
    distinct file (onnxruntime names EPContext partitions after the path)."""
    return f"g{index}/g{index}.onnx"


def part_of(name: str) -> str:
    """The part a graph belongs to: its name up to the last dot (``part1.prefill`` -> ``part1``;
    ``prefill`` -> ``""``). Consecutive graphs of one part share their context binaries; each
    part has its own, as the HTP process domain limits one context to about 3.5 GB."""
    return name.rsplit(".", 1)[0] if "." in name else ""


def check_graph_name(name: Any) -> str:
    if not isinstance(name, str) or len(name) > 64 or not GRAPH_NAME_RE.fullmatch(name):
        shown = name[:80] if isinstance(name, str) else type(name).__name__
        raise BadGroupError(f"graph name {shown!r} is not allowed", hint=NAME_HINT)
    return name


def check_members(members: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(name, path) pairs: at least two, at most MAX_GRAPHS, names valid and unique."""
    if len(members) < 2:
        raise BadGroupError(f"a graph group needs at least two graphs, {len(members)} given",
                            hint="farm build --graph prefill=prefill.onnx --graph decode=decode.onnx -t TARGET")
    if len(members) > MAX_GRAPHS:
        raise BadGroupError(f"a graph group holds at most {MAX_GRAPHS} graphs, {len(members)} given")
    seen: set[str] = set()
    for name, _ in members:
        check_graph_name(name)
        if name in seen:
            raise BadGroupError(f"graph name {name!r} is given twice", hint=NAME_HINT)
        seen.add(name)
    return members


def parse_graph_args(values: list[str]) -> list[tuple[str, str]]:
    """``--graph NAME=PATH`` values, in order."""
    out = []
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not path:
            raise BadGroupError(f"--graph {v[:80]!r} is not NAME=PATH", hint="e.g. --graph prefill=prefill.onnx")
        out.append((check_graph_name(name.strip()), path))
    return out


MAX_GROUP_FILE = 1024 * 1024  # bytes: a group file names a few dozen graphs
MAX_GROUP_DEPTH = 16  # nesting of lists and tables: the file needs 3


def _depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` outside quoted strings (JSON's and TOML's quotes),
    counted before a parser recurses into it."""
    deepest = depth = 0
    quote = ""
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def read_group_file(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """A group file: JSON ``{"graphs": [{"name": N, "path": P}, ...]}`` or TOML with
    ``[[graphs]]`` tables of the same keys. Relative paths are relative to the file. At most
    ``MAX_GROUP_FILE`` bytes, nested at most ``MAX_GROUP_DEPTH`` deep (else ``bad-group``)."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_GROUP_FILE:
            raise BadGroupError(f"the group file {p} is over {MAX_GROUP_FILE} bytes")
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise BadGroupError(f"cannot read the group file {p}: {exc}") from None
    if _depth(text) > MAX_GROUP_DEPTH:
        raise BadGroupError(f"the group file {p} nests lists or tables over {MAX_GROUP_DEPTH} deep",
                            hint='{"graphs": [{"name": "prefill", "path": "prefill.onnx"}, ...]}')
    try:
        if p.suffix.lower() == ".toml":
            import tomllib

            doc: Any = tomllib.loads(text)
        else:
            doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadGroupError(f"group file {p} is not valid {'TOML' if p.suffix.lower() == '.toml' else 'JSON'}: "
                            f"{str(exc)[:200] or type(exc).__name__}") from None
    graphs = doc.get("graphs") if isinstance(doc, dict) else None
    if not isinstance(graphs, list):
        raise BadGroupError(f"group file {p} has no 'graphs' list",
                            hint='{"graphs": [{"name": "prefill", "path": "prefill.onnx"}, ...]}')
    out = []
    for g in graphs:
        if not isinstance(g, dict) or not isinstance(g.get("path"), str) or not g.get("path"):
            raise BadGroupError(f"group file {p}: every graph needs a 'name' and a 'path'")
        gp = Path(g["path"])
        out.append((check_graph_name(g.get("name")), str(gp if gp.is_absolute() else p.parent / gp)))
    return out


@dataclass(frozen=True)
class GroupMember:
    name: str
    bundle: ModelBundle

    def io(self) -> dict[str, list[dict[str, Any]]]:
        """The model's graph inputs and outputs (name, shape, ONNX dtype name)."""
        return model_io(self.bundle.path)


@dataclass(frozen=True)
class GroupBundle:
    """A group as one model snapshot (the interface of ``farm.core.bundle.ModelBundle`` that
    submission uses: digest, onnx, size, stem, files_json, sources)."""

    members: tuple[GroupMember, ...]
    descriptor: bytes  # group.json
    digest: str
    onnx: BundleFile  # group.json's entry: the snapshot's first file
    display: str
    _dir: Path = field(repr=False, compare=False, default=Path("."))

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    @property
    def size(self) -> int:
        """Every graph's bundle in full, a data file shared by graphs counted once per graph:
        each graph's session loads its weights, and a group's compile peak follows this sum
        (measured, QNN 2.51.0: prefill + decode sharing 384 MiB peaked at 1,975 MiB, one graph
        alone at 1,081 MiB; farm.pipeline.memory predicts from this size). The store holds a
        shared file once."""
        return len(self.descriptor) + sum(m.bundle.size for m in self.members)

    @property
    def stem(self) -> str:
        return self.display

    @property
    def path(self) -> Path:
        return self._dir / GROUP_FILE

    def cleanup(self) -> None:
        """Remove the temporary directory that holds group.json (the CLI calls it when the
        command ends, however it ends: success, refusal or Ctrl-C)."""
        if self._dir.name.startswith("ctxfarm-group-"):
            shutil.rmtree(self._dir, ignore_errors=True)

    def files_json(self) -> list[dict[str, Any]]:
        out = [{"path": GROUP_FILE, "digest": self.onnx.digest, "size": self.onnx.size}]
        for i, m in enumerate(self.members):
            out.append({"path": member_onnx(i), "digest": m.bundle.onnx.digest, "size": m.bundle.onnx.size})
            out += [{"path": f"{member_dir(i)}/{f.path}", "digest": f.digest, "size": f.size}
                    for f in m.bundle.external]
        return out

    def sources(self) -> list[tuple[dict[str, Any], Path]]:
        entries = self.files_json()
        out = [(entries[0], self.path)]
        k = 1
        for m in self.members:
            out.append((entries[k], m.bundle.path))
            k += 1
            for f in m.bundle.external:
                out.append((entries[k], inside(m.bundle.root, f.path)))
                k += 1
        return out


def descriptor(members: list[tuple[str, str]]) -> dict[str, Any]:
    """group.json: the kind, then each graph's name, model digest and file, in order."""
    return {"kind": GROUP_KIND,
            "graphs": [{"name": n, "model": d, "file": member_onnx(i)} for i, (n, d) in enumerate(members)]}


def inspect_group(members: list[tuple[str, str]], *, display: str | None = None) -> GroupBundle:
    """Validate every member (names, ONNX, external data) and compute the group digest. A
    member that is not ONNX is ``invalid-model`` naming the graph; bad or repeated names are
    ``bad-group``. Nothing is written to the registry here."""
    check_members(members)
    inspected: list[GroupMember] = []
    for name, path in members:
        try:
            bundle = inspect_model(path)
        except InvalidModelError as exc:
            raise InvalidModelError(f"graph {name!r}: {exc.message}", hint=exc.hint) from None
        own = Path(member_onnx(len(inspected))).name  # the member's .onnx, beside its data
        if any(f.path == own for f in bundle.external):
            raise InvalidModelError(f"graph {name!r}: external data may not be named {own!r} in a group "
                                    "(the group keeps the graph's .onnx under that name)")
        inspected.append(GroupMember(name, bundle))
    desc = canonical_json(descriptor([(m.name, m.bundle.digest) for m in inspected]))
    entry = BundleFile("", sha256_bytes(desc), len(desc))
    files: list[tuple[str, str]] = []
    for i, m in enumerate(inspected):
        files.append((member_onnx(i), m.bundle.onnx.digest))
        files += [(f"{member_dir(i)}/{f.path}", f.digest) for f in m.bundle.external]
    digest = bundle_digest(entry.digest, files)
    tmp = Path(tempfile.mkdtemp(prefix="ctxfarm-group-"))
    (tmp / GROUP_FILE).write_bytes(desc)
    return GroupBundle(tuple(inspected), desc, digest, entry, display or "+".join(m.name for m in inspected), tmp)


def read_descriptor(path: Path) -> dict[str, Any]:
    """group.json from a snapshot laid out by the executor (verified by digest already), checked
    again: names valid and unique, files the fixed ones."""
    doc = json.loads(path.read_bytes())
    if not isinstance(doc, dict) or doc.get("kind") != GROUP_KIND or not isinstance(doc.get("graphs"), list):
        raise InvalidModelError("group.json is not a ctxfarm graph group")
    check_members([(str(g.get("name")) if isinstance(g.get("name"), str) else "", "") for g in doc["graphs"]
                   if isinstance(g, dict)])
    for i, g in enumerate(doc["graphs"]):
        if g.get("file") != member_onnx(i):
            raise InvalidModelError(f"group.json lists graph {i} at {str(g.get('file'))[:80]!r}, "
                                    f"not {member_onnx(i)!r}")
    return doc


ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
               9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}


def model_io(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Graph inputs (initializers excluded) and outputs: name, shape (a symbolic dim as its
    name), dtype. Reads the graph only, never the external data."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def one(v: Any) -> dict[str, Any]:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        return {"name": v.name, "shape": dims, "dtype": ONNX_DTYPES.get(t.elem_type, str(t.elem_type))}

    return {"inputs": [one(v) for v in model.graph.input if v.name not in inits],
            "outputs": [one(v) for v in model.graph.output]}


MULTI_SOC_MIN_QNN = (2, 48)
SHARING_MIN_HTP = 73


def check_build_support(target: Any, toolchain: str, *, group: bool, llm: bool = False) -> None:
    """Refuse, before anything is written, what the QNN toolchain can't build: weight sharing
    (a group) below HTP v73 or for another backend; a multi-SoC target on QNN < 2.48, for
    another backend, or combined with sharing (the QNN EP documents the two as exclusive).
    ``llm``: the groups are an LLM's parts (farm build --genai): the refusal speaks of them,
    not of --graph, which the user did not give."""
    from farm.core.errors import MultiSocUnsupportedError, SharingUnsupportedError
    from farm.core.keys import parse_version

    if getattr(target, "multi_soc", False):
        if target.backend != "qnn":
            raise MultiSocUnsupportedError(f"{target.ref}: multi-SoC builds are QNN only")
        if parse_version(toolchain)[:2] < MULTI_SOC_MIN_QNN:
            raise MultiSocUnsupportedError(
                f"{target.ref} needs QNN >= 2.48 for one context binary serving several SoCs; "
                f"this build's toolchain is QNN {toolchain}",
                hint="build it with QNN 2.48 or newer (--qnn 2.51.0), or one build per SoC "
                     f"({' '.join('-t qnn:' + s for s in target.socs)})")
        if group:
            what = "an LLM's parts (weight-shared groups)" if llm else "a weight-shared graph group"
            raise SharingUnsupportedError(
                f"{target.ref}: {what} can't also be a multi-SoC build "
                "(the QNN EP documents shared contexts and multi-SoC binaries as exclusive)",
                hint=f"build it once per SoC: {' '.join('-t qnn:' + s for s in target.socs)}")
    if group:
        if target.backend != "qnn":
            raise SharingUnsupportedError(f"{target.ref}: " + ("an LLM's parts are weight-shared QNN groups: QNN only"
                                                               if llm else "weight-shared graph groups are QNN only"))
        arch = target.htp_arch_number
        if arch is None or arch < SHARING_MIN_HTP:
            v73 = "SM8550, SC8380XP, SM8650, SM8750, SM8850"
            raise SharingUnsupportedError(
                f"{target.ref} is HTP {target.htp_arch or 'unknown'}: "
                + ("an LLM's parts build as weight-shared groups, and " if llm else "")
                + "shared weights need HTP v73 or newer (the QNN link step fails with 'does not support shared weights')",
                hint=(f"an LLM package needs a v73+ target: {v73}" if llm else
                      f"build the graphs one by one for this SoC (no --graph), or pick a v73+ target: {v73}"))


def group_listing(members: list[tuple[str, str, list[dict[str, Any]]]]) -> tuple[bytes, str, list[dict[str, Any]]]:
    """(group.json, group digest, snapshot listing) of a group from its members' recorded
    snapshots: (graph name, model digest, that model's listing: ``model.onnx`` first, then its
    external data). The same digest ``inspect_group`` computes from the files themselves, so a
    group assembled by the service from uploaded members is the group a CLI builds locally."""
    check_members([(n, "") for n, _, _ in members])
    desc = canonical_json(descriptor([(n, d) for n, d, _ in members]))
    entry: dict[str, Any] = {"path": GROUP_FILE, "digest": sha256_bytes(desc), "size": len(desc)}
    listing: list[dict[str, Any]] = [entry]
    for i, (_, _, files) in enumerate(members):
        head, rest = files[0], files[1:]
        listing.append({"path": member_onnx(i), "digest": head["digest"], "size": int(head["size"])})
        listing += [{"path": f"{member_dir(i)}/{f['path']}", "digest": f["digest"], "size": int(f["size"])}
                    for f in rest]
    digest = bundle_digest(entry["digest"], [(f["path"], f["digest"]) for f in listing[1:]])
    return desc, digest, listing
