"""The QNN System API reader without a compile: its strides against the header layouts, and
hostile binaries (garbage, truncated, ZIP-like) refused as DescriptionError, never a crash."""

from __future__ import annotations

import ctypes as C
import importlib.util
import os
import zipfile
from pathlib import Path

import pytest

from workers.qnn.sysapi import GRAPH_STRIDE, TENSOR_STRIDE, DescriptionError, describe, describe_file


def test_strides_follow_the_header_layouts() -> None:
    class QuantizeParams(C.Structure):  # two enums, then a union whose largest member is 32 bytes
        _fields_ = [("definition", C.c_uint32), ("encoding", C.c_uint32), ("u", C.c_byte * 32), ("_a", C.c_void_p * 0)]

    class ClientBuffer(C.Structure):
        _fields_ = [("data", C.c_void_p), ("size", C.c_uint32)]

    class TensorV2(C.Structure):
        _fields_ = [("id", C.c_uint32), ("name", C.c_char_p), ("type", C.c_uint32), ("format", C.c_uint32),
                    ("dtype", C.c_uint32), ("q", QuantizeParams), ("rank", C.c_uint32), ("dims", C.c_void_p),
                    ("memType", C.c_uint32), ("buf", ClientBuffer), ("dynamic", C.c_void_p),
                    ("sparse", C.c_uint32 * 3), ("produced", C.c_uint8)]

    class GraphInfoV3(C.Structure):
        _fields_ = [("name", C.c_char_p), ("nin", C.c_uint32), ("ins", C.c_void_p), ("nout", C.c_uint32),
                    ("outs", C.c_void_p), ("nup", C.c_uint32), ("ups", C.c_void_p), ("blobsize", C.c_uint32),
                    ("blob", C.c_void_p), ("start", C.c_uint32), ("end", C.c_uint32)]

    assert TensorV2.rank.offset == 72 and TensorV2.dims.offset == 80 and TensorV2.dtype.offset == 24
    assert 8 + C.sizeof(TensorV2) == TENSOR_STRIDE
    assert 8 + C.sizeof(GraphInfoV3) == GRAPH_STRIDE


def _library() -> str:
    spec = importlib.util.find_spec("onnxruntime_qnn")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("onnxruntime-qnn is not installed here")
    lib = Path(next(iter(spec.submodule_search_locations))) / "libQnnSystem.so"
    if not lib.exists():
        pytest.skip("this onnxruntime-qnn has no libQnnSystem.so")
    return str(lib)


@pytest.mark.parametrize("data", [b"\0", os.urandom(4096), b"PK\x03\x04" + os.urandom(200), b"\xff" * 65536])
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(DescriptionError):
        describe(_library(), data)


def test_a_zip_without_htp_caches_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("dlc.metadata", b"{}")
    with pytest.raises(DescriptionError, match="htp.cache"):
        describe_file(_library(), str(path))
    path.write_bytes(b"PK\x03\x04 not a zip at all")
    with pytest.raises(DescriptionError):
        describe_file(_library(), str(path))
