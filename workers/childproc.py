"""The inside of every compile/load child (``python -m workers.<backend>.child``).

Before any SDK is imported the child ties itself to its owner and caps itself:

- ``PR_SET_PDEATHSIG`` = SIGKILL, then a check that the parent is still the one that started us
  (closing the race where it died before the prctl): a SIGKILLed worker or ``farm build`` never
  leaves a compile running under init;
- ``RLIMIT_AS`` from ``CTXFARM_MEMORY_MB`` (address space; measured compile peaks are in
  farm.core.settings), so a model that asks for a huge tensor fails fast as ``resource-limit``;
- a watchdog thread that writes a ``resource-limit`` result and exits at ``CTXFARM_TIME_LIMIT``
  seconds, so the limit holds even if the parent cannot enforce it.

Results go to RESULT.json as ``{"ok": true, ...}`` or ``{"ok": false, "error": {...}}``.
Imports nothing heavy at module level.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1

# Error texts of the EP/ORT mapped to our failure codes (first match wins).
_CLASSIFY = (
    ("bad_alloc", "resource-limit"),
    ("bad allocation", "resource-limit"),
    ("Failed to allocate memory", "resource-limit"),
    ("MemoryError", "resource-limit"),
    ("Cannot allocate memory", "resource-limit"),
    ("soc_model is not specified", "bad-options"),
    ("QNN_DEVICE_ERROR_INVALID_CONFIG", "bad-options"),
    ("INVALID_PROTOBUF", "invalid-model"),
    ("Protobuf parsing failed", "invalid-model"),
    ("NOT_IMPLEMENTED", "unsupported-ops"),
    ("Could not find an implementation", "unsupported-ops"),
)

_RESULT_PATH: list[str] = []
_LOCK = threading.Lock()


def classify(message: str) -> str:
    for needle, code in _CLASSIFY:
        if needle in message:
            return code
    return "toolchain-error"


def write_result(data: dict[str, Any]) -> None:
    if not _RESULT_PATH:
        return
    with _LOCK:
        tmp = _RESULT_PATH[0] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, _RESULT_PATH[0])


def checkpoint(data: dict[str, Any]) -> None:
    """Write what is known so far: if a later step crashes the process (SDK segfaults are real:
    light_inception_v1 built for SM8650 kills the x86_64 HTP simulator when run), the parent
    still gets the finished steps."""
    write_result({"ok": True, "partial": True, **data})


def install_guards(env: dict[str, str] | None = None) -> None:
    """Die with the parent, cap memory, enforce the time limit (see the module docstring)."""
    env = dict(os.environ) if env is None else env
    parent = int(env.get("CTXFARM_PARENT_PID", "0") or 0)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent and os.getppid() != parent:
        os._exit(137)  # the parent died before the prctl took effect
    memory_mb = int(env.get("CTXFARM_MEMORY_MB", "0") or 0)
    if memory_mb > 0:
        import resource

        cap = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    limit = float(env.get("CTXFARM_TIME_LIMIT", "0") or 0)
    if limit > 0:
        def watchdog() -> None:
            write_result({"ok": False, "error": {
                "code": "resource-limit",
                "message": f"the compile child ran past its time limit of {limit:g} s and stopped itself"}})
            os._exit(124)

        timer = threading.Timer(limit, watchdog)
        timer.daemon = True
        timer.start()


def run_commands(argv: list[str], commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]]) -> int:
    """``child COMMAND REQUEST.json RESULT.json``; shared by every backend's child."""
    command, req_path, res_path = argv[1], argv[2], argv[3]
    _RESULT_PATH.append(res_path)
    install_guards()
    try:
        with open(req_path) as f:
            req = json.load(f)
        out: dict[str, Any] = {"ok": True, **commands[command](req)}
        rc = 0
    except MemoryError:
        out = {"ok": False, "error": {"code": "resource-limit",
                                      "message": "the compile ran out of memory under its cap (MemoryError)"}}
        rc = 1
    except Exception as exc:  # the parent maps the code; the log has the traceback
        import traceback

        traceback.print_exc()
        message = str(exc).strip() or type(exc).__name__
        out = {"ok": False, "error": {"code": classify(message), "message": message[:4000]}}
        rc = 1
    write_result(out)
    return rc
