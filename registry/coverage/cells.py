"""What every coverage view folds into a cell the same way: the SoCs a build's target counts
in, the active artifacts that leave nodes on the CPU, the cells no runtime here can verify,
and the NAME:TAGs of a set of models."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from registry.lite import Rows, as_json, in_params


def socs(backend: str, target: str) -> list[str]:
    """The cell targets a build's target counts in: each SoC of a multi-SoC QNN target
    (``SM8650+SM8750``), else the target itself (as ``registry.coverage_sql.covered``)."""
    return list(dict.fromkeys(target.split("+"))) if backend == "qnn" else [target]


def partial_offloads(rows: Any, backend: str | None, digests: list[str] | None, extra: str = "",
             params: dict[str, Any] | None = None) -> list[tuple[str, str, str, str, list[str]]]:
    """(model, backend, target, toolchain, op types) of each active artifact that leaves nodes on
    the CPU (a partial offload; op types [] where not recorded), for the cells to mark."""
    p: dict[str, Any] = dict(params or {})
    sql = ("SELECT model_digest, backend, target, toolchain, cpu_op_types FROM artifacts a"
           " WHERE a.status = 'active' AND a.nodes_cpu > 0" + extra)
    if backend:
        sql += " AND a.backend = :p_backend"
        p["p_backend"] = backend
    if digests is not None:
        if not digests:
            return []
        placeholders, ps = in_params("p", digests)
        sql += f" AND a.model_digest IN ({placeholders})"
        p.update(ps)
    out = []
    for m, b, t, tc, ops in rows.rows(sql, p):
        value = as_json(ops)
        out.append((m, b, t, tc, [str(o) for o in value] if isinstance(value, list) else []))
    return out


def unverifiable(artifacts: Any) -> dict[tuple[str, str, str, str], str]:
    """(model, backend, SoC, toolchain) -> why no runtime here can verify that cell, from its active
    artifacts ``(model, backend, target, toolchain, ctx_model)``: every one of them a weight-shared
    graph group or a multi-SoC binary (the x86_64 simulator loads neither: ``registry.resolve``).
    A cell with one plain single-SoC artifact is verifiable and not listed. QNN only."""
    from registry.resolve import SHARED_KINDS, UNVERIFIED_MULTI_SOC, UNVERIFIED_SHARED

    kinds: dict[tuple[str, str, str, str], set[str]] = defaultdict(set)
    for m, be, target, tc, ctx_model in artifacts:
        if be != "qnn":
            continue
        for soc in socs(be, target):
            kind = ("multi" if soc != target else "") + ("group" if ctx_model in SHARED_KINDS else "")
            kinds[(m, be, soc, tc)].add(kind or "plain")
    out = {}
    for key, seen in kinds.items():
        if "plain" in seen:
            continue
        why = []
        if any("group" in k for k in seen):
            why.append(f"built only as weight-shared graph groups or genai packages ({UNVERIFIED_SHARED})")
        if any("multi" in k for k in seen):
            why.append(f"built only as a multi-SoC binary ({UNVERIFIED_MULTI_SOC})")
        out[key] = "; ".join(why) if len(why) == 1 else \
            "built only as weight-shared graph groups or multi-SoC binaries (the x86_64 simulator loads neither)"
    return out


def as_aware(value: Any) -> Any:
    from registry.lite import as_datetime

    return as_datetime(value)


def tags_of(rows: Rows, digests: list[str]) -> dict[str, list[str]]:
    placeholders, params = in_params("t", digests)
    out: dict[str, list[str]] = defaultdict(list)
    for d, n, t in rows.rows(f"SELECT model_digest, name, tag FROM tags WHERE model_digest IN ({placeholders})"
                             " ORDER BY name, tag", params):
        out[d].append(f"{n}:{t}")
    return out
