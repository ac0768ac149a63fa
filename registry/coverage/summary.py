"""The summary (``summary``): SoC x SDK counts for the farm, a tag or a name prefix, read from
the tables the triggers of migration 0008 keep (``registry.coverage_sql``): it sums
``coverage_deltas`` (a few rows per target x toolchain once folded) or, for a subset of models,
aggregates their ``coverage_cells`` rows; milliseconds at a million artifacts. Also the scope
filters every read takes, the fold and rebuild of those tables, and their self-check."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from farm.core.keys import parse_version
from registry.coverage.llm import PART_DIGESTS
from registry.coverage_sql import COUNTERS
from registry.lite import Rows, in_params, rows_of

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


def scope_conditions(sc: Scope, alias: str, params: dict[str, Any]) -> str:
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
        # The counters count every model digest; an LLM's parts count under their package, not
        # as models: their cells' share is taken off (a few rows: genai_parts is small).
        parts = _cells_rows(rows, sc, f" AND c.model_digest IN ({PART_DIGESTS})")
        found = [*found, *((be, tg, tc, *(-int(v or 0) for v in values)) for be, tg, tc, *values in parts)]
        source = "counters"
    else:
        found = _cells_rows(rows, sc, f" AND c.model_digest NOT IN ({PART_DIGESTS})")
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
    cells = {k: r for k, r in cells.items() if r.cells > 0}
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


def _cells_rows(rows: Rows, sc: Scope, extra: str) -> list[Any]:
    """The scope's cells (and ``extra``'s condition on ``c``) aggregated as the counters are:
    (backend, target, toolchain, counters..., 0) per SDK, then (backend, target, "", 0...,
    models) per SoC."""
    from registry.coverage_sql import _contribution

    params: dict[str, Any] = {}
    cond = scope_conditions(sc, "c", params) + extra
    found: list[Any] = [(*r, 0) for r in rows.rows(
        f"SELECT c.backend, c.target, c.toolchain, {_contribution('c')} FROM coverage_cells c"
        f" WHERE 1 = 1{cond} GROUP BY c.backend, c.target, c.toolchain", params)]
    zeros = [0] * (len(COUNTERS) - 1)
    found += [(be, tg, "", *zeros, n) for be, tg, n in rows.rows(
        f"SELECT c.backend, c.target, count(DISTINCT c.model_digest) FROM coverage_cells c"
        f" WHERE 1 = 1{cond} GROUP BY c.backend, c.target", params)]
    return found


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
