"""The genai checks of the QNN backend, parent side: no onnxruntime here. Each runs
``workers.qnn.genai_child`` as a child process under a time and memory budget
(``workers.runner.run_child``), so a simulator crash or hang costs one record, never the worker.

- ``check_folder(folder, work_dir, parts=...)``: a built genai folder (the artifact) is what a
  device can open: ``og.Config`` parses it, every file it names exists, every EPContext points
  inside it, each part's ``.bin`` holds exactly its two graphs. Returns the child's description;
  raises ``GenaiFolderError`` (``genai-folder-invalid``) naming the file. The child is a job
  forked from a warm check host (``workers.host``, ``prestart_check``), with the same guards.
- ``run_twin(export_dir, target, options, work_dir)``: the weight-shared artifact can't run here
  (the simulator crashes on shared contexts, measured), so its parts are compiled again without
  sharing, and that twin generates greedy tokens through onnxruntime-genai on the simulator
  against the source pipeline on the CPU EP: at least ``min_tokens`` (4), then more up to
  ``tokens`` (16) while the generation stays within ``generate_seconds`` (default: a twentieth of
  ``timeout``, the accuracy budget; the simulator takes ~2 s a step for 2 x 170 MB parts, a tiny
  export gets all 16). Returns the figures (``status`` ``ok`` |
  ``unverified`` | ``runtime-crashed``, tokens compared and matched, first mismatch and its
  logit gap, first step's logits PSNR, timings); a crash keeps what was finished.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from farm.core.catalog import Target
from farm.core.errors import WorkerLostError
from farm.core.genai import TWIN_PROMPT, TWIN_TOKENS
from workers.runner import run_child

MODULE = "workers.qnn.genai_child"
TWIN_MIN_TOKENS = 4  # compared, always (fewer only where the KV cache can't hold them)
GENERATE_SHARE = 20  # the twin's generation past the minimum: within timeout / GENERATE_SHARE


def check_folder(folder: Path, work_dir: Path, *, parts: list[list[str]] | None = None, timeout: float = 300.0,
                 memory_mb: int = 0, python: str | None = None) -> dict[str, Any]:
    """Check a built genai folder in a child process (see the module docstring). ``parts``:
    each part's [prefill file, decode file], when the caller knows them (the manifest's roles).
    ``python``: the interpreter of the worker environment to run it in (default: this one).
    Raises ``GenaiFolderError``; a child that dies is ``worker-lost`` / ``resource-limit``."""
    from workers.host import pool_for

    work_dir.mkdir(parents=True, exist_ok=True)
    # A job forked from the warm check host (``prestart_check``; started here if it was not): the
    # guards and errors of ``run_child``, without an interpreter and runtime imports per check.
    result, _, _, _ = pool_for(MODULE, python=python).run(
        "check", {"folder": str(Path(folder).resolve()), "parts": parts or []}, work_dir, timeout=timeout,
        memory_mb=memory_mb)
    result.pop("ok", None)
    return result


def prestart_check(*, python: str | None = None) -> None:
    """Spawn the warm folder-check host now without waiting for it (``workers.host.HostPool.prestart``):
    its interpreter start and onnxruntime-genai import (~0.25 s of CPU) run while the parts compile,
    not after them; every folder check of this process (each target of a package) forks from it."""
    from workers.host import pool_for

    pool_for(MODULE, python=python).prestart(1)


def run_twin(export_dir: Path, target: Target, options: dict[str, Any], work_dir: Path, *,
             tokens: int = TWIN_TOKENS, min_tokens: int = TWIN_MIN_TOKENS, generate_seconds: float | None = None,
             prompt: str = TWIN_PROMPT, timeout: float = 900.0, nice: int = 10, memory_mb: int = 0,
             python: str | None = None) -> dict[str, Any]:
    """The twin check of an export folder for ``target`` (compiled with the build's own
    provider options, ``workers.qnn.runner.provider_options``, but the quickest finalization).
    ``nice``: the child's niceness (a worker's twin yields to its compiles; a command that waits
    on its twin gives 0). Raises
    ``BadGenaiError`` for an export that can't be mapped, ``ToolchainError`` when the EP compiles
    no node; a runtime that dies while generating is ``status: runtime-crashed`` with the steps
    it finished."""
    from workers.qnn.runner import provider_options

    work_dir.mkdir(parents=True, exist_ok=True)
    # The twin checks what the graphs compute, which the finalization mode does not change: mode 1
    # (the quickest prepare) gave bit-identical outputs on the simulator for a prefill and a decode
    # graph (hidden 1024, 4 layers) against the default, in 0.81-0.86 s of CPU against 1.32-1.45
    # s a compile; its runs took 1.06 s against 0.94 (decode) and 3.09 against 3.12 (prefill).
    compile_options = {**provider_options(target, options), "htp_graph_finalization_optimization_mode": "1"}
    req = {"export": str(Path(export_dir).resolve()), "work": str((work_dir / "twin-run").resolve()),
           "provider_options": compile_options, "tokens": int(tokens), "prompt": prompt,
           "min_tokens": int(min_tokens), "nice": int(nice),
           "generate_seconds": float(generate_seconds if generate_seconds is not None else timeout / GENERATE_SHARE)}
    try:
        result, wall, _ = run_child(MODULE, "twin", req, work_dir, timeout=timeout, memory_mb=memory_mb,
                                    python=python)
    except WorkerLostError as exc:  # died before its first checkpoint: during the compile
        return {"status": "runtime-crashed", "detail": exc.message, "tokens_compared": int(tokens),
                "tokens_matched": 0, "prompt": prompt}
    result.pop("ok", None)
    result.pop("partial", None)
    if result.get("crashed"):
        result["status"] = "runtime-crashed"
        result["detail"] = f"{result.get('detail')}: {result.pop('crashed')}"
    result["wall_seconds"] = round(wall, 3)
    return result
