"""Read an EPContext model back: context node attributes, node placement, file references.

Shared by every backend; uses ``onnx`` only.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from farm.core.errors import ToolchainError

EPCONTEXT_ATTRS = ("source", "ep_sdk_version", "embed_mode", "partition_name", "main_context",
                   "ep_cache_context", "hardware_architecture", "onnx_model_filename")


def read_epcontext(ctx_model: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(EPContext node attributes, placement) of a context model written by an EP."""
    import onnx

    model = onnx.load(str(ctx_model), load_external_data=False)
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
    placement = {"ep_nodes": len(nodes), "cpu_nodes": len(other), "cpu_op_types": sorted(set(other))}
    return nodes, placement


def _embedded(node: Any) -> bool:
    for a in node.attribute:
        if a.name == "embed_mode":
            return bool(a.i)
    return True  # the ONNX contrib-op default embed_mode is 1


def referenced_files(nodes: list[dict[str, Any]], out_dir: Path) -> list[str]:
    """Relative files the context model points at; each must stay inside ``out_dir`` and exist."""
    root = out_dir.resolve()
    names: list[str] = []
    for attrs in nodes:
        if attrs.get("embed_mode", 1) != 0:
            continue
        rel = str(attrs.get("ep_cache_context", ""))
        pure = PurePosixPath(rel.replace("\\", "/"))
        if not rel or pure.is_absolute() or ".." in pure.parts:
            raise ToolchainError(f"EPContext points outside its directory: {rel!r}")
        resolved = (root / pure).resolve()
        if root not in resolved.parents:
            raise ToolchainError(f"EPContext points outside its directory: {rel!r}")
        if not resolved.is_file():
            raise ToolchainError(f"EPContext references {rel!r}, which the EP did not write")
        if str(pure) not in names:
            names.append(str(pure))
    return names
