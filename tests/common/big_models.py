"""Models of any size, written without holding their weights in memory: a chain of fp32 MatMuls
(hidden -> 4 x hidden -> hidden, ``layers`` times, then ``tail`` hidden x hidden MatMuls) whose
weights live in one external-data file written 64 MiB at a time (seeded, so the same arguments
give the same bytes). The .onnx itself is a few KiB. Used by the > 2 GiB integration test and by
bench/memory.py; what makes it quick to compile is that it is one simple chain."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

DATA = "weights.data"
CHUNK_FLOATS = 16 * 1024 * 1024  # 64 MiB of float32 per write


def matmul_chain(path: Path, *, hidden: int = 1024, layers: int = 1, tail: int = 0, seed: int = 0,
                 scale: float = 0.01) -> Path:
    """Write ``path`` (the .onnx) and ``weights.data`` beside it; returns ``path``. Weight bytes:
    ``4 * hidden^2 * (8 * layers + tail)``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shapes = [s for _ in range(layers) for s in ((hidden, 4 * hidden), (4 * hidden, hidden))]
    shapes += [(hidden, hidden)] * tail
    rng = np.random.default_rng(seed)
    inits, nodes, offset = [], [], 0
    prev = "x"
    with open(path.parent / DATA, "wb") as f:
        for i, (k, n) in enumerate(shapes):
            count = k * n
            left = count
            while left:
                m = min(left, CHUNK_FLOATS)
                block = rng.random(m, dtype=np.float32)
                block -= 0.5
                block *= scale * 2
                f.write(block.tobytes())
                left -= m
            t = TensorProto()
            t.name, t.data_type = f"w{i}", TensorProto.FLOAT
            t.dims.extend([k, n])
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", DATA), ("offset", str(offset)), ("length", str(count * 4))):
                e = t.external_data.add()
                e.key, e.value = key, value
            inits.append(t)
            out = "y" if i == len(shapes) - 1 else f"h{i}"
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out]))
            prev = out
            offset += count * 4
    graph = helper.make_graph(nodes, "matmul_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ctxfarm-tests")
    model.ir_version = 8
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def weight_bytes(*, hidden: int, layers: int = 1, tail: int = 0) -> int:
    return 4 * hidden * hidden * (8 * layers + tail)
