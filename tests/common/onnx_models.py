"""Real test models without downloads: the `onnx` wheel's light models, or onnx.helper graphs.

Shared by unit tests (bundle inspection) and integration tests (real QNN compiles)."""

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

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light(name: str) -> Path:
    path = LIGHT_DIR / f"light_{name}.onnx"
    assert path.exists(), f"{path} missing from the onnx wheel"
    return path


def _save(model: onnx.ModelProto, path: Path, **kw: object) -> Path:
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path), **kw)  # type: ignore[arg-type]
    return path


def conv_relu_add(path: Path, *, seed: int = 0, external: bool = False) -> Path:
    """A small conv net every QNN HTP arch takes whole: Conv -> Relu -> Add."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "b")
    bias = numpy_helper.from_array(rng.standard_normal((1, 8, 16, 16)).astype(np.float32), "bias")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Add", ["r", "bias"], ["y"]),
        ],
        "conv_relu_add", [x], [y], [w, b, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if external:
        return _save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                     location=path.stem + ".data", size_threshold=0)
    return _save(model, path)


def partly_unsupported(path: Path) -> Path:
    """Relu/Add go to the HTP; Erf and Mod (fmod) are not supported by the QNN EP (measured)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Add", ["r", "r"], ["a"]),
            helper.make_node("Erf", ["a"], ["e"]),
            helper.make_node("Mod", ["e", "e"], ["z"], fmod=1),
        ],
        "partly_unsupported", [x], [z],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def gemm_left_on_cpu(path: Path, *, seed: int = 0, size: int = 16) -> Path:
    """A decode-style step, MatMul then a Gemm with alpha/beta != 1: the QNN EP takes the MatMul
    and leaves the Gemm on the CPU (measured: QNN 2.51.0, SM8650, ``1 ctx / 1 cpu ['Gemm']``)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("W0", (size, size)), ("W", (size, size)), ("B", (size,)))]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W0"], ["m"]),
         helper.make_node("Gemm", ["m", "W", "B"], ["y"], alpha=0.5, beta=2.0)],
        "gemm_left_on_cpu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])], initializer=inits)
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


def memory_bomb(path: Path) -> Path:
    """A few hundred bytes that ask the compiler for a 2 GiB tensor (ConstantOfShape)."""
    shape = numpy_helper.from_array(np.array([1, 1 << 29], dtype=np.int64), "shape")
    g = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["c"],
                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
         helper.make_node("ReduceSum", ["c"], ["s"], keepdims=1),
         helper.make_node("Add", ["x", "s"], ["y"])], "bomb",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], [shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path
