"""What this environment can make besides context binaries (``farm.core.capabilities``), probed
once per process in a child (``workers.capability_child``): no onnxruntime is imported here.

A worker announces it when it registers (``workers.main``); the embedded farm (``farm build
--genai``, a service without a broker) decides from it before it compiles anything; a worker
asked to assemble a genai package it can't make refuses with ``capability-missing``.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path

from farm.core.capabilities import Capabilities, from_probe
from farm.core.errors import FarmError

log = logging.getLogger("ctxfarm.worker")
CHILD = "workers.capability_child"
PROBE_TIMEOUT_S = 120.0  # importing onnxruntime and onnxruntime-genai: ~1 s warm, more on a cold disk


def probe(backend: str, *, python: str | None = None) -> dict[str, object]:
    """The child's facts (``workers.capability_child.probe``) for ``backend``, in the environment
    of ``python`` (default: this one)."""
    from workers.runner import run_child

    with tempfile.TemporaryDirectory(prefix="ctxfarm-capabilities-") as tmp:
        result, _, _ = run_child(CHILD, "probe", {"backend": backend}, Path(tmp), timeout=PROBE_TIMEOUT_S,
                                 python=python)
    result.pop("ok", None)
    return result


def detect(backend: str, *, python: str | None = None) -> Capabilities:
    """What an environment makes; a probe that itself fails makes nothing (said in ``lacks``)."""
    try:
        facts = probe(backend, python=python)
    except FarmError as exc:
        log.warning("probing this environment's capabilities failed: %s", exc)
        facts = {"onnxruntime_error": exc.message, "genai_error": exc.message}
    return from_probe(facts, backend)


_PROBED: dict[str, Future[Capabilities]] = {}
_PROBED_LOCK = threading.Lock()


def here(backend: str) -> Capabilities:
    """This process's environment, probed once (a probe ``probe_soon`` started is waited for)."""
    fut, mine = _probe(backend)
    if mine:
        _run(backend, fut)
    return fut.result()


def probe_soon(backend: str) -> None:
    """Start this process's probe of ``backend`` now, in a thread: the child's interpreter start
    and runtime imports (~0.3 s) run beside the caller's own imports; ``here`` then waits for it."""
    fut, mine = _probe(backend)
    if mine:
        threading.Thread(target=_run, args=(backend, fut), name=f"probe-{backend}", daemon=True).start()


def _probe(backend: str) -> tuple[Future[Capabilities], bool]:
    with _PROBED_LOCK:
        fut = _PROBED.get(backend)
        if fut is not None:
            return fut, False
        fut = _PROBED[backend] = Future()
        return fut, True


def _run(backend: str, fut: Future[Capabilities]) -> None:
    try:
        fut.set_result(detect(backend))
    except BaseException as exc:
        with _PROBED_LOCK:  # not remembered: the next call probes again
            _PROBED.pop(backend, None)
        fut.set_exception(exc)
