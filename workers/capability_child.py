"""Child that reports what this environment holds (``workers.capabilities`` reads it): the only
place a worker imports onnxruntime_genai outside a genai check.

    python -m workers.capability_child probe REQUEST.json RESULT.json

Importing, not reading package metadata: an installed wheel that does not import (a missing
library, a runtime too old for it) is no capability. The request names the backend; for QNN the
QNN EP library is registered with onnxruntime-genai, as the folder check and the twin do.
"""

from __future__ import annotations

import sys
from typing import Any

from workers.childproc import run_commands


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def probe(req: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        import onnxruntime as ort

        out["onnxruntime"] = ort.__version__
        out["model_package"] = hasattr(ort, "ModelPackage") and hasattr(ort, "ModelPackageContext")
    except Exception as exc:  # noqa: BLE001 - what failed is the answer
        out["onnxruntime_error"] = _error(exc)
    try:
        import onnxruntime_genai as og

        out["genai"] = og.__version__
    except Exception as exc:  # noqa: BLE001
        out["genai_error"] = _error(exc)
        return out
    if req.get("backend") == "qnn":
        try:
            import onnxruntime_qnn as oq

            og.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
            out["genai_ep"] = True
        except Exception as exc:  # noqa: BLE001
            out["genai_ep_error"] = _error(exc)
    return out


def main(argv: list[str]) -> int:
    if not (len(argv) == 4 and argv[1] == "probe"):
        print("usage: python -m workers.capability_child probe REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    return run_commands(argv, {"probe": probe})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
