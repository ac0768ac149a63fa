"""``farm promote``: move NAME:TO to what NAME:FROM points at, on device evidence, and gate it.

For each SoC of the model's QNN artifacts (one SoC per artifact: the newest active one), the
verification jobs the requirement needs are made (``registry.verification.ensure_jobs``); the
live reports are counted against the requirement (``farm.core.requirements``). Met: the tag
moves, a ``promotions`` row records who, when and the evidence, and the tag is gated (plain
``farm tag --force`` refuses it until ``farm tag --ungate``). Not met: ``promotion-unmet`` with the
per-SoC account, nothing moved.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from farm.core.errors import NotFoundError, PromotionUnmetError
from farm.core.requirements import Requirement, parse
from registry.models import Artifact, Promotion, Tag, TagGate


def targets_of(session: Session, digest: str, prefer_fastest: bool = False) -> dict[str, int]:
    """SoC -> the artifact the agents will verify there: for each SoC the model has a published
    single-SoC QNN artifact for, what resolve serves a device of that SoC running the newest QNN
    SDK the model was built with for it (an agent installs through resolve, and leaves a job whose
    artifact resolve does not answer it: ``prefer_fastest`` is the service's
    FARM_RESOLVE_PREFER_FASTEST, so the jobs are on what it answers)."""
    from farm.core.catalog import load_catalog
    from farm.core.errors import FarmError
    from farm.core.keys import parse_version
    from registry.resolve import Device, resolve

    rows = session.execute(select(Artifact.target, Artifact.toolchain).where(
        Artifact.model_digest == digest, Artifact.backend == "qnn", Artifact.status == "active")).all()
    newest: dict[str, str] = {}
    for target, toolchain in rows:
        if "+" not in target and (target not in newest or parse_version(toolchain) > parse_version(newest[target])):
            newest[target] = toolchain
    out = {}
    for soc, toolchain in sorted(newest.items()):
        try:
            chosen, _verdict = resolve(session, digest, Device("qnn", load_catalog().get(soc, backend="qnn"), toolchain),
                                       prefer_fastest=prefer_fastest)
        except FarmError:  # nothing servable there (quarantined by device reports): nothing to verify
            continue
        out[soc] = chosen.id
    return out


def evaluate(session: Session, name: str, source: str, req: Requirement, allow_simulator: bool,
             prefer_fastest: bool = False) -> dict[str, Any]:
    """Make the jobs the requirement needs and count the evidence (commits nothing itself)."""
    from registry.index import resolve_model_ref
    from registry.verification import ensure_jobs, evidence, open_jobs

    digest = resolve_model_ref(session, f"{name}:{source}")
    socs = targets_of(session, digest, prefer_fastest)
    if not socs:
        raise PromotionUnmetError(f"{name}:{source} ({digest[:19]}) has no published single-SoC QNN artifact to verify",
                                  hint="build it for device targets first (farm build -t qnn:SM8650)")
    slots = max(req.slots, math.ceil(req.total / len(socs)) if req.total else 0)
    made = sum(ensure_jobs(session, art_id, soc, slots) for soc, art_id in socs.items())
    account = req.account(evidence(session, socs), allow_simulator)
    pending = open_jobs(session, socs)
    for soc, cell in account["socs"].items():
        cell["jobs_open"] = pending.get(soc, 0)
        cell["target"] = soc
    return {"digest": digest, "jobs_made": made, **account}


def promote(session: Session, name: str, source: str, to: str, expr: str, *, allow_simulator: bool = False,
            by: str | None = None, prefer_fastest: bool = False) -> dict[str, Any]:
    """Move NAME:TO on evidence. Not met: nothing moves and ``met`` is False (the jobs it made are
    kept: the caller commits, then raises ``unmet(...)`` to the user)."""
    from registry.index import set_tag

    req = parse(expr)
    account = evaluate(session, name, source, req, allow_simulator, prefer_fastest)
    if not account["met"]:
        return {"ref": f"{name}:{to}", "digest": account["digest"], "moved": False, "met": False,
                "require": expr, "account": account}
    move = set_tag(session, name, to, account["digest"], force=True, promoting=True)
    row = Promotion(name=name, tag=to, kind="promote", source=source, model_digest=account["digest"],
                    previous_digest=move.previous, require=expr[:500], allow_simulator=allow_simulator,
                    evidence=account, by=by)
    session.add(row)
    session.flush()
    _gate(session, name, to, row.id)
    return {"ref": f"{name}:{to}", "digest": account["digest"], "previous": move.previous, "moved": move.moved,
            "met": True, "require": expr, "changed": move.changed, "promotion": row.id,
            "allow_simulator": allow_simulator, "account": account}


def rollback(session: Session, name: str, tag: str, *, by: str | None = None) -> dict[str, Any]:
    """Point NAME:TAG back where it was before its newest promotion (recorded, still gated)."""
    from registry.index import set_tag

    last = session.scalar(select(Promotion).where(Promotion.name == name, Promotion.tag == tag,
                                                  Promotion.kind == "promote").order_by(Promotion.id.desc()).limit(1))
    if last is None or last.previous_digest is None:
        raise NotFoundError(f"{name}:{tag} has no promotion to roll back (or it had no earlier model)",
                            hint=f"farm tag --history {name}:{tag} shows its changes")
    current = session.scalar(select(Tag.model_digest).where(Tag.name == name, Tag.tag == tag))
    move = set_tag(session, name, tag, last.previous_digest, force=True, promoting=True)
    row = Promotion(name=name, tag=tag, kind="rollback", source=None, model_digest=last.previous_digest,
                    previous_digest=current, require=None, evidence={"rolled_back": last.id}, by=by)
    session.add(row)
    session.flush()
    _gate(session, name, tag, row.id)
    return {"ref": f"{name}:{tag}", "digest": last.previous_digest, "previous": current, "moved": move.moved,
            "changed": move.changed, "promotion": row.id, "rolled_back": last.id}


def ungate(session: Session, name: str, tag: str, *, by: str | None = None) -> bool:
    """Let plain ``farm tag`` move NAME:TAG again (recorded in its promotions' history, ``kind``
    ungate); False when it was not gated."""
    lifted = session.execute(delete(TagGate).where(TagGate.name == name, TagGate.tag == tag)).rowcount  # type: ignore[attr-defined]
    current = session.scalar(select(Tag.model_digest).where(Tag.name == name, Tag.tag == tag))
    if lifted and current is not None:
        session.add(Promotion(name=name, tag=tag, kind="ungate", model_digest=current, previous_digest=current,
                              evidence={}, by=by))
        session.flush()
    return bool(lifted)


def _gate(session: Session, name: str, tag: str, promotion_id: int) -> None:
    row = session.scalar(select(TagGate).where(TagGate.name == name, TagGate.tag == tag))
    if row is None:
        session.add(TagGate(name=name, tag=tag, promotion_id=promotion_id))
    else:
        row.promotion_id = promotion_id
    session.flush()


def history(session: Session, name: str, tag: str) -> list[dict[str, Any]]:
    """The promotions and rollbacks of NAME:TAG, oldest first (who, when, which evidence)."""
    from farm.core.times import iso

    out = []
    for p in session.scalars(select(Promotion).where(Promotion.name == name, Promotion.tag == tag).order_by(Promotion.id)):
        ev = p.evidence or {}
        out.append({"id": p.id, "kind": p.kind, "at": iso(p.at), "by": p.by, "from": p.source, "digest": p.model_digest,
                    "previous": p.previous_digest, "require": p.require, "allow_simulator": p.allow_simulator,
                    "devices": {soc: c.get("devices", []) for soc, c in (ev.get("socs") or {}).items()}})
    return out


def unmet(out: dict[str, Any], source: str) -> PromotionUnmetError:
    """The user's error for a promotion that did not move (``promote``'s answer, ``met`` False)."""
    return PromotionUnmetError(f"{out['ref']} not moved to {source}: the evidence does not meet "
                               f"{out['require']!r}: {missing_text(out['account'])}", details={"account": out["account"]})


def missing_text(account: dict[str, Any]) -> str:
    parts = []
    for soc, cell in account["socs"].items():
        why = "; ".join(f"{r['device']}: {r['why']}" for r in cell["not_counted"][:3])
        parts.append(f"{soc}: {len(cell['devices'])} device(s) count, {cell['missing']} missing, "
                     f"{cell.get('jobs_open', 0)} job(s) open" + (f" (not counted: {why})" if why else ""))
    if account.get("missing_total"):
        parts.append(f"{account['missing_total']} more device(s) in all")
    return "; ".join(parts)


# ---- jobs to time every SDK (farm device verify) ---------------------------------------------------

MAX_DEVICES = 16  # jobs per (SoC, SDK) one request may ask for


def sdk_jobs(session: Any, ref: str, devices: int, *, prefer_fastest: bool = False) -> list[dict[str, Any]]:
    """Verification jobs so the lab can time every SDK of a model (`farm device verify`): for each
    SoC the model has single-SoC QNN artifacts for, and each SDK version it was built with there,
    ``devices`` jobs (``registry.verification.ensure_jobs``: done by distinct devices) on the
    artifact resolve answers a device of that SoC running that SDK (an agent installs through
    resolve; ``prefer_fastest``: the service's FARM_RESOLVE_PREFER_FASTEST). Two SDKs answered
    the same artifact share its jobs. Commits nothing. Returns per (SoC, SDK): the artifact, jobs
    made, jobs not done yet."""
    from sqlalchemy import func, select

    from farm.core.catalog import load_catalog
    from farm.core.errors import FarmError, UsageError
    from farm.core.keys import parse_version
    from registry.index import resolve_model_ref
    from registry.models import Artifact, VerificationJob
    from registry.resolve import Device, resolve
    from registry.verification import ensure_jobs

    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= MAX_DEVICES:
        raise UsageError(f"devices: a whole number from 1 to {MAX_DEVICES}", hint="e.g. --devices 2")
    digest = resolve_model_ref(session, ref)
    pairs = sorted({(t, tc) for t, tc in session.execute(select(Artifact.target, Artifact.toolchain).where(
        Artifact.model_digest == digest, Artifact.backend == "qnn", Artifact.status == "active")) if "+" not in t},
        key=lambda p: (p[0], parse_version(p[1])))
    out = []
    done: set[tuple[str, int]] = set()
    for soc, toolchain in pairs:
        try:
            chosen, _ = resolve(session, digest, Device("qnn", load_catalog().get(soc, backend="qnn"), toolchain),
                                prefer_fastest=prefer_fastest)
        except FarmError:  # nothing served there (quarantined by device reports): nothing to time
            continue
        made = 0 if (soc, chosen.id) in done else ensure_jobs(session, chosen.id, soc, devices)
        done.add((soc, chosen.id))
        open_ = session.scalar(select(func.count()).select_from(VerificationJob).where(
            VerificationJob.artifact_id == chosen.id, VerificationJob.soc == soc, VerificationJob.state != "done"))
        out.append({"soc": soc, "toolchain": toolchain, "artifact": chosen.digest,
                    "artifact_toolchain": chosen.toolchain, "jobs_made": made, "jobs_open": int(open_ or 0)})
    if not out:
        from farm.core.errors import NotFoundError

        raise NotFoundError(f"{ref} has no published single-SoC QNN artifact to time on devices",
                            hint="build it for device targets first (farm build -t qnn:SM8650)")
    return out
