"""``farm promote --require EXPR``: what evidence a promotion needs, and the check against it.

EXPR is clauses joined by commas: ``devices>=N per soc`` (distinct devices on each SoC of the
model's targets), ``devices>=N`` (distinct devices in all), ``psnr>=DB`` and ``p50_ms<=MS`` (what a
device's report must show to count). Anything else is a usage error naming the clause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from farm.core.errors import UsageError

_CLAUSE = re.compile(r"^\s*(devices)\s*>=\s*(\d+)\s*(per\s+soc)?\s*$|^\s*(psnr)\s*>=\s*(\d+(?:\.\d+)?)\s*$|"
                     r"^\s*(p50_ms)\s*<=\s*(\d+(?:\.\d+)?)\s*$")
MAX_DEVICES = 1000


@dataclass(frozen=True)
class Requirement:
    per_soc: int = 0  # devices>=N per soc
    total: int = 0  # devices>=N
    min_psnr: float | None = None
    max_p50_ms: float | None = None

    @property
    def slots(self) -> int:
        """How many devices each SoC is asked for (jobs per SoC)."""
        return max(self.per_soc, 1)

    def counts(self, report: dict[str, Any], allow_simulator: bool) -> str | None:
        """None when this report counts as evidence; else why not."""
        if report.get("struck"):
            return f"struck: {report['struck']}"
        if report["simulator"] and not allow_simulator:
            return "simulator (needs --allow-simulator)"
        if report["outcome"] != "ok":
            return f"outcome {report['outcome']}"
        if self.min_psnr is not None and (report.get("psnr_db") is None or report["psnr_db"] < self.min_psnr):
            return f"psnr {report.get('psnr_db')} < {self.min_psnr:g}"
        if self.max_p50_ms is not None and (report.get("p50_ms") is None or report["p50_ms"] > self.max_p50_ms):
            return f"p50_ms {report.get('p50_ms')} > {self.max_p50_ms:g}"
        return None

    def account(self, evidence: dict[str, list[dict[str, Any]]], allow_simulator: bool) -> dict[str, Any]:
        """Per SoC: devices that count, what is missing; ``met`` overall."""
        socs: dict[str, Any] = {}
        everyone: set[str] = set()
        for soc, reports in sorted(evidence.items()):
            good = sorted({r["device"] for r in reports if self.counts(r, allow_simulator) is None})
            refused = [{"device": r["device"], "why": why} for r in reports
                       if (why := self.counts(r, allow_simulator)) is not None]
            everyone |= set(good)
            missing = max(self.per_soc - len(good), 0)
            socs[soc] = {"devices": good, "not_counted": refused, "missing": missing,
                         "met": missing == 0 and (self.per_soc > 0 or bool(good) or self.total > 0)}
        total_missing = max(self.total - len(everyone), 0)
        met = bool(socs) and all(c["missing"] == 0 for c in socs.values()) and total_missing == 0
        if self.per_soc == 0 and self.total == 0:  # only thresholds: every SoC needs one device that meets them
            for c in socs.values():
                c["missing"] = 0 if c["devices"] else 1
            met = bool(socs) and all(c["devices"] for c in socs.values())
        return {"met": met, "socs": socs, "devices": len(everyone), "missing_total": total_missing}


def parse(expr: str) -> Requirement:
    """EXPR -> Requirement; ``usage`` naming the first clause that is not one of the four forms."""
    per_soc = total = 0
    psnr: float | None = None
    p50: float | None = None
    clauses = [c for c in str(expr).split(",")]
    if not expr or not any(c.strip() for c in clauses):
        raise UsageError("--require is empty", hint="e.g. --require 'devices>=2 per soc,psnr>=30,p50_ms<=20'")
    for clause in clauses:
        m = _CLAUSE.match(clause.lower())
        if m is None:
            raise UsageError(f"--require: {clause.strip()[:80]!r} is not a clause",
                             hint="clauses: devices>=N per soc, devices>=N, psnr>=DB, p50_ms<=MS (joined by commas)")
        if m.group(1):
            n = int(m.group(2))
            if not 1 <= n <= MAX_DEVICES:
                raise UsageError(f"--require: {clause.strip()!r}: N from 1 to {MAX_DEVICES}")
            if m.group(3):
                per_soc = n
            else:
                total = n
        elif m.group(4):
            psnr = float(m.group(5))
        else:
            p50 = float(m.group(7))
    return Requirement(per_soc, total, psnr, p50)
