"""Quantized (QDQ) test models built with onnx.helper: activations quantized to uint8 or uint16
by QuantizeLinear/DequantizeLinear pairs, weights stored as int8 (symmetric, zero point 0) with
a DequantizeLinear in front of their use, the format onnxruntime.quantization.quantize_static
writes and the QNN HTP backend runs in integer arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ACTIVATIONS = {"uint8": (TensorProto.UINT8, np.uint8, 255), "uint16": (TensorProto.UINT16, np.uint16, 65535)}


def qdq_matmul_relu(path: Path, *, activations: str = "uint8", n: int = 64, seed: int = 0) -> Path:
    """x[1,n] float -> Q/DQ -> MatMul(W: int8 through DQ) -> Add(bias) -> Relu -> Q/DQ -> y[1,n] float."""
    onnx_type, np_type, qmax = ACTIVATIONS[activations]
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, n)) * 0.1).astype(np.float32)
    w_scale = np.float32(np.abs(w).max() / 127)
    wq = np.clip(np.round(w / w_scale), -127, 127).astype(np.int8)
    bias = (rng.standard_normal((n,)) * 0.05).astype(np.float32)
    x_scale, x_zero = np.float32(2.0 / qmax), np_type(qmax // 2 + 1)  # x in [-1, 1]
    y_max = float(np.abs(w).sum(axis=0).max() + np.abs(bias).max())
    y_scale, y_zero = np.float32(y_max / qmax), np_type(0)  # after Relu: [0, y_max]
    init = [
        numpy_helper.from_array(wq, "w_q"), numpy_helper.from_array(np.array(w_scale), "w_scale"),
        numpy_helper.from_array(np.array(0, dtype=np.int8), "w_zero"),
        numpy_helper.from_array(bias, "bias"),
        numpy_helper.from_array(np.array(x_scale), "x_scale"), numpy_helper.from_array(np.array(x_zero), "x_zero"),
        numpy_helper.from_array(np.array(y_scale), "y_scale"), numpy_helper.from_array(np.array(y_zero), "y_zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w_dq"]),
        helper.make_node("MatMul", ["x_dq", "w_dq"], ["mm"]),
        helper.make_node("Add", ["mm", "bias"], ["biased"]),
        helper.make_node("Relu", ["biased"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "y_scale", "y_zero"], ["y_q"]),
        helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zero"], ["y"]),
    ]
    graph = helper.make_graph(nodes, f"qdq_{activations}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], init)
    # 16-bit QuantizeLinear/DequantizeLinear are in opset 21.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21 if activations == "uint16" else 13)],
                              producer_name="ctxfarm-tests")
    model.ir_version = 10 if activations == "uint16" else 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
