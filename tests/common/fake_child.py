"""A backend child for unit tests of the warm compile host (workers.host): the real harness
(workers.childproc: host loop, fork, guards, result files), fake work chosen by the request.

    python -m tests.common.fake_child host
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from workers.childproc import run_commands

PRELOADED: list[int] = []  # the pid of the process that ran preload (a job inherits it)


def preload() -> None:
    if os.environ.get("FAKE_CHILD_PRELOAD_FAILS"):
        raise RuntimeError("no SDK in this environment")
    PRELOADED.append(os.getpid())


def compile_model(req: dict[str, Any]) -> dict[str, Any]:
    action = req.get("action", "ok")
    print(f"fake compile: {action}", flush=True)
    if action == "segv":
        import ctypes

        ctypes.string_at(0)  # SIGSEGV, as a crashing SDK library would
    elif action == "sleep":
        time.sleep(float(req.get("seconds", 60)))
    elif action == "alloc":
        block = bytearray(int(req["mb"]) * 1024 * 1024)  # MemoryError under a smaller RLIMIT_AS
        del block
    elif action == "bad_alloc":
        # What the QNN/ORT C++ code does when RLIMIT_AS refuses an allocation.
        print("terminate called after throwing an instance of 'std::bad_alloc'", flush=True)
        os.abort()
    elif action == "fail":
        raise RuntimeError("QNN_DEVICE_ERROR_INVALID_CONFIG: soc_model 999")
    with open("/proc/self/comm") as f:
        comm = f.read().strip()
    return {"compile_seconds": 0.0, "pid": os.getpid(), "ppid": os.getppid(), "preloaded_in": PRELOADED,
            "cwd": os.getcwd(), "comm": comm}


def main(argv: list[str]) -> int:
    return run_commands(argv, {"compile": compile_model}, preload=preload)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
