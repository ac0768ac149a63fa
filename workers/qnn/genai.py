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

import os
import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.core.catalog import Target
from farm.core.errors import FarmError, ResourceLimitError, WorkerLostError
from farm.core.genai import TWIN_PROMPT, TWIN_TOKENS
from farm.core.hostmem import CAP_FACTOR, available_mb
from workers.runner import run_child

MODULE = "workers.qnn.genai_child"
TWIN_MIN_TOKENS = 4  # compared, always (fewer only where the KV cache can't hold them)
GENERATE_SHARE = 20  # the twin's generation past the minimum: within timeout / GENERATE_SHARE
HVX_THREADS = 4  # the threads the HTP simulator runs a graph on (genai_child.HVX_THREADS)
MIB = 1 << 20


def check_folder(folder: Path, work_dir: Path, *, parts: list[list[str]] | None = None,
                 described: dict[str, list[str]] | None = None, timeout: float = 300.0,
                 memory_mb: int = 0, python: str | None = None) -> dict[str, Any]:
    """Check a built genai folder in a child process (see the module docstring). ``parts``:
    each part's [prefill file, decode file], when the caller knows them (the manifest's roles).
    ``described``: binaries not in the folder, by name, with the QNN graphs the System API found
    in them when they were built (the same bytes: the check takes those graphs, reads nothing).
    ``python``: the interpreter of the worker environment to run it in (default: this one).
    Raises ``GenaiFolderError``; a child that dies is ``worker-lost`` / ``resource-limit``."""
    from workers.host import pool_for

    work_dir.mkdir(parents=True, exist_ok=True)
    # A job forked from the warm check host (``prestart_check``; started here if it was not): the
    # guards and errors of ``run_child``, without an interpreter and runtime imports per check.
    result, _, _, _ = pool_for(MODULE, python=python).run(
        "check", {"folder": str(Path(folder).resolve()), "parts": parts or [], "described": described or {}},
        work_dir, timeout=timeout,
        memory_mb=memory_mb)
    result.pop("ok", None)
    return result


def prestart_check(*, python: str | None = None) -> None:
    """Spawn the warm folder-check host now without waiting for it (``workers.host.HostPool.prestart``):
    its interpreter start and onnxruntime-genai import (~0.25 s of CPU) run while the parts compile,
    not after them; every folder check of this process (each target of a package) forks from it."""
    from workers.host import pool_for

    pool_for(MODULE, python=python).prestart(1)


def twin_compile_options(target: Target, options: dict[str, Any]) -> dict[str, str]:
    """The provider options the twin's graphs are compiled with: the build's own
    (``workers.qnn.runner.provider_options``) but the quickest finalization."""
    from workers.qnn.runner import provider_options

    # The twin checks what the graphs compute, which the finalization mode does not change: mode 1
    # (the quickest prepare) gave bit-identical outputs on the simulator for a prefill and a decode
    # graph (hidden 1024, 4 layers) against the default, in 0.81-0.86 s of CPU against 1.32-1.45
    # s a compile; its runs took 1.06 s against 0.94 (decode) and 3.09 against 3.12 (prefill).
    return {**provider_options(target, options), "htp_graph_finalization_optimization_mode": "1"}


def twin_compile_part(export_dir: Path, part_index: int, target: Target, options: dict[str, Any], out_dir: Path, *,
                      timeout: float = 600.0, nice: int = 10, memory_mb: int = 0, python: str | None = None,
                      cpus: list[int] | None = None) -> dict[str, Any]:
    """Part ``part_index``'s prefill and decode graph compiled WITHOUT sharing into ``out_dir``
    (a child process; the twin's contexts, so a farm build can run one part's as its own job).
    Returns ``{"part", "files": {stage name: absolute path of the context model, its .bin
    beside it}, "graphs": {role: compile seconds and placement}, "compile_seconds",
    "wall_seconds"}``; pass the files of every part as ``run_twin(compiled=...)``. Raises
    ``BadGenaiError`` (no such part, an export that can't be mapped), ``ToolchainError`` (the
    EP compiled no node), ``worker-lost`` / ``resource-limit`` for a child that dies."""
    out_dir.mkdir(parents=True, exist_ok=True)
    req = {"export": str(Path(export_dir).resolve()), "part": int(part_index), "out_dir": str(out_dir.resolve()),
           "provider_options": twin_compile_options(target, options), "nice": int(nice), "cpus": cpus}
    result, wall, _ = run_child(MODULE, "compile_part", req, out_dir, timeout=timeout, memory_mb=memory_mb,
                                python=python)
    result.pop("ok", None)
    result["wall_seconds"] = round(wall, 3)
    return result


def cpu_slots(cpus: list[int], count: int) -> list[list[int]]:
    """``cpus`` split into ``count`` disjoint sets for children that run at once: ``HVX_THREADS``
    CPUs each where there are enough (the simulator runs a graph on that many threads), else one
    each (a child's simulator threads stay on its set: with fewer CPUs than its threads, one is
    faster than several, ``genai_child._simulator_cpus``); fewer sets when there are fewer CPUs."""
    count = max(1, min(count, len(cpus)))
    size = HVX_THREADS if len(cpus) // count >= HVX_THREADS else 1
    return [cpus[i * size:(i + 1) * size] for i in range(count)]


def memory_bound(part_bytes: list[int], available: int) -> int:
    """How many twin compiles (``twin_compile_part``, the parts compiled here) fit in
    ``available`` bytes at once: each holds its part's weights about three times, the largest
    part counted for each; at least one."""
    need = 3 * max(part_bytes, default=0)
    return max(1, available // need) if need else len(part_bytes) or 1


# ---- the twin's children: their memory caps and what runs at once ---------------------------------
#
# Each check child's peak grows with what it loads: a part check its part (the CPU EP session of
# both graphs, the simulator's copy of the contexts), the generation every part and the CPU stages
# (the source pipeline on the CPU EP, then the twin: the prefill graphs on the CPU EP, the decode
# contexts on the simulator). Measured, QNN 2.51.0, x86_64, no cap (the children's peak_rss_kib /
# peak_vm_kib; bench/genai_export.py --parts 2, prompt TWIN_PROMPT, 2 tokens):
#
#   export                    loads (MiB)      peak RSS (MiB)   VmPeak (MiB)
#   hidden 1024, 8 layers     part 162         445 / 485        1,522 / 1,559   (part check 0 / 1)
#                             all 326          757              1,930           (generation)
#   hidden 1536, 12 layers    part 543         1,043 / 1,484    2,417 / 2,855
#                             all 1,089        2,313            3,240
#   hidden 2048, 20 layers    part 1,604       2,524 / 3,210    3,939 / 4,616
#                             all 3,214        6,615            7,195
#
# Least-squares lines through the larger part check of each size and the generation: a part
# check 315 MiB + 1.83 x its part (+26 %, -12 %, +1 % of the three), the generation 100 MiB +
# 2.03 x all it loads (within 1 %). Part 1's check peaks higher than part 0's: it first runs part
# 0 on the CPU EP for its inputs (one session at a time, but the heap keeps what it grew to).
# VmPeak runs 0.6-1.4 GiB above RSS (the simulator's and the runtime's reserved address space),
# so the flat 6 GiB compile cap killed the default size's generation (7.2 GiB of address space:
# std::bad_alloc; reproduced here with the cap at 6,144 MiB).
PART_CHECK_BASE_MB, PART_CHECK_RATIO = 315.0, 1.83
GENERATE_BASE_MB, GENERATE_RATIO = 100.0, 2.03
# VmPeak above the RSS line: the cap is never under the predicted RSS plus this (the measured gap
# is 0.6-1.4 GiB), so a small child under a low FARM_COMPILE_MEMORY_MB is not capped below its
# address space.
VM_OVER_RSS_MB = 2048
# What the twin leaves free beside its children (the worker, the page cache the store needs).
TWIN_RESERVE_MB = 512


def twin_peak_mb(load_bytes: int, *, generate: bool = False) -> int:
    """A twin child's predicted peak RSS in MiB: a part check (``load_bytes``: its part's graphs
    and weights) or, ``generate``, the generation (every part and the CPU stages)."""
    base, ratio = (GENERATE_BASE_MB, GENERATE_RATIO) if generate else (PART_CHECK_BASE_MB, PART_CHECK_RATIO)
    return int(round(base + ratio * load_bytes / MIB))


def twin_cap_mb(load_bytes: int, floor_mb: int, *, generate: bool = False) -> int:
    """The address-space cap of a twin child: CAP_FACTOR x its predicted peak RSS (and at least
    that peak plus VM_OVER_RSS_MB), never below ``floor_mb`` (FARM_COMPILE_MEMORY_MB); 0 (no
    cap) stays 0."""
    if floor_mb <= 0:
        return 0
    peak = twin_peak_mb(load_bytes, generate=generate)
    return max(floor_mb, int(CAP_FACTOR * peak), peak + VM_OVER_RSS_MB)


@dataclass(frozen=True)
class TwinPlan:
    """How the twin's check children run: each part check's cap and the generation's (MiB, 0:
    none), whether the generation runs beside the part checks, and how many part checks at once."""

    part_caps_mb: list[int]
    generate_cap_mb: int
    concurrent: bool
    parts_at_once: int


def plan_twin(part_bytes: list[int], generate_bytes: int, floor_mb: int, available_mb: int | None, *,
              concurrent: bool) -> TwinPlan:
    """The twin's children sized to this host: each capped by what it loads (``twin_cap_mb``);
    what runs at once predicted to fit ``available_mb`` (None: not known, nothing held back). The
    generation runs beside the part checks (``concurrent``) only with room for it and one part
    check; part checks run together only as many as fit (at least one). Raises
    ``ResourceLimitError`` when one child alone would not fit: not started, rather than killed by
    the kernel (or another process of the host) halfway."""
    part_need = [twin_peak_mb(b) for b in part_bytes]
    gen_need = twin_peak_mb(generate_bytes, generate=True)
    caps = [twin_cap_mb(b, floor_mb) for b in part_bytes]
    gen_cap = twin_cap_mb(generate_bytes, floor_mb, generate=True)
    largest = max(part_need, default=0)
    if available_mb is None:
        return TwinPlan(caps, gen_cap, concurrent, max(len(part_bytes), 1))
    if max(largest, gen_need) > available_mb:
        which = ("the generation (every part and the CPU stages)" if gen_need >= largest
                 else f"a part check (part {part_need.index(largest)})")
        raise ResourceLimitError(
            f"the twin check was not started: {which} is predicted to peak at {max(largest, gen_need)} MiB and "
            f"this host has {available_mb} MiB for it (MemAvailable less {TWIN_RESERVE_MB} MiB)",
            hint="run the twin on a worker with more memory, or cut the model into more parts")
    if concurrent and gen_need + largest > available_mb:
        concurrent = False  # the part checks first, then the generation alone
    room = available_mb - (gen_need if concurrent else 0)
    at_once = max(1, min(len(part_bytes), room // largest)) if largest else max(len(part_bytes), 1)
    return TwinPlan(caps, gen_cap, concurrent, at_once)


def _available_memory() -> int:
    """MemAvailable within the cgroup's limit, in bytes (``farm.core.hostmem``); unbounded where
    the host can't tell."""
    avail = available_mb()
    return avail * MIB if avail is not None else 1 << 62


def _available_mb() -> int | None:
    """What the twin's children may use now: MemAvailable (within a cgroup v2 limit) less
    TWIN_RESERVE_MB; None where the host can't tell."""
    avail = available_mb()
    return max(avail - TWIN_RESERVE_MB, 0) if avail is not None else None


def _pooled(jobs: list[Callable[[list[int] | None], Any]], slots: list[list[int]]) -> list[Any]:
    """Run ``jobs`` on threads, at most one per slot at a time, each given a free slot (its
    CPUs); returns each job's result or the exception it raised, in order."""
    free: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
    for slot in slots:
        free.put(slot)

    def one(job: Callable[[list[int] | None], Any]) -> Any:
        slot = free.get()
        try:
            return job(slot)
        except Exception as exc:  # noqa: BLE001 - handed back to the caller, who records it
            return exc
        finally:
            free.put(slot)

    with ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="twin") as pool:
        return list(pool.map(one, jobs))


def _part_failure(index: int, exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, WorkerLostError):
        return {"part": index, "status": "runtime-crashed", "detail": f"part {index}: {exc.message[:1000]}"}
    if isinstance(exc, FarmError):
        return {"part": index, "status": "unverified", "detail": f"part {index}: {exc.code}: {exc.message[:1000]}"}
    raise exc


def worst_part(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The lowest PSNR over every part's prefill and decode outputs: ``{"part", "phase",
    "output", "psnr_db"}`` (None without figures)."""
    rows = [(v, p.get("part"), phase, name) for p in parts for phase in ("prefill", "decode")
            for name, v in (p.get(phase) or {}).items() if isinstance(v, int | float)]
    if not rows:
        return None
    v, part, phase, name = min(rows, key=lambda r: r[0])
    return {"part": part, "phase": phase, "output": name, "psnr_db": v}


def run_twin(export_dir: Path, target: Target, options: dict[str, Any], work_dir: Path, *,
             tokens: int = TWIN_TOKENS, min_tokens: int = TWIN_MIN_TOKENS, generate_seconds: float | None = None,
             prompt: str = TWIN_PROMPT, timeout: float = 900.0, nice: int = 10, memory_mb: int = 0,
             python: str | None = None, compiled: dict[str, str] | None = None,
             concurrent: bool | None = None, prefill_on: str = "cpu") -> dict[str, Any]:
    """The twin check of an export folder for ``target`` (see the module docstring).
    ``compiled``: {stage name: absolute path of its twin context model} for every part stage
    (``twin_compile_part``'s files): nothing is compiled (``compiled: given``); else each part
    is compiled here first, the parts at once (``here``). Then each part's check
    (``parts``) and the end-to-end generation run in their own children; ``concurrent`` (default:
    with 2 CPUs or more) runs the generation beside the part checks, on a CPU of its own, going on
    past ``min_tokens`` while they run (else it follows them). ``prefill_on``: ``cpu`` runs the
    generation's prefill stages on the CPU EP (the part checks ran each prefill graph on the
    simulator), so its tokens past the first come from the simulator's decode steps.
    ``nice``: the children's niceness (a worker's twin yields to its compiles; a command that
    waits on its twin gives 0). ``memory_mb`` (FARM_COMPILE_MEMORY_MB) is the floor of each check
    child's address-space cap, which grows with what the child loads (``plan_twin``; 0: no caps);
    a check that this host can't hold is ``resource-limit`` before any child starts. Raises
    ``BadGenaiError`` for an export that can't be mapped,
    ``ToolchainError`` when the EP compiles no node; a runtime that dies while generating is
    ``status: runtime-crashed`` with the steps it finished."""
    from farm.core.genai import read_export

    start = time.perf_counter()
    deadline = start + timeout
    export = read_export(export_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    stages = [st for p in export.parts for st in (p.prefill, p.decode)]
    given = {k: str(v) for k, v in (compiled or {}).items()}
    cpus = sorted(os.sched_getaffinity(0))
    graphs: dict[str, Any] = {}
    how = "given"
    compile_wall = 0.0

    def left() -> float:
        return max(1.0, deadline - time.perf_counter())

    concurrent = len(cpus) >= 2 if concurrent is None else concurrent
    part_bytes, generate_bytes = _part_bytes(export), _generate_bytes(export)
    plan_twin(part_bytes, generate_bytes, memory_mb, _available_mb(), concurrent=concurrent)  # no fit: compile nothing
    if not all(given.get(st.name) for st in stages):
        how, given = "here", {}
        t = time.perf_counter()
        # The compiles are single-threaded: one part a CPU, all at once.

        def compile_one(i: int) -> Callable[[list[int] | None], Any]:
            return lambda slot: twin_compile_part(export_dir, i, target, options, work_dir / "twin-compile" / f"part{i}",
                                                  timeout=left(), nice=nice, memory_mb=memory_mb, python=python,
                                                  cpus=slot)

        done = _pooled([compile_one(p.index) for p in export.parts],
            cpu_slots(cpus, min(len(export.parts), memory_bound(part_bytes, _available_memory()))))
        for r in done:
            if isinstance(r, WorkerLostError):  # died during the compile
                return {"status": "runtime-crashed", "detail": r.message, "tokens_compared": int(tokens),
                        "tokens_matched": 0, "prompt": prompt, "compiled": how}
            if isinstance(r, BaseException):
                raise r
            given.update(r["files"])
            graphs.update(r["graphs"])
        compile_wall = time.perf_counter() - t

    # Each child capped by what it loads (``memory_mb``, FARM_COMPILE_MEMORY_MB: the floor), and
    # only as many at once as this host holds now; one that can't fit alone is resource-limit.
    plan = plan_twin(part_bytes, generate_bytes, memory_mb, _available_mb(), concurrent=concurrent)
    concurrent, room = plan.concurrent, plan.parts_at_once
    req = {"export": str(Path(export_dir).resolve()), "work": str((work_dir / "twin-run").resolve()),
           "provider_options": twin_compile_options(target, options), "tokens": int(tokens), "prompt": prompt,
           "min_tokens": int(min_tokens), "nice": int(nice), "compiled": given, "prefill_on": prefill_on,
           "generate_seconds": float(generate_seconds if generate_seconds is not None else timeout / GENERATE_SHARE)}
    phases: dict[str, float] = {}
    t_checks = time.perf_counter()

    def generation(slot: list[int] | None) -> Any:
        t = time.perf_counter()
        gen_dir = work_dir / "generate"
        gen_dir.mkdir(parents=True, exist_ok=True)
        try:
            return run_child(MODULE, "twin", {**req, "cpus": slot}, gen_dir, timeout=left(),
                             memory_mb=plan.generate_cap_mb, python=python)
        finally:
            phases["generate"] = time.perf_counter() - t

    def part_job(index: int) -> Callable[[list[int] | None], Any]:
        def job(slot: list[int] | None) -> Any:
            d = work_dir / "parts" / f"part{index}"
            d.mkdir(parents=True, exist_ok=True)
            p = export.parts[index]
            preq = {"export": req["export"], "part": index, "work": str(d.resolve()), "prompt": prompt,
                    "nice": int(nice), "cpus": slot,
                    "compiled": {st.name: given[st.name] for st in (p.prefill, p.decode)}}
            try:
                result, _, _ = run_child(MODULE, "part_check", preq, d, timeout=left(),
                                         memory_mb=plan.part_caps_mb[index], python=python)
            finally:
                phases["parts_check"] = time.perf_counter() - t_checks
            return result
        return job

    jobs = [part_job(p.index) for p in export.parts]
    if concurrent:
        # The generation on a CPU of its own, the part checks on the others (each part one set,
        # as many at once as there are sets). Past its minimum the generation goes on only while
        # the part checks run (its CPU is not theirs: those tokens cost no wall time), within
        # ``generate_seconds``.
        stop = work_dir / "parts-done"
        stop.unlink(missing_ok=True)
        req["stop_file"] = str(stop.resolve())
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="twin-generate") as pool:
            gen_future = pool.submit(lambda: _pooled([generation], [[cpus[0]]])[0])
            try:
                part_results = _pooled(jobs, cpu_slots(cpus[1:], min(len(jobs), room)))
            finally:
                stop.touch()
            gen = gen_future.result()
    else:
        part_results = _pooled(jobs, cpu_slots(cpus, min(len(jobs), room)))
        gen = _pooled([lambda _slot: generation(None)], [cpus])[0]  # its own pinning (genai_child._pin)

    parts: list[dict[str, Any]] = []
    for p, r in zip(export.parts, part_results, strict=True):
        if isinstance(r, BaseException):
            parts.append(_part_failure(p.index, r))
            continue
        r.pop("ok", None)
        if r.pop("partial", None) or r.get("crashed"):
            r["status"] = "runtime-crashed"
            r["detail"] = f"{r.get('detail')}: {r.pop('crashed', '')}"
        parts.append(r)
    if isinstance(gen, WorkerLostError):  # died before its first checkpoint
        result: dict[str, Any] = {"status": "runtime-crashed", "detail": gen.message, "tokens_compared": int(tokens),
                                  "tokens_matched": 0, "prompt": prompt}
    elif isinstance(gen, BaseException):
        raise gen
    else:  # (result, wall, log)
        result, _, _ = gen
        result.pop("ok", None)
        result.pop("partial", None)
        if result.get("crashed"):
            result["status"] = "runtime-crashed"
            result["detail"] = f"{result.get('detail')}: {result.pop('crashed')}"
    if how == "here":
        result["graphs"] = graphs
        result["compile_seconds"] = round(compile_wall, 3)
    result["compiled"] = how
    result["parts"] = parts
    result["worst_part"] = worst_part(parts)
    failed = next((p for p in parts if p.get("status") != "ok"), None)
    if failed is not None and result.get("status") == "ok":  # a part that can't be checked: no verdict
        result["status"], result["detail"] = failed["status"], failed.get("detail")
    timing = result.setdefault("timing", {})
    timing.update({"compile": round(compile_wall, 3), "parts_check": round(phases.get("parts_check", 0.0), 3),
                   "generate": round(phases.get("generate", 0.0), 3), "concurrent": bool(concurrent)})
    result["wall_seconds"] = round(time.perf_counter() - start, 3)
    return result


def _part_bytes(export: Any) -> list[int]:
    """Each part's weights in bytes (its graphs and their external data)."""
    out = []
    for p in export.parts:
        files = {p.prefill.graph.file, p.decode.graph.file, *p.data}
        out.append(sum(export.path(f).stat().st_size for f in files))
    return out


def _generate_bytes(export: Any) -> int:
    """What the twin's generation loads, in bytes: every stage's graph and external data (the
    parts and the CPU stages), each file once."""
    files = {f for st in export.stages for f in (st.graph.file, *st.graph.data)}
    for p in export.parts:
        files.update(p.data)
    return sum(export.path(f).stat().st_size for f in files)
