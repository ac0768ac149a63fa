"""Model bundle inspection: is it ONNX, where does its external data live, what is its digest.

Uses ``onnx`` (protobuf parsing and the checker), never onnxruntime. Everything here runs
before any row or blob is written, so bad input leaves the registry untouched.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.core.errors import InvalidModelError
from farm.core.keys import bundle_digest, sha256_bytes, sha256_file
from farm.core.names import UnsafePathError, UnusablePathError, canonical_relative, input_file, inside


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
        """The file's stem, for display only (never a path)."""
        return self.path.stem

    def files_json(self) -> list[dict[str, Any]]:
        """The snapshot listing: the .onnx under its fixed name, then each data file."""
        return [{"path": ONNX_NAME, "digest": self.onnx.digest, "size": self.onnx.size}] + [
            {"path": f.path, "digest": f.digest, "size": f.size} for f in self.external
        ]

    def sources(self) -> list[tuple[dict[str, Any], Path]]:
        """(listing entry, the file it was hashed from): uploads read exactly these paths and
        the store checks each digest, so a file changed after hashing is refused."""
        entries = self.files_json()
        return [(entries[0], self.path)] + [(e, inside(self.root, e["path"])) for e in entries[1:]]


ONNX_NAME = "model.onnx"  # the fixed name of the .onnx in every snapshot and job dir
MAX_EXTERNAL_FILES = 4096
# Where an ONNX tensor's external data lives is the value of this key among its ``external_data``
# key/value strings: a model whose bytes hold no such key names no external-data file.
EXTERNAL_KEY = b"location"


def names_no_external_data(data: bytes) -> bool:
    """True when a serialized model can't reference an external-data file: ``location`` occurs
    nowhere in its bytes. (A model whose bytes hold it anyway, in a name, a doc string or a
    weight, is only inspected in full: False never means it has external data.)"""
    return EXTERNAL_KEY not in data


def match_recorded(path: Path, onnx_digest: str, onnx_size: int,
                   recorded: list[tuple[str, list[dict[str, Any]]]]) -> ModelBundle | None:
    """The bundle at ``path`` when it is one the index already recorded, else None (inspect it).

    ``recorded``: (bundle digest, snapshot listing) of every model whose .onnx has
    ``onnx_digest``, the sha256 of the bytes at ``path``. The same .onnx bytes name the same
    external-data locations, offsets and lengths, all validated by ``inspect_model`` when the
    model was first recorded, so the .onnx is not parsed again. What is checked again, here:
    each recorded data file is a regular file that stays inside the model's directory after
    symlinks (``inside``) and hashes to its recorded digest. A data file changed, missing or
    moved outside makes no match, and the caller inspects the bundle in full."""
    for digest, files in recorded:
        external = []
        for f in files[1:]:
            try:
                p = inside(path.parent, str(f["path"]))
                if not p.is_file() or sha256_file(p)[0] != f["digest"]:
                    break
            except (UnsafePathError, OSError):
                break
            external.append(BundleFile(f["path"], f["digest"], int(f["size"])))
        else:
            return ModelBundle(path=path.absolute(), digest=digest, onnx=BundleFile("", onnx_digest, onnx_size),
                               external=tuple(external))
    return None


def inspect_model(path: str | os.PathLike[str]) -> ModelBundle:
    """Validate an ONNX model bundle and compute its digest. Raises InvalidModelError.

    The bundle root is the directory of ``path`` as given (where onnxruntime looks for external
    data). Every external-data location must be a canonical relative POSIX path to a regular
    file that, after symlinks, stays inside that root; offsets and lengths must be non-negative
    integers inside the file. The compile never reads these files: it reads the snapshot of
    them stored by digest (``farm.pipeline``), so what was hashed is what is compiled.
    """
    import onnx

    p = Path(path)
    model_file(p)
    try:
        data = p.read_bytes()
    except OSError as exc:  # changed since it was checked
        raise InvalidModelError(f"{p}: cannot read the model ({exc.strerror or exc})") from None
    if not data:
        raise InvalidModelError(f"{p}: empty file, not an ONNX model")
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # protobuf raises DecodeError, RuntimeError, ValueError, even SystemError
        kind = "truncated or corrupt ONNX file" if data[:1] == b"\x08" else "not an ONNX file"
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InvalidModelError(
            f"{p}: {kind} ({detail})", hint="check the upload finished and the file is a .onnx ModelProto"
        ) from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise InvalidModelError(f"{p}: not an ONNX file (no ir_version or no graph)")
    if not model.graph.node:
        raise InvalidModelError(f"{p}: the graph has no nodes")

    root = p.parent
    external: dict[str, BundleFile] = {}
    for info in _external_infos(model, p):
        rel = info["location"]
        if rel not in external:
            ext_path = _resolve_inside(root, rel, p)
            digest, size = hashed_file(ext_path)
            external[rel] = BundleFile(rel, digest, size)
        _check_range(info, external[rel].size, p)
        if len(external) > MAX_EXTERNAL_FILES:
            raise InvalidModelError(f"{p}: more than {MAX_EXTERNAL_FILES} external data files")

    try:
        # The path form lets the checker read external data and models over 2 GB; every
        # location was validated above, so the checker reads only files inside the bundle.
        onnx.checker.check_model(str(p))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
        raise InvalidModelError(f"{p}: ONNX checker rejected the model: {first[:300]}") from None
    except Exception as exc:
        raise InvalidModelError(f"{p}: ONNX checker failed on the model: {str(exc)[:300]}") from None

    onnx_digest = sha256_bytes(data)
    digest = bundle_digest(onnx_digest, [(f.path, f.digest) for f in external.values()])
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return ModelBundle(
        path=p.absolute(),
        digest=digest,
        onnx=BundleFile("", onnx_digest, len(data)),
        external=tuple(sorted(external.values(), key=lambda f: f.path)),
        opset=opset,
        node_count=len(model.graph.node),
        op_types=tuple(sorted({n.op_type for n in model.graph.node})),
    )


_HASHED: dict[tuple[Any, ...], str] = {}
_HASHED_LOCK = threading.Lock()
HASHED_MAX = 256
# A file written this recently may change again within its filesystem's timestamp granularity
# without its mtime moving ("racy git"): hashed, but not remembered.
RACY_NS = 1_000_000_000


def _stat_key(path: Path) -> tuple[Any, ...]:
    st = os.stat(path)
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def hashed_file(path: Path) -> tuple[str, int]:
    """``sha256_file``, remembered in this process by the file's stat (path, inode, size, mtime,
    ctime), as git's index remembers what it hashed: an external-data file that a prefill and a
    decode graph share, or that a check reads again a moment later, is read once per call. A
    file that changed while it was hashed, or had changed within a second before, is not
    remembered. What is remembered only names the
    bundle: the store hashes every byte it takes and refuses a file whose digest differs
    (``registry.store``), and the compile reads that stored copy."""
    try:
        key = _stat_key(path)
    except OSError:
        return sha256_file(path)
    with _HASHED_LOCK:
        digest = _HASHED.get(key)
    if digest is not None:
        return digest, int(key[3])
    began = time.time_ns()
    digest, size = sha256_file(path)
    try:
        same = _stat_key(path) == key and size == key[3] and key[4] < began - RACY_NS
    except OSError:
        same = False
    if same:
        with _HASHED_LOCK:
            if len(_HASHED) >= HASHED_MAX:
                _HASHED.clear()
            _HASHED[key] = digest
    return digest, size


def model_file(p: Path) -> os.stat_result:
    """The stat of the .onnx a user named, or ``invalid-model`` saying why it can't be read as
    one: no such file, a dangling symlink, a symlink loop, a folder, FIFO or device, permission
    denied, a name the OS refuses (``farm.core.names.input_file``)."""
    try:
        return input_file(p)
    except UnusablePathError as exc:
        if exc.missing:
            raise InvalidModelError(f"{p}: no such file") from None
        raise InvalidModelError(f"{p}: can't be read as a model: {exc.reason}",
                                hint="give the path of a readable regular .onnx file (symlinks are followed)") from None


def _tensors(model):  # type: ignore[no-untyped-def]
    from onnx.external_data_helper import _get_all_tensors

    return _get_all_tensors(model)


_HINT = "external data must be relative files beside the model (onnx.save(..., location='x.data'))"


def _external_infos(model, model_path: Path) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """Each external tensor's location (canonical), offset and length, validated."""
    import onnx

    out: list[dict[str, Any]] = []
    for tensor in _tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        raw = info.get("location", "")
        try:
            rel = str(canonical_relative(raw))
        except UnsafePathError as exc:
            raise InvalidModelError(f"{model_path}: external data location {raw[:120]!r} is refused: {exc}",
                                    hint=_HINT) from None
        if rel == ONNX_NAME:
            raise InvalidModelError(f"{model_path}: external data may not be named {ONNX_NAME!r}", hint=_HINT)
        entry: dict[str, Any] = {"tensor": tensor.name, "location": rel}
        for key in ("offset", "length"):
            value = info.get(key)
            if value is None or value == "":
                continue
            if not value.isascii() or not value.isdigit():
                raise InvalidModelError(
                    f"{model_path}: external data {key} {value[:40]!r} of tensor {tensor.name[:80]!r} is not a "
                    "non-negative integer", hint=_HINT)
            entry[key] = int(value)
        out.append(entry)
    return out


def _resolve_inside(root: Path, rel: str, model_path: Path) -> Path:
    """A data file must stay inside the model's directory, symlinks resolved, and be a file."""
    try:
        target = inside(root, rel)
    except UnusablePathError as exc:
        raise InvalidModelError(f"{model_path}: external data file {rel!r} can't be read: {exc.reason}",
                                hint=_HINT) from None
    except UnsafePathError:
        raise InvalidModelError(
            f"{model_path}: external data {rel!r} points outside the model directory", hint=_HINT
        ) from None
    try:
        input_file(target)
    except UnusablePathError as exc:
        if exc.missing:
            raise InvalidModelError(f"{model_path}: external data file {rel!r} is missing", hint=_HINT) from None
        raise InvalidModelError(f"{model_path}: external data file {rel!r} can't be read: {exc.reason}",
                                hint=_HINT) from None
    return target


def _check_range(info: dict[str, Any], size: int, model_path: Path) -> None:
    offset = int(info.get("offset", 0))
    length = info.get("length")
    end = offset + (int(length) if length is not None else 0)
    if offset > size or end > size:
        raise InvalidModelError(
            f"{model_path}: external data for tensor {str(info['tensor'])[:80]!r} runs past the end of "
            f"{info['location']!r} ({offset}+{length or 0} > {size} bytes): truncated data file"
        )
