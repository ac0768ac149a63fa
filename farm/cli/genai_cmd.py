"""farm build --genai DIR -t qnn:SOC [--name N --tag T]: an exported static decoder pipeline
built into one onnxruntime-genai folder (farm.pipeline.genai), its answer and progress."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from farm.cli.progress import BuildProgress
from farm.core.settings import Settings
from farm.core.text import strip_ansi


def add_genai_arguments(p: argparse.ArgumentParser) -> None:
    """``--genai DIR`` and its gate (farm build)."""
    p.add_argument("--genai", metavar="DIR",
                   help="an exported static decoder pipeline (Olive QNN recipe or AI Hub genai export): each part's "
                        "prefill and decode become one weight-shared group build, parts in parallel, and the answer is "
                        "one onnxruntime-genai folder (genai_config.json, tokenizer, CPU stages, one .bin per part)")
    p.add_argument("--require-twin", action="store_true",
                   help="with --genai: fail with twin-mismatch unless the twin (the parts compiled without sharing, "
                        "run through onnxruntime-genai on the simulator) generates every greedy token the CPU EP does; "
                        "a gate on the answer: the package is published either way")
    p.add_argument("--no-twin", action="store_true", help="with --genai: skip the twin check")


class PackageProgress(BuildProgress):
    """A row per part and target while the parts compile, then one per target for the package;
    from its publication on (the answer), plain lines: when it was published, then its twin."""

    def __call__(self, event: str, target: str, info: dict[str, Any], model: str | None = None) -> None:
        model = model or "package"
        key = f"{model} {target}"
        cells = {"model": model, "target": target}
        if event == "assembling":
            self.update(key, "assembling", f"{info['parts']} part(s) into one folder", cells=cells, restart=True)
        elif event == "published":
            self.settle()
            pending = " (twin pending)" if info.get("twin") == "pending" else ""
            self.say(f"published {target} {str(info['artifact'])[7:19]} at {info['at']}{pending}")
        elif event == "checking" and info.get("what") == "twin":
            self.settle()
            self.say(f"twin {target}: checking: the parts' twin builds (compiled without sharing, behind the "
                     "package's own compiles), then the simulator against the CPU EP (Ctrl-C leaves it pending; "
                     "the same command again runs it)")
        elif event == "twin":
            self.say(f"twin {target}: {twin_cell(info) or 'no figures'}"
                     + (f" ({str(info.get('detail'))[:300]})" if info.get("status") != "ok" and info.get("detail")
                        else "") + f", recorded in {float(info.get('wall_seconds') or 0):.1f} s")
        elif event == "checking":
            self.update(key, "checking", str(info.get("what") or ""), cells=cells)
        else:
            super().__call__(event, target, info, model=model)

    def settle(self) -> None:
        """Stop the live table (its rows are final): what follows is plain lines."""
        with self.lock:
            self.__exit__(None, None, None)
            self.live = False

    def say(self, text: str) -> None:
        with self.lock:
            self.stream.write(f"  {text}\n")
            self.stream.flush()


def run_build(args: argparse.Namespace, settings: Settings, build_json: Any) -> int:
    """``build_json``: farm build --json's document of one report (farm.cli.build_cmd)."""
    from farm.core.errors import UsageError

    if args.model or args.graph or args.group_file:
        raise UsageError("--genai DIR is the whole model: give no model paths or --graph with it",
                         hint="farm build --genai EXPORT_DIR -t qnn:SM8650 --name llm/tiny --tag t")
    if args.min_psnr is not None or args.accuracy or args.samples:
        raise UsageError("--min-psnr/--accuracy/--samples check one context model; a genai package is checked "
                         "by its twin", hint="use --require-twin as the gate")
    if args.require_twin and args.no_twin:
        raise UsageError("--require-twin gates on the twin that --no-twin skips: give one of them")
    options = list(args.option) + (["require_full_offload=true"] if args.require_full_offload else [])
    start = time.perf_counter()
    # The compile host, the capability probe and the folder check's host start now (interpreters and
    # runtime imports), beside this process's pipeline imports and index; the probe is waited for
    # before anything is read.
    if any(str(t).strip().lower().startswith("qnn:") for t in args.target):
        import os

        from workers.backends import prestart_genai_check, prestart_qnn_hosts, probe_soon

        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        prestart_qnn_hosts(min(cpus, 2))  # the parts compile side by side (a host has a slot per CPU)
        probe_soon("qnn")
        prestart_genai_check()  # the folder check's host too: its imports done long before the check
    from farm.pipeline.genai import build_package

    answered: list[int] = []

    def answer(report: Any) -> None:
        # Published is the answer (its exit status too); the twin that follows is evidence.
        answered.append(print_answer(args, report, time.perf_counter() - start, build_json))

    with PackageProgress(live=False if args.json else None) as progress:
        progress.columns = ("model", *BuildProgress.columns)
        report = build_package(settings, args.genai, args.target, options, name=args.name, tag=args.tag,
                               progress=progress, part_progress=lambda i: progress.for_model(f"part{i}"),
                               retry_failed=args.retry_failed, force_tag=args.force_tag, twin=not args.no_twin,
                               require_twin=args.require_twin, published=None if args.require_twin else answer)
    if answered:
        if args.no_twin:
            print("  twin not run (--no-twin): `farm build --genai` of the same export without it runs it on the "
                  "published package", file=sys.stderr)
        return answered[0]
    return print_answer(args, report, time.perf_counter() - start, build_json)  # --require-twin: after its twin


def print_answer(args: argparse.Namespace, report: Any, elapsed: float, build_json: Any) -> int:
    """The package's answer on stdout (a table, or --json's document); returns the exit status."""
    pkg = report.package
    if pkg.tag_moved:
        print(f"moved {pkg.tag_moved['tag']}: {pkg.tag_moved['from']} -> {pkg.tag_moved['to']}", file=sys.stderr)
    if args.json:
        doc = build_json(pkg, elapsed)
        doc["kind"] = "genai-package"
        doc["parts"] = [build_json(p, elapsed) for p in report.parts]
        print(json.dumps(doc, indent=2), flush=True)
        return 0 if report.ok else 1
    from farm.cli import human_size, table

    shown = f"{pkg.name}:{pkg.tag}" if pkg.tag else pkg.name
    print(f"genai package {shown} {pkg.model_digest}")
    rows = []
    for o in pkg.outcomes:
        tw = (o.accuracy or {}).get("twin") or {}
        rows.append({"target": o.target, "toolchain": o.toolchain,
                     "state": o.state if o.state != "failed" else f"failed ({o.error_code})",
                     "artifact": o.artifact.removeprefix("sha256:")[:12] if o.artifact else "",
                     "compile_s": f"{o.compile_seconds:.2f}" if o.compile_seconds is not None else "",
                     "size": human_size(o.size), "twin": twin_cell(tw)})
    table(rows, ["target", "toolchain", "state", "artifact", "compile_s", "size", "twin"])
    sys.stdout.flush()
    for o in pkg.outcomes:
        if o.state == "failed":
            print(f"error[{o.error_code}] {o.target}: {strip_ansi(o.error_message or '')}", file=sys.stderr)
    from farm.cli.offload import warn_outcomes

    # The package's placement sums its parts' (an op the EP left on the CPU in any part is named).
    warn_outcomes([pkg], ["package"])
    print(f"{len(report.parts)} part(s), {len(pkg.outcomes)} package(s) in {elapsed:.3f} s", file=sys.stderr)
    return 0 if report.ok else 1


def twin_cell(tw: dict[str, Any]) -> str:
    """``16/16 tokens, 58.1 dB`` (or the status when the twin did not run)."""
    if not tw:
        return ""
    if tw.get("status") != "ok":
        return str(tw.get("status") or "")
    cell = f"{tw.get('tokens_matched')}/{tw.get('tokens_compared')} tokens"
    psnr = (tw.get("first_step") or {}).get("psnr_db")
    if isinstance(psnr, int | float):
        cell += f", first step {psnr:.1f} dB"
    return cell
