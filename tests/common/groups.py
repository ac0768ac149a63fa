"""Small weight-shared graph pairs for graph-group tests: an LLM's ``prefill`` (seq 16) and
``decode`` (seq 1) reduced to one shared 64x64 MatMul + Add + Relu, two inputs each (so the
description's tensor arrays have more than one entry)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 64


def shared_graph(seq: int, *, seed: int = 0, hidden: int = HIDDEN) -> onnx.ModelProto:
    """y = Relu(x @ W + bias), W the same seeded weights for every ``seq``."""
    w = numpy_helper.from_array(np.random.default_rng(seed).standard_normal((hidden, hidden)).astype(np.float32),
                                "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "bias"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        f"shared_seq{seq}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def prefill_decode(root: Path, *, external: bool = False, seed: int = 0) -> tuple[Path, Path]:
    """``root/prefill.onnx`` (seq 16) and ``root/decode.onnx`` (seq 1) sharing W; with
    ``external`` each keeps W in its own ``weights.data`` beside it (in its own folder)."""
    paths = []
    for name, seq in (("prefill", 16), ("decode", 1)):
        d = root / name if external else root
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{name}.onnx"
        model = shared_graph(seq, seed=seed)
        if external:
            onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                            location="weights.data", size_threshold=0)
        else:
            onnx.save_model(model, str(path))
        paths.append(path)
    return paths[0], paths[1]
