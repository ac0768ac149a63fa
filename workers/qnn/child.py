"""Child process for QNN compiles and loads: the only place that imports onnxruntime_qnn.

    python -m workers.qnn.child compile REQUEST.json RESULT.json
    python -m workers.qnn.child load    REQUEST.json RESULT.json
    python -m workers.qnn.child host    (a warm compile host: workers.host)

Writes ``{"ok": true, ...}`` or ``{"ok": false, "error": {"code", "message"}}`` to RESULT.json.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

from workers.childproc import checkpoint, run_commands

_REGISTERED: list[bool] = []  # an EP library registers once per process
_LIVE: list[object] = []  # the self-probe's session, left to the process's exit


# A model the QNN EP takes no node of (Identity on strings), for the host's warm-up session:
# onnx.helper.make_model(make_graph([make_node("Identity", ["x"], ["y"])], "warmup", [x], [y]),
# opset 13, IR 8, producer "ctxfarm"), x and y string tensors of shape [1]; the bytes are checked
# against that recipe by tests/unit/workers/test_qnn_child.py.
WARMUP_MODEL = bytes.fromhex(
    "080812076374786661726d3a3c0a100a017812017922084964656e7469747912067761726d75705a0f0a0178120a0a0808"
    "0812040a020801620f0a0179120a0a08080812040a02080142040a00100d")


def preload() -> None:
    """A warm compile host's start (``child host``, workers.childproc.serve_host): onnxruntime
    imported, the QNN EP library registered, and one session of ``WARMUP_MODEL`` with the QNN EP
    (the EP set up and asked for its nodes; it takes none, so no QNN graph is built). Every job
    forked from the host inherits all of it. A compile in such a fork writes the bytes a fresh
    process writes (QNN 2.49.40, 2.51.0: measured, and the integration tests check it), and
    saves 15-25 ms; a host that compiled once would not (the SDK numbers its graphs per process)."""
    import onnxruntime as ort

    ort.disable_telemetry_events()  # an offline farm; and a forked job never needs its thread
    _, so = _session_options({})
    so.log_severity_level = 3
    ort.InferenceSession(WARMUP_MODEL, so, enable_fallback=0)


def _session_options(provider_options: dict[str, str] | None):  # type: ignore[no-untyped-def]
    import onnxruntime as ort
    import onnxruntime_qnn as oq

    if not _REGISTERED:
        ort.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
        _REGISTERED.append(True)
    if provider_options is None:
        return ort, None
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devices:
        raise RuntimeError("onnxruntime-qnn registered no QNN device")
    so = ort.SessionOptions()
    so.log_severity_level = 2
    so.add_provider_for_devices(devices, {"backend_path": oq.get_qnn_htp_path(), **provider_options})
    return ort, so


def ir_version_of(head: bytes) -> int | None:
    """A serialized ModelProto's ``ir_version`` when it is the first field (field 1, a varint), as
    onnx and onnxruntime write it, and fits one byte (every IR version so far); None otherwise."""
    return head[1] if len(head) >= 2 and head[0] == 0x08 and head[1] < 0x80 else None


# The IR version onnxruntime 1.24 to 1.31 write context models in (1.24.4 measured; 1.31.1
# refuses newer), which every device runtime of the worker pins reads.
CONTEXT_IR = 13


def keep_ir_version(ctx_path: str, source_path: str) -> int | None:
    """Write the context model in IR ``max(source's, CONTEXT_IR)`` when onnxruntime wrote a newer
    one: onnxruntime 1.32 writes IR 14, which onnxruntime 1.31 and older refuse before the EP sees
    the context, so a device whose runtime ran the source model (and loaded contexts the farm made
    before) could not load it. The context holds only the source's nodes and EPContext nodes,
    which IR 13 describes. Patched in place, one byte for one (both versions under 128), so the
    file's size is unchanged whatever it holds; returns the version written, or None if left."""
    with open(source_path, "rb") as f:
        source = ir_version_of(f.read(2))
    with open(ctx_path, "r+b") as f:
        written = ir_version_of(f.read(2))
        if source is None or written is None:
            return None  # not the first field: leave the file as onnxruntime wrote it
        wanted = max(source, CONTEXT_IR)
        if not 0 < wanted < written:
            return None
        f.seek(1)
        f.write(bytes([wanted]))
    return wanted


def compile_model(req: dict[str, Any]) -> dict[str, Any]:
    ort, so = _session_options(req["provider_options"])
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", req["ctx_path"])
    so.add_session_config_entry("ep.context_embed_mode", str(req["embed_mode"]))
    # onnxruntime names the EPContext partition after a hash of the model path as given, so a
    # bundle compiled from another directory gave other bytes (measured). Compiling from the
    # model's own directory by its fixed file name makes the bytes depend on the content only;
    # external data files resolve relative to it as before. (Passing the model as bytes is not
    # enough: with external data the folder path is hashed instead.)
    os.chdir(os.path.dirname(os.path.abspath(req["model"])))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    # enable_fallback=0: never retry silently on the CPU EP when the QNN EP fails.
    ort.InferenceSession(os.path.basename(req["model"]), so, enable_fallback=0)
    result: dict[str, Any] = {"compile_seconds": time.perf_counter() - start,
                              "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults}
    if os.path.exists(req["ctx_path"]):
        keep_ir_version(req["ctx_path"], os.path.basename(req["model"]))
    if req.get("describe"):
        result["descriptions"] = describe_outputs(os.path.dirname(req["ctx_path"]))
    if req.get("verify_load"):
        checkpoint({**result, "self_load": {"ok": False, "error": "loading the fresh context crashed the process"}})
        # Load the fresh context in this process (no second interpreter + EP start-up): the
        # worker records it as probe evidence for its own toolchain.
        try:
            # Load only (session creation): that is the verdict; running is the probe's extra.
            _, so2 = _session_options(req["provider_options"])
            t0 = time.perf_counter()
            # Kept: a job forked by a warm host ends with os._exit, which spares its teardown
            # (3-14 ms measured); a fresh child tears it down at exit as before.
            _LIVE.append(ort.InferenceSession(req["ctx_path"], so2, enable_fallback=0))
            result["self_load"] = {"ok": True, "load_seconds": time.perf_counter() - t0}
        except Exception as exc:
            result["self_load"] = {"ok": False, "error": str(exc)[:2000]}
    # The process's peak RSS (compile and self-probe): what memory planning (farm.pipeline.memory)
    # fits its predictions on. A forked job's figure counts the pages it shares with its host.
    result["peak_rss_kib"] = _vm_hwm_kib()
    return result


def _vm_hwm_kib() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def compile_group(req: dict[str, Any]) -> dict[str, Any]:
    """A graph group: each graph in its own session, in order, with ``ep.share_ep_contexts=1``
    (and ``ep.stop_share_ep_contexts=1`` on the last), so the QNN EP links them into shared
    context binaries (the last session writes them). Through ``onnxruntime.ModelCompiler``
    where this onnxruntime has it (the documented compile API), else a session with
    ``ep.context_enable``; both wrote the same files (measured, QNN 2.51.0). Each graph compiles
    from its own directory by its own fixed file name (see ``compile_model``)."""
    ort, _ = _session_options(None)
    members = req["group"]
    # A twin build (``share`` false): each graph alone, a binary of its own (what the simulator
    # runs), at a lower priority than the compiles a publication waits on (``nice``).
    share = bool(req.get("share", True))
    if int(req.get("nice", 0)) > 0:
        os.nice(int(req["nice"]))
    graphs = []
    start = time.perf_counter()
    for i, m in enumerate(members):
        _, so = _session_options(req["provider_options"])
        if share:
            so.add_session_config_entry("ep.share_ep_contexts", "1")
        if share and m.get("stop", i == len(members) - 1):  # the last graph of a part ends its binaries
            so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
        os.chdir(os.path.dirname(os.path.abspath(m["model"])))
        name = os.path.basename(m["model"])
        t0 = time.perf_counter()
        if hasattr(ort, "ModelCompiler"):
            ort.ModelCompiler(so, name, embed_compiled_data_into_model=False).compile_to_file(m["ctx_path"])
        else:
            so.add_session_config_entry("ep.context_enable", "1")
            so.add_session_config_entry("ep.context_file_path", m["ctx_path"])
            so.add_session_config_entry("ep.context_embed_mode", "0")
            ort.InferenceSession(name, so, enable_fallback=0)
        if os.path.exists(m["ctx_path"]):
            keep_ir_version(m["ctx_path"], name)
        graphs.append({"compile_seconds": time.perf_counter() - t0,
                       "peak_rss_kib": _vm_hwm_kib()})
        checkpoint({"compile_seconds": time.perf_counter() - start, "graphs": graphs})
    result: dict[str, Any] = {"compile_seconds": time.perf_counter() - start, "graphs": graphs,
                              "api": "ModelCompiler" if hasattr(ort, "ModelCompiler") else "InferenceSession"}
    result["peak_rss_kib"] = _vm_hwm_kib()  # the whole group's peak: what the memory planner learns from
    result["descriptions"] = describe_outputs(req["out_dir"])
    return result


def describe_outputs(out_dir: str) -> dict[str, Any]:
    """Each context binary in ``out_dir`` as the QNN System API of this toolchain describes it
    (workers.qnn.sysapi), by file name; a binary it can't read carries ``error``."""
    import onnxruntime_qnn as oq

    from workers.qnn.sysapi import DescriptionError, describe_file

    library = os.path.join(os.path.dirname(oq.get_library_path()), "libQnnSystem.so")
    out: dict[str, Any] = {}
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".bin"):
            t0 = time.perf_counter()
            try:
                out[name] = describe_file(library, os.path.join(out_dir, name))
            except (DescriptionError, OSError, ValueError) as exc:
                out[name] = {"error": str(exc)[:500]}
            out[name]["read_seconds"] = round(time.perf_counter() - t0, 6)
    return out


def load_model(req: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    ort, so = _session_options(req["provider_options"])
    start = time.perf_counter()
    sess = ort.InferenceSession(req["ctx_model"], so, enable_fallback=0)
    load_seconds = time.perf_counter() - start
    checkpoint({"load_seconds": load_seconds, "run": "running the loaded context crashed the process"})
    feeds = {}
    rng = np.random.default_rng(0)
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
        dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
                 "tensor(int32)": np.int32, "tensor(uint8)": np.uint8}.get(inp.type, np.float32)
        feeds[inp.name] = rng.random(shape).astype(dtype)
    start = time.perf_counter()
    outputs = sess.run(None, feeds)
    run_seconds = time.perf_counter() - start
    return {
        "load_seconds": load_seconds,
        "run_seconds": run_seconds,
        "outputs": [list(o.shape) for o in outputs],
        "providers": sess.get_providers(),
    }


def main(argv: list[str]) -> int:
    rc = run_commands(argv, {"compile": compile_model, "compile_group": compile_group, "load": load_model},
                      preload=preload)
    _LIVE.clear()  # a fresh child: torn down here, in order, not during interpreter shutdown
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
