"""The accuracy gate's test models: a 64x64 MatMul with seeded weights (the HTP's fp16
rounding: PSNR about 78.6 dB against the CPU) and the same MatMul followed by x 1e5 then x 1e-5
(an intermediate beyond fp16's 65,504: PSNR about 9.8 dB)."""

from __future__ import annotations

from pathlib import Path


def matmul_model(path: Path, *, overflow: bool = False, seed: int = 0, n: int = 64) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).standard_normal((n, n)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y" if not overflow else "m"])]
    if overflow:
        inits += [numpy_helper.from_array(np.array(1e5, np.float32), "up"),
                  numpy_helper.from_array(np.array(1e-5, np.float32), "down")]
        nodes += [helper.make_node("Mul", ["m", "up"], ["big"]), helper.make_node("Mul", ["big", "down"], ["y"])]
    graph = helper.make_graph(nodes, "matmul_overflow" if overflow else "matmul",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ctxfarm-tests")
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
