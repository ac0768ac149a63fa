"""Small ONNX models built with onnx.helper (no onnxruntime), for bundle inspection tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def matmul_add(*, seed: int = 0, size: int = 8) -> onnx.ModelProto:
    """y = x @ W + b with float32 initializers (big enough to go to external data)."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((size, size)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal((size,)).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["y"])],
        "matmul_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])],
        initializer=[w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def empty_graph() -> onnx.ModelProto:
    """A valid ModelProto whose graph has no nodes (y is just the input)."""
    graph = helper.make_graph(
        [], "empty",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def save_external(model: onnx.ModelProto, path: Path, location: str = "w.data") -> Path:
    """Save with every initializer in one external data file beside the model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)
    return path


def set_external_location(path: Path, location: str) -> None:
    """Rewrite the external data location of every tensor in the saved model at ``path``."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    path.write_bytes(model.SerializeToString())
