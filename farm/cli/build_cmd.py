"""farm build MODEL.onnx --target qnn:SM8650 [--target ...] [--name N --tag T] [--option k=v ...]"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from farm.cli import human_size, table
from farm.core.settings import Settings


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to the .onnx (external-data files beside it)")
    p.add_argument("--target", "-t", action="append", default=[], metavar="BACKEND:NAME",
                   help="target to build for, e.g. qnn:SM8650 (repeatable; see `farm targets`)")
    p.add_argument("--name", help="model name; NAME:TAG then points at this model's digest")
    p.add_argument("--tag", help="tag for --name (default: latest)")
    p.add_argument("--force-tag", action="store_true", help="move NAME:TAG if it points at another model")
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="build option (repeatable), e.g. precision=fp16, require_full_offload=true")
    p.add_argument("--require-full-offload", action="store_true",
                   help="fail with unsupported-ops if any node would stay on the CPU")
    p.add_argument("--retry-failed", action="store_true",
                   help="compile again builds that failed (by default failures are answered from the index)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


class ProgressLine:
    """One status line per target on stderr; rewritten in place on a terminal."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.started: dict[str, float] = {}

    def __call__(self, event: str, target: str, info: dict[str, Any]) -> None:
        if event == "compiling":
            self.started[target] = time.perf_counter()
            self._say(f"  compiling {target} with {info['toolchain']} (attempt {info['attempt']}) ...", end=not self.tty)
        elif event == "retrying":
            self._say(f"  retrying {target} in {info['in_seconds']:.0f} s (infrastructure failure) ...", end=True)
        elif event == "waiting":
            self._say(f"  waiting for build {info['build_id']} ({target}) held by another process ...", end=not self.tty)
        elif event == "finished":
            took = (time.perf_counter() - self.started[target] if target in self.started
                    else info.get("wall_seconds") or 0.0)
            self._say(f"  {info['state']:9s} {target} in {took:.1f} s", end=True)

    def _say(self, text: str, *, end: bool) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K" + text + ("\n" if end else ""))
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    from farm.pipeline.cached import answer

    options = list(args.option)
    if args.require_full_offload:
        options.append("require_full_offload=true")
    start = time.perf_counter()
    progress = ProgressLine()
    # Answered whole by the index (nothing to write or compile): no SQLAlchemy, no onnx imported.
    report = answer(settings, args.model, args.target, options, name=args.name, tag=args.tag, progress=progress,
                    retry_failed=args.retry_failed)
    if report is None:
        from farm.pipeline.plan import build

        report = build(settings, args.model, args.target, options, name=args.name, tag=args.tag,
                       progress=progress, retry_failed=args.retry_failed, force_tag=args.force_tag)
    if report.tag_moved:
        print(f"moved {report.tag_moved['tag']}: {report.tag_moved['from']} -> {report.tag_moved['to']}",
              file=sys.stderr)
    elapsed = time.perf_counter() - start
    if args.json:
        print(json.dumps({"model": report.model_digest, "name": report.name, "tag": report.tag,
                          "seconds": elapsed, "builds": [o.to_dict() for o in report.outcomes]}, indent=2))
    else:
        label = f"{report.name}:{report.tag}" if report.tag else report.name
        print(f"model {label} {report.model_digest}")
        rows = []
        for o in report.outcomes:
            rows.append({
                "target": o.target, "toolchain": o.toolchain,
                "state": o.state if o.state != "failed" else f"failed ({o.error_code})",
                "artifact": o.artifact.removeprefix("sha256:")[:12] if o.artifact else "",
                "compile_s": f"{o.compile_seconds:.2f}" if o.compile_seconds is not None else "",
                "ctx_size": human_size(o.size),
                "placement": f"{o.nodes_ep} ctx / {o.nodes_cpu} cpu" if o.nodes_ep is not None else "",
            })
        table(rows, ["target", "toolchain", "state", "artifact", "compile_s", "ctx_size", "placement"])
        for o in report.outcomes:
            if o.state == "failed":
                cached = " (answered from the index; same inputs fail the same way)" if o.cached_failure else ""
                print(f"error[{o.error_code}] {o.target}: {o.error_message}{cached}", file=sys.stderr)
        print(f"{len(report.outcomes)} build(s) in {elapsed:.3f} s", file=sys.stderr)
    return 0 if report.ok else 1
