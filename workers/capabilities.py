"""What this environment can make besides context binaries (``farm.core.capabilities``), probed
once per process in a child (``workers.capability_child``): no onnxruntime is imported here.

A worker announces it when it registers (``workers.main``); the embedded farm (``farm build
--genai``, a service without a broker) decides from it before it compiles anything; a worker
asked to assemble a genai package it can't make refuses with ``capability-missing``.
"""

from __future__ import annotations

import functools
import logging
import tempfile
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


@functools.lru_cache(maxsize=4)
def here(backend: str) -> Capabilities:
    """This process's environment, probed once."""
    return detect(backend)
