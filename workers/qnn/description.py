"""Evidence from a context binary's own description (workers.qnn.sysapi, read in the compile
child): does the artifact hold exactly the graphs that were asked for, with the source models'
inputs and outputs?

The QNN graphs in a binary are named after the EPContext nodes' ``partition_name``; a graph
that the EP took whole (one EPContext node, nothing left on the CPU) must have the source
model's inputs and outputs, by name and shape. A graph partly left on the CPU is checked by
its partitions only (its EPContext nodes' inputs are intermediate tensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from farm.core.errors import ToolchainError

SHARED_UNVERIFIED = ("the x86_64 simulator cannot load weight-shared contexts "
                     "(measured: QNN_COMMON_ERROR_NOT_SUPPORTED on QNN 2.47.0, 2.49.40 and 2.51.0, "
                     "or the load process dies with SIGSEGV)")
MULTI_SOC_UNVERIFIED = ("the x86_64 simulator cannot load multi-SoC contexts "
                        "(QNN_CONTEXT_ERROR_CREATE_FROM_BINARY, measured on QNN 2.51.0)")


@dataclass(frozen=True)
class Expected:
    """One requested graph: its name, the partitions its EPContext nodes name, the context
    binaries they reference, and the source model's inputs/outputs (None: partly on the CPU)."""

    name: str
    partitions: list[str]
    binaries: list[str]
    io: dict[str, list[dict[str, Any]]] | None


def _io_mismatch(kind: str, want: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[str]:
    problems = []
    have = {t["name"]: t for t in got}
    if sorted(have) != sorted(t["name"] for t in want):
        return [f"{kind} {sorted(have)} != the model's {sorted(t['name'] for t in want)}"]
    for t in want:
        shape = have[t["name"]]["shape"]
        # A symbolic dim in the model (batch) is whatever the compile fixed it to.
        fixed = list(t["shape"])
        if len(fixed) != len(shape) or any(isinstance(d, int) and d > 0 and d != s
                                           for d, s in zip(fixed, shape, strict=True)):
            problems.append(f"{kind} {t['name']!r} has shape {shape}, the model {t['shape']}")
    return problems


def check(descriptions: dict[str, Any] | None, expected: list[Expected]) -> dict[str, Any]:
    """The evidence record (``artifacts.description``); raises ToolchainError when a binary
    can't be read or does not describe exactly the requested graphs."""
    binaries = descriptions or {}
    wanted_bins = sorted({b for e in expected for b in e.binaries})
    if not wanted_bins:  # embed_mode=1: the binary is inside the context model
        return {"check": "not read: the context binary is embedded in the context model (embed_mode=1)",
                "binaries": {}, "graphs": []}
    problems: list[str] = []
    for b in wanted_bins:
        d = binaries.get(b)
        if d is None:
            problems.append(f"{b} was not described")
        elif "error" in d:
            problems.append(f"{b}: {d['error']}")
    if problems:
        raise ToolchainError("the QNN System API could not describe the context binary: " + "; ".join(problems))
    qnn_graphs = {g["name"]: (b, g) for b in wanted_bins for g in binaries[b]["graphs"]}
    asked = {p for e in expected for p in e.partitions}
    if set(qnn_graphs) != asked:
        extra, missing = sorted(set(qnn_graphs) - asked), sorted(asked - set(qnn_graphs))
        problems.append(f"the binaries hold graphs {extra} nobody asked for" if extra else "")
        problems.append(f"the requested graphs' partitions {missing} are not in the binaries" if missing else "")
    graphs = []
    for e in expected:
        found = [qnn_graphs[p] for p in e.partitions if p in qnn_graphs]
        entry: dict[str, Any] = {"name": e.name, "qnn_graphs": [g["name"] for _, g in found],
                                 "binaries": sorted({b for b, _ in found})}
        if len(found) == 1:
            entry["inputs"], entry["outputs"] = found[0][1]["inputs"], found[0][1]["outputs"]
            if e.io is not None:
                mism = (_io_mismatch("inputs", e.io["inputs"], entry["inputs"])
                        + _io_mismatch("outputs", e.io["outputs"], entry["outputs"]))
                problems += [f"graph {e.name!r}: {m}" for m in mism]
                dtypes = {t["name"]: t["dtype"] for t in e.io["inputs"] + e.io["outputs"]}
                entry["dtypes_differ"] = sorted(t["name"] for t in entry["inputs"] + entry["outputs"]
                                                if dtypes.get(t["name"]) not in (None, t["dtype"]))
        graphs.append(entry)
    problems = [p for p in problems if p]
    if problems:
        raise ToolchainError("the context binary does not describe exactly the requested graphs: "
                             + "; ".join(problems)[:3000],
                             hint="the QNN System API's description of the binary disagrees with the source models")
    summary = {b: {k: v for k, v in binaries[b].items() if k != "graphs"} for b in wanted_bins}
    socs = sorted({m for d in summary.values() for m in (d.get("soc_models") or [d.get("soc_model")]) if m})
    return {"check": "ok: the binaries hold exactly the requested graphs, with the source models' inputs and "
                     "outputs", "binaries": summary, "graphs": graphs, "soc_models": socs}
