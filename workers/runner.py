"""The Runner protocol and the child-process harness every backend uses.

A compile runs in a child process (``python -m workers.<backend>.child``) in a fresh temp dir:
ORT refuses to overwrite an existing context file, a crashing SDK library must not take the
caller down, and a hung compile must be killable. This module imports no onnxruntime.
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

from farm.catalog import Target
from farm.errors import (
    CompileTimeoutError,
    FarmError,
    MissingExtraError,
    ToolchainError,
    WorkerLostError,
    error_for_code,
)

MEDIA_CTX_MODEL = "application/vnd.ctxfarm.epcontext-model.v1+onnx"
MEDIA_LOG = "text/plain; charset=utf-8"
LOG_LIMIT = 256 * 1024  # bytes of compile log kept in the index/manifest


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


@dataclass(frozen=True)
class CompileJob:
    model_path: Path
    target: Target
    options: dict[str, Any]
    ctx_stem: str  # output is <ctx_stem>_ctx.onnx (+ context files named by the EP)
    timeout: float
    verify_load: bool = False  # also load the result in the compile child (self-probe)


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

    Checks: a context model exists, it has EPContext nodes, full offload when required, every
    referenced file stays inside ``out_dir``. ``strays``: files the context model does not
    reference are an ``error`` (QNN writes none) or ``delete``d (TensorRT leaves profiles).
    """
    from farm.errors import UnsupportedOpsError
    from workers.epcontext import read_epcontext, referenced_files

    ctx_path = out_dir / ctx_name
    if not ctx_path.exists():
        raise ToolchainError(f"the {ep} EP finished without writing a context model", details={"log": log})
    nodes, placement = read_epcontext(ctx_path)
    if not nodes:
        raise UnsupportedOpsError(
            f"the {ep} EP took no node of this model: nothing to put in a context binary",
            hint=f"ops in the model: {', '.join(placement['cpu_op_types'])}",
            details={"log": log, "cpu_op_types": placement["cpu_op_types"]},
        )
    if job.options.get("require_full_offload") and placement["cpu_nodes"]:
        ops = ", ".join(placement["cpu_op_types"])
        raise UnsupportedOpsError(
            f"{placement['cpu_nodes']} node(s) would stay on the CPU ({ops}) and full offload is required",
            hint="drop require_full_offload=true to ship a partially offloaded model, or replace these ops",
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
                         toolchain, log, result.get("self_load"))


def get_runner(backend: str) -> Runner:
    if backend == "qnn":
        from workers.qnn.runner import QnnRunner

        return QnnRunner()
    if backend == "trt":
        from workers.trt.runner import TrtRunner

        return TrtRunner()
    raise MissingExtraError(f"no runner for backend {backend!r}")


def read_log(path: Path) -> str:
    if not path.exists():
        return ""
    data = path.read_bytes()
    if len(data) > LOG_LIMIT:
        data = b"[... log truncated ...]\n" + data[-LOG_LIMIT:]
    return data.decode("utf-8", "replace")


def run_child(module: str, command: str, request: dict[str, Any], work_dir: Path, *, timeout: float,
              python: str | None = None) -> tuple[dict[str, Any], float, str]:
    """Run ``python -m module command req.json res.json`` with a timeout.

    Returns (result, wall seconds, log). Errors the child reports come back as the FarmError of
    their code; a timeout kills the whole process group; death by signal is ``worker-lost``.
    """
    req_path = work_dir / f"{command}-request.json"
    res_path = work_dir / f"{command}-result.json"
    log_path = work_dir / f"{command}.log"
    req_path.write_text(json.dumps(request))
    res_path.unlink(missing_ok=True)
    argv = [python or sys.executable, "-m", module, command, str(req_path), str(res_path)]
    env = dict(os.environ)
    # The child must import this project even when run from another working directory.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=work_dir, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CompileTimeoutError(
                f"{command} did not finish within {timeout:g} s and was stopped",
                hint="raise FARM_COMPILE_TIMEOUT if this model legitimately needs longer",
                details={"log": read_log(log_path)},
            ) from None
        except BaseException:
            _kill_group(proc)
            raise
    wall = time.perf_counter() - start
    log_text = read_log(log_path)
    result: dict[str, Any] = json.loads(res_path.read_text()) if res_path.exists() else {}
    if rc == 0 and result.get("ok"):
        return result, wall, log_text
    if rc < 0 and result.get("ok") and result.get("partial"):
        # The child checkpointed finished steps before a step that killed it: keep them.
        result["crashed"] = f"signal {-rc} ({_signame(-rc)})"
        return result, wall, log_text
    err = result.get("error")
    if err:
        exc: FarmError = error_for_code(err["code"], err["message"], hint=err.get("hint"))
    elif rc < 0:
        exc = WorkerLostError(f"{command} process died with signal {-rc} ({_signame(-rc)})",
                              hint="the SDK crashed on this model; the log holds its last words")
    else:
        tail = "\n".join(log_text.strip().splitlines()[-5:])
        exc = ToolchainError(f"{command} process exited with code {rc}: {tail}")
    exc.details["log"] = log_text
    raise exc


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
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
