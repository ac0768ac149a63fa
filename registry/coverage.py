"""Coverage for ops, two ways.

The summary and the drill-down (``summary``, ``models_page``; docs/coverage.md) read the tables that the
triggers of migration 0008 keep (``registry.coverage_sql``): SoC x SDK counts for the farm, a tag
or a name prefix, and models paged by name with a keyset cursor. They answer in milliseconds at a
million artifacts; `farm coverage --summary/--missing`, GET /v1/coverage/summary|models and the
/coverage page use them.

The whole matrix (``coverage``: model digests with their tags x targets x toolchain versions and
the probe evidence per cell) is folded in Python from two grouped SQL queries over every build:
`farm coverage` without flags and GET /v1/coverage, for a filtered set of models; its cost grows
with the builds.

A model is its digest: a digest with three tags is one row with three tags, and a tag moved to
another digest leaves the old digest's row in place (its artifacts still exist)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from farm.core.keys import parse_version
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

    def label(self) -> str:
        if self.state == "failed":
            return "failed(" + ",".join(sorted(set(self.codes))) + ")"
        return self.state


_RANK = {"built": 4, "building": 3, "broken": 2, "failed": 1}


def socs(backend: str, target: str) -> list[str]:
    """The cell targets a build's target counts in: each SoC of a multi-SoC QNN target
    (``SM8650+SM8750``), else the target itself (as ``registry.coverage_sql.covered``)."""
    return list(dict.fromkeys(target.split("+"))) if backend == "qnn" else [target]


@dataclass
class Coverage:
    toolchains: dict[str, list[str]]  # backend -> versions built with, oldest first
    cells: dict[tuple[str, str, str], Cell]  # (model digest, backend:target, toolchain) -> cell
    models: list[str]  # digests, tagged ones first (by first tag), then untagged by digest
    tags: dict[str, list[str]] = field(default_factory=dict)  # digest -> NAME:TAGs
    names: dict[str, str] = field(default_factory=dict)  # digest -> the name it was first recorded under
    runtimes: dict[str, list[str]] = field(default_factory=dict)  # backend -> probed runtime versions

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
            "models": [{"digest": d, "tags": self.tags.get(d, []), "name": self.names.get(d)} for d in self.models],
            "cells": [{"model": m, "tags": self.tags.get(m, []), "target": t, "toolchain": tc, "state": c.state,
                       "builds": c.builds, "codes": sorted(set(c.codes)), "probe_verified": c.verified,
                       "via": sorted(set(c.via)), "partial_offload": c.partial_offload,
                       "cpu_op_types": sorted(set(c.cpu_op_types)), "unverified": c.unverified, "devices": c.devices,
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
    for model, be, target, toolchain, ops in _partial(rows_of(session), backend, digests):
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
    tags = tags_by_digest(session, sorted(seen))
    names = {d: n for d, n in session.execute(select(Model.digest, Model.first_name).where(Model.digest.in_(seen)))}
    order = sorted(seen, key=lambda d: (not tags[d], tags[d][0] if tags[d] else d))
    return Coverage({b: sorted(v, key=parse_version) for b, v in toolchains.items()}, cells, order, tags, names,
                    runtimes)


def _partial(rows: Any, backend: str | None, digests: list[str] | None, extra: str = "",
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


# ---- the summary and the paged drill-down ---------------------------------------------------------
#
# Both read the tables the triggers of migration 0008 keep (registry.coverage_sql): the summary
# sums ``coverage_deltas`` (a few rows per target x toolchain once folded) or, for a subset of
# models (a tag, a name prefix, refs), aggregates their ``coverage_cells`` rows; the drill-down
# pages models by (first name, digest) with a keyset cursor and reads the page's cells only.

from registry.coverage_sql import COUNTERS  # noqa: E402
from registry.lite import Rows, as_json, in_params, rows_of  # noqa: E402

CELL_STATES = ("built", "building", "broken", "failed", "missing")
PAGE_MAX = 200
COMPACT_OVER = 2000  # delta rows before a summary read folds them
# A summary of a subset is aggregated from its cells: past this many models it is refused
# (use a narrower prefix, or the whole farm's summary, which is kept precomputed).
SUBSET_MAX = 50_000


@dataclass(frozen=True)
class Scope:
    """Which models: a tag (every NAME:TAG with this TAG, e.g. ``stable``), a name prefix (tags'
    names and first names), model refs (``farm ls --model``'s), a backend; all given must hold."""

    tag: str | None = None
    prefix: str | None = None
    digests: tuple[str, ...] | None = None
    backend: str | None = None

    @property
    def whole(self) -> bool:
        return self.tag is None and self.prefix is None and self.digests is None

    def to_dict(self) -> dict[str, Any]:
        return {"tag": self.tag, "prefix": self.prefix, "models": list(self.digests) if self.digests is not None
                else None, "backend": self.backend}


def scope(session: Any, *, tag: str | None = None, prefix: str | None = None, models: list[str] | None = None,
          backend: str | None = None) -> Scope:
    """Check the filters (bad ones are usage errors, unknown model refs not-found)."""
    from farm.core.errors import UsageError
    from farm.core.names import check_name

    if tag is not None:
        tag = tag.strip()
        if not tag or len(tag) > 128 or not all(c.isalnum() or c in "._-" for c in tag):
            raise UsageError(f"bad tag {tag[:40]!r}", hint="a tag is letters, digits, '.', '_' or '-', e.g. stable")
    if prefix is not None:
        if not prefix or len(prefix) > 255:
            raise UsageError("bad name prefix", hint="the first letters of model names, e.g. yolo")
        check_name(prefix.rstrip("-_./") or prefix)
    if backend is not None and backend not in ("qnn", "trt"):
        raise UsageError(f"unknown backend {backend[:20]!r}", hint="qnn or trt")
    digests = None
    if models:
        from registry.index import resolve_model_refs

        digests = tuple(sorted({d for ref in models for d in resolve_model_refs(session, ref)}))
    return Scope(tag, prefix, digests, backend)


def _like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _subset(sc: Scope, alias: str, params: dict[str, Any]) -> str:
    """SQL conditions on ``alias.model_digest`` for the scope's models ("" for all)."""
    out = []
    if sc.tag is not None:
        params["s_tag"] = sc.tag
        out.append(f" AND {alias}.model_digest IN (SELECT model_digest FROM tags WHERE tag = :s_tag)")
    if sc.prefix is not None:
        params["s_like"] = _like(sc.prefix)
        # One IN over a UNION (each side by its index: tags (name, tag), models (first_name,
        # digest)): an OR of two INs made PostgreSQL scan every cell (3.6 s at 1M).
        out.append(f" AND {alias}.model_digest IN (SELECT model_digest FROM tags WHERE name LIKE :s_like"
                   f" ESCAPE '\\' UNION SELECT digest FROM models WHERE first_name LIKE :s_like ESCAPE '\\')")
    if sc.digests is not None:
        if not sc.digests:
            out.append(" AND 1 = 0")
        else:
            placeholders, p = in_params("s_d", list(sc.digests))
            params.update(p)
            out.append(f" AND {alias}.model_digest IN ({placeholders})")
    if sc.backend is not None:
        params["s_backend"] = sc.backend
        out.append(f" AND {alias}.backend = :s_backend")
    return "".join(out)


@dataclass
class SummaryRow:
    """One SoC (target) x SDK (toolchain): cells (models) built, building, broken, failed,
    missing (wanted, i.e. built for this target with some SDK, but nothing with this one),
    and built ones verified by a probe or by a device report."""

    backend: str
    target: str
    toolchain: str
    cells: int = 0
    built: int = 0
    building: int = 0
    broken: int = 0
    failed: int = 0
    probe_verified: int = 0
    device_verified: int = 0
    wanted: int = 0

    @property
    def missing(self) -> int:
        return max(self.wanted - self.cells, 0)

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "target": f"{self.backend}:{self.target}", "toolchain": self.toolchain,
                "models": self.wanted, "built": self.built, "building": self.building, "broken": self.broken,
                "failed": self.failed, "missing": self.missing, "probe_verified": self.probe_verified,
                "device_verified": self.device_verified}


@dataclass
class Summary:
    scope: Scope
    rows: list[SummaryRow]
    toolchains: dict[str, list[str]]  # backend -> SDK versions with builds, oldest first
    source: str  # "counters" (precomputed) | "cells" (aggregated for the subset)

    def to_dict(self) -> dict[str, Any]:
        """GET /v1/coverage/summary and `farm coverage --summary --json`."""
        return {"scope": self.scope.to_dict(), "toolchains": self.toolchains, "source": self.source,
                "rows": [r.to_dict() for r in self.rows]}


def summary(session: Any, sc: Scope | None = None, *, compact_over: int | None = COMPACT_OVER) -> Summary:
    """SoC x SDK counts for the scope. The whole farm: the precomputed counters (folded first
    when more than ``compact_over`` deltas piled up and the connection may write); a subset:
    one aggregate over its cells."""
    rows = rows_of(session)
    sc = sc or Scope()
    counters = [c for c in COUNTERS if c != "wanted"]
    if sc.whole or (sc.tag is not None and sc.prefix is None and sc.digests is None):
        # The farm, or a tag (channel): counters kept as builds finish and tags move.
        if compact_over is not None and _deltas_over(rows, compact_over):
            compact(rows)
        params: dict[str, Any] = {"scope": "" if sc.tag is None else f"tag:{sc.tag}"}
        where = " WHERE scope = :scope"
        if sc.backend is not None:
            params["s_backend"] = sc.backend
            where += " AND backend = :s_backend"
        found = rows.rows(f"SELECT backend, target, toolchain, {', '.join(f'sum({c})' for c in COUNTERS)}"
                          f" FROM coverage_deltas{where} GROUP BY backend, target, toolchain", params)
        source = "counters"
    else:
        params = {}
        cond = _subset(sc, "c", params)
        from registry.coverage_sql import _contribution

        found = [(*r, 0) for r in rows.rows(
            f"SELECT c.backend, c.target, c.toolchain, {_contribution('c')} FROM coverage_cells c"
            f" WHERE 1 = 1{cond} GROUP BY c.backend, c.target, c.toolchain", params)]
        params = {}
        cond = _subset(sc, "c", params)
        found += [(be, tg, "", *([0] * len(counters)), n) for be, tg, n in rows.rows(
            f"SELECT c.backend, c.target, count(DISTINCT c.model_digest) FROM coverage_cells c"
            f" WHERE 1 = 1{cond} GROUP BY c.backend, c.target", params)]
        source = "cells"
    cells: dict[tuple[str, str, str], SummaryRow] = {}
    wanted: dict[tuple[str, str], int] = defaultdict(int)
    for be, tg, tc, *values in found:
        counts = dict(zip(COUNTERS, (int(v or 0) for v in values), strict=True))
        wanted[(be, tg)] += counts.pop("wanted")
        if tc and any(counts.values()):
            row = cells.setdefault((be, tg, tc), SummaryRow(be, tg, tc))
            for k, v in counts.items():
                setattr(row, k, getattr(row, k) + v)
    toolchains: dict[str, set[str]] = defaultdict(set)
    for be, _tg, tc in cells:
        toolchains[be].add(tc)
    # Every (target, SDK) of a backend is a row, missing where no model of the scope has a build.
    for (be, tg), n in wanted.items():
        if n <= 0:
            continue
        for tc in toolchains[be]:
            cells.setdefault((be, tg, tc), SummaryRow(be, tg, tc))
    for row in cells.values():
        row.wanted = wanted.get((row.backend, row.target), 0)
    ordered = sorted(cells.values(), key=lambda r: (r.backend, r.target, parse_version(r.toolchain)))
    return Summary(sc, [r for r in ordered if r.wanted > 0 or r.cells > 0],
                   {b: sorted(v, key=parse_version) for b, v in sorted(toolchains.items())}, source)


def _deltas_over(rows: Rows, n: int) -> bool:
    return len(rows.rows("SELECT 1 FROM coverage_deltas LIMIT :n", {"n": n + 1})) > n


def compact(session: Any) -> bool:
    """Fold the summary's deltas into one row per (backend, target, toolchain), in the caller's
    transaction. PostgreSQL: one session at a time (a transaction-scoped advisory lock; another
    one skips), False when skipped."""
    from registry.coverage_sql import compact as statements

    rows = rows_of(session)
    if rows.dialect == "postgresql":
        got = rows.rows("SELECT pg_try_advisory_xact_lock(hashtext('ctxfarm.coverage'), 0)")
        if not got or not got[0][0]:
            return False
    for statement in statements(rows.dialect):
        rows.rows(statement)
    return True


def rebuild(session: Any) -> None:
    """Recompute every cell and the summary from the builds (after a bulk load with triggers
    off; a repair). Takes the tables' write locks for the transaction."""
    from registry.coverage_sql import rebuild as statements

    rows = rows_of(session)
    if rows.dialect == "postgresql":
        rows.rows("LOCK TABLE coverage_cells, coverage_deltas IN EXCLUSIVE MODE")
    for statement in statements(rows.dialect):
        rows.rows(statement)


# -- the drill-down -------------------------------------------------------------------------------

@dataclass
class ModelCoverage:
    digest: str
    name: str
    tags: list[str]
    cells: list[dict[str, Any]]
    missing: list[dict[str, Any]]


@dataclass
class Page:
    scope: Scope
    models: list[ModelCoverage]
    next_cursor: str | None
    toolchains: dict[str, list[str]]  # newest per backend decides "missing"

    def to_dict(self) -> dict[str, Any]:
        """GET /v1/coverage/models and `farm coverage --missing --json` (one page)."""
        return {"scope": self.scope.to_dict(), "next": self.next_cursor, "toolchains": self.toolchains,
                "models": [{"digest": m.digest, "name": m.name, "tags": m.tags, "cells": m.cells,
                            "missing": m.missing} for m in self.models]}


def encode_cursor(name: str, digest: str) -> str:
    import base64

    return base64.urlsafe_b64encode(json.dumps([name, digest]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    import base64

    from farm.core.errors import UsageError
    from farm.core.keys import is_digest

    bad = UsageError("bad cursor", hint="pass the `next` value of the previous page as it came")
    if len(cursor) > 600:
        raise bad
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except ValueError:
        raise bad from None
    if (not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, str) for v in value)
            or not is_digest(value[1]) or len(value[0]) > 255):
        raise bad
    return value[0], value[1]


def models_page(session: Any, sc: Scope | None = None, *, target: str | None = None, toolchain: str | None = None,
                state: str | None = None, cursor: str | None = None, limit: int = 20) -> Page:
    """One page of models with their cells, by (first name, digest) after ``cursor``. ``target``
    (backend:name), ``toolchain``: only those cells; ``state``: only models with a cell in that
    state (``missing``: a wanted target with nothing built or building on the toolchain asked,
    default the newest of its backend)."""
    from farm.core.errors import UsageError

    rows = rows_of(session)
    sc = sc or Scope()
    if state is not None and state not in CELL_STATES:
        raise UsageError(f"unknown state {state[:20]!r}", hint="one of " + ", ".join(CELL_STATES))
    limit = max(1, min(int(limit), PAGE_MAX))
    newest = _newest_toolchains(rows, sc.backend)
    params: dict[str, Any] = {"limit": limit + 1}
    cell_cond = _subset(sc, "c", params)
    be = tg = None
    if target is not None:
        be, _, tg = target.partition(":")
        if not tg or be not in ("qnn", "trt"):
            raise UsageError(f"bad target {target[:40]!r}", hint="backend:name, e.g. qnn:SM8650")
        params.update(f_backend=be, f_target=tg)
        cell_cond += " AND c.backend = :f_backend AND c.target = :f_target"
    if toolchain is not None:
        params["f_toolchain"] = toolchain
    if state == "missing":
        tc_expr = ":f_toolchain" if toolchain is not None else _newest_case(newest, params)
        exists = (f"EXISTS (SELECT 1 FROM coverage_cells c WHERE c.model_digest = m.digest{cell_cond}"
                  f" AND NOT EXISTS (SELECT 1 FROM coverage_cells g WHERE g.model_digest = c.model_digest"
                  f" AND g.backend = c.backend AND g.target = c.target AND g.toolchain = {tc_expr}"
                  f" AND g.state IN ('built', 'building')))")
    else:
        extra = " AND c.toolchain = :f_toolchain" if toolchain is not None else ""
        if state is not None:
            params["f_state"] = state
            extra += " AND c.state = :f_state"
        exists = f"EXISTS (SELECT 1 FROM coverage_cells c WHERE c.model_digest = m.digest{cell_cond}{extra})"
    after = ""
    if cursor:
        params["k_name"], params["k_digest"] = decode_cursor(cursor)
        # A row comparison: the index (first_name, digest) starts at the cursor (an OR filtered from the first row).
        after = " AND (m.first_name, m.digest) > (:k_name, :k_digest)"
    found = rows.rows(f"SELECT m.digest, m.first_name FROM models m WHERE {exists}{after}"
                      " ORDER BY m.first_name, m.digest LIMIT :limit", params)
    more = len(found) > limit
    found = found[:limit]
    digests = [d for d, _ in found]
    models = _page_models(rows, found, be, tg, toolchain, newest) if digests else []
    nxt = encode_cursor(found[-1][1], found[-1][0]) if more and found else None
    return Page(sc, models, nxt, {b: [v] for b, v in newest.items()})


def _newest_toolchains(rows: Rows, backend: str | None) -> dict[str, str]:
    """backend -> the newest toolchain with a build (from the summary's counters)."""
    found: dict[str, list[str]] = defaultdict(list)
    for be, tc in rows.rows("SELECT backend, toolchain FROM coverage_deltas WHERE scope = '' AND toolchain <> ''"
                            " GROUP BY backend, toolchain HAVING sum(cells) > 0"):
        if backend is None or be == backend:
            found[be].append(tc)
    return {be: max(v, key=parse_version) for be, v in found.items()}


def _newest_case(newest: dict[str, str], params: dict[str, Any]) -> str:
    if not newest:
        return "''"
    parts = []
    for i, (be, tc) in enumerate(sorted(newest.items())):
        params[f"n_be{i}"], params[f"n_tc{i}"] = be, tc
        parts.append(f" WHEN :n_be{i} THEN :n_tc{i}")
    return f"CASE c.backend{''.join(parts)} ELSE '' END"


def _device_evidence(rows: Rows, placeholders: str, params: dict[str, Any], filtered: bool,
                     index: dict[tuple[str, str, str, str], dict[str, Any]]) -> None:
    """Device evidence on each cell (docs/evidence.md): ``devices`` (distinct devices that reported it
    loads, not revoked) and ``accuracy_min_psnr_db`` (the lowest PSNR a check against the CPU
    reference found among its active artifacts; None when none was checked or none ran)."""
    where = (f" WHERE a.model_digest IN ({placeholders}) AND a.status = 'active'"
             + (" AND a.backend = :f_backend AND (a.target = :f_target OR a.target LIKE :f_multi)" if filtered else ""))
    group = " GROUP BY a.model_digest, a.backend, a.target, a.toolchain"
    for cell in index.values():
        cell["devices"], cell["accuracy_min_psnr_db"] = 0, None
    # A multi-SoC artifact's report counts for the SoC of the device that sent it.
    for m, b, t, tc, soc, n in rows.rows(
            "SELECT a.model_digest, a.backend, a.target, a.toolchain, r.soc, count(*) FROM artifacts a"
            " JOIN device_reports r ON r.artifact_id = a.id AND r.outcome = 'loads' AND r.revoked_at IS NULL"
            + where + group + ", r.soc", params):
        cell_target = t if "+" not in t or b != "qnn" else soc
        if cell_target in socs(b, t) and (reported := index.get((m, b, cell_target, tc))) is not None:
            reported["devices"] += int(n)
    for m, b, t, tc, psnr in rows.rows(
            "SELECT a.model_digest, a.backend, a.target, a.toolchain, min(r.min_psnr_db) FROM artifacts a"
            " JOIN accuracy_results r ON r.artifact_id = a.id AND r.status = 'ok'" + where + group, params):
        for soc in socs(b, t):
            if (measured := index.get((m, b, soc, tc))) is not None and psnr is not None:
                low = round(float(psnr), 3)
                have = measured["accuracy_min_psnr_db"]
                measured["accuracy_min_psnr_db"] = low if have is None else min(have, low)


def _twin_evidence(rows: Rows, placeholders: str, params: dict[str, Any],
                   index: dict[tuple[str, str, str, str], dict[str, Any]]) -> None:
    """The twin's evidence on each cell of a genai package (its artifact's ctx model is its
    genai_config.json): ``twin``, the greedy tokens its twin matched of those compared
    (``16/16``), or the twin's status when it gave no figure."""
    for m, b, t, tc, desc in rows.rows(
            "SELECT a.model_digest, a.backend, a.target, a.toolchain, a.description FROM artifacts a"
            f" WHERE a.model_digest IN ({placeholders}) AND a.status = 'active'"
            " AND a.ctx_model = 'genai_config.json'", params):
        tw = (as_json(desc) or {}).get("twin") if desc is not None else None
        cell = index.get((m, b, t, tc))
        if cell is None or not isinstance(tw, dict):
            continue
        cell["twin"] = (f"{tw.get('tokens_matched')}/{tw.get('tokens_compared')}" if tw.get("status") == "ok"
                        else str(tw.get("status"))[:40])


def _page_models(rows: Rows, found: list[tuple[str, str]], be: str | None, tg: str | None, toolchain: str | None,
                 newest: dict[str, str]) -> list[ModelCoverage]:
    from farm.core.times import iso

    digests = [d for d, _ in found]
    placeholders, params = in_params("d", digests)
    params["f_multi"] = "%+%"  # a parameter: the PostgreSQL drivers' pyformat takes a literal % as a placeholder
    cond = ""
    if be is not None:
        params.update(f_backend=be, f_target=tg)
        # Also the multi-SoC targets (they count in each SoC's cell); the rows fan out below.
        cond = " AND backend = :f_backend AND (target = :f_target OR target LIKE :f_multi)"
    cells: dict[str, list[dict[str, Any]]] = defaultdict(list)
    wanted: dict[str, set[tuple[str, str]]] = defaultdict(set)
    good: set[tuple[str, str, str, str]] = set()
    index: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for m, b, t, tc, state, builds, probe, device in rows.rows(
            "SELECT model_digest, backend, target, toolchain, state, builds, probe_verified, device_verified"
            f" FROM coverage_cells WHERE model_digest IN ({placeholders}){cond}", params):
        wanted[m].add((b, t))
        if state in ("built", "building"):
            good.add((m, b, t, tc))
        if toolchain is not None and tc != toolchain:
            continue
        cell = {"target": f"{b}:{t}", "toolchain": tc, "state": state, "builds": int(builds), "codes": [],
                "probe_verified": state == "built" and int(probe) > 0,
                "device_verified": state == "built" and int(device) > 0, "verdicts": [], "via": [],
                "partial_offload": False, "cpu_op_types": []}
        cells[m].append(cell)
        index[(m, b, t, tc)] = cell
    for m, b, t, tc, code in rows.rows(
            "SELECT DISTINCT model_digest, backend, target, toolchain, error_code FROM builds"
            f" WHERE model_digest IN ({placeholders}) AND state = 'failed' AND error_code IS NOT NULL{cond}",
            params):
        for soc in socs(b, t):
            failed_cell = index.get((m, b, soc, tc))
            if failed_cell is not None:
                failed_cell["codes"] = sorted({*failed_cell["codes"], code})
    # ``via``: the multi-SoC builds (published, not broken) a cell counts as built.
    for m, b, t, tc in rows.rows(
            "SELECT DISTINCT b.model_digest, b.backend, b.target, b.toolchain FROM builds b"
            " JOIN artifacts a ON a.build_id = b.id AND a.status = 'active'"
            f" WHERE b.model_digest IN ({placeholders}) AND b.state = 'succeeded' AND b.backend = 'qnn'"
            " AND b.target LIKE :f_multi", params):
        for soc in socs(b, t):
            if (covered_cell := index.get((m, b, soc, tc))) is not None:
                covered_cell["via"] = sorted({*covered_cell["via"], f"{b}:{t}"})
    verdicts: dict[tuple[str, str, str, str], dict[tuple[str, str], dict[str, Any]]] = defaultdict(dict)
    for m, b, t, tc, rb, rv, verdict, n, last in rows.rows(
            "SELECT a.model_digest, a.backend, a.target, a.toolchain, v.runtime_backend, v.runtime_version,"
            " v.verdict, count(*), max(v.recorded_at) FROM artifacts a JOIN compat_verdicts v ON v.artifact_id = a.id"
            f" WHERE a.model_digest IN ({placeholders}) AND v.source = 'probe' AND a.status = 'active'"
            + (" AND a.backend = :f_backend AND (a.target = :f_target OR a.target LIKE :f_multi)"
               if be is not None else "")
            + " GROUP BY a.model_digest, a.backend, a.target, a.toolchain, v.runtime_backend, v.runtime_version,"
              " v.verdict", params):
        for soc in socs(b, t):
            ev = verdicts[(m, b, soc, tc)].setdefault((rb, rv), {"runtime_backend": rb, "runtime": rv, "loads": 0,
                                                                  "fails": 0, "last_probed_at": None})
            ev["loads" if verdict == "loads" else "fails"] += int(n)
            when = iso(as_aware(last))
            if when and (ev["last_probed_at"] is None or when > ev["last_probed_at"]):
                ev["last_probed_at"] = when
    for key, evs in verdicts.items():
        probed = index.get(key)
        if probed is None:
            continue
        for ev in sorted(evs.values(), key=lambda e: (e["runtime_backend"], parse_version(e["runtime"]))):
            ev["verdict"] = "mixed" if ev["loads"] and ev["fails"] else ("loads" if ev["loads"] else "fails")
            probed["verdicts"].append(ev)
    _device_evidence(rows, placeholders, params, be is not None, index)
    # Partial offload: the page's active artifacts that leave nodes on the CPU.
    only = (" AND a.backend = :f_backend AND (a.target = :f_target OR a.target LIKE :f_multi)"
            if be is not None else "")
    for m, b, t, tc, ops in _partial(rows, None, digests, only, params):
        for soc in socs(b, t):
            if (marked := index.get((m, b, soc, tc))) is not None:
                marked["partial_offload"] = True
                marked["cpu_op_types"] = sorted({*marked["cpu_op_types"], *ops})
    for cell in index.values():
        cell["unverified"] = None
    for (m, b, soc, tc), why in unverifiable(rows.rows(
            "SELECT model_digest, backend, target, toolchain, ctx_model FROM artifacts"
            f" WHERE model_digest IN ({placeholders}) AND status = 'active' AND backend = 'qnn'", params)).items():
        if (unverified_cell := index.get((m, b, soc, tc))) is not None and unverified_cell["state"] == "built":
            unverified_cell["unverified"] = why
    _twin_evidence(rows, placeholders, params, index)
    tags = _tags(rows, digests)
    out = []
    for digest, name in found:
        missing = []
        for b, t in sorted(wanted[digest]):
            tc = toolchain or newest.get(b)
            if tc is not None and (digest, b, t, tc) not in good:
                have = index.get((digest, b, t, tc))
                missing.append({"target": f"{b}:{t}", "toolchain": tc,
                                "state": (f"failed({','.join(have['codes'])})" if have["state"] == "failed"
                                          and have["codes"] else have["state"]) if have else "missing"})
        out.append(ModelCoverage(digest, name, tags.get(digest, []),
                                 sorted(cells[digest], key=lambda c: (c["target"], parse_version(c["toolchain"]))),
                                 missing))
    return out


def as_aware(value: Any) -> Any:
    from registry.lite import as_datetime

    return as_datetime(value)


def _tags(rows: Rows, digests: list[str]) -> dict[str, list[str]]:
    placeholders, params = in_params("t", digests)
    out: dict[str, list[str]] = defaultdict(list)
    for d, n, t in rows.rows(f"SELECT model_digest, name, tag FROM tags WHERE model_digest IN ({placeholders})"
                             " ORDER BY name, tag", params):
        out[d].append(f"{n}:{t}")
    return out


def recomputed_matches(session: Any) -> list[str]:
    """Differences between the kept cells and summary and a recompute from the builds (empty when
    they agree): the check the tests run after every kind of change, and an ops self-test."""
    from registry.coverage_sql import CELL_COLUMNS, _contribution, cells_recompute

    rows = rows_of(session)
    key_cols = "model_digest, backend, target, toolchain"
    kept = {tuple(r[:4]): tuple(r[4:]) for r in rows.rows(
        f"SELECT {key_cols}, {', '.join(CELL_COLUMNS)} FROM coverage_cells")}
    fresh = {tuple(r[:4]): tuple(r[4:]) for r in rows.rows(cells_recompute(rows.dialect))}
    diffs = [f"cell {k}: kept {kept.get(k)} recomputed {fresh.get(k)}"
             for k in sorted(set(kept) | set(fresh)) if kept.get(k) != fresh.get(k)]
    tag_join = " JOIN tags t ON t.model_digest = c.model_digest AND t.tag = :tag"
    scopes: list[tuple[str, str, dict[str, Any]]] = [("", "", {})] + [
        (f"tag:{t}", tag_join, {"tag": t}) for (t,) in rows.rows("SELECT DISTINCT tag FROM tags")]
    kept_scopes = {r[0] for r in rows.rows("SELECT DISTINCT scope FROM coverage_deltas")}
    for scope, join, params in scopes:
        kept_scopes.discard(scope)
        p = {**params, "scope": scope}
        sums = {tuple(r[:3]): tuple(int(v) for v in r[3:]) for r in rows.rows(
            f"SELECT backend, target, toolchain, {', '.join(f'sum({c})' for c in COUNTERS[:-1])}"
            " FROM coverage_deltas WHERE scope = :scope AND toolchain <> '' GROUP BY backend, target, toolchain", p)}
        sums = {k: v for k, v in sums.items() if any(v)}
        # A model with two NAME:TAGs of one TAG counts once in that scope (DISTINCT digests).
        cells_of = (f"(SELECT DISTINCT c.* FROM coverage_cells c{join})" if join else "coverage_cells")
        expect = {tuple(r[:3]): tuple(int(v) for v in r[3:]) for r in rows.rows(
            f"SELECT c.backend, c.target, c.toolchain, {_contribution('c')} FROM {cells_of} c"
            " GROUP BY c.backend, c.target, c.toolchain", params)}
        diffs += [f"summary {scope or 'farm'} {k}: kept {sums.get(k)} recomputed {expect.get(k)}"
                  for k in sorted(set(sums) | set(expect)) if sums.get(k) != expect.get(k)]
        wanted = {tuple(r[:2]): int(r[2]) for r in rows.rows(
            "SELECT backend, target, sum(wanted) FROM coverage_deltas WHERE scope = :scope GROUP BY backend, target",
            p)}
        wanted = {k: v for k, v in wanted.items() if v}
        expect_w = {tuple(r[:2]): int(r[2]) for r in rows.rows(
            f"SELECT c.backend, c.target, count(DISTINCT c.model_digest) FROM coverage_cells c{join}"
            " GROUP BY c.backend, c.target", params)}
        diffs += [f"wanted {scope or 'farm'} {k}: kept {wanted.get(k)} recomputed {expect_w.get(k)}"
                  for k in sorted(set(wanted) | set(expect_w)) if wanted.get(k) != expect_w.get(k)]
    for scope in sorted(kept_scopes):
        left = rows.rows(f"SELECT {', '.join(f'sum({c})' for c in COUNTERS)} FROM coverage_deltas"
                         " WHERE scope = :scope", {"scope": scope})
        if any(int(v or 0) for v in left[0]):
            diffs.append(f"scope {scope}: counters left {left[0]} though no model has the tag")
    return diffs
