"""Read an EPContext model back: context node attributes, node placement, file references.

Shared by every backend; uses ``onnx`` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from farm.core.errors import InvalidModelError, NotAContextError, NotFoundError, ToolchainError

EPCONTEXT_ATTRS = ("source", "ep_sdk_version", "embed_mode", "partition_name", "main_context",
                   "ep_cache_context", "hardware_architecture", "onnx_model_filename")


COMPAT_PREFIX = "ep_compatibility_info."


def read_epcontext(ctx_model: Path, model: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(EPContext node attributes, placement) of a context model written by an EP (``model``:
    the ModelProto when already loaded)."""
    nodes, placement, _compat = read_context(ctx_model, model)
    return nodes, placement


def read_context(ctx_model: Path, model: Any = None
                 ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    """``read_epcontext`` and the EP's own compatibility strings, from one read of the model:
    ``{"QNNExecutionProvider": "v2:6:2.51.0:..."}`` from its ``ep_compatibility_info.<EP>``
    metadata (what onnxruntime's ``GetCompiledModelCompatibilityInfo`` returns, and what an ORT
    model package's variant gives as its ``compatibility_string``); {} where the EP wrote none."""
    import onnx

    if model is None:
        model = onnx.load(str(ctx_model), load_external_data=False)
    nodes, placement = _placement(model)
    return nodes, placement, compatibility_info({p.key: p.value for p in model.metadata_props})


def compatibility_info(metadata: dict[str, str]) -> dict[str, str]:
    """EP name -> compatibility string, from a context model's metadata_props."""
    return {k.removeprefix(COMPAT_PREFIX): v for k, v in sorted(metadata.items())
            if k.startswith(COMPAT_PREFIX) and len(k) > len(COMPAT_PREFIX)}


def _placement(model: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import onnx

    nodes: list[dict[str, Any]] = []
    other: list[str] = []
    for node in model.graph.node:
        if node.op_type == "EPContext":
            attrs: dict[str, Any] = {}
            for a in node.attribute:
                if a.name not in EPCONTEXT_ATTRS:
                    continue
                value = onnx.helper.get_attribute_value(a)
                if isinstance(value, bytes):
                    embedded = a.name == "ep_cache_context" and _embedded(node)
                    value = f"<{len(value)} bytes embedded>" if embedded else value.decode("utf-8", "replace")
                attrs[a.name] = value
            nodes.append(attrs)
        else:
            other.append(node.op_type)
    # cpu_op_counts: how many nodes of each op type stayed on the CPU (partial offload, shown by
    # build, resolve, show and coverage).
    placement = {"ep_nodes": len(nodes), "cpu_nodes": len(other), "cpu_op_types": sorted(set(other)),
                 "cpu_op_counts": {op: other.count(op) for op in sorted(set(other))}}
    return nodes, placement


def _embedded(node: Any) -> bool:
    for a in node.attribute:
        if a.name == "embed_mode":
            return bool(a.i)
    return True  # the ONNX contrib-op default embed_mode is 1


def referenced_files(nodes: list[dict[str, Any]], out_dir: Path) -> list[str]:
    """Relative files the context model points at; each must stay inside ``out_dir`` and exist."""
    names: list[str] = []
    for rel, resolved in _context_files(nodes, out_dir.resolve()):
        if resolved is None:
            raise ToolchainError(f"EPContext points outside its directory: {rel!r}")
        if not resolved.is_file():
            raise ToolchainError(f"EPContext references {rel!r}, which the EP did not write")
        names.append(rel)
    return names


def _context_files(nodes: list[dict[str, Any]], root: Path) -> list[tuple[str, Path | None]]:
    """Each file the EPContext nodes name (``ep_cache_context`` of ``embed_mode=0``), once:
    its relative name and where it resolves under ``root``; None where it would leave ``root``."""
    out: dict[str, Path | None] = {}
    for attrs in nodes:
        if attrs.get("embed_mode", 1) != 0:
            continue
        if attrs.get("main_context") == 0 and "ep_cache_context" not in attrs:
            # A second partition of the same model (the EP split it around a CPU op): its graph
            # is in the binary its main node names; the QNN EP writes no ep_cache_context here.
            continue
        rel = str(attrs.get("ep_cache_context", ""))
        pure = PurePosixPath(rel.replace("\\", "/"))
        resolved = (root / pure).resolve()
        inside = bool(rel) and not pure.is_absolute() and ".." not in pure.parts and root in resolved.parents
        out.setdefault(str(pure) if inside else rel, resolved if inside else None)
    return list(out.items())


@dataclass
class ContextModel:
    """A context model as a device finds it on disk, read before any runtime sees it."""

    path: Path
    nodes: list[dict[str, Any]]  # EPContext attributes, as read_epcontext gives them
    placement: dict[str, Any]
    metadata: dict[str, str]  # the model's metadata_props (ep_compatibility_info.<EP>, ...)
    files: list[str]  # context files beside the model (embed_mode=0), relative names
    embedded: list[bytes] = field(default_factory=list, repr=False)  # contexts inside the model

    @property
    def sources(self) -> list[str]:
        """The EPs that wrote the EPContext nodes (``QNNExecutionProvider``, ...)."""
        return sorted({str(n.get("source", "")) for n in self.nodes if n.get("source")})

    def context_head(self, size: int = 4 << 20) -> bytes:
        """The first ``size`` bytes of the first context binary, beside the model or embedded."""
        if self.files:
            with open(self.path.parent / self.files[0], "rb") as f:
                return f.read(size)
        return self.embedded[0][:size] if self.embedded else b""


def open_context(ctx_model: Path) -> ContextModel:
    """Read a context model the way a runtime is about to load it, and name what would stop it:
    the file is missing (not-found), not ONNX (invalid-model), has no EPContext node
    (not-a-context: a plain model would be compiled on the spot, not loaded), or points at a
    context file that is not beside it (not-found, naming that file)."""
    import onnx
    from google.protobuf.message import DecodeError

    where = "after `farm fetch --out DIR` it is DIR/model_ctx.onnx"
    if not ctx_model.exists():
        raise NotFoundError(f"{ctx_model} does not exist", hint=f"give the path of a *_ctx.onnx: {where}")
    if not ctx_model.is_file():
        raise NotFoundError(f"{ctx_model} is not a file", hint=f"give the path of a *_ctx.onnx, not a directory: {where}")
    try:
        model = onnx.load(str(ctx_model), load_external_data=False)
    except (DecodeError, ValueError, OSError) as exc:
        raise InvalidModelError(f"{ctx_model} is not an ONNX model ({type(exc).__name__}: {str(exc)[:200]})",
                                hint=f"load-check takes the *_ctx.onnx a build wrote: {where}") from None
    nodes, placement = read_epcontext(ctx_model, model)
    if not nodes:
        raise NotAContextError(
            f"{ctx_model} has no EPContext node ({placement['cpu_nodes']} ordinary nodes): it is a plain ONNX "
            "model, which a runtime would compile on the spot rather than load from a context",
            hint="build it first (farm build MODEL -t TARGET), then check the model_ctx.onnx that "
                 "`farm fetch --out DIR` writes")
    embedded = [onnx.helper.get_attribute_value(a) for n in model.graph.node if n.op_type == "EPContext"
                for a in n.attribute if a.name == "ep_cache_context" and _embedded(n)]
    root = ctx_model.resolve().parent
    files: list[str] = []
    for rel, resolved in _context_files(nodes, root):
        if resolved is None:
            raise InvalidModelError(f"{ctx_model.name} points at {rel!r} (ep_cache_context), outside its directory",
                                    hint="a context model must name its context files relative to itself")
        if not resolved.is_file():
            raise NotFoundError(
                f"{ctx_model.name} points at {rel} (EPContext ep_cache_context), which is not in {root}",
                hint=f"the context file must sit beside the model: put {rel} in {root} "
                     "(`farm fetch --out DIR` places model_ctx.onnx and its .bin together)")
        files.append(rel)
    metadata = {p.key: p.value for p in model.metadata_props}
    return ContextModel(ctx_model, nodes, placement, metadata, files, [bytes(b) for b in embedded])
