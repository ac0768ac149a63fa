"""Registry commands: farm ls | show | db upgrade."""

from __future__ import annotations

import argparse
import json

from farm.cli import human_size, table
from farm.core.settings import Settings


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "db":
        p.add_argument("action", choices=["upgrade", "current"], help="upgrade: migrate to head")
        p.add_argument("--json", action="store_true")
        return
    if name == "show":
        p.add_argument("artifact", help="artifact id (6+ hex digits) or manifest digest")
    else:
        p.add_argument("--model", "-m", help="only this model (NAME:TAG or digest)")
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
    from registry.index import Registry, find_artifact, list_artifacts, resolve_model_ref, tags_of

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            if name == "show":
                return _show(reg, s, find_artifact(s, args.artifact), args.json, tags_of)
            model = resolve_model_ref(s, args.model) if args.model else None
            backend, _, target = (args.target or "").partition(":")
            if args.target:
                from farm.core.catalog import parse_target

                t = parse_target(args.target)
                backend, target = t.backend, t.name
            arts = list_artifacts(s, model_digest=model, backend=backend or None, target=target or None,
                                  limit=args.limit)
            rows = [{"artifact": a.short_id, "model": ", ".join(tags_of(s, a.model_digest)) or a.model_digest[7:19],
                     "target": f"{a.backend}:{a.target}", "toolchain": a.toolchain,
                     "compile_s": f"{a.compile_seconds:.2f}", "size": human_size(a.size),
                     "placement": f"{a.nodes_ep} ctx / {a.nodes_cpu} cpu", "status": a.status,
                     "created": a.created_at.strftime("%Y-%m-%d %H:%M:%S")} for a in arts]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            table(rows, ["artifact", "model", "target", "toolchain", "compile_s", "size", "placement", "status",
                         "created"])
        return 0
    finally:
        reg.close()


def _show(reg, s, a, as_json, tags_of) -> int:  # type: ignore[no-untyped-def]
    from registry import manifest as mf
    from registry.store.base import read_bytes

    manifest = mf.decode(read_bytes(reg.store, a.digest), a.digest)
    info = {
        "artifact": a.digest, "status": a.status, "model": a.model_digest, "tags": tags_of(s, a.model_digest),
        "build": {"id": a.build.id, "key": a.build.build_key, "attempts": a.build.attempts,
                  "state": a.build.state},
        "files": [{"name": f.name, "role": f.role, "digest": f.digest, "size": f.size,
                   "mediaType": f.media_type} for f in a.files],
        "manifest": manifest,
    }
    if as_json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"artifact  {a.digest}  ({a.status})")
    print(f"model     {a.model_digest}  {' '.join(info['tags'])}")
    print(f"target    {a.backend}:{a.target}   toolchain {a.backend.upper()} {a.toolchain}  "
          f"(onnxruntime {manifest['toolchain']['ort_version']}, {manifest['toolchain']['ep_package']} "
          f"{manifest['toolchain']['ep_version']})")
    print(f"options   {json.dumps(manifest['options'], sort_keys=True)}")
    print(f"compile   {a.compile_seconds:.3f} s   placement {a.nodes_ep} ctx / {a.nodes_cpu} cpu "
          f"{manifest['placement']['cpu_op_types'] or ''}")
    for n in manifest["epcontext"]:
        print(f"epcontext source={n.get('source')} ep_sdk_version={n.get('ep_sdk_version')} "
              f"embed_mode={n.get('embed_mode')} main_context={n.get('main_context')} "
              f"partition={n.get('partition_name')}")
    print("files")
    for f in info["files"]:
        print(f"  {f['role']:9s} {f['name']:40s} {human_size(f['size']):>10s}  {f['digest']}")
    return 0
