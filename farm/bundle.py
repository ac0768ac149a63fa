"""Model bundle inspection: is it ONNX, where does its external data live, what is its digest.

Uses ``onnx`` (protobuf parsing and the checker), never onnxruntime. Everything here runs
before any row or blob is written, so bad input leaves the registry untouched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from farm.errors import InvalidModelError
from farm.keys import bundle_digest, sha256_file


@dataclass(frozen=True)
class BundleFile:
    path: str  # relative to the bundle root; "" for the .onnx itself
    digest: str
    size: int


@dataclass(frozen=True)
class ModelBundle:
    path: Path  # the .onnx file
    digest: str
    onnx: BundleFile
    external: tuple[BundleFile, ...] = field(default_factory=tuple)
    opset: int = 0
    node_count: int = 0
    op_types: tuple[str, ...] = field(default_factory=tuple)

    @property
    def root(self) -> Path:
        return self.path.parent

    @property
    def size(self) -> int:
        return self.onnx.size + sum(f.size for f in self.external)

    @property
    def stem(self) -> str:
        return self.path.stem

    def files_json(self) -> list[dict[str, Any]]:
        return [{"path": self.path.name, "digest": self.onnx.digest, "size": self.onnx.size}] + [
            {"path": f.path, "digest": f.digest, "size": f.size} for f in self.external
        ]


def inspect_model(path: str | os.PathLike[str]) -> ModelBundle:
    """Validate an ONNX model bundle and compute its digest. Raises InvalidModelError."""
    import onnx
    from google.protobuf.message import DecodeError

    p = Path(path)
    if not p.exists():
        raise InvalidModelError(f"{p}: no such file")
    if not p.is_file():
        raise InvalidModelError(f"{p}: not a regular file")
    data = p.read_bytes()
    if not data:
        raise InvalidModelError(f"{p}: empty file, not an ONNX model")
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        # A ModelProto starts with field 1 (ir_version, varint): tag byte 0x08.
        kind = "truncated or corrupt ONNX file" if data[:1] == b"\x08" else "not an ONNX file"
        raise InvalidModelError(
            f"{p}: {kind} ({exc})", hint="check the upload finished and the file is a .onnx ModelProto"
        ) from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise InvalidModelError(f"{p}: not an ONNX file (no ir_version or no graph)")
    if not model.graph.node:
        raise InvalidModelError(f"{p}: the graph has no nodes")

    root = p.parent.resolve()
    external: dict[str, BundleFile] = {}
    for rel in _external_locations(model):
        ext_path = _resolve_inside(root, rel, p)
        if rel not in external:
            digest, size = sha256_file(ext_path)
            external[rel] = BundleFile(rel, digest, size)
    _check_external_ranges(model, root)

    try:
        # The path form lets the checker read external data and models over 2 GB.
        onnx.checker.check_model(str(p))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
        raise InvalidModelError(f"{p}: ONNX checker rejected the model: {first}") from None

    onnx_digest, onnx_size = sha256_file(p)
    digest = bundle_digest(onnx_digest, [(f.path, f.digest) for f in external.values()])
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return ModelBundle(
        path=p.resolve(),
        digest=digest,
        onnx=BundleFile("", onnx_digest, onnx_size),
        external=tuple(sorted(external.values(), key=lambda f: f.path)),
        opset=opset,
        node_count=len(model.graph.node),
        op_types=tuple(sorted({n.op_type for n in model.graph.node})),
    )


def _tensors(model):  # type: ignore[no-untyped-def]
    from onnx.external_data_helper import _get_all_tensors

    return _get_all_tensors(model)


def _external_locations(model) -> list[str]:  # type: ignore[no-untyped-def]
    import onnx

    out: list[str] = []
    for tensor in _tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            out.append(info.get("location", ""))
    return out


def _resolve_inside(root: Path, rel: str, model_path: Path) -> Path:
    """A data file must be a relative path that stays inside the model's directory."""
    hint = "external data must be relative files beside the model (onnx.save(..., location='x.data'))"
    if not rel:
        raise InvalidModelError(f"{model_path}: external tensor without a location", hint=hint)
    pure = PurePosixPath(rel.replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts or rel.startswith(("/", "\\")) or ":" in pure.parts[0]:
        raise InvalidModelError(
            f"{model_path}: external data {rel!r} points outside the model directory", hint=hint
        )
    target = (root / pure).resolve()
    if root != target and root not in target.parents:
        # A symlink that leaves the directory is as bad as '..'.
        raise InvalidModelError(
            f"{model_path}: external data {rel!r} points outside the model directory", hint=hint
        )
    if not target.is_file():
        raise InvalidModelError(f"{model_path}: external data file {rel!r} is missing", hint=hint)
    return target


def _check_external_ranges(model, root: Path) -> None:  # type: ignore[no-untyped-def]
    import onnx

    for tensor in _tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        size = (root / info["location"]).stat().st_size
        offset = int(info.get("offset", 0) or 0)
        length = int(info.get("length", 0) or 0)
        if offset + length > size:
            raise InvalidModelError(
                f"external data for tensor {tensor.name!r} runs past the end of {info['location']!r} "
                f"({offset}+{length} > {size} bytes): truncated data file"
            )
