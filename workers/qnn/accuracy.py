"""Accuracy of a QNN context: the context run on the HTP backend (on x86_64: the simulator) against
the source model on onnxruntime's CPU EP, with the same inputs, every output compared.

    python -m workers.qnn.accuracy_child accuracy REQUEST.json RESULT.json

This module, the parent side (``check_accuracy``) and the figures, imports no onnxruntime: it
runs ``workers.qnn.accuracy_child`` (the half that does) as a child process under a time and
memory budget (``workers.runner.run_child``), so a runtime that crashes or hangs costs one
record (``runtime-crashed`` / ``skipped``), never the caller. A context the runtime here
refuses to load is ``unverified`` with the runtime's own words (weight-shared and multi-SoC
contexts on the simulator, measured).

Figures per output: PSNR in dB (peak = the reference's largest magnitude; ``PSNR_CAP`` when the
outputs are identical), cosine similarity and the largest absolute error.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from farm.core.catalog import Target
from farm.core.errors import (
    CompileTimeoutError,
    FarmError,
    LeaseLostError,
    ResourceLimitError,
    WorkerLostError,
)

MODULE = "workers.qnn.accuracy_child"
PSNR_CAP = 200.0  # dB: what identical outputs (zero error) are recorded as; JSON has no infinity
DEFAULT_SEED = 0
# onnx tensor type -> numpy dtype name, for seeded inputs and for checking sample inputs
DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
          "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int16)": "int16", "tensor(int8)": "int8",
          "tensor(uint8)": "uint8", "tensor(uint16)": "uint16", "tensor(bool)": "bool"}


# ---- figures (numpy only) -------------------------------------------------------------------------

def compare(reference: Any, got: Any) -> dict[str, Any]:
    """PSNR (dB), cosine similarity and max abs error of ``got`` against ``reference``."""
    import numpy as np

    ref = np.asarray(reference, dtype=np.float64).ravel()
    out = np.asarray(got, dtype=np.float64).ravel()
    if ref.shape != out.shape:
        return {"psnr_db": 0.0, "cosine": 0.0, "max_abs_error": None,
                "error": f"shape {list(np.shape(got))} != reference {list(np.shape(reference))}"}
    if ref.size == 0:
        return {"psnr_db": PSNR_CAP, "cosine": 1.0, "max_abs_error": 0.0}
    finite = np.isfinite(out).all()
    diff = ref - out if finite else np.where(np.isfinite(out), ref - out, np.inf)
    mse = float(np.mean(diff * diff)) if finite else float("inf")
    peak = float(np.max(np.abs(ref)))
    if mse == 0.0:
        psnr = PSNR_CAP
    elif not np.isfinite(mse) or peak == 0.0:
        psnr = 0.0
    else:
        psnr = min(PSNR_CAP, 10.0 * float(np.log10(peak * peak / mse)))
    nr, no = float(np.linalg.norm(ref)), float(np.linalg.norm(out)) if finite else float("inf")
    if nr == 0.0 and no == 0.0:
        cosine = 1.0
    elif nr == 0.0 or no == 0.0 or not np.isfinite(no):
        cosine = 0.0
    else:
        cosine = float(np.dot(ref, out) / (nr * no))
    return {"psnr_db": round(psnr, 3), "cosine": round(cosine, 6),
            "max_abs_error": float(np.max(np.abs(diff))) if finite else None}


REFERENCE_NAMES = "names"  # the .npz member holding the output names; the arrays are out0, out1, ...


def keep_reference(path: str | Path, names: list[str], arrays: list[Any], max_bytes: int) -> dict[str, Any]:
    """Write the CPU reference ``arrays`` (one per output, in ``names``' order) as an ``.npz`` at
    ``path`` when they hold at most ``max_bytes``; what was done: ``{"kept", "bytes", "why"}``.
    Members have fixed names (``out0``...; the output names are data in ``names``): an output's
    name never becomes a path inside the archive."""
    import numpy as np

    nbytes = int(sum(np.asarray(a).nbytes for a in arrays))
    if nbytes > max_bytes:
        return {"kept": False, "bytes": nbytes,
                "why": f"the CPU reference outputs are {nbytes} bytes, over FARM_REFERENCE_MAX_BYTES ({max_bytes})"}
    if any(np.asarray(a).dtype.hasobject for a in arrays):
        return {"kept": False, "bytes": nbytes, "why": "an output is not a plain numeric array"}
    members: dict[str, Any] = {REFERENCE_NAMES: np.array(names, dtype=str)}
    members |= {f"out{i}": np.asarray(a) for i, a in enumerate(arrays)}
    with open(path, "wb") as f:
        np.savez(f, **members)
    return {"kept": True, "bytes": nbytes, "why": None}


def load_reference(path: str | Path, names: list[str]) -> list[Any]:
    """The arrays of a reference ``.npz`` (``keep_reference``) in ``names``' order, read without
    pickles; ``ValueError`` when it does not hold exactly these outputs."""
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        kept = [str(n) for n in z[REFERENCE_NAMES].tolist()]
        if sorted(kept) != sorted(names) or len(kept) != len(z.files) - 1:
            raise ValueError(f"the reference holds the outputs {kept[:20]}, the context has {names[:20]}")
        return [z[f"out{kept.index(n)}"] for n in names]


def seeded_inputs(specs: list[tuple[str, str, list[Any]]], seed: int, dims: dict[str, int]) -> dict[str, Any]:
    """Deterministic inputs by (name, onnx type, shape): uniform [0, 1) for floats, 0..9 for
    integers. A symbolic or unknown dimension takes ``dims[name]`` (the request's) or 1."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds: dict[str, Any] = {}
    for name, type_, shape in specs:
        dtype = DTYPES.get(type_)
        if dtype is None:
            raise ValueError(f"input {name!r} has type {type_}: no seeded input for it; upload sample inputs")
        concrete = [d if isinstance(d, int) and d > 0 else int(dims.get(str(d), 1)) for d in shape]
        if dtype == "bool":
            feeds[name] = rng.random(concrete) < 0.5
        elif dtype.startswith(("int", "uint")):
            feeds[name] = rng.integers(0, 10, size=concrete).astype(dtype)
        else:
            feeds[name] = rng.random(concrete).astype(dtype)
    return feeds


# ---- the parent -----------------------------------------------------------------------------------

def check_accuracy(model: Path, ctx_model: Path, target: Target, work_dir: Path, *, budget: float,
                   memory_mb: int = 0, seed: int = DEFAULT_SEED, dims: dict[str, int] | None = None,
                   sample: Path | None = None, warm_host: bool = True, idle: bool = False,
                   cancel: Any = None, reference_out: Path | None = None, reference_max: int = 0) -> dict[str, Any]:
    """Run the comparison in a child within ``budget`` seconds: a job forked from a warm host
    (``workers.host``: onnxruntime imported and the QNN EP registered once per process, as for
    compiles: a fresh child spends about half a second on that), or a fresh child. ``idle``: the
    child runs at ``SCHED_IDLE`` (no answer waits for it), else at nice 10. ``cancel`` (an
    ``is_set()`` flag): the child is killed once it is set and ``LeaseLostError`` is raised, no
    record (a background check preempted by a build: it runs again later). Otherwise returns a
    record:
    ``{"status": ok | runtime-crashed | skipped | unverified, "outputs", "detail", timings}``.
    ``reference_out``: also keep the CPU reference outputs there (``keep_reference``, at most
    ``reference_max`` bytes); the record's ``reference`` says whether they were kept and why not."""
    from workers.qnn.runner import provider_options
    from workers.runner import run_child

    request = {"model": str(model.resolve()), "ctx_model": str(ctx_model.resolve()),
               "provider_options": provider_options(target, {}), "seed": seed, "dims": dims or {},
               "sample": str(sample.resolve()) if sample else None, "idle": bool(idle),
               "reference_out": str(reference_out.resolve()) if reference_out else None,
               "reference_max": int(reference_max)}
    start = time.perf_counter()
    try:
        if warm_host:
            from workers.host import pool_for

            result, _wall, _log, _t = pool_for(MODULE).run("accuracy", request, work_dir, timeout=budget,
                                                           memory_mb=memory_mb, cancel=cancel)
        else:
            result, _wall, _log = run_child(MODULE, "accuracy", request, work_dir, timeout=budget,
                                            memory_mb=memory_mb, cancel=cancel)
    except LeaseLostError:
        raise  # stopped on ``cancel``: not a result of the check
    except (ResourceLimitError, CompileTimeoutError) as exc:
        if isinstance(exc, CompileTimeoutError) or "within" in exc.message or "time limit" in exc.message:
            return {"status": "skipped", "detail": f"skipped: over {budget:g} s", "outputs": []}
        return {"status": "skipped", "detail": f"skipped: {exc.message[:500]}", "outputs": []}
    except WorkerLostError as exc:
        return {"status": "runtime-crashed", "detail": exc.message[:1000], "outputs": []}
    except FarmError as exc:
        return {"status": "unverified", "detail": f"{exc.code}: {exc.message[:1500]}", "outputs": []}
    result.pop("ok", None)
    if result.pop("partial", None) or result.get("crashed"):
        crashed = result.pop("crashed", "")
        result["status"] = "runtime-crashed"
        result["detail"] = f"{result.get('detail') or 'the runtime crashed'} ({crashed})".strip()
    result.setdefault("outputs", [])
    result["wall_seconds"] = time.perf_counter() - start
    return result
