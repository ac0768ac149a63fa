"""Backend workers. Only ``workers/qnn`` and ``workers/trt`` child modules import onnxruntime,
and only inside the compile/load child process."""

from __future__ import annotations
