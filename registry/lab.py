"""What the device lab's enrolled devices confirmed, shown where people look: resolve's answer,
`farm show`, coverage (docs/device-lab.md).

Per artifact and SoC: how many enrolled devices of that SoC ran it with outcome ``ok``, and the
median of their figures (p50 latency, PSNR against the CPU reference, load time). Only the
enrollment record says what a device is (its SoC, whether it is a simulator): never the report's
own claims. A simulator agent's report is never device evidence: it is counted apart
(``simulator_reports``) and its timings are never read. A struck report (its device revoked) is
not counted. Anonymous `farm install --report` reports are another table
(``device_reports``, ``registry.reports``) and never mix with these.

Speed per SDK: per model x SoC, each toolchain's median p50 (over its cells' reports) against
the fastest toolchain's; ``SLOWER`` times it or more is flagged (``slower: 1.6x vs QNN 2.49.40``).

Every read here is one statement by the index on ``device_verifications.artifact_id`` (a lab
reports on few artifacts: the rows read are the reports themselves).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from registry.lite import Rows, in_params

SLOWER = 1.2  # an SDK this many times slower than another's artifact on the same SoC is flagged
FIGURES = ("p50_ms", "psnr_db", "load_ms")
RUNTIME_NAMES = {"qnn": "QNN", "trt": "TensorRT"}


def median(values: Iterable[float | None]) -> float | None:
    """The median of the finite values (None for none): the middle one, or the mean of the two."""
    xs = sorted(float(v) for v in values if v is not None and math.isfinite(float(v)))
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def slower(medians: dict[str, float | None], *, threshold: float = SLOWER) -> dict[str, dict[str, Any]]:
    """Toolchain -> ``{"ratio": 1.6, "vs": "2.49.40"}`` for each toolchain whose median is at least
    ``threshold`` times the fastest one's (ratio rounded to 0.01); toolchains without a median
    take no part. Ties for the fastest: the lowest version string wins (a stable answer)."""
    from farm.core.keys import parse_version

    known = {tc: m for tc, m in medians.items() if m is not None and m > 0}
    if len(known) < 2:
        return {}
    fastest = min(known, key=lambda tc: (known[tc], parse_version(tc)))
    out = {}
    for tc, m in known.items():
        ratio = m / known[fastest]
        if tc != fastest and ratio >= threshold:
            out[tc] = {"ratio": round(ratio, 2), "vs": fastest, "vs_p50_ms": known[fastest]}
    return out


def slower_text(flag: dict[str, Any] | None, backend: str = "qnn") -> str:
    """``slower: 1.6x vs QNN 2.49.40`` (empty without a flag)."""
    if not flag:
        return ""
    return f"slower: {flag['ratio']:g}x vs {RUNTIME_NAMES.get(backend, backend)} {flag['vs']}"


@dataclass
class LabCell:
    """Enrolled devices' verdicts on one artifact (or one coverage cell) on one SoC."""

    soc: str
    devices: int = 0  # distinct enrolled (not simulator, not revoked) devices of the SoC: outcome ok
    failed: int = 0  # distinct enrolled devices of the SoC whose report was fails or crashed
    simulator_reports: int = 0  # live reports of simulator agents: shown apart, never device evidence
    p50_ms: float | None = None  # medians over the ok reports of enrolled devices
    psnr_db: float | None = None
    load_ms: float | None = None
    slower: dict[str, Any] | None = None  # speed per SDK: {"ratio", "vs", "vs_p50_ms"} or None
    _ok: dict[str, list[float | None]] = field(default_factory=lambda: {k: [] for k in FIGURES}, repr=False)
    _ok_devices: set[int] = field(default_factory=set, repr=False)
    _failed_devices: set[int] = field(default_factory=set, repr=False)

    def add(self, device_id: int, simulator: bool, outcome: str, figures: Sequence[float | None]) -> None:
        if simulator:
            self.simulator_reports += 1
            return
        if outcome == "ok":
            self._ok_devices.add(device_id)
            for key, value in zip(FIGURES, figures, strict=True):
                self._ok[key].append(value)
        else:
            self._failed_devices.add(device_id)
        self.devices, self.failed = len(self._ok_devices), len(self._failed_devices)
        self.p50_ms, self.psnr_db, self.load_ms = (_round(median(self._ok[k])) for k in FIGURES)

    @property
    def confirmed(self) -> bool:
        """Enrolled devices of the SoC ran it, and none failed it."""
        return self.devices > 0 and self.failed == 0

    def to_dict(self) -> dict[str, Any]:
        return {"soc": self.soc, "devices": self.devices, "failed": self.failed, "p50_ms": self.p50_ms,
                "psnr_db": self.psnr_db, "load_ms": self.load_ms, "simulator_reports": self.simulator_reports,
                **({"slower": self.slower} if self.slower else {})}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


# The live (not struck) reports, with what the enrollment record says of their device. A
# device's own SoC must be the job's (``registry.verification.accept`` refuses any other; read
# again here: only the enrollment record counts). Revoked devices' reports are struck with them.
_LIVE = ("SELECT v.artifact_id, d.soc, d.simulator, v.soc, v.outcome, v.device_id, v.p50_ms, v.psnr_db, v.load_ms"
         " FROM device_verifications v JOIN devices d ON d.id = v.device_id"
         " WHERE v.struck_at IS NULL AND d.revoked_at IS NULL AND d.enrolled_at IS NOT NULL")


def _fold(found: Iterable[Sequence[Any]], targets: dict[int, str]) -> dict[tuple[int, str], LabCell]:
    """(artifact id, SoC) -> its LabCell. A simulator's report counts (apart) on the job's SoC; an
    enrolled device's only on its own SoC, and only where the artifact's target covers it."""
    out: dict[tuple[int, str], LabCell] = {}
    for art_id, dev_soc, simulator, job_soc, outcome, device_id, *figures in found:
        sim = bool(simulator) or dev_soc == "simulator"
        soc = job_soc if sim else dev_soc
        if not soc or (not sim and job_soc != dev_soc) or soc not in str(targets.get(art_id, "")).split("+"):
            continue
        out.setdefault((art_id, soc), LabCell(soc)).add(int(device_id), sim, str(outcome), figures)
    return out


def of_artifacts(rows: Rows, artifacts: dict[int, str]) -> dict[int, list[LabCell]]:
    """Artifact id -> its LabCells by SoC name (artifacts without reports are left out).
    ``artifacts``: id -> target (``SM8650`` or a multi-SoC ``SM8650+SM8750``)."""
    if not artifacts:
        return {}
    placeholders, params = in_params("a", sorted(artifacts))
    found = rows.rows(f"{_LIVE} AND v.artifact_id IN ({placeholders}) ORDER BY v.id", params)
    out: dict[int, list[LabCell]] = defaultdict(list)
    for (art_id, _soc), cell in sorted(_fold(found, artifacts).items()):
        out[art_id].append(cell)
    return dict(out)


def of_models(rows: Rows, digests: list[str] | None = None, backend: str | None = None
              ) -> dict[tuple[str, str, str, str], LabCell]:
    """Coverage's view: (model digest, backend, SoC, toolchain) -> the LabCell over the cell's
    active artifacts, each flagged when its toolchain is ``SLOWER`` than another's on the same
    model x SoC. ``digests``: only these models (None: every model with reports)."""
    sql = ("SELECT v.artifact_id, d.soc, d.simulator, v.soc, v.outcome, v.device_id, v.p50_ms, v.psnr_db, v.load_ms,"
           " a.model_digest, a.backend, a.target, a.toolchain"
           " FROM device_verifications v JOIN devices d ON d.id = v.device_id JOIN artifacts a ON a.id = v.artifact_id"
           " WHERE v.struck_at IS NULL AND d.revoked_at IS NULL AND d.enrolled_at IS NOT NULL"
           " AND a.status = :active")
    params: dict[str, Any] = {"active": "active"}
    if backend is not None:
        sql += " AND a.backend = :backend"
        params["backend"] = backend
    if digests is not None:
        if not digests:
            return {}
        placeholders, more = in_params("m", digests)
        sql += f" AND a.model_digest IN ({placeholders})"
        params.update(more)
    found = rows.rows(sql + " ORDER BY v.id", params)
    keys = {r[0]: (r[9], r[10], r[12]) for r in found}
    targets = {r[0]: r[11] for r in found}
    cells: dict[tuple[str, str, str, str], LabCell] = {}
    for (art_id, soc), per_artifact in _fold((r[:9] for r in found), targets).items():
        model, be, tc = keys[art_id]
        cell = cells.setdefault((model, be, soc, tc), LabCell(soc))
        _merge(cell, per_artifact)
    flag_slower(cells)
    return cells


def _merge(into: LabCell, other: LabCell) -> None:
    into.simulator_reports += other.simulator_reports
    into._ok_devices |= other._ok_devices
    into._failed_devices |= other._failed_devices
    for k in FIGURES:
        into._ok[k].extend(other._ok[k])
    into.devices, into.failed = len(into._ok_devices), len(into._failed_devices)
    into.p50_ms, into.psnr_db, into.load_ms = (_round(median(into._ok[k])) for k in FIGURES)


def flag_slower(cells: dict[tuple[str, str, str, str], LabCell]) -> None:
    """Set ``slower`` on each cell whose toolchain's median p50 is ``SLOWER`` than another
    toolchain's of the same (model, backend, SoC)."""
    groups: dict[tuple[str, str, str], dict[str, LabCell]] = defaultdict(dict)
    for (model, be, soc, tc), cell in cells.items():
        groups[(model, be, soc)][tc] = cell
    for by_tc in groups.values():
        flags = slower({tc: c.p50_ms for tc, c in by_tc.items() if c.devices})
        for tc, cell in by_tc.items():
            cell.slower = flags.get(tc)


def sdk_speeds(rows: Rows, model_digest: str, backend: str, soc: str) -> list[dict[str, Any]]:
    """`farm show`'s speed per SDK for one model x SoC: each toolchain with enrolled-device
    timings, oldest first: ``{"toolchain", "devices", "p50_ms", "slower"}``."""
    from farm.core.keys import parse_version

    cells = {k: c for k, c in of_models(rows, [model_digest], backend).items() if k[2] == soc and c.devices}
    return [{"toolchain": tc, "devices": c.devices, "p50_ms": c.p50_ms, "slower": c.slower}
            for (_m, _b, _s, tc), c in sorted(cells.items(), key=lambda kv: parse_version(kv[0][3]))]


def cell_label(lab: Any) -> str:
    """A coverage cell's device lab figures as the table and the page show them:
    ``lab×2 p50 48 ms slower: 1.6x vs QNN 2.49.40`` (``+1 sim`` for simulator reports, never
    counted); empty without any. ``lab`` may come from a service: every field is checked."""
    from farm.core.untrusted import clean_text

    if not isinstance(lab, dict):
        return ""

    def count(key: str) -> int:
        v = lab.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0

    parts = []
    if count("devices"):
        parts.append(f"lab\u00d7{count('devices')}")
        p50 = lab.get("p50_ms")
        if isinstance(p50, int | float) and not isinstance(p50, bool) and math.isfinite(p50):
            parts.append(f"p50 {p50:g} ms")
    if count("failed"):
        parts.append(f"lab failed\u00d7{count('failed')}")
    flag = lab.get("slower")
    if isinstance(flag, dict) and isinstance(flag.get("ratio"), int | float) and not isinstance(flag["ratio"], bool):
        parts.append(f"slower: {float(flag['ratio']):g}x vs QNN {clean_text(flag.get('vs'), 64)}")
    if count("simulator_reports"):
        parts.append(f"+{count('simulator_reports')} sim")
    return " ".join(parts)
