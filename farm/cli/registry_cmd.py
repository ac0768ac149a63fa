"""Registry commands: farm ls | show | db upgrade."""

from __future__ import annotations

import argparse
import functools
import io
import json
from typing import Any

from farm.cli import human_size, table
from farm.core.settings import Settings
from farm.core.times import human, iso


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "db":
        p.add_argument("action", choices=["upgrade", "current"], help="upgrade: migrate to head")
        p.add_argument("--json", action="store_true")
        return
    if name == "show":
        p.add_argument("artifact", help="artifact id (6+ hex digits) or manifest digest")
    else:
        p.add_argument("--model", "-m", help="only this model: NAME (every tag of it), NAME:TAG or a digest")
        p.add_argument("--target", "-t", help="only this target, e.g. qnn:SM8650")
        p.add_argument("--limit", type=int, default=200, choices=range(1, 100001), metavar="N")
    p.add_argument("--json", action="store_true")


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    if name == "db":
        from registry.db import SCHEMA_HEAD, Database, current_revision, upgrade

        db = Database(settings.database_url, check=False)
        try:
            before = current_revision(db.engine)
            if args.action == "upgrade" and before != SCHEMA_HEAD:
                upgrade(db.engine)
            now = current_revision(db.engine)
        finally:
            db.dispose()
        if getattr(args, "json", False):
            print(json.dumps({"before": before, "schema": now, "head": SCHEMA_HEAD}))
        else:
            print(f"schema at {now or 'none'} (head {SCHEMA_HEAD})" + (f", was {before or 'none'}" if before != now else ""))
        return 0
    from registry.index import Registry, find_artifact, list_artifacts, resolve_model_refs, tags_by_digest

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            if name == "show":
                return _show(reg, s, find_artifact(s, args.artifact), args.json)
            models = resolve_model_refs(s, args.model) if args.model else None
            backend, target = None, None
            if args.target:
                from farm.core.catalog import parse_target

                t = parse_target(args.target)
                backend, target = t.backend, t.name
            arts = list_artifacts(s, model_digest=models, backend=backend, target=target, limit=args.limit)
            tags = tags_by_digest(s, sorted({a.model_digest for a in arts}))
            rows = [ls_row(a, tags[a.model_digest]) for a in arts]
            created = [human(a.created_at) for a in arts]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            table([{**r, "artifact": r["id"], "model": ", ".join(r["tags"]) or r["model"][:19],
                    "options": " ".join(f"{k}={_text(v)}" for k, v in r["options"].items()),
                    "compile_s": f"{r['compile_seconds']:.2f}", "size": human_size(r["size_bytes"]),
                    "placement": f"{r['nodes_ep']} ctx / {r['nodes_cpu']} cpu", "created": when}
                   for r, when in zip(rows, created, strict=True)],
                  ["artifact", "model", "target", "toolchain", "options", "compile_s", "size", "placement", "status",
                   "created"])
        return 0
    finally:
        reg.close()


def ls_row(a: Any, tags: list[str]) -> dict[str, Any]:
    """One artifact as `farm ls --json` writes it (schema: farm/cli/schemas/ls.json)."""
    return {"id": a.short_id, "artifact": a.digest, "model": a.model_digest, "tags": tags,
            "target": f"{a.backend}:{a.target}", "toolchain": a.toolchain,
            "options": non_default_options(a.backend, a.target, a.build.options if a.build else {}),
            "compile_seconds": float(a.compile_seconds), "size_bytes": int(a.size), "nodes_ep": a.nodes_ep,
            "nodes_cpu": a.nodes_cpu, "status": a.status, "created_at": iso(a.created_at)}


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


def _text(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def _show(reg: Any, s: Any, a: Any, as_json: bool) -> int:
    from registry import manifest as mf
    from registry.index import tags_of, verdicts_of
    from registry.store.base import read_bytes

    manifest = mf.decode(read_bytes(reg.store, a.digest), a.digest)
    options = dict(a.build.options)
    evidence = verdicts_of(s, a.id)
    verdicts = [{"runtime_backend": v.runtime_backend, "runtime": v.runtime_version, "verdict": v.verdict,
                 "source": v.source, "self_probe": v.source == "probe" and v.runtime_backend == a.backend
                 and v.runtime_version == a.toolchain,
                 "detail": v.detail, "recorded_at": iso(v.recorded_at)} for v in evidence]
    info = {
        "artifact": a.digest, "id": a.short_id, "status": a.status, "model": a.model_digest,
        "tags": tags_of(s, a.model_digest), "target": f"{a.backend}:{a.target}", "toolchain": a.toolchain,
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
    if as_json:
        print(json.dumps(info, indent=2))
        return 0
    non_default = info["non_default_options"]
    print(f"artifact  {a.digest}  ({a.status})")
    print(f"model     {a.model_digest}  {' '.join(info['tags'])}")
    print(f"target    {a.backend}:{a.target}   toolchain {a.backend.upper()} {a.toolchain}  "
          f"(onnxruntime {manifest['toolchain']['ort_version']}, {manifest['toolchain']['ep_package']} "
          f"{manifest['toolchain']['ep_version']})")
    print(f"options   {' '.join(f'{k}={_text(v)}' for k, v in non_default.items()) or 'defaults'}  "
          f"(all: {json.dumps(options, sort_keys=True)})")
    print(f"compile   {a.compile_seconds:.3f} s   placement {a.nodes_ep} ctx / {a.nodes_cpu} cpu "
          f"{manifest['placement']['cpu_op_types'] or ''}".rstrip())
    print(f"created   {human(a.created_at)}")
    for n in manifest["epcontext"]:
        print(f"epcontext source={n.get('source')} ep_sdk_version={n.get('ep_sdk_version')} "
              f"embed_mode={n.get('embed_mode')} main_context={n.get('main_context')} "
              f"partition={n.get('partition_name')}")
    if verdicts:
        print("verdicts  (probes: this artifact loaded, or not, under each runtime)")
        buf = io.StringIO()
        table([{"runtime": f"{RUNTIME_NAMES.get(v['runtime_backend'], v['runtime_backend'])} {v['runtime']}",
                "verdict": v["verdict"], "source": v["source"], "when": human(r.recorded_at), "note": _note(v)}
               for v, r in zip(verdicts, evidence, strict=True)],
              ["runtime", "verdict", "source", "when", "note"], out=buf)
        for line in buf.getvalue().splitlines():
            print(f"  {line}")
    else:
        print("verdicts  none yet (no probe has loaded this artifact)")
    print("files")
    for f in info["files"]:
        print(f"  {f['role']:9s} {f['name']:40s} {human_size(f['size']):>10s}  {f['digest']}")
    return 0


RUNTIME_NAMES = {"qnn": "QNN", "trt": "TensorRT"}


def _note(v: dict[str, Any]) -> str:
    parts = []
    if v["self_probe"]:
        parts.append("self-probe: loaded right after the compile, by the toolchain that built it")
    if v["detail"]:
        first = v["detail"].strip().splitlines()[0] if v["detail"].strip() else ""
        parts.append(first[:120] + ("..." if len(first) > 120 else ""))
    return "; ".join(parts)
