"""A device verification of a QNN context (``ctxfarm-agent run``): load it, run it once (first
inference), ``runs`` more times (steady state: the median), read the peak memory, then compare every
output with the source model on the CPU EP. The parent side: no onnxruntime here; the child
(``workers.qnn.verify_child``) is a fresh process under a time cap, so a runtime that crashes or
hangs is one ``crashed`` report, never the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from farm.core.catalog import Target
from farm.core.errors import CompileTimeoutError, FarmError, ResourceLimitError, WorkerLostError


def measure(model: Path | None, ctx_model: Path, target: Target, work_dir: Path, *, runs: int = 10,
            timeout: float = 300.0, memory_mb: int = 0, sample: Path | None = None,
            reference: Path | None = None) -> dict[str, Any]:
    """``{"outcome": ok | fails | crashed, "error", "load_ms", "first_inference_ms", "p50_ms",
    "runs", "peak_memory_mb", "psnr_db", "outputs"}``; ``model`` None: no comparison. ``sample``:
    the submitter's ``.npz`` of inputs (read without pickles), else the seeded inputs. ``reference``:
    the farm's CPU outputs for ``sample`` (``workers.qnn.accuracy.keep_reference``, already checked
    against its digest), compared against instead of running ``model`` on this CPU."""
    from workers.qnn.runner import provider_options
    from workers.runner import run_child

    request = {"model": str(model.resolve()) if model else None, "ctx_model": str(ctx_model.resolve()),
               "provider_options": provider_options(target, {}), "runs": runs,
               "sample": str(sample.resolve()) if sample else None,
               "reference": str(reference.resolve()) if reference else None}
    try:
        result, _wall, _log = run_child("workers.qnn.verify_child", "verify", request, work_dir, timeout=timeout,
                                        memory_mb=memory_mb)
    except WorkerLostError as exc:
        return {"outcome": "crashed", "error": exc.message[:3000]}
    except (ResourceLimitError, CompileTimeoutError) as exc:
        return {"outcome": "crashed", "error": f"{exc.code}: {exc.message[:3000]}"}
    except FarmError as exc:
        return {"outcome": "fails", "error": f"{exc.code}: {exc.message[:3000]}"}
    result.pop("ok", None)
    if result.pop("partial", None):
        result["outcome"] = "crashed"
    return result
