"""Coverage for ops: models (name:tag) x targets x toolchain versions, one grouped SQL query."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from farm.core.keys import parse_version
from registry.models import Artifact, Build, Tag


@dataclass
class Cell:
    state: str  # built | broken | building | failed | missing
    builds: int = 0
    codes: list[str] = field(default_factory=list)
    verified: bool = False  # a probe loaded a built artifact of this cell

    def label(self) -> str:
        if self.state == "failed":
            return "failed(" + ",".join(sorted(set(self.codes))) + ")"
        return self.state


_RANK = {"built": 4, "building": 3, "broken": 2, "failed": 1}


@dataclass
class Coverage:
    toolchains: dict[str, list[str]]  # backend -> versions, oldest first
    cells: dict[tuple[str, str, str], Cell]  # (model label, backend:target, toolchain) -> cell
    models: list[str]

    def newest(self, backend: str) -> str | None:
        versions = self.toolchains.get(backend)
        return versions[-1] if versions else None

    def missing(self, targets: list[str] | None = None) -> list[dict[str, Any]]:
        """Per model: targets without a good build on the newest toolchain of their backend.
        ``targets`` (backend:name) sets the wanted matrix; default: what each model was ever built for."""
        wanted_by_model: dict[str, set[str]] = defaultdict(set)
        for (model, target, _tc) in self.cells:
            wanted_by_model[model].add(target)
        out = []
        for model in self.models:
            for target in sorted(set(targets) if targets else wanted_by_model[model]):
                backend = target.split(":", 1)[0]
                newest = self.newest(backend)
                if newest is None:
                    continue
                cell = self.cells.get((model, target, newest))
                if cell is None or cell.state not in ("built", "building"):
                    out.append({"model": model, "target": target, "toolchain": newest,
                                "state": cell.label() if cell else "missing"})
        return out


def coverage(session: Session, *, backend: str | None = None, models: list[str] | None = None) -> Coverage:
    """One grouped query over builds (x tags, x artifacts); the matrix is folded in Python."""
    from sqlalchemy import case, exists

    from registry.models import CompatVerdict

    label = func.coalesce(Tag.name + ":" + Tag.tag, Build.model_digest)
    loaded = exists().where(CompatVerdict.artifact_id == Artifact.id, CompatVerdict.verdict == "loads",
                            CompatVerdict.source == "probe")
    q = (
        select(label.label("model"), Build.backend, Build.target, Build.toolchain, Build.state, Build.error_code,
               Artifact.status, func.count().label("n"), func.max(case((loaded, 1), else_=0)).label("verified"))
        .select_from(Build)
        .outerjoin(Tag, Tag.model_digest == Build.model_digest)
        .outerjoin(Artifact, Artifact.build_id == Build.id)
        .group_by(label, Build.backend, Build.target, Build.toolchain, Build.state, Build.error_code, Artifact.status)
    )
    if backend:
        q = q.where(Build.backend == backend)
    if models:
        q = q.where(label.in_(models))
    cells: dict[tuple[str, str, str], Cell] = {}
    toolchains: dict[str, set[str]] = defaultdict(set)
    names: set[str] = set()
    for model, be, target, toolchain, state, code, status, n, verified in session.execute(q):
        if model.startswith("sha256:"):
            model = model[:19]
        names.add(model)
        toolchains[be].add(toolchain)
        cell_state = {"succeeded": "built", "queued": "building", "running": "building"}.get(state, "failed")
        if cell_state == "built" and status == "broken":
            cell_state = "broken"
        key = (model, f"{be}:{target}", toolchain)
        cell = cells.get(key)
        if cell is None or _RANK[cell_state] > _RANK[cell.state]:
            prev = cell
            cell = Cell(cell_state, builds=prev.builds if prev else 0, codes=prev.codes if prev else [])
            cells[key] = cell
        cell.builds += n
        cell.verified = cell.verified or (cell_state == "built" and bool(verified))
        if state == "failed" and code:
            cell.codes.append(code)
    return Coverage({b: sorted(v, key=parse_version) for b, v in toolchains.items()}, cells, sorted(names))
