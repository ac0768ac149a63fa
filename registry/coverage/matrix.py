"""The whole matrix (``coverage``: model digests with their tags x targets x toolchain versions
and the probe evidence per cell), folded in Python from grouped SQL queries over every build:
`farm coverage` without flags and GET /v1/coverage, for a filtered set of models; its cost grows
with the builds."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from farm.core.keys import parse_version
from registry.coverage.cells import partial_offloads, socs, unverifiable
from registry.coverage.llm import Parts, llm_parts, twins
from registry.lite import rows_of
from registry.models import Artifact, Build, Model


@dataclass
class Evidence:
    """Probe verdicts of a cell's artifacts under one runtime version."""

    loads: int = 0
    fails: int = 0
    last: datetime | None = None

    @property
    def verdict(self) -> str:
        if self.loads and self.fails:
            return "mixed"
        return "loads" if self.loads else "fails"


@dataclass
class Cell:
    state: str  # built | broken | building | failed | missing
    builds: int = 0
    codes: list[str] = field(default_factory=list)
    verified: bool = False  # a probe loaded a built artifact of this cell
    # (runtime backend, runtime version) -> what probes of this cell's artifacts said
    evidence: dict[tuple[str, str], Evidence] = field(default_factory=dict)
    via: list[str] = field(default_factory=list)  # multi-SoC targets (qnn:A+B) built into this SoC's cell
    # Partial offload: an active artifact of the cell leaves nodes on the CPU; their op types.
    partial_offload: bool = False
    cpu_op_types: list[str] = field(default_factory=list)
    # Why no runtime here can verify the cell (built only by graph groups or multi-SoC binaries).
    unverified: str | None = None
    devices: int = 0  # distinct devices that reported a built artifact of the cell loads (its own SoC)
    # The device lab (registry.lab.LabCell.to_dict): enrolled devices of this SoC on the cell's
    # active artifacts, their medians, and the speed-per-SDK flag; None where the lab has no report.
    lab: dict[str, Any] | None = None
    # An LLM (genai package): its twin's figure (``16/16``), and its parts' cells of the same
    # target and toolchain ({"part", "model", "state"}), counted under it (registry.coverage.llm).
    twin: str | None = None
    parts: list[dict[str, Any]] = field(default_factory=list)

    def label(self) -> str:
        if self.state == "failed":
            return "failed(" + ",".join(sorted(set(self.codes))) + ")"
        return self.state


_RANK = {"built": 4, "building": 3, "broken": 2, "failed": 1}


@dataclass
class Coverage:
    toolchains: dict[str, list[str]]  # backend -> versions built with, oldest first
    cells: dict[tuple[str, str, str], Cell]  # (model digest, backend:target, toolchain) -> cell
    models: list[str]  # digests, tagged ones first (by first tag), then untagged by digest
    tags: dict[str, list[str]] = field(default_factory=dict)  # digest -> NAME:TAGs
    names: dict[str, str] = field(default_factory=dict)  # digest -> the name it was first recorded under
    runtimes: dict[str, list[str]] = field(default_factory=dict)  # backend -> probed runtime versions
    parts: dict[str, list[str]] = field(default_factory=dict)  # an LLM's digest -> its parts' digests, in order

    def newest(self, backend: str) -> str | None:
        versions = self.toolchains.get(backend)
        return versions[-1] if versions else None

    def label(self, digest: str) -> str:
        """``squeeze:latest, squeeze:stable`` or, untagged, ``sha256:1933fa1642a4``."""
        return ", ".join(self.tags.get(digest, [])) or digest[:19]

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
                    out.append({"model": model, "tags": self.tags.get(model, []), "target": target,
                                "toolchain": newest, "state": cell.label() if cell else "missing"})
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `farm coverage --json` and GET /v1/coverage (schema: farm/cli/schemas/coverage.json)."""
        from farm.core.times import iso

        return {
            "toolchains": self.toolchains,
            "runtimes": self.runtimes,
            "models": [{"digest": d, "tags": self.tags.get(d, []), "name": self.names.get(d),
                        "parts": self.parts.get(d, [])} for d in self.models],
            "cells": [{"model": m, "tags": self.tags.get(m, []), "target": t, "toolchain": tc, "state": c.state,
                       "builds": c.builds, "codes": sorted(set(c.codes)), "probe_verified": c.verified,
                       "via": sorted(set(c.via)), "partial_offload": c.partial_offload,
                       "cpu_op_types": sorted(set(c.cpu_op_types)), "unverified": c.unverified, "devices": c.devices,
                       "twin": c.twin, "parts": c.parts, "device_lab": c.lab,
                       "verdicts": [{"runtime_backend": rb, "runtime": rv, "verdict": e.verdict, "loads": e.loads,
                                     "fails": e.fails, "last_probed_at": iso(e.last)}
                                    for (rb, rv), e in sorted(c.evidence.items(),
                                                              key=lambda kv: (kv[0][0], parse_version(kv[0][1])))]}
                      for (m, t, tc), c in self.ordered_cells()],
        }

    def ordered_cells(self) -> list[tuple[tuple[str, str, str], Cell]]:
        """Cells in the order of ``models``, then target, then toolchain version."""
        pos = {m: i for i, m in enumerate(self.models)}
        return sorted(self.cells.items(), key=lambda kv: (pos.get(kv[0][0], len(pos)), kv[0][1],
                                                          parse_version(kv[0][2])))


def coverage(session: Session, *, backend: str | None = None, models: list[str] | None = None) -> Coverage:
    """``models``: refs as `farm ls --model` takes them (NAME = every tag of it, NAME:TAG, digest
    or prefix); an unknown one is not-found."""
    from sqlalchemy import case, exists

    from registry.index import resolve_model_refs, tags_by_digest
    from registry.models import CompatVerdict

    digests: list[str] | None = None
    if models:
        digests = sorted({d for ref in models for d in resolve_model_refs(session, ref)})
    # An LLM's parts are read with it, and folded under it at the end.
    parts = llm_parts(rows_of(session), digests)
    if digests is not None:
        digests = sorted({*digests, *parts.of})
    loaded = exists().where(CompatVerdict.artifact_id == Artifact.id, CompatVerdict.verdict == "loads",
                            CompatVerdict.source == "probe")
    q = (
        select(Build.model_digest, Build.backend, Build.target, Build.toolchain, Build.state, Build.error_code,
               Artifact.status, func.count().label("n"), func.max(case((loaded, 1), else_=0)).label("verified"))
        .select_from(Build)
        .outerjoin(Artifact, Artifact.build_id == Build.id)
        .group_by(Build.model_digest, Build.backend, Build.target, Build.toolchain, Build.state, Build.error_code,
                  Artifact.status)
    )
    if backend:
        q = q.where(Build.backend == backend)
    if digests is not None:
        q = q.where(Build.model_digest.in_(digests))
    cells: dict[tuple[str, str, str], Cell] = {}
    toolchains: dict[str, set[str]] = defaultdict(set)
    seen: set[str] = set()
    for model, be, target, toolchain, state, code, status, n, verified in session.execute(q):
        seen.add(model)
        toolchains[be].add(toolchain)
        cell_state = {"succeeded": "built", "queued": "building", "running": "building"}.get(state, "failed")
        if cell_state == "built" and status == "broken":
            cell_state = "broken"
        # A multi-SoC build (qnn SM8650+SM8750) counts in each SoC's cell.
        for soc in socs(be, target):
            key = (model, f"{be}:{soc}", toolchain)
            cell = cells.get(key)
            if cell is None or _RANK[cell_state] > _RANK[cell.state]:
                prev = cell
                cell = Cell(cell_state, builds=prev.builds if prev else 0, codes=prev.codes if prev else [],
                            via=prev.via if prev else [])
                cells[key] = cell
            cell.builds += n
            cell.verified = cell.verified or (cell_state == "built" and bool(verified))
            if state == "failed" and code:
                cell.codes.append(code)
            if cell_state == "built" and soc != target:
                cell.via.append(f"{be}:{target}")
    runtimes = _evidence(session, cells, backend, digests)
    for model, be, target, toolchain, ops in partial_offloads(rows_of(session), backend, digests):
        for soc in socs(be, target):
            cell = cells.get((model, f"{be}:{soc}", toolchain))
            if cell is not None:
                cell.partial_offload = True
                cell.cpu_op_types = sorted({*cell.cpu_op_types, *ops})
    built = select(Artifact.model_digest, Artifact.backend, Artifact.target, Artifact.toolchain, Artifact.ctx_model
                   ).where(Artifact.status == "active")
    if backend:
        built = built.where(Artifact.backend == backend)
    if digests is not None:
        built = built.where(Artifact.model_digest.in_(digests))
    for (m, be, soc, tc), why in unverifiable(session.execute(built)).items():
        if (cell := cells.get((m, f"{be}:{soc}", tc))) is not None and cell.state == "built":
            cell.unverified = why
    _device_confirmations(session, cells, backend, digests)
    from registry.lab import of_models as lab_cells

    for (m, be, soc, tc), lab in lab_cells(rows_of(session), digests, backend).items():
        if (lab_cell := cells.get((m, f"{be}:{soc}", tc))) is not None:
            lab_cell.lab = lab.to_dict()
    for (m, be, target, tc), label in twins(rows_of(session), sorted(seen), backend).items():
        if (package_cell := cells.get((m, f"{be}:{target}", tc))) is not None:
            package_cell.twin = label
    _fold_parts(cells, parts)
    seen -= set(parts.of)
    tags = tags_by_digest(session, sorted(seen))
    names = {d: n for d, n in session.execute(select(Model.digest, Model.first_name).where(Model.digest.in_(seen)))}
    order = sorted(seen, key=lambda d: (not tags[d], tags[d][0] if tags[d] else d))
    return Coverage({b: sorted(v, key=parse_version) for b, v in toolchains.items()}, cells, order, tags, names,
                    runtimes, {p: d for p, d in parts.under().items() if p in seen})


def _fold_parts(cells: dict[tuple[str, str, str], Cell], parts: Parts) -> None:
    """Each cell of an LLM's part goes under its package's cell of the same target and
    toolchain (``Cell.parts``); a part is no model of its own."""
    for key in [k for k in cells if k[0] in parts.of]:
        cell = cells.pop(key)
        package, i = parts.of[key[0]]
        if (package_cell := cells.get((package, key[1], key[2]))) is not None:
            package_cell.parts.append({"part": i, "model": key[0], "state": cell.label()})
            package_cell.parts.sort(key=lambda p: p["part"])


def _device_confirmations(session: Session, cells: dict[tuple[str, str, str], Cell], backend: str | None,
                          digests: list[str] | None) -> None:
    """Distinct devices that reported a cell's active artifacts load, on the cell of the device's
    own SoC (a multi-SoC artifact: only the SoC that was loaded), struck reports left out."""
    from registry.models import DeviceReport

    q = (select(Artifact.model_digest, Artifact.backend, Artifact.target, Artifact.toolchain, DeviceReport.soc,
                func.count())
         .join(DeviceReport, DeviceReport.artifact_id == Artifact.id)
         .where(Artifact.status == "active", DeviceReport.outcome == "loads", DeviceReport.revoked_at.is_(None))
         .group_by(Artifact.model_digest, Artifact.backend, Artifact.target, Artifact.toolchain, DeviceReport.soc))
    if backend:
        q = q.where(Artifact.backend == backend)
    if digests is not None:
        q = q.where(Artifact.model_digest.in_(digests))
    for m, be, target, tc, soc, n in session.execute(q):
        cell = cells.get((m, f"{be}:{soc}", tc))
        if cell is not None and soc in socs(be, target) and cell.state == "built":
            cell.devices += int(n)


def _evidence(session: Session, cells: dict[tuple[str, str, str], Cell], backend: str | None,
              digests: list[str] | None) -> dict[str, list[str]]:
    """Fold probe verdicts (grouped in SQL) into the cells; returns the probed runtime versions."""
    from registry.models import CompatVerdict

    q = (select(Artifact.model_digest, Artifact.backend, Artifact.target, Artifact.toolchain,
                CompatVerdict.runtime_backend, CompatVerdict.runtime_version, CompatVerdict.verdict,
                func.count(), func.max(CompatVerdict.recorded_at))
         .join(CompatVerdict, CompatVerdict.artifact_id == Artifact.id)
         .where(CompatVerdict.source == "probe", Artifact.status == "active")
         .group_by(Artifact.model_digest, Artifact.backend, Artifact.target, Artifact.toolchain,
                   CompatVerdict.runtime_backend, CompatVerdict.runtime_version, CompatVerdict.verdict))
    if backend:
        q = q.where(Artifact.backend == backend)
    if digests is not None:
        q = q.where(Artifact.model_digest.in_(digests))
    runtimes: dict[str, set[str]] = defaultdict(set)
    for model, be, target, toolchain, rb, rv, verdict, n, last in session.execute(q):
        for soc in socs(be, target):
            cell = cells.get((model, f"{be}:{soc}", toolchain))
            if cell is None:
                continue
            runtimes[rb].add(rv)
            ev = cell.evidence.setdefault((rb, rv), Evidence())
            if verdict == "loads":
                ev.loads += n
            else:
                ev.fails += n
            if last is not None and (ev.last is None or last > ev.last):
                ev.last = last
    return {b: sorted(v, key=parse_version) for b, v in runtimes.items()}
