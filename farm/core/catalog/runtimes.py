"""Runtime releases as data (``runtimes.toml``): which onnxruntime-qnn release carries which
QNN SDK. A device's QNN runtime is the SDK inside its onnxruntime-qnn wheel, so this is the map
from what ``pip`` installed to what ``--qnn`` means (the standard library only: the device client
ships it)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class RuntimeRelease:
    package: str  # the pip package that carries the runtime, e.g. onnxruntime-qnn
    version: str  # its release, e.g. 2.7.0
    sdk: str  # the SDK inside it (QNN 2.51.0)
    onnxruntime: str  # the onnxruntime release it runs with


@lru_cache(maxsize=1)
def qnn_runtimes() -> tuple[RuntimeRelease, ...]:
    data = tomllib.loads((Path(__file__).parent / "runtimes.toml").read_text(encoding="utf-8"))
    return tuple(RuntimeRelease("onnxruntime-qnn", row["onnxruntime-qnn"], row["sdk"], row["onnxruntime"])
                 for row in data.get("qnn", []))


def qnn_map_text() -> str:
    """``onnxruntime-qnn 2.3.0 = QNN 2.47.0, 2.5.0 = QNN 2.49.40, ...`` for hints."""
    return "onnxruntime-qnn " + ", ".join(f"{r.version} = QNN {r.sdk}" for r in qnn_runtimes())
