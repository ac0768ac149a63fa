"""An LLM (a genai package, farm.pipeline.genai) is one model in coverage. Each of its parts is
a weight-shared group build of a model digest of its own; coverage counts those under the
package they were built for (``genai_parts`` links the builds), never as models, and a
package's cells carry its twin's figure (the greedy tokens the parts compiled without sharing
generated on the simulator as the CPU EP did)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from registry.lite import Rows, as_json, in_params

# The model digests built as an LLM's parts: SQL to leave them out of what counts models.
PART_DIGESTS = ("SELECT pb.model_digest FROM genai_parts g JOIN builds pb ON pb.id = g.part_build_id")


@dataclass
class Parts:
    """Which model digests are an LLM's parts: part digest -> (package digest, part index)."""

    of: dict[str, tuple[str, int]] = field(default_factory=dict)

    def under(self) -> dict[str, list[str]]:
        """package digest -> its parts' digests, in part order."""
        out: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for part, (package, i) in self.of.items():
            out[package].append((i, part))
        return {p: [d for _, d in sorted(v)] for p, v in out.items()}


def llm_parts(rows: Rows, packages: list[str] | None = None) -> Parts:
    """The parts of these packages (every package's when None)."""
    sql = ("SELECT DISTINCT pb.model_digest, pk.model_digest, g.part FROM genai_parts g"
           " JOIN builds pb ON pb.id = g.part_build_id JOIN builds pk ON pk.id = g.package_build_id")
    params: dict[str, Any] = {}
    if packages is not None:
        if not packages:
            return Parts()
        placeholders, params = in_params("lp", packages)
        sql += f" WHERE pk.model_digest IN ({placeholders})"
    out = Parts()
    for part, package, i in sorted(rows.rows(sql, params), key=lambda r: (r[1], int(r[2]), r[0])):
        if part != package:
            out.of.setdefault(part, (package, int(i)))
    return out


def twin_label(description: Any) -> str | None:
    """``16/16`` (tokens matched of those compared) from a genai package artifact's description,
    or the twin's status when it gave no figure; None without a twin."""
    tw = (as_json(description) or {}).get("twin") if description is not None else None
    if not isinstance(tw, dict):
        return None
    if tw.get("status") == "ok":
        return f"{tw.get('tokens_matched')}/{tw.get('tokens_compared')}"
    return str(tw.get("status"))[:40]


def twins(rows: Rows, digests: list[str], backend: str | None = None) -> dict[tuple[str, str, str, str], str]:
    """(model, backend, target, toolchain) -> the twin label of each active genai package
    artifact among these models."""
    if not digests:
        return {}
    placeholders, params = in_params("tw", digests)
    sql = ("SELECT a.model_digest, a.backend, a.target, a.toolchain, a.description FROM artifacts a"
           f" WHERE a.model_digest IN ({placeholders}) AND a.status = 'active' AND a.ctx_model = 'genai_config.json'")
    if backend:
        sql += " AND a.backend = :tw_backend"
        params["tw_backend"] = backend
    out = {}
    for m, b, t, tc, desc in rows.rows(sql, params):
        if (label := twin_label(desc)) is not None:
            out[(m, b, t, tc)] = label
    return out
