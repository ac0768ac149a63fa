"""Partial offload in plain sight: how the CLI words a build that left nodes on the CPU (farm
build, submit, status, resolve, show, coverage), from the ``offload`` / ``cpu_op_types`` fields of
the JSON documents, which may come from a service (cleaned before printing)."""

from __future__ import annotations

from typing import Any

from farm.core.untrusted import clean_text

CODE = "partial-offload"


def _ops(ops: Any) -> str:
    if not isinstance(ops, list):
        return ""
    return ", ".join(clean_text(o, 64) for o in ops[:32] if isinstance(o, str))


def offload_text(offload: Any) -> str | None:
    """``partial offload: 1 node(s) stay on the CPU (Gemm) beside 1 EP node(s)`` for a resolve
    answer's ``offload`` that is not full; None otherwise. Cleaned: it may come from a service."""
    if not isinstance(offload, dict) or offload.get("full") is not False:
        return None
    counts = [n if isinstance(n, int) and not isinstance(n, bool) else "?"
              for n in (offload.get("cpu_nodes"), offload.get("ep_nodes"))]
    return (f"partial offload: {counts[0]} node(s) stay on the CPU "
            f"({_ops(offload.get('cpu_op_types')) or 'op types not recorded'}) beside {counts[1]} EP node(s)")


def build_warning(target: str, nodes_cpu: Any, cpu_op_types: Any) -> str | None:
    """``warning[partial-offload] qnn:SM8650: 1 node(s) stay on the CPU (Gemm): ...`` for a built
    (or cached) build with CPU nodes; None for a fully offloaded or failed one."""
    if not isinstance(nodes_cpu, int) or isinstance(nodes_cpu, bool) or nodes_cpu <= 0:
        return None
    return (f"warning[{CODE}] {clean_text(target, 80)}: {nodes_cpu} node(s) stay on the CPU "
            f"({_ops(cpu_op_types) or 'op types not recorded'}): built and published, but the device runs them "
            "on its CPU; --require-full-offload refuses such builds")


def warnings_of(builds: list[dict[str, Any]], ok_states: tuple[str, ...]) -> list[dict[str, Any]]:
    """The ``warnings`` of a `farm build` / `farm submit` / `farm status` --json document: one
    ``partial-offload`` warning per build in ``ok_states`` whose artifact left nodes on the CPU."""
    out = []
    for b in builds:
        if b.get("state") not in ok_states:
            continue
        message = build_warning(str(b.get("target")), b.get("nodes_cpu"), b.get("cpu_op_types"))
        if message is not None:
            out.append({"code": CODE, "target": b.get("target"), "toolchain": b.get("toolchain"),
                        "artifact": b.get("artifact"), "nodes_cpu": b.get("nodes_cpu"),
                        "cpu_op_types": b.get("cpu_op_types"),
                        "message": message.split("] ", 1)[1]})
    return out


def warn_outcomes(reports: list[Any], labels: list[str] | None = None, out: Any = None) -> None:
    """``warning[partial-offload] TARGET: ...`` (stderr) for each built or cached outcome of these
    build reports (plain models, graph groups, genai packages alike) that left nodes on the CPU:
    a table's placement column says it, this says what it means. ``labels``: a model's label
    before the target, one per report."""
    import sys

    for i, report in enumerate(reports):
        for o in report.outcomes:
            if o.state in ("built", "cached"):
                where = f"{labels[i]} {o.target}" if labels else o.target
                message = build_warning(where, o.nodes_cpu, o.cpu_op_types)
                if message is not None:
                    print(message, file=out or sys.stderr)


def print_warnings(warnings: list[dict[str, Any]], out: Any = None) -> None:
    """``warning[partial-offload] TARGET: ...`` lines (stderr by default)."""
    import sys

    for w in warnings:
        print(f"warning[{w['code']}] {w['message']}", file=out or sys.stderr)
