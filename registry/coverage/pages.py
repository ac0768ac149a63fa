"""The drill-down (``models_page``): models paged by (first name, digest) with a keyset cursor,
each with its cells read from ``coverage_cells`` (kept by the triggers of migration 0008) and
their evidence: `farm coverage --missing`, GET /v1/coverage/models and the /coverage page."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from farm.core.keys import parse_version
from registry.coverage.cells import as_aware, partial_offloads, socs, tags_of, unverifiable
from registry.coverage.llm import PART_DIGESTS, twins
from registry.coverage.summary import Scope, scope_conditions
from registry.lite import Rows, in_params, rows_of

CELL_STATES = ("built", "building", "broken", "failed", "missing")
PAGE_MAX = 200


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
    cell_cond = scope_conditions(sc, "c", params)
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
    # An LLM's parts are counted under their package (registry.coverage.llm), not as models.
    found = rows.rows(f"SELECT m.digest, m.first_name FROM models m WHERE {exists}{after}"
                      f" AND m.digest NOT IN ({PART_DIGESTS}) ORDER BY m.first_name, m.digest LIMIT :limit", params)
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
    from registry.lab import of_models as lab_cells

    for cell in index.values():
        cell["device_lab"] = None
    for (m, b, soc, tc), lab in lab_cells(rows, digests, be).items():
        if (lab_cell := index.get((m, b, soc, tc))) is not None:
            lab_cell["device_lab"] = lab.to_dict()
    # Partial offload: the page's active artifacts that leave nodes on the CPU.
    only = (" AND a.backend = :f_backend AND (a.target = :f_target OR a.target LIKE :f_multi)"
            if be is not None else "")
    for m, b, t, tc, ops in partial_offloads(rows, None, digests, only, params):
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
    for key, label in twins(rows, digests).items():  # a genai package's cells: its twin's figure
        if (package_cell := index.get(key)) is not None:
            package_cell["twin"] = label
    tags = tags_of(rows, digests)
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
