"""What a QNN context binary says about itself, read through the QNN System API
(``libQnnSystem.so``: ``QnnSystemContext_getBinaryInfo``), as Qualcomm's
``qnn-context-binary-utility`` does: the graphs, their inputs and outputs (names, shapes, data
types), the SDK build, the SoC model and the sizes. No backend is created and nothing is loaded.

Run in the compile child, with the ``libQnnSystem.so`` of the toolchain that built the binary.
Imports no onnxruntime; ctypes only.

Layouts (QNN headers ``System/QnnSystemInterface.h``, ``System/QnnSystemContext.h``,
``QnnTypes.h``; 64-bit):

- ``QnnSystemInterface_t``: backendId u32 @0, providerName char* @8, systemApiVersion
  {major, minor, patch} u32 @16, then the function table @32: systemContextCreate,
  systemContextGetBinaryInfo, systemContextGetMetadata, systemContextFree, ...
- ``QnnSystemContext_BinaryInfo_t``: version u32 @0, union @8. V1/V2: backendId u32 @0, buildId
  char* @8, coreApiVersion @16, backendApiVersion @28, socVersion char* @40, hwInfoBlobVersion
  @48, contextBlobVersion @60, hwInfoBlobSize u32 @72, hwInfoBlob @80, contextBlobSize u64 @88,
  numContextTensors @96, contextTensors @104, numGraphs @112, graphs @120 (V2: platformInfo
  @128). V3 drops hwInfoBlob*: contextBlobVersion @48, contextBlobSize u64 @64,
  numContextTensors @72, contextTensors @80, numGraphs @88, graphs @96, platformInfo @104,
  contextMetadataSize @112, contextMetadata @120, socModel u32 @128.
- ``QnnSystemContext_GraphInfo_t``: version u32 @0, union @8 of V1 (graphName, numGraphInputs,
  graphInputs, numGraphOutputs, graphOutputs), V2 (+ updateable tensors), V3 (+ graphBlobInfo,
  start/end op index): the largest (V3) is 80 bytes, so the array stride is 88.
- ``Qnn_Tensor_t``: version u32 @0, union @8 of V1/V2 sharing id u32 @0, name char* @8, type
  @16, dataFormat @20, dataType @24, quantizeParams (40 bytes) @32, rank u32 @72, dimensions
  u32* @80; V2 (136 bytes) is the largest, so the array stride is 144.

Measured on QNN 2.51.0 (System API 1.15.0): BinaryInfo V3 with socModel, GraphInfo V3, Tensor V1;
the strides are checked on every read (each graph's version and name, each tensor's version and
name must make sense), and anything off raises ``DescriptionError`` rather than guessing.
"""

from __future__ import annotations

import ctypes as C
from typing import Any

GRAPH_STRIDE = 88
TENSOR_STRIDE = 144
MAX_GRAPHS = 4096
MAX_TENSORS = 65536
MAX_RANK = 16

# Qnn_DataType_t (QnnTypes.h): the low byte is the width in decimal digits read as hex.
DATA_TYPES = {
    0x0008: "int8", 0x0016: "int16", 0x0032: "int32", 0x0064: "int64",
    0x0108: "uint8", 0x0116: "uint16", 0x0132: "uint32", 0x0164: "uint64",
    0x0216: "float16", 0x0232: "float32", 0x0264: "float64",
    0x0304: "sfixed4", 0x0308: "sfixed8", 0x0316: "sfixed16", 0x0332: "sfixed32",
    0x0404: "ufixed4", 0x0408: "ufixed8", 0x0416: "ufixed16", 0x0432: "ufixed32",
    0x0508: "bool8",
}


class DescriptionError(RuntimeError):
    """The binary or the library did not give a description that reads consistently."""


def _u32(addr: int) -> int:
    return int(C.c_uint32.from_address(addr).value)


def _u64(addr: int) -> int:
    return int(C.c_uint64.from_address(addr).value)


def _ptr(addr: int) -> int:
    return int(C.c_void_p.from_address(addr).value or 0)


def _str(addr: int, what: str) -> str:
    p = _ptr(addr)
    if not p:
        return ""
    raw = C.string_at(p, 4096).split(b"\0", 1)[0]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DescriptionError(f"{what} is not UTF-8 text: the struct layout does not match") from None
    if any(ord(c) < 32 for c in text):
        raise DescriptionError(f"{what} has control characters: the struct layout does not match")
    return text


def _tensor(addr: int) -> dict[str, Any]:
    version = _u32(addr)
    if version not in (1, 2):
        raise DescriptionError(f"tensor version {version}: the layout does not match")
    body = addr + 8
    rank = _u32(body + 72)
    if rank > MAX_RANK:
        raise DescriptionError(f"tensor rank {rank}: the layout does not match")
    dims_ptr = _ptr(body + 80)
    dims = [_u32(dims_ptr + 4 * i) for i in range(rank)] if dims_ptr else []
    code = _u32(body + 24)
    return {"name": _str(body + 8, "tensor name"), "shape": dims,
            "dtype": DATA_TYPES.get(code, f"0x{code:04x}")}


def _tensors(array: int, count: int) -> list[dict[str, Any]]:
    if count > MAX_TENSORS or (count and not array):
        raise DescriptionError(f"{count} tensors at {array:#x}: the layout does not match")
    return [_tensor(array + i * TENSOR_STRIDE) for i in range(count)]


def _graphs(array: int, count: int) -> list[dict[str, Any]]:
    if count > MAX_GRAPHS or (count and not array):
        raise DescriptionError(f"{count} graphs at {array:#x}: the layout does not match")
    out = []
    for i in range(count):
        g = array + i * GRAPH_STRIDE
        version = _u32(g)
        if version not in (1, 2, 3):
            raise DescriptionError(f"graph {i} has version {version}: the layout does not match")
        body = g + 8
        out.append({"name": _str(body, "graph name"), "version": version,
                    "inputs": _tensors(_ptr(body + 16), _u32(body + 8)),
                    "outputs": _tensors(_ptr(body + 32), _u32(body + 24))})
    return out


def describe_file(library: str, path: str) -> dict[str, Any]:
    """``describe`` of a file, mapped (copy-on-write) rather than read: a multi-GiB binary costs
    page cache, not a second copy in this process. A multi-SoC binary (QNN >= 2.48,
    ``soc_model="57,69"``) is a ZIP container (stored, not compressed) of one HTP cache per SoC
    (``htp.cache.sm8650.0``, ...) beside shared weights and metadata; getBinaryInfo reads each
    cache, not the container (measured, QNN 2.51.0), so each is described on its own."""
    import mmap

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mm:
        if mm[:4] == b"PK\x03\x04":
            return _describe_container(library, path, mm)
        view = (C.c_char * len(mm)).from_buffer(mm)
        try:
            out = describe(library, C.addressof(view), len(mm))
        finally:
            del view  # the mapping can close only once no ctypes object exports it
    return out


def _describe_container(library: str, path: str, mm: Any) -> dict[str, Any]:
    import struct
    import zipfile

    try:
        entries = zipfile.ZipFile(path).infolist()
    except zipfile.BadZipFile as exc:
        raise DescriptionError(f"a ZIP-like context binary that is no ZIP: {exc}") from None
    caches: dict[str, Any] = {}
    for e in entries:
        if not e.filename.startswith("htp.cache."):
            continue
        o = e.header_offset
        if e.compress_type != zipfile.ZIP_STORED or o + 30 > len(mm):
            raise DescriptionError(f"container entry {e.filename!r} is compressed or out of bounds")
        n, extra = struct.unpack("<HH", mm[o + 26:o + 30])
        start = o + 30 + n + extra
        if start + e.file_size > len(mm):
            raise DescriptionError(f"container entry {e.filename!r} runs past the end of the file")
        caches[e.filename] = describe(library, bytes(mm[start:start + e.file_size]))
    if not caches:
        raise DescriptionError("a multi-SoC container without any htp.cache.* entry")
    names = {f: sorted(g["name"] for g in d["graphs"]) for f, d in caches.items()}
    first = next(iter(caches.values()))
    if any(v != names[next(iter(names))] for v in names.values()):
        raise DescriptionError(f"the per-SoC caches hold different graphs: {names}")
    return {**{k: v for k, v in first.items() if k not in ("soc_model", "file_size")},
            "container": "multi-soc", "file_size": len(mm),
            "entries": [{"name": e.filename, "size": e.file_size} for e in entries],
            "soc_model": None, "soc_models": sorted(d["soc_model"] for d in caches.values() if d["soc_model"]),
            "caches": {f: {k: v for k, v in d.items() if k != "graphs"} for f, d in caches.items()}}


def describe(library: str, binary: Any, size: int | None = None) -> dict[str, Any]:
    """The description of one context binary (``bytes``, or the address of ``size`` bytes; see
    the module docstring for what is read)."""
    _keep = None  # the copy of ``bytes`` lives as long as the call
    if isinstance(binary, bytes):
        size = len(binary)
        _keep = C.create_string_buffer(binary, size)
        binary = C.addressof(_keep)
    assert size is not None
    lib = C.CDLL(library)
    providers = C.POINTER(C.c_void_p)()
    count = C.c_uint32()
    get_providers = lib.QnnSystemInterface_getProviders
    get_providers.restype = C.c_uint64
    rc = get_providers(C.byref(providers), C.byref(count))
    if rc != 0 or count.value < 1:
        raise DescriptionError(f"QnnSystemInterface_getProviders returned {rc} ({count.value} providers)")
    iface = int(providers[0] or 0)
    api = [_u32(iface + 16 + 4 * i) for i in range(3)]
    if api[0] != 1:
        raise DescriptionError(f"System API {'.'.join(map(str, api))}: only 1.x is read here")
    create = C.CFUNCTYPE(C.c_uint64, C.POINTER(C.c_void_p))(_ptr(iface + 32))
    get_info = C.CFUNCTYPE(C.c_uint64, C.c_void_p, C.c_void_p, C.c_uint64, C.POINTER(C.c_void_p),
                           C.POINTER(C.c_uint64))(_ptr(iface + 40))
    free = C.CFUNCTYPE(C.c_uint64, C.c_void_p)(_ptr(iface + 56))
    handle = C.c_void_p()
    rc = create(C.byref(handle))
    if rc != 0:
        raise DescriptionError(f"QnnSystemContext_create returned {rc}")
    try:
        info = C.c_void_p()
        info_size = C.c_uint64()
        rc = get_info(handle, C.c_void_p(binary), size, C.byref(info), C.byref(info_size))
        if rc != 0 or not info.value:
            raise DescriptionError(f"QnnSystemContext_getBinaryInfo returned {rc}: not a context binary "
                                   "this System API can read")
        out = _binary_info(int(info.value), api)
        out["file_size"] = size
        return out
    finally:
        free(handle)


def _binary_info(addr: int, api: list[int]) -> dict[str, Any]:
    version = _u32(addr)
    b = addr + 8
    out: dict[str, Any] = {
        "system_api": ".".join(map(str, api)), "binary_info_version": version, "backend_id": _u32(b),
        "build_id": _str(b + 8, "build id"),
        "core_api": ".".join(str(_u32(b + 16 + 4 * i)) for i in range(3)),
        "backend_api": ".".join(str(_u32(b + 28 + 4 * i)) for i in range(3)),
        "soc_version": _str(b + 40, "SoC version") or None, "soc_model": None,
    }
    if version in (1, 2):
        out["context_blob_version"] = ".".join(str(_u32(b + 60 + 4 * i)) for i in range(3))
        out["context_blob_size"] = _u64(b + 88)
        graphs = _graphs(_ptr(b + 120), _u32(b + 112))
    elif version == 3:
        out["context_blob_version"] = ".".join(str(_u32(b + 48 + 4 * i)) for i in range(3))
        out["context_blob_size"] = _u64(b + 64)
        graphs = _graphs(_ptr(b + 96), _u32(b + 88))
        out["soc_model"] = _u32(b + 128) or None
    else:
        raise DescriptionError(f"binary info version {version}: only 1, 2 and 3 are read here")
    out["graphs"] = graphs
    return out
