"""The Runner protocol and the child-process harness every backend uses.

A compile runs in a child process (``python -m workers.<backend>.child``, ``run_child``) or in a
job forked from a warm compile host (``workers.host``), in a fresh temp dir: ORT refuses to
overwrite an existing context file, a crashing SDK library must not take the caller down, and a
hung compile must be killable. Both read a finished child the same way (``child_outcome``).
This module imports no onnxruntime, and no backend: the backends import it (their shared types),
and the lookup of a backend's runner lives above them, in ``workers.backends``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from farm.core.catalog import Target
from farm.core.errors import (
    FarmError,
    LeaseLostError,
    ResourceLimitError,
    ToolchainError,
    WorkerLostError,
    error_for_code,
)

MEDIA_CTX_MODEL = "application/vnd.ctxfarm.epcontext-model.v1+onnx"
MEDIA_LOG = "text/plain; charset=utf-8"
LOG_LIMIT = 256 * 1024  # bytes of compile log kept in the index/manifest
_OOM_NEEDLES = ("std::bad_alloc", "Cannot allocate memory", "MemoryError", "out of memory")
KILL_GRACE_S = 5.0  # the child stops itself at its time limit; we kill its group this much later


@dataclass(frozen=True)
class Toolchain:
    """What compiles: the backend SDK version (the build key's toolchain) and the packages."""

    backend: str
    version: str  # QNN SDK version (2.51.0) or TensorRT version (10.13.x)
    ort_version: str
    ep_package: str
    ep_version: str
    extra: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Every artifact's files use this fixed stem (model_ctx.onnx + the EP's model_ctx_*.bin): no file
# name ever comes from a user-supplied model name.
CTX_STEM = "model"
CTX_MODEL_NAME = f"{CTX_STEM}_ctx.onnx"


class CancelFlag(Protocol):
    """Set by the owner to stop a running child (a lost lease): ``threading.Event`` fits."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class CompileJob:
    model_path: Path
    target: Target
    options: dict[str, Any]
    timeout: float
    memory_mb: int = 0  # address-space cap of the compile child; 0 = none
    verify_load: bool = False  # also load the result in the compile child (self-probe)
    cancel: CancelFlag | None = None


@dataclass(frozen=True)
class OutputFile:
    name: str  # relative to the output dir, as the context model references it
    path: Path
    role: str  # ctx-model | context
    media_type: str


@dataclass
class CompileOutput:
    out_dir: Path
    ctx_model: str
    files: list[OutputFile]
    compile_seconds: float  # inside the child: session creation = the EP's compile
    wall_seconds: float  # child process start to finish
    epcontext: list[dict[str, Any]]
    placement: dict[str, Any]
    toolchain: Toolchain
    log: str
    self_load: dict[str, Any] | None = None  # {"ok", "load_seconds" | "error"} when verify_load
    # Finer parent-side timings of the call, where the runner has them (a warm host: waiting for
    # a host, the fork and the job's own wall): seconds by name.
    timings: dict[str, float] = field(default_factory=dict)
    # A graph group (farm.core.groups): each graph's name, context model and binaries.
    graphs: list[dict[str, Any]] | None = None
    # What the context binaries say about themselves (QNN System API), checked; the evidence.
    description: dict[str, Any] | None = None
    # Why no runtime here can load it (weight-shared, multi-SoC): no self-probe verdict then.
    unverified: str | None = None
    # The EP's own compatibility string(s) the context model carries (``ep_compatibility_info.<EP>``
    # metadata), by EP name: recorded in the manifest and the index.
    compatibility: dict[str, str] = field(default_factory=dict)

class Runner(Protocol):
    backend: str

    def toolchain(self) -> Toolchain:
        """The toolchain installed in this environment. Raises MissingExtraError when absent."""
        ...

    def compile(self, job: CompileJob, work_dir: Path) -> CompileOutput:
        """Compile ``job`` into ``work_dir/out``. Raises a FarmError with a failure code."""
        ...

    def load_check(self, ctx_model: Path, target: Target, *, timeout: float = 300.0) -> dict[str, Any]:
        """Load a context model (and run it once); returns timings. Raises on failure."""
        ...


def collect_output(ep: str, job: CompileJob, out_dir: Path, ctx_name: str, result: dict[str, Any], wall: float,
                   log: str, toolchain: Toolchain, context_media: str, *, strays: str) -> CompileOutput:
    """Read what an EP wrote back and turn it into a CompileOutput, for every backend.

    Checks: a context model exists, it has EPContext nodes, every referenced file stays inside
    ``out_dir``. The placement (CPU nodes and their op types) is recorded, never refused here:
    ``--require-full-offload`` is a gate on each request's answer (farm.pipeline.submission).
    ``strays``: files the context model does not reference are an ``error`` (QNN writes none) or
    ``delete``d (TensorRT leaves profiles).
    """
    from farm.core.errors import UnsupportedOpsError
    from workers.epcontext import read_context, referenced_files

    ctx_path = out_dir / ctx_name
    if not ctx_path.exists():
        # The session was created (the compile succeeded) but no EPContext model was written:
        # onnxruntime writes one only when an EP took nodes. Measured with QNN on a model of
        # ops HTP has no kernel for; deterministic, so not retried.
        op_types = _op_types(job.model_path)
        raise UnsupportedOpsError(
            f"the {ep} EP took no node of this model ({', '.join(op_types) or 'op types unknown'}): "
            "it wrote no context model",
            hint=f"ops in the model: {', '.join(op_types) or 'unknown'}; none of them runs on {ep}",
            details={"log": log, "cpu_op_types": op_types},
        )
    nodes, placement, compatibility = read_context(ctx_path)
    if not nodes:
        raise UnsupportedOpsError(
            f"the {ep} EP took no node of this model ({', '.join(placement['cpu_op_types'])}): "
            "nothing to put in a context binary",
            hint=f"ops in the model: {', '.join(placement['cpu_op_types'])}",
            details={"log": log, "cpu_op_types": placement["cpu_op_types"]},
        )
    files = [OutputFile(ctx_name, ctx_path, "ctx-model", MEDIA_CTX_MODEL)]
    files += [OutputFile(rel, out_dir / rel, "context", context_media) for rel in referenced_files(nodes, out_dir)]
    known = {f.name for f in files}
    extra = sorted(p for p in out_dir.rglob("*") if p.is_file() and str(p.relative_to(out_dir)) not in known)
    if extra and strays == "error":
        raise ToolchainError(f"the {ep} EP wrote files the context model does not reference: "
                             f"{[str(p.relative_to(out_dir)) for p in extra]}")
    for p in extra:
        p.unlink()
    return CompileOutput(out_dir, ctx_name, files, float(result["compile_seconds"]), wall, nodes, placement,
                         toolchain, log, result.get("self_load"), compatibility=compatibility)


def _op_types(model_path: Path) -> list[str]:
    """The op types of a model (its graph only, external data not loaded); [] if unreadable."""
    try:
        import onnx

        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # noqa: BLE001 - only for the message
        return []
    return sorted({n.op_type for n in model.graph.node})


def read_log(path: Path) -> str:
    if not path.exists():
        return ""
    data = path.read_bytes()
    if len(data) > LOG_LIMIT:
        data = b"[... log truncated ...]\n" + data[-LOG_LIMIT:]
    from farm.core.text import strip_ansi

    # onnxruntime colours its log lines even into a file: none reach a build log or JSON.
    return strip_ansi(data.decode("utf-8", "replace"))


def run_child(module: str, command: str, request: dict[str, Any], work_dir: Path, *, timeout: float,
              memory_mb: int = 0, cancel: CancelFlag | None = None, env: dict[str, str] | None = None,
              python: str | None = None) -> tuple[dict[str, Any], float, str]:
    """Run ``python -m module command req.json res.json`` under a time and memory cap.

    Returns (result, wall seconds, log). Errors the child reports come back as the FarmError of
    their code. The child dies with us (PR_SET_PDEATHSIG, workers.childproc) and stops itself at
    ``timeout``; we also kill its process group a little later, on ``cancel`` (a lost lease:
    LeaseLostError) and on any exception here (Ctrl-C, SIGTERM). Past a cap is
    ``resource-limit``; death by another signal is ``worker-lost``.
    """
    req_path = work_dir / f"{command}-request.json"
    res_path = work_dir / f"{command}-result.json"
    log_path = work_dir / f"{command}.log"
    req_path.write_text(json.dumps(request))
    res_path.unlink(missing_ok=True)
    argv = [python or sys.executable, "-m", module, command, str(req_path), str(res_path)]
    env = {**os.environ, **(env or {})}
    # The child must import this project even when run from another working directory.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(CTXFARM_PARENT_PID=str(os.getpid()), CTXFARM_TIME_LIMIT=f"{timeout:g}",
               CTXFARM_MEMORY_MB=str(int(memory_mb)))
    start = time.perf_counter()
    deadline = time.monotonic() + timeout + KILL_GRACE_S
    peak_kib = 0
    with open(log_path, "wb") as log:
        # Own session: a timeout or cancel kills the whole group (the SDK may fork helpers).
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=work_dir, env=env, start_new_session=True)
        try:
            pause = 0.002
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    peak_kib = usage.ru_maxrss
                    break
                if cancel is not None and cancel.is_set():
                    _kill_group(proc)
                    raise LeaseLostError(f"{command} stopped: this executor lost the build's lease")
                if time.monotonic() > deadline:
                    _kill_group(proc)
                    raise ResourceLimitError(
                        f"{command} did not finish within {timeout:g} s and was stopped",
                        details={"log": read_log(log_path)})
                time.sleep(pause)
                pause = min(pause * 1.5, 0.05)
        except BaseException:
            _kill_group(proc)
            raise
    wall = time.perf_counter() - start
    result, log_text = child_outcome(command, proc.returncode, peak_kib, res_path, log_path, memory_mb)
    return result, wall, log_text


def child_outcome(command: str, rc: int, peak_kib: int, res_path: Path, log_path: Path,
                  memory_mb: int) -> tuple[dict[str, Any], str]:
    """(result, log) of a finished child (``rc`` as ``os.waitstatus_to_exitcode`` gives it: < 0
    is a signal), or the FarmError of its code: the child's own error, ``resource-limit`` past the
    memory cap, ``worker-lost`` for death by another signal, else ``toolchain-error``."""
    log_text = read_log(log_path)
    try:
        result: dict[str, Any] = json.loads(res_path.read_text()) if res_path.exists() else {}
    except (OSError, ValueError):
        result = {}
    if rc == 0 and result.get("ok"):
        return result, log_text
    if rc < 0 and result.get("ok") and result.get("partial"):
        # The child checkpointed finished steps before a step that killed it: keep them.
        result["crashed"] = f"signal {-rc} ({_signame(-rc)})"
        return result, log_text
    err = result.get("error")
    # An allocation refused under RLIMIT_AS usually aborts C++ code (std::bad_alloc): the log
    # says so, while the peak RSS stays well under the (address-space) cap.
    out_of_memory = memory_mb > 0 and (peak_kib * 1024 >= 0.9 * memory_mb * 1024 * 1024
                                       or any(n in log_text[-20000:] for n in _OOM_NEEDLES))
    if err:
        exc: FarmError = error_for_code(err["code"], err["message"], hint=err.get("hint"))
    elif rc < 0 and out_of_memory:
        exc = ResourceLimitError(f"{command} ran out of memory under its cap of {memory_mb} MiB and died with "
                                 f"signal {-rc} ({_signame(-rc)}); peak RSS {peak_kib // 1024} MiB")
    elif rc < 0:
        exc = WorkerLostError(f"{command} process died with signal {-rc} ({_signame(-rc)})",
                              hint="the SDK crashed on this model; the log holds its last words")
    else:
        tail = "\n".join(log_text.strip().splitlines()[-5:])
        exc = ToolchainError(f"{command} process exited with code {rc}: {tail}")
    exc.details["log"] = log_text
    exc.details["peak_rss_kib"] = peak_kib
    raise exc


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "unknown"
