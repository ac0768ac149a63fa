"""The child half of a device verification (``workers.qnn.verify``): the context loaded and run on
this runtime's QNN EP (the HTP of a device; on x86_64 the simulator), timed, then the source model
on onnxruntime's CPU EP with the same inputs (or the farm's stored CPU outputs for the sample
inputs), every output compared.

    python -m workers.qnn.verify_child verify REQUEST.json RESULT.json

Run only as a fresh child (``workers.runner.run_child``): its peak resident memory is the
context's own, read after the context ran and before the CPU reference is loaded.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from typing import Any

from workers.qnn.accuracy import DEFAULT_SEED, compare, load_reference, seeded_inputs

MODULE = "workers.qnn.verify_child"


def verify(req: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    from workers.childproc import checkpoint
    from workers.qnn.child import _session_options

    runs = max(1, int(req.get("runs", 10)))
    ort_, so = _session_options(req["provider_options"])
    t = time.perf_counter()
    try:
        sess = ort_.InferenceSession(req["ctx_model"], so, enable_fallback=0)
    except Exception as exc:  # the runtime refused the context: that is the outcome
        return {"outcome": "fails", "error": f"this runtime cannot load the context: {str(exc).strip()[:3000]}"}
    load_ms = (time.perf_counter() - t) * 1000
    checkpoint({"outcome": "crashed", "error": "running the loaded context crashed the runtime", "load_ms": load_ms})
    specs = [(i.name, i.type, list(i.shape)) for i in sess.get_inputs()]
    if req.get("sample"):
        with np.load(req["sample"], allow_pickle=False) as z:
            feeds = {name: z[name] for name, _, _ in specs}
    else:
        feeds = seeded_inputs(specs, int(req.get("seed", DEFAULT_SEED)), {})
    names = [o.name for o in sess.get_outputs()]
    t = time.perf_counter()
    got = sess.run(names, feeds)
    first_ms = (time.perf_counter() - t) * 1000
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(names, feeds)
        times.append((time.perf_counter() - t) * 1000)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    del sess
    base = {"outcome": "ok", "load_ms": load_ms, "first_inference_ms": first_ms, "p50_ms": statistics.median(times),
            "runs": runs, "peak_memory_mb": peak_mb}
    if req.get("reference"):
        try:
            reference = load_reference(req["reference"], names)
        except (ValueError, KeyError, OSError) as exc:  # a reference of other outputs: nothing to compare with
            return {"outcome": "fails", "error": f"the stored CPU reference is not this context's: {str(exc)[:1000]}",
                    "load_ms": load_ms}
    elif not req.get("model"):
        return {**base, "psnr_db": None, "outputs": []}
    else:
        cpu = ort.InferenceSession(req["model"], providers=["CPUExecutionProvider"])
        reference = cpu.run(names, feeds)
    outputs = [{"name": n, "shape": list(np.shape(r)), **compare(r, g)}
               for n, r, g in zip(names, reference, got, strict=True)]
    psnr = min((o["psnr_db"] for o in outputs), default=None)
    return {**base, "psnr_db": psnr, "outputs": outputs}


def main(argv: list[str]) -> int:
    from workers.childproc import run_commands

    if len(argv) != 4 or argv[1] != "verify":
        print(f"usage: python -m {MODULE} verify REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    return run_commands(argv, {"verify": verify})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
