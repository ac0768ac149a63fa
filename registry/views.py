"""The documents read commands print, made in one place for both doors: ``farm ls --json``,
``farm show --json`` and ``farm workers --json`` read from this machine's index, and
``GET /v1/artifacts``, ``GET /v1/artifacts/ID`` and ``GET /v1/workers`` answer the same JSON
(schemas: farm/cli/schemas/ls.json, show.json, workers.json), so a command shows the same thing
whichever side answers it."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from farm.core.times import iso

LS_LIMIT_MAX = 100_000


def ls_row(a: Any, tags: list[str]) -> dict[str, Any]:
    """One artifact as `farm ls --json` writes it (schema: farm/cli/schemas/ls.json)."""
    return {"id": a.short_id, "artifact": a.digest, "model": a.model_digest, "tags": tags,
            "target": f"{a.backend}:{a.target}", "toolchain": a.toolchain,
            "options": non_default_options(a.backend, a.target, a.build.options if a.build else {}),
            "compile_seconds": float(a.compile_seconds), "size_bytes": int(a.size), "nodes_ep": a.nodes_ep,
            "nodes_cpu": a.nodes_cpu, "status": a.status, "created_at": iso(a.created_at)}


def ls_rows(session: Session, *, model: str | None = None, target: str | None = None,
            limit: int = 200) -> list[dict[str, Any]]:
    """`farm ls`: artifacts, newest first; ``model`` a NAME, NAME:TAG or digest, ``target`` a
    ``backend:name`` (checked against the catalog)."""
    from registry.index import list_artifacts, resolve_model_refs, tags_by_digest

    models = resolve_model_refs(session, model) if model else None
    backend, name = None, None
    if target:
        from farm.core.catalog import parse_target

        t = parse_target(target)
        backend, name = t.backend, t.name
    arts = list_artifacts(session, model_digest=models, backend=backend, target=name,
                          limit=max(1, min(int(limit), LS_LIMIT_MAX)))
    tags = tags_by_digest(session, sorted({a.model_digest for a in arts}))
    return [ls_row(a, tags[a.model_digest]) for a in arts]


def non_default_options(backend: str, target: str, options: dict[str, Any]) -> dict[str, Any]:
    """The build options that differ from what ``farm build`` uses when given none, sorted."""
    defaults = _defaults(backend, target)
    return {k: options[k] for k in sorted(options) if k not in defaults or defaults[k] != options[k]}


@functools.cache
def _defaults(backend: str, target: str) -> dict[str, Any]:
    from farm.core.catalog import load_catalog
    from farm.core.errors import FarmError
    from farm.core.options import normalize

    try:
        return normalize(backend, {}, load_catalog().get(target, backend=backend))
    except FarmError:  # a target since removed from the catalog: every option shows
        return {}


SHOW_CHOICES = 8  # artifacts a refusal of an ambiguous `farm show MODEL` lists


def show_artifact(session: Session, ref: str, target: str | None = None) -> Any:
    """The artifact `farm show REF` means: an artifact id (6+ hex digits) or manifest digest, as
    `farm ls` prints them; else a model reference (NAME:TAG, NAME, a model digest) like every other
    command takes, when it has exactly one active artifact (for ``target``, a ``backend:name``,
    when given). A model with several is refused (usage) with the ids to pick from."""
    from farm.core.errors import NotFoundError, UsageError
    from registry.index import find_artifact, list_artifacts, resolve_model_ref

    hexpart = ref.removeprefix("sha256:").lower()
    if target is None and len(hexpart) >= 6 and all(c in "0123456789abcdef" for c in hexpart):
        try:
            return find_artifact(session, ref)
        except NotFoundError:
            if len(hexpart) == 64 and ref.startswith("sha256:"):
                pass  # a full digest that is no artifact: perhaps a model's
    digest = resolve_model_ref(session, ref)
    backend, name = None, None
    if target:
        from farm.core.catalog import parse_target

        t = parse_target(target)
        backend, name = t.backend, t.name
    arts = [a for a in list_artifacts(session, model_digest=digest, backend=backend, target=name, limit=200)
            if a.status == "active"]
    where = f" for {target}" if target else ""
    if not arts:
        raise NotFoundError(f"{ref} has no artifact{where}",
                            hint=f"farm ls -m {ref} lists what there is; farm build builds one")
    if len(arts) > 1:
        listed = "; ".join(f"{a.short_id} {a.backend}:{a.target} {a.toolchain}" for a in arts[:SHOW_CHOICES])
        more = f" and {len(arts) - SHOW_CHOICES} more" if len(arts) > SHOW_CHOICES else ""
        raise UsageError(f"{ref} has {len(arts)} artifacts{where}; farm show shows one",
                         hint=f"pick one by id: {listed}{more} (farm show ID)"
                              + ("" if target else ", or narrow with --target"))
    return arts[0]


def artifact_document(session: Session, store: Any, ref: str, target: str | None = None) -> dict[str, Any]:
    """`farm show --json` of the artifact ``ref`` names (``show_artifact``: an id of 6+ hex
    digits, a manifest digest, or a model with one artifact for ``target``): its manifest read
    back from the store, build, probe verdicts and files."""
    from registry import manifest as mf
    from registry.index import tags_of, verdicts_of
    from registry.store.base import read_bytes

    a = show_artifact(session, ref, target)
    manifest = mf.decode(read_bytes(store, a.digest), a.digest)
    options = dict(a.build.options)
    verdicts = [{"runtime_backend": v.runtime_backend, "runtime": v.runtime_version, "verdict": v.verdict,
                 "source": v.source, "self_probe": v.source == "probe" and v.runtime_backend == a.backend
                 and v.runtime_version == a.toolchain,
                 "detail": v.detail, "recorded_at": iso(v.recorded_at)} for v in verdicts_of(session, a.id)]
    doc = {
        "artifact": a.digest, "id": a.short_id, "status": a.status, "model": a.model_digest,
        "tags": tags_of(session, a.model_digest), "target": f"{a.backend}:{a.target}", "toolchain": a.toolchain,
        "options": options, "non_default_options": non_default_options(a.backend, a.target, options),
        "compile_seconds": float(a.compile_seconds), "size_bytes": int(a.size), "nodes_ep": a.nodes_ep,
        "nodes_cpu": a.nodes_cpu, "ep_sdk_version": a.ep_sdk_version, "created_at": iso(a.created_at),
        "build": {"id": a.build.id, "key": a.build.build_key, "attempts": a.build.attempts,
                  "state": a.build.state},
        "verdicts": verdicts,
        "files": [{"name": f.name, "role": f.role, "digest": f.digest, "size": f.size,
                   "mediaType": f.media_type} for f in a.files],
        "manifest": manifest,
    }
    # How much the EP took, and the EP's own compatibility string: the index's columns, else (an
    # artifact published before migration 0012) what its manifest says.
    from registry.resolve import offload

    cpu_ops = a.cpu_op_types if a.cpu_op_types is not None else (manifest.get("placement") or {}).get("cpu_op_types")
    doc["offload"] = offload(a.nodes_ep, a.nodes_cpu, cpu_ops)
    doc["compatibility"] = dict(a.compatibility if a.compatibility is not None else manifest.get("compatibility") or {})
    if getattr(a, "description", None) is not None:  # the context binaries' own description (QNN System API)
        doc["description"] = a.description
    # Evidence beyond "it loads" (docs/evidence.md): accuracy against the CPU reference, device reports.
    from registry.evidence import of_artifacts
    from registry.reports import summary

    doc["accuracy"] = of_artifacts(session, [a.id]).get(a.id, [])
    doc["devices"] = summary(session, [a.id]).get(a.id, [])
    doc["device_lab"] = device_lab(session, a)
    return doc


def device_lab(session: Session, a: Any) -> list[dict[str, Any]]:
    """Per SoC the artifact serves: what enrolled devices of the device lab confirmed of it
    (``registry.lab.LabCell``: devices, medians, simulator reports apart), whether its SDK is
    ``SLOWER`` than another's on that SoC (``slower``), and the speed of every SDK of the model
    there (``sdks``: toolchain, devices, median p50, oldest first). SoCs with nothing measured
    are left out."""
    from farm.core.keys import parse_version
    from registry.lab import LabCell, of_models
    from registry.lab import of_artifacts as lab_of
    from registry.lite import SessionRows

    rows = SessionRows(session)
    mine = {c.soc: c for c in lab_of(rows, {a.id: a.target}).get(a.id, [])}
    cells = of_models(rows, [a.model_digest], a.backend) if a.backend == "qnn" else {}
    out = []
    for soc in a.target.split("+"):
        here = sorted(((key[3], c) for key, c in cells.items() if key[2] == soc and c.devices),
                      key=lambda tc_c: parse_version(tc_c[0]))
        sdks = [{"toolchain": tc, "devices": c.devices, "p50_ms": c.p50_ms, "slower": c.slower} for tc, c in here]
        if soc not in mine and not sdks:
            continue
        entry = (mine.get(soc) or LabCell(soc)).to_dict()
        entry["slower"] = next((x["slower"] for x in sdks if x["toolchain"] == a.toolchain), None)
        entry["sdks"] = sdks
        out.append(entry)
    return out


def _capabilities(extra: Any) -> dict[str, Any]:
    """What a worker announced it makes besides context binaries (``farm.core.capabilities``)."""
    from farm.core.capabilities import Capabilities

    caps = Capabilities.from_extra(extra)
    if caps is None:
        return {"makes": None, "lacks": {}}
    return {"makes": sorted(caps.makes), "lacks": dict(sorted(caps.lacks.items()))}


def worker_rows(session: Session, *, stale_after: float, include_all: bool = False) -> list[dict[str, Any]]:
    """`farm workers --json` (schema: farm/cli/schemas/workers.json): the live workers, with
    ``include_all`` also the stopped and dead ones (the 200 seen last)."""
    from registry.index import all_workers, live_workers

    now = datetime.now(UTC)
    rows = []
    found = all_workers(session) if include_all else live_workers(session, stale_after=stale_after)
    for w in found:
        seen = w.last_seen if w.last_seen.tzinfo else w.last_seen.replace(tzinfo=UTC)
        age = (now - seen).total_seconds()
        state = "stopped" if w.stopped_at else ("live" if age <= stale_after else "dead")
        if state != "live" and not include_all:
            continue
        rows.append({"worker": w.name, "state": state, "backend": w.backend, "toolchain": w.toolchain,
                     "onnxruntime": w.ort_version, "ep_package": w.ep_package, "ep_version": w.ep_version,
                     "host": w.host, "pid": int(w.pid), "jobs": int(w.jobs_done),
                     "started_at": iso(w.started_at), "last_seen": iso(w.last_seen),
                     "last_seen_seconds": round(age, 3), "stopped_at": iso(w.stopped_at),
                     "queues": list(w.queues), **_capabilities(w.extra)})
    return rows
