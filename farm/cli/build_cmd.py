"""farm build MODEL.onnx [MODEL.onnx ...] --target qnn:SM8650 [--target ...] [--name N --tag T] [--option k=v ...]

Several models in one call share one pool of parallel compiles (every model x target build), and
answer in one table (with a MODEL column) and, with --json, a document per model."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from farm.cli import human_size, table
from farm.cli.offload import warn_outcomes
from farm.cli.progress import BuildProgress
from farm.core.settings import Settings
from farm.core.text import strip_ansi


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="*", help="path to the .onnx (external-data files beside it); several "
                   "models build in one pool of parallel compiles")
    add_group_arguments(p)
    from farm.cli.genai_cmd import add_genai_arguments

    add_genai_arguments(p)
    p.add_argument("--target", "-t", action="append", default=[], metavar="BACKEND:NAME",
                   help="target to build for, e.g. qnn:SM8650 (repeatable; see `farm targets`)")
    p.add_argument("--name", help="model name; NAME:TAG then points at this model's digest (one model only)")
    p.add_argument("--tag", help="tag for --name (default: latest)")
    p.add_argument("--force-tag", action="store_true", help="move NAME:TAG if it points at another model")
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="build option (repeatable), e.g. graph_optimization=3, vtcm_mb=4")
    p.add_argument("--require-full-offload", action="store_true",
                   help="fail with unsupported-ops (naming the op types) if the build leaves any node on the CPU; "
                        "a gate on the answer, not a build input: the artifact is built and kept either way "
                        "(-o require_full_offload=true is the same)")
    p.add_argument("--min-psnr", type=float, metavar="DB",
                   help="run the context on the HTP simulator against onnxruntime's CPU EP (same seeded inputs) and "
                        "fail with accuracy-below-threshold, naming the output, if any output's PSNR is below DB; "
                        "a gate on the answer: the artifact is built and kept either way (docs/evidence.md)")
    p.add_argument("--accuracy", action="store_true",
                   help="run that accuracy check and show its figures, without a gate")
    p.add_argument("--samples", metavar="NPZ",
                   help="the model's own sample inputs for the accuracy check: an .npz (numpy.savez) with one array "
                        "per model input, checked against the model before anything is built (one model only; "
                        "implies --accuracy)")
    p.add_argument("--retry-failed", action="store_true",
                   help="compile again builds that failed (by default failures are answered from the index)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def add_group_arguments(p: argparse.ArgumentParser) -> None:
    """``--graph NAME=PATH`` / ``--group-file FILE``: a graph group (farm build and farm submit)."""
    p.add_argument("--graph", action="append", default=[], metavar="NAME=PATH",
                   help="a graph of a weight-shared group, in order (repeatable): --graph prefill=p.onnx "
                        "--graph decode=d.onnx compiles them together into shared context binaries (QNN, HTP v73+)")
    p.add_argument("--group-file", metavar="FILE",
                   help="the group's graphs from a JSON or TOML file: {\"graphs\": [{\"name\": N, \"path\": P}, ...]}")


def group_of(args: argparse.Namespace, settings: Settings | None = None) -> Any:
    """The inspected GroupBundle asked for with --graph/--group-file, or None. With
    ``settings``: a group the index records is recognized by its files' remembered digests
    (farm.pipeline.groups.load_group), not read again."""
    if not args.graph and not args.group_file:
        return None
    from farm.core.errors import UsageError
    from farm.core.groups import inspect_group, parse_graph_args, read_group_file

    models = args.model if isinstance(args.model, list) else ([args.model] if args.model else [])
    if models:
        raise UsageError("give the models either as paths or as --graph NAME=PATH, not both",
                         hint="farm build --graph prefill=prefill.onnx --graph decode=decode.onnx -t qnn:SM8650")
    members = parse_graph_args(args.graph) + (read_group_file(args.group_file) if args.group_file else [])
    if settings is not None:
        from farm.pipeline.groups import load_group

        return load_group(settings, members, display=getattr(args, "name", None))
    return inspect_group(members, display=getattr(args, "name", None))


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    from farm.pipeline.cached import answer

    if getattr(args, "genai", None):
        from farm.cli.genai_cmd import run_build

        return run_build(args, settings, build_json)
    group = group_of(args, settings)
    if group is not None:
        try:
            return run_group(group, args, settings)
        finally:
            group.cleanup()  # its temporary group.json, on success, refusal and Ctrl-C alike
    if not args.model:
        from farm.core.errors import UsageError

        raise UsageError("the following arguments are required: model (or --graph NAME=PATH ...)",
                         hint="farm build MODEL.onnx -t qnn:SM8650, or --graph NAME=PATH ...")
    models: list[str] = list(args.model)
    several = len(models) > 1
    samples = _samples(args, models)  # refused before anything is built
    if several and (args.name or args.tag or args.force_tag):
        from farm.core.errors import UsageError

        raise UsageError("--name/--tag/--force-tag name one model; several models were given",
                         hint="build the named model in its own `farm build MODEL.onnx --name N --tag T`")
    # The gate travels as the old -o spelling: answer() and build_many() take it out of the options.
    options = list(args.option)
    if args.require_full_offload:
        options.append("require_full_offload=true")
    labels = model_labels(models)
    start = time.perf_counter()
    # A live table on a terminal; plain lines on state changes otherwise (and with --json).
    with BuildProgress(live=False if args.json else None) as progress:
        listeners: list[Callable[[str, str, dict[str, Any]], None]] = (
            [progress.for_model(label) for label in labels] if several else [progress])
        # Answered whole by the index (nothing to write or compile): no SQLAlchemy, no onnx imported.
        found = [answer(settings, m, args.target, options, name=args.name, tag=args.tag, progress=listen,
                        retry_failed=args.retry_failed) for m, listen in zip(models, listeners, strict=True)]
        todo = [i for i, r in enumerate(found) if r is None]
        if todo:
            prestart_hosts(args.target, len(todo))
            from farm.pipeline import early

            # SIGTERM/SIGINT unwind from here on (the early compiles stopped, their dirs removed),
            # as they do once the builds run.
            with early.interruptible():
                started = early.EarlyCompiles()
                try:
                    # The first compiles start now, beside the pipeline's imports, index and model
                    # check; each claimed build adopts its own (farm.pipeline.early).
                    early.start(settings, [models[i] for i in todo], args.target, options,
                                retry_failed=args.retry_failed, into=started,
                                progress=[listeners[i] for i in todo])
                    from farm.pipeline.plan import build_many

                    # The rest in one pool of parallel compiles, every (model, target) build together.
                    built = build_many(settings, [models[i] for i in todo], args.target, options,
                                       name=args.name, tag=args.tag, progress=[listeners[i] for i in todo],
                                       retry_failed=args.retry_failed, force_tag=args.force_tag, early=started)
                finally:
                    started.close()  # what no build adopted: stopped, its dir removed
            for i, r in zip(todo, built, strict=True):
                found[i] = r
    reports = [r for r in found if r is not None]
    if args.min_psnr is not None or args.accuracy or samples is not None:
        _check_accuracy(settings, reports, args.min_psnr, samples)
    for report in reports:
        if report.tag_moved:
            print(f"moved {report.tag_moved['tag']}: {report.tag_moved['from']} -> {report.tag_moved['to']}",
                  file=sys.stderr)
    elapsed = time.perf_counter() - start
    if args.json:
        if several:
            doc = {"ok": all(r.ok for r in reports), "seconds": round(elapsed, 6),
                   "models": [build_json(r, elapsed) for r in reports]}
        else:
            doc = build_json(reports[0], elapsed)
        print(json.dumps(doc, indent=2))
        return 0 if all(r.ok for r in reports) else 1
    rows = []
    for label, report in zip(labels, reports, strict=True):
        shown = f"{report.name}:{report.tag}" if report.tag else report.name
        print(f"model {shown} {report.model_digest}")
        for o in report.outcomes:
            rows.append({
                "model": label, "target": o.target, "toolchain": o.toolchain,
                "state": o.state if o.state != "failed" else f"failed ({o.error_code})",
                "artifact": o.artifact.removeprefix("sha256:")[:12] if o.artifact else "",
                "compile_s": f"{o.compile_seconds:.2f}" if o.compile_seconds is not None else "",
                "ctx_size": human_size(o.size),
                "placement": f"{o.nodes_ep} ctx / {o.nodes_cpu} cpu" if o.nodes_ep is not None else "",
                "accuracy": _accuracy_cell(o.accuracy),
            })
    columns = ["target", "toolchain", "state", "artifact", "compile_s", "ctx_size", "placement"]
    if args.min_psnr is not None or args.accuracy or samples is not None:
        columns.append("accuracy")
    table(rows, ["model", *columns] if several else columns)
    for label, report in zip(labels, reports, strict=True):
        for o in report.outcomes:
            if o.state == "failed":
                cached = " (answered from the index; same inputs fail the same way)" if o.cached_failure else ""
                where = f"{label} {o.target}" if several else o.target
                print(f"error[{o.error_code}] {where}: {strip_ansi(o.error_message or '')}{cached}",
                      file=sys.stderr)
    warn_outcomes(reports, labels if several else None)
    print(f"{sum(len(r.outcomes) for r in reports)} build(s) in {elapsed:.3f} s", file=sys.stderr)
    return 0 if all(r.ok for r in reports) else 1


def prestart_hosts(targets: list[str], models: int) -> None:
    """Spawn this call's QNN compile host before importing the pipeline: a host's interpreter
    start and SDK import (~0.2-0.4 s, a fixed cost of every `farm build` call) then run on the
    other core beside this process's SQLAlchemy import, index and model hashing. One host serves
    the call's concurrent compiles (workers.host.HostPool: a slot per CPU), each in a job forked
    from it (a crashing QNN library takes down the job only).
    A host no build takes is stopped at exit; one that cannot start says why at the first compile."""
    qnn = [t for t in targets if t.strip().lower().startswith("qnn:")]
    if not qnn:
        return
    import os

    from workers.backends import prestart_qnn_hosts

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    prestart_qnn_hosts(min(cpus, models * len(qnn)))


def _samples(args: argparse.Namespace, models: list[str]) -> tuple[Path, list[dict[str, Any]]] | None:
    """--samples: the .npz and its arrays, checked against the one model given."""
    if not getattr(args, "samples", None):
        return None
    from farm.core.errors import UsageError
    from registry.evidence import check_samples

    if len(models) != 1:
        raise UsageError("--samples are one model's inputs: give one model")
    path = Path(args.samples)
    if not path.is_file():
        raise UsageError(f"--samples {args.samples!r} is not a file")
    return path, check_samples(path, Path(models[0]))


def _check_accuracy(settings: Settings, reports: list[Any], min_psnr: float | None,
                    samples: tuple[Path, list[dict[str, Any]]] | None = None) -> None:
    """--min-psnr / --accuracy / --samples: the simulator check after the builds
    (farm.pipeline.accuracy), fed the model's samples when given (stored beside it)."""
    from farm.pipeline.accuracy import check_min_psnr, gate_outcomes
    from registry.index import Registry

    min_psnr = check_min_psnr(min_psnr)
    reg = Registry.open(settings)
    try:
        if samples is not None:
            from registry.evidence import record_samples
            from registry.store.base import put_file

            info = put_file(reg.store, samples[0])
            with reg.db.session() as s:
                record_samples(s, reports[0].model_digest, info.digest, info.size, samples[1])
        for report in reports:
            gate_outcomes(settings, reg, report.outcomes, min_psnr)
    finally:
        reg.close()


def _accuracy_cell(view: dict[str, Any] | None) -> str:
    if view is None:
        return ""
    from registry.evidence import headline

    return headline([view])


def run_group(group: Any, args: argparse.Namespace, settings: Settings) -> int:
    """A graph group: one build per target, every graph compiled together."""
    from farm.pipeline.plan import build

    if getattr(args, "min_psnr", None) is not None or getattr(args, "accuracy", False) or getattr(args, "samples", None):
        from farm.core.errors import AccuracyUnverifiedError

        # Refused before anything is built: the check runs the context on the simulator.
        raise AccuracyUnverifiedError(
            "--min-psnr/--accuracy/--samples can't check a weight-shared graph group here: the x86_64 simulator "
            "cannot load weight-shared contexts", hint="drop them for a group; only a device can verify it")

    options = list(args.option) + (["require_full_offload=true"] if args.require_full_offload else [])
    start = time.perf_counter()
    with BuildProgress(live=False if args.json else None) as progress:
        report = build(settings, group, args.target, options, name=args.name, tag=args.tag, progress=progress,
                       retry_failed=args.retry_failed, force_tag=args.force_tag)
    elapsed = time.perf_counter() - start
    if args.json:
        doc = build_json(report, elapsed)
        doc["graphs"] = group.names
        print(json.dumps(doc, indent=2))
        return 0 if report.ok else 1
    shown = f"{report.name}:{report.tag}" if report.tag else report.name
    print(f"group {shown} {report.model_digest} ({len(group.names)} graphs: {', '.join(group.names)})")
    rows = [{"target": o.target, "toolchain": o.toolchain,
             "state": o.state if o.state != "failed" else f"failed ({o.error_code})",
             "artifact": o.artifact.removeprefix("sha256:")[:12] if o.artifact else "",
             "compile_s": f"{o.compile_seconds:.2f}" if o.compile_seconds is not None else "",
             "ctx_size": human_size(o.size),
             "placement": f"{o.nodes_ep} ctx / {o.nodes_cpu} cpu" if o.nodes_ep is not None else ""}
            for o in report.outcomes]
    table(rows, ["target", "toolchain", "state", "artifact", "compile_s", "ctx_size", "placement"])
    for o in report.outcomes:
        if o.state == "failed":
            print(f"error[{o.error_code}] {o.target}: {strip_ansi(o.error_message or '')}", file=sys.stderr)
    warn_outcomes([report])
    print(f"{len(report.outcomes)} build(s) in {elapsed:.3f} s", file=sys.stderr)
    return 0 if report.ok else 1


def model_labels(models: list[str]) -> list[str]:
    """How each model is shown in rows: its file's stem, or the path as given where stems repeat."""
    stems = [Path(m).stem for m in models]
    return [s if stems.count(s) == 1 else m for s, m in zip(stems, models, strict=True)]


def build_json(report: Any, elapsed: float) -> dict[str, Any]:
    """`farm build --json` (schema: farm/cli/schemas/build.json). ``warnings``: a built or cached
    build that left nodes on the CPU (partial-offload)."""
    from farm.cli.offload import warnings_of

    builds = [{"target": o.target, "toolchain": o.toolchain, "state": o.state, "build_id": o.build_id,
               "artifact": o.artifact,
               "compile_seconds": None if o.compile_seconds is None else float(o.compile_seconds),
               "wall_seconds": None if o.wall_seconds is None else float(o.wall_seconds),
               "size_bytes": None if o.size is None else int(o.size), "nodes_ep": o.nodes_ep,
               "nodes_cpu": o.nodes_cpu, "cpu_op_types": o.cpu_op_types, "error_code": o.error_code,
               "error_message": None if o.error_message is None else strip_ansi(o.error_message),
               "cached_failure": o.cached_failure, "accuracy": o.accuracy}
              for o in report.outcomes]
    return {
        "model": report.model_digest, "name": report.name, "tag": report.tag, "ok": report.ok,
        "seconds": round(elapsed, 6), "tag_moved": report.tag_moved, "builds": builds,
        "warnings": warnings_of(builds, ("built", "cached")),
    }
