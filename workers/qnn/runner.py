"""QnnRunner: compiles EPContext models for the QNN HTP backend in a job process forked from a
warm compile host (workers.host), or in a fresh child process.

This module imports no onnxruntime: the toolchain is read from the packages' build info files,
and the compile/load happens in ``workers.qnn.child``.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

from farm.core.catalog import Target
from farm.core.errors import (
    FarmError,
    LoadUnverifiedError,
    MissingExtraError,
    RuntimeCrashedError,
    RuntimeTooOldError,
    TargetMismatchError,
    ToolchainError,
    WorkerLostError,
)
from farm.core.keys import parse_version
from workers.epcontext import ContextModel, open_context
from workers.qnn import description
from workers.runner import CTX_MODEL_NAME, CompileJob, CompileOutput, Toolchain, collect_output, run_child

MEDIA_QNN_CONTEXT = "application/vnd.qualcomm.qnn.context-binary.v1"
# The niceness of a twin build's compile child: the compiles a publication waits on go first.
TWIN_NICE = 10
CHILD = "workers.qnn.child"


@lru_cache(maxsize=1)
def detect_toolchain() -> Toolchain:
    """QNN SDK version and package versions of this environment, without importing them.

    Read from the ``build_and_package_info.py`` each onnxruntime wheel writes at build time
    (``package_name``, ``__version__``, and ``qnn_version`` for onnxruntime-qnn), not through
    importlib.metadata, whose import alone costs every ``farm build`` about 20 ms."""
    qnn = _build_info("onnxruntime_qnn", "build_and_package_info.py")
    if qnn.get("package_name") != "onnxruntime-qnn" or not qnn.get("__version__"):
        from farm.core.extras import install_hint

        raise MissingExtraError(
            "onnxruntime-qnn is not installed in this environment: no QNN toolchain to compile with",
            hint=f"{install_hint('qnn')}  (onnxruntime 1.32.0 + onnxruntime-qnn 2.7.0 = QNN 2.51.0)",
        )
    ort = _build_info("onnxruntime", "capi/build_and_package_info.py")
    # onnxruntime-qnn needs the CPU onnxruntime: onnxruntime-gpu is the same module, another package.
    if ort.get("package_name") != "onnxruntime" or not ort.get("__version__"):
        from farm.core.extras import install_hint

        raise MissingExtraError("onnxruntime is not installed", hint=install_hint("qnn"))
    sdk = qnn.get("qnn_version", "")
    if not sdk:
        raise ToolchainError(f"cannot read the QNN SDK version from onnxruntime-qnn {qnn['__version__']}")
    return Toolchain("qnn", sdk, ort["__version__"], "onnxruntime-qnn", qnn["__version__"])


_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\s*=\s*(['\"])([^'\"]*)\2\s*$", re.MULTILINE)


def _build_info(package: str, rel: str) -> dict[str, str]:
    """The string constants of ``rel`` inside ``package`` (found, not imported); {} if absent."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return {}
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / rel).read_text(encoding="utf-8")
    except OSError:
        return {}
    return {m.group(1): m.group(3) for m in _ASSIGN.finditer(text)}


def provider_options(target: Target, options: dict[str, Any]) -> dict[str, str]:
    """Map normalized farm options to QNN EP provider options (backend_path added by the child).

    No ``enable_htp_fp16_precision``: the EP's default is on, and 0, 1 or unset compile
    byte-identical contexts (measured, QNN 2.47.0, 2.49.40, 2.51.0; see farm.core.options)."""
    out: dict[str, str] = {"htp_graph_finalization_optimization_mode": str(options.get("graph_optimization", 0))}
    if target.soc_model is not None:
        out["soc_model"] = str(target.soc_model)
    elif target.soc_models:  # one binary for several SoCs (QNN >= 2.48): "57,69"
        out["soc_model"] = ",".join(str(m) for m in target.soc_models)
    if options.get("vtcm_mb"):
        out["vtcm_mb"] = str(options["vtcm_mb"])
    return out


QNN_SOURCE = "QNNExecutionProvider"
COMPAT_KEY = "ep_compatibility_info.QNNExecutionProvider"
# The HTP compiler's configuration, kept in every context binary (QNN 2.47.0, 2.49.40 and 2.51.0
# alike, ~20 KB in): ``...;soc_type=SM8650;arch=75;...``, with the catalog's SoC names.
_SOC_TYPE = re.compile(rb"soc_type=([A-Za-z0-9_]{2,32});arch=(\d{1,3});")


def context_facts(ctx: ContextModel) -> dict[str, Any]:
    """What a QNN context model says about itself, read without loading it: the SDK that built it
    (``ep_sdk_version``, e.g. ``v2.51.0.260929181845``), and the SoC and HTP arch from the context
    binary itself; else the soc_model ids of the EP's compatibility string (``v2:<backend>:<sdk>:
    <api>:<htp archs>:<soc models>:<vtcm>:...``; QNN 2.47.0 writes a v1 string without SoCs)."""
    facts: dict[str, Any] = {"sources": ctx.sources, "files": ctx.files, "embedded": not ctx.files,
                             "ep_sdk_version": None, "sdk": None, "soc": None, "htp_arch": None,
                             "soc_models": [], "compatibility": ctx.metadata.get(COMPAT_KEY)}
    ep_sdk = next((str(n["ep_sdk_version"]) for n in ctx.nodes if n.get("ep_sdk_version")), "")
    compat = (facts["compatibility"] or "").split(":")
    if ep_sdk:
        facts["ep_sdk_version"] = ep_sdk
        m = re.match(r"v?(\d+\.\d+\.\d+)", ep_sdk)
        facts["sdk"] = m.group(1) if m else None
    if compat[0] == "v2" and len(compat) > 5:
        facts["sdk"] = facts["sdk"] or compat[2]
        facts["soc_models"] = [int(x) for x in re.findall(r"\d+", compat[5]) if int(x) > 0]
    elif len(compat) > 1 and not facts["sdk"]:
        facts["sdk"] = compat[1]
    socs = sorted({(m.group(1).decode(), m.group(2).decode()) for m in _SOC_TYPE.finditer(ctx.context_head())})
    if socs:
        facts["soc"] = ",".join(name for name, _ in socs)
        facts["htp_arch"] = ",".join(f"v{arch}" for _, arch in socs)
    return facts


def _simulator_cannot_load(context: dict[str, Any], ctx: ContextModel) -> str | None:
    """Why the x86_64 simulator refuses this context whatever its state (measured), or None: a
    multi-SoC binary (several SoCs), or a weight-shared one (its binary is not its own:
    g1_ctx.onnx -> g0_ctx_qnn.bin)."""
    if len(context.get("soc_models") or []) > 1 or "," in (context.get("soc") or ""):
        return description.MULTI_SOC_UNVERIFIED
    if re.fullmatch(r"g\d{1,2}_ctx\.onnx", ctx.path.name) and ctx.files:  # a graph group's fixed stems
        return description.SHARED_UNVERIFIED
    if ctx.files and _shares_binary(ctx):  # a genai package's part: context_0_ctx.onnx + iterator_0_ctx.onnx
        return description.SHARED_UNVERIFIED
    return None


def _shares_binary(ctx: ContextModel, limit: int = 256) -> bool:
    """Whether another context model beside this one points at one of its binaries (weight
    sharing has no field of its own: both EPContext nodes name the same .bin)."""
    from workers.epcontext import read_epcontext

    mine = set(ctx.files)
    for other in sorted(ctx.path.parent.glob("*.onnx"))[:limit]:
        if other.name == ctx.path.name or other.stat().st_size > 64 << 20:  # a context model is small
            continue
        try:
            nodes, _ = read_epcontext(other)
        except Exception:  # noqa: BLE001 - not a model a device would load: no evidence either way
            continue
        if mine & {str(n.get("ep_cache_context")) for n in nodes if n.get("embed_mode", 1) == 0
                   and n.get("ep_cache_context")}:
            return True
    return False


def _model_io(path: Path) -> dict[str, list[dict[str, Any]]] | None:
    from farm.core.groups import model_io

    try:
        return model_io(path)
    except Exception:  # noqa: BLE001 - the check then covers the partitions only
        return None


def _model_op_types(path: Path) -> list[str]:
    """The op types of a source model (its graph only), for an error message; [] if unreadable."""
    try:
        import onnx

        return sorted({n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node})
    except Exception:  # noqa: BLE001 - only for the message
        return []


def runtime_facts(toolchain: Toolchain) -> dict[str, Any]:
    """This machine's QNN runtime. On x86_64 the HTP backend is Qualcomm's simulator: it loads and
    runs contexts, but it is no device (not a phone's timings, and it has crashed running contexts
    that load fine)."""
    machine = platform.machine().lower()
    simulator = machine in ("x86_64", "amd64")
    return {"backend": "qnn", "sdk": toolchain.version, "ep_package": toolchain.ep_package,
            "ep_version": toolchain.ep_version, "onnxruntime": toolchain.ort_version, "machine": machine,
            "simulator": simulator,
            "device": f"QNN HTP simulator ({machine})" if simulator else f"QNN HTP ({machine})"}


class QnnRunner:
    backend = "qnn"

    def __init__(self, *, warm_host: bool = True):
        # False: a fresh ``python -m workers.qnn.child compile`` per build (what the bench compares).
        self.warm_host = warm_host

    def warm(self) -> None:
        """Start this process's compile host now (a worker at start), not at its first build."""
        from workers.host import pool_for

        pool_for(CHILD).warm(1)

    def toolchain(self) -> Toolchain:
        return detect_toolchain()

    def compile(self, job: CompileJob, work_dir: Path) -> CompileOutput:
        from farm.core.groups import GROUP_FILE

        if job.model_path.name == GROUP_FILE:
            return self.compile_group(job, work_dir)
        toolchain = self.toolchain()
        out_dir = work_dir / "out"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        ctx_name = CTX_MODEL_NAME
        request = {
            "model": str(job.model_path),
            "ctx_path": str(out_dir / ctx_name),
            "embed_mode": int(job.options.get("embed_mode", 0)),
            "provider_options": provider_options(job.target, job.options),
            # A multi-SoC context can't load here: no self-probe to record (description.py).
            "verify_load": job.verify_load and not job.target.multi_soc,
            "describe": True,
        }
        timings: dict[str, float] = {}
        if self.warm_host:
            # A job forked from this process's warm host (workers.host): no interpreter start,
            # import or EP registration per build; the same guards, bytes and error codes.
            from workers.host import pool_for

            result, wall, log, timings = pool_for(CHILD).run("compile", request, work_dir, timeout=job.timeout,
                                                             memory_mb=job.memory_mb, cancel=job.cancel)
        else:
            result, wall, log = run_child(CHILD, "compile", request, work_dir, timeout=job.timeout,
                                          memory_mb=job.memory_mb, cancel=job.cancel)
        out = collect_output("QNN", job, out_dir, ctx_name, result, wall, log, toolchain, MEDIA_QNN_CONTEXT,
                             strays="error")
        # Minor page faults during the EP compile (a count, not seconds): what the standby's warm
        # heap saves (workers.childproc); bench/host.py reports it.
        out.timings = {**timings, "page_faults": float(result.get("page_faults") or 0)}
        if result.get("peak_rss_kib"):  # a count too: builds.phases["child.peak_rss_kib"]
            out.timings["peak_rss_kib"] = float(result["peak_rss_kib"])
        whole = out.placement["cpu_nodes"] == 0 and len(out.epcontext) == 1
        out.description = description.check(result.get("descriptions"), [description.Expected(
            "model", [str(n.get("partition_name", "")) for n in out.epcontext],
            [f.name for f in out.files if f.role == "context"], _model_io(job.model_path) if whole else None)])
        if job.target.multi_soc:
            out.unverified = description.MULTI_SOC_UNVERIFIED
            out.description["unverified"] = out.unverified
        return out

    def compile_group(self, job: CompileJob, work_dir: Path) -> CompileOutput:
        """A graph group (farm.core.groups): every graph compiled in one fresh child, in order,
        sharing context binaries; the artifact holds each ``g<i>_ctx.onnx`` and the shared
        ``.bin`` files (named by the EP after the first graph: fixed stems, never a graph
        name). The description of the binaries must name exactly the requested graphs."""
        from farm.core.errors import UnsupportedOpsError
        from farm.core.groups import part_of, read_descriptor
        from farm.core.names import inside
        from workers.epcontext import read_context, referenced_files
        from workers.runner import MEDIA_CTX_MODEL, OutputFile

        toolchain = self.toolchain()
        out_dir = work_dir / "out"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        doc = read_descriptor(job.model_path)
        root = job.model_path.parent
        parts = [part_of(g["name"]) for g in doc["graphs"]]
        members: list[dict[str, Any]] = [
            {"model": str(inside(root, g["file"])), "ctx_path": str(out_dir / f"g{i}_ctx.onnx"),
             # Each part (part1.prefill, part1.decode -> part1) gets binaries of its own.
             "stop": i == len(parts) - 1 or parts[i + 1] != parts[i]}
            for i, g in enumerate(doc["graphs"])]
        # A genai part's twin build (``twin`` among its options, farm.pipeline.genai.twin_builds):
        # the same graphs compiled alone, no sharing, the child at TWIN_NICE.
        twin = bool(job.options.get("twin"))
        request = {"group": members, "out_dir": str(out_dir), "share": not twin, "nice": TWIN_NICE if twin else 0,
                   "provider_options": provider_options(job.target, job.options)}
        # A fresh child, not a warm host's fork: the EP keeps the shared contexts per process.
        result, wall, log = run_child(CHILD, "compile_group", request, work_dir, timeout=job.timeout,
                                      memory_mb=job.memory_mb, cancel=job.cancel)
        files: list[OutputFile] = []
        nodes_all: list[dict[str, Any]] = []
        graphs: list[dict[str, Any]] = []
        expected: list[description.Expected] = []
        cpu = 0
        cpu_ops: dict[str, int] = {}
        compatibility: dict[str, str] = {}
        per_graph = result.get("graphs") or []
        # Every graph's context model first: one the EP took nothing of is unsupported-ops (the
        # binaries the other graphs name may then be missing: the graph that should have ended
        # them wrote nothing; measured under onnxruntime 1.32's ModelCompiler).
        read = []
        for i, g in enumerate(doc["graphs"]):
            ctx_path = out_dir / f"g{i}_ctx.onnx"
            nodes, placement, compat = (read_context(ctx_path) if ctx_path.exists()
                                        else ([], {"cpu_op_types": []}, {}))
            if not nodes:
                ops = placement["cpu_op_types"] or _model_op_types(Path(members[i]["model"]))
                raise UnsupportedOpsError(f"graph {g['name']!r}: the QNN EP took no node of it "
                                          f"({', '.join(ops) or 'op types unknown'})",
                                          hint=f"ops left on the CPU: {', '.join(ops) or 'unknown'}; none of them "
                                               "runs on the QNN EP",
                                          details={"log": log, "cpu_op_types": ops})
            read.append((nodes, placement, compat))
        for i, g in enumerate(doc["graphs"]):
            ctx_name = f"g{i}_ctx.onnx"
            nodes, placement, compat = read[i]
            bins = referenced_files(nodes, out_dir)
            # Its own context model (not the last one the loop above read: every graph then
            # published the last graph's, caught by the genai folder check under onnxruntime 1.32).
            files.append(OutputFile(ctx_name, out_dir / ctx_name, "ctx-model", MEDIA_CTX_MODEL))
            files += [OutputFile(b, out_dir / b, "context", MEDIA_QNN_CONTEXT) for b in bins
                      if b not in {f.name for f in files}]
            nodes_all += [{**n, "graph": g["name"]} for n in nodes]
            cpu += placement["cpu_nodes"]
            for op, n in placement["cpu_op_counts"].items():
                cpu_ops[op] = cpu_ops.get(op, 0) + n
            # Every graph of a group shares its binaries' compiler settings: the first one's string
            # is the group's (each graph keeps its own below).
            for ep, value in compat.items():
                compatibility.setdefault(ep, value)
            stats = per_graph[i] if i < len(per_graph) else {}
            graphs.append({"name": g["name"], "model": g["model"], "ctxModel": ctx_name, "contexts": bins,
                           "placement": placement, "compatibility": compat,
                           "compileSeconds": round(float(stats.get("compile_seconds") or 0), 6),
                           "peakRssKib": int(stats.get("peak_rss_kib") or 0)})
            whole = placement["cpu_nodes"] == 0 and len(nodes) == 1
            expected.append(description.Expected(
                g["name"], [str(n.get("partition_name", "")) for n in nodes], bins,
                _model_io(Path(members[i]["model"])) if whole else None))
        known = {f.name for f in files}
        extra = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*")
                       if p.is_file() and str(p.relative_to(out_dir)) not in known)
        if extra:
            raise ToolchainError(f"the QNN EP wrote files no graph of the group references: {extra}")
        placement_all = {"ep_nodes": len(nodes_all), "cpu_nodes": cpu, "cpu_op_types": sorted(cpu_ops),
                         "cpu_op_counts": dict(sorted(cpu_ops.items()))}
        out = CompileOutput(out_dir, files[0].name, files, float(result["compile_seconds"]), wall, nodes_all,
                            placement_all, toolchain, log, None, compatibility=compatibility)
        out.graphs = graphs
        out.description = description.check(result.get("descriptions"), expected)
        if not twin:
            out.unverified = description.SHARED_UNVERIFIED
            out.description["unverified"] = out.unverified
        out.description["api"] = result.get("api")
        if result.get("peak_rss_kib"):
            out.timings["peak_rss_kib"] = float(result["peak_rss_kib"])
        return out

    def load_check(self, ctx_model: Path, target: Target, *, timeout: float = 300.0) -> dict[str, Any]:
        """Load the context in a child (the verdict) and run it once: the measurement a probe
        records. A crash while running comes back as ``crashed`` beside the load time; a crash
        while loading is ``runtime-crashed``. ``check_load`` is the device-side check."""
        import tempfile

        toolchain = self.toolchain()
        request = {"ctx_model": str(ctx_model.resolve()), "provider_options": provider_options(target, {})}
        with tempfile.TemporaryDirectory(prefix="ctxfarm-load-") as tmp:
            try:
                result, wall, _log = run_child(CHILD, "load", request, Path(tmp), timeout=timeout)
            except WorkerLostError as exc:
                raise RuntimeCrashedError(
                    f"loading {ctx_model.name} crashed the QNN {toolchain.version} runtime: {exc.message}",
                    hint=CRASH_HINT[runtime_facts(toolchain)["simulator"]], details=exc.details) from None
            except ToolchainError as exc:
                raise ToolchainError(
                    f"QNN {toolchain.version} (onnxruntime-qnn {toolchain.ep_version}) could not load "
                    f"{ctx_model.name}: {exc.message}",
                    hint="the message is the QNN SDK's own; `farm load-check` compares the file's SoC and SDK "
                         "with this runtime before loading", details=exc.details) from None
        result.pop("partial", None)
        result.pop("ok", None)
        result["wall_seconds"] = wall
        return result

    def check_load(self, ctx_model: Path, target: Target, *, timeout: float = 300.0) -> dict[str, Any]:
        """``farm load-check``: what the file says about itself against ``target`` and this runtime
        (its SoC, the SDK that built it), then a real load and one run. Every reason the context
        would not work on the device is an error of its own: not-found (the model or its .bin),
        not-a-context, target-mismatch, runtime-too-old, runtime-crashed, toolchain-error."""
        toolchain = self.toolchain()
        ctx = open_context(ctx_model)
        context = context_facts(ctx)
        runtime = runtime_facts(toolchain)
        report: dict[str, Any] = {"ok": False, "ctx_model": str(ctx_model), "target": target.ref,
                                  "context": context, "runtime": runtime, "notes": []}
        notes: list[str] = report["notes"]
        if QNN_SOURCE not in context["sources"]:
            raise TargetMismatchError(
                f"{ctx_model.name} holds a context written by {', '.join(context['sources']) or 'an unnamed EP'}, "
                f"not by the QNN EP: it cannot load on {target.ref}",
                hint="check it against a target of the backend that built it", details=report)
        built_for = context["soc"] or ",".join(_soc_names(context["soc_models"]))
        if built_for and target.name not in built_for.split(","):
            arch = f" (HTP {context['htp_arch']})" if context["htp_arch"] else ""
            sim = (f"; the {runtime['device']} would load it anyway, a device with {target.name} would not"
                   if runtime["simulator"] else "")
            raise TargetMismatchError(
                f"{ctx_model.name} was built for {built_for}{arch}, not for {target.name} "
                f"(HTP {target.htp_arch}){sim}",
                hint=f"install the build for this device: farm install --model NAME:TAG --soc {target.name} "
                     f"--qnn {toolchain.version} --dest DIR", details=report)
        if not built_for:
            notes.append("the context records no SoC: it was not checked against the target")
        built = context["sdk"]
        if built and parse_version(built) > parse_version(toolchain.version):
            raise RuntimeTooOldError(
                f"{ctx_model.name} was built with QNN {built} (ep_sdk_version {context['ep_sdk_version']}), "
                f"newer than this runtime's QNN {toolchain.version} (onnxruntime-qnn {toolchain.ep_version}): "
                "a QNN runtime loads contexts built with its own SDK or an older one, never a newer one "
                "(measured: QNN_CONTEXT_ERROR_INVALID_ARGUMENT)",
                hint=f"install a build made with QNN <= {toolchain.version} (farm install --model NAME:TAG "
                     f"--soc {target.name} --qnn {toolchain.version} --dest DIR picks one), or an onnxruntime-qnn "
                     f"with QNN >= {built} (farm targets lists which release carries which QNN)", details=report)
        if built and parse_version(built) < parse_version(toolchain.version):
            notes.append(f"built with QNN {built}, older than this runtime's {toolchain.version}: "
                         "newer runtimes load older contexts (measured)")
        if not built:
            notes.append("the context records no SDK version: it was not checked against the runtime")
        unloadable = _simulator_cannot_load(context, ctx) if runtime["simulator"] else None
        if unloadable:
            # Known before trying: the load would crash or be refused, a verdict on the simulator,
            # not on the context. Everything checkable was checked: say so, as its own outcome.
            report["unverified"] = unloadable
            raise LoadUnverifiedError(
                f"{ctx_model.name}: its files, SoC ({built_for or 'not recorded'}) and SDK ({built or 'not recorded'}) "
                f"check out for {target.ref}; not loaded: {unloadable}",
                hint=f"no verdict on the device: this runtime is the {runtime['device']}; load it on a device with "
                     f"{target.name} (og.Model(dir) for a genai package, docs/shipping-llm.md)", details=report)
        try:
            loaded = self.load_check(ctx_model, target, timeout=timeout)
        except FarmError as exc:
            exc.details = {**report, **({"log": exc.details["log"][-8000:]} if "log" in exc.details else {})}
            # (What the simulator can't load was answered load-unverified above, before trying.)
            if isinstance(exc, ToolchainError):
                checked = ", ".join(f"{k} {v}" for k, v in (("SoC", built_for), ("SDK", built)) if v)
                exc.hint = (f"the message is the QNN SDK's own; the file's {checked} matched this runtime, so the "
                            "context itself was refused: fetch it again (farm fetch verifies digests) or rebuild it"
                            if checked else "the message is the QNN SDK's own")
            raise
        report.update(loaded)
        if loaded.get("crashed"):
            raise RuntimeCrashedError(
                f"{ctx_model.name} loaded in {loaded['load_seconds'] * 1000:.1f} ms on the {runtime['device']}, "
                f"then running it crashed the runtime: {loaded['crashed']}",
                hint=CRASH_HINT[runtime["simulator"]], details=report)
        if runtime["simulator"]:
            notes.append(f"ran on the {runtime['device']}, not on a device with {target.name}: the timings "
                         "are the simulator's")
        report["ok"] = True
        return report


CRASH_HINT = {
    True: "the x86_64 HTP simulator crashes on some contexts that load (measured: light_inception_v1 for "
          "SM8650, QNN 2.51.0): only a run on the device itself can clear this one",
    False: "the QNN runtime died on this context: keep its log and the versions above for a bug report",
}


def _soc_names(ids: list[int]) -> list[str]:
    """Catalog names of QNN soc_model ids (an id the catalog lacks stays a number)."""
    if not ids:
        return []
    from farm.core.catalog import load_catalog

    names = {t.soc_model: t.name for t in load_catalog().of_backend("qnn")}
    return [names.get(i, f"soc_model {i}") for i in ids]
