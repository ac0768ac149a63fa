"""The child half of the accuracy check (``workers.qnn.accuracy``): the source model on
onnxruntime's CPU EP and the context on QNN, same inputs, every output compared.

    python -m workers.qnn.accuracy_child accuracy REQUEST.json RESULT.json

Run only as a child process (``workers.runner.run_child``): with ``workers.qnn.child``, the only
modules of the QNN backend that import onnxruntime.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from workers.qnn.accuracy import DEFAULT_SEED, MODULE, compare, keep_reference, seeded_inputs


def accuracy(req: dict[str, Any]) -> dict[str, Any]:
    """CPU reference first (it never fails on a valid model), then the context on QNN."""
    import os

    import numpy as np
    import onnxruntime as ort

    from workers.childproc import checkpoint
    from workers.qnn.child import _session_options

    if req.get("idle"):
        # A check no answer waits for (an ungated release): only CPU time nothing else wants, so
        # the next build's compile and the service never share a core with it.
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.nice(int(req.get("nice", 10)))  # a check yields the CPU to compiles: answers wait for those
    scheduler = "idle" if os.sched_getscheduler(0) == os.SCHED_IDLE else f"nice {os.getpriority(os.PRIO_PROCESS, 0)}"
    t = time.perf_counter()
    cpu = ort.InferenceSession(req["model"], providers=["CPUExecutionProvider"])
    specs = [(i.name, i.type, list(i.shape)) for i in cpu.get_inputs()]
    if req.get("sample"):
        with np.load(req["sample"], allow_pickle=False) as z:
            feeds = {name: z[name] for name, _, _ in specs}
    else:
        feeds = seeded_inputs(specs, int(req.get("seed", DEFAULT_SEED)), dict(req.get("dims") or {}))
    names = [o.name for o in cpu.get_outputs()]
    reference = cpu.run(names, feeds)
    reference_seconds = time.perf_counter() - t
    kept = None
    if req.get("reference_out"):
        # Kept for device agents (the farm's reference, not each device CPU's): before the
        # context is loaded, so a runtime that crashes on it still leaves the reference.
        kept = keep_reference(req["reference_out"], names, reference, int(req.get("reference_max") or 0))
    base = {"reference_seconds": reference_seconds, "status": "runtime-crashed",
            "detail": "loading the context crashed the runtime", "scheduler": scheduler, "reference": kept}
    checkpoint(base)
    ort_, so = _session_options(req["provider_options"])
    t = time.perf_counter()
    try:
        sess = ort_.InferenceSession(req["ctx_model"], so, enable_fallback=0)
    except Exception as exc:  # the runtime refused the context: nothing to compare
        return {"reference_seconds": reference_seconds, "status": "unverified", "scheduler": scheduler, "reference": kept,
                "detail": f"this runtime cannot load the context: {str(exc).strip()[:1500]}"}
    load_seconds = time.perf_counter() - t
    checkpoint({**base, "detail": "running the loaded context crashed the runtime", "load_seconds": load_seconds})
    t = time.perf_counter()
    got = sess.run(names, feeds)
    run_seconds = time.perf_counter() - t
    outputs = [{"name": n, "shape": list(np.shape(r)), **compare(r, g)}
               for n, r, g in zip(names, reference, got, strict=True)]
    return {"status": "ok", "outputs": outputs, "reference_seconds": reference_seconds,
            "load_seconds": load_seconds, "run_seconds": run_seconds, "scheduler": scheduler, "reference": kept}



def main(argv: list[str]) -> int:
    """``accuracy REQUEST RESULT`` (a fresh child) or ``host`` (a warm host its jobs fork from:
    ``workers.qnn.child.preload`` imports onnxruntime and registers the QNN EP once)."""
    from workers.childproc import run_commands
    from workers.qnn.child import preload

    if not (len(argv) == 4 and argv[1] == "accuracy" or len(argv) == 2 and argv[1] == "host"):
        print(f"usage: python -m {MODULE} accuracy REQUEST.json RESULT.json | host", file=sys.stderr)
        return 2
    return run_commands(argv, {"accuracy": accuracy}, preload=preload)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
