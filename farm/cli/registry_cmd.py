"""Registry commands: farm ls | show (from this index or, with --server/FARM_SERVER, the service) | db."""

from __future__ import annotations

import argparse
import io
import json
from datetime import datetime
from typing import Any

from farm.cli import human_size, table
from farm.cli.remote import add_server_arguments, answer_of, client, require_local_index
from farm.core.settings import Settings
from farm.core.times import human


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "db":
        p.add_argument("action", choices=["upgrade", "current"], help="upgrade: migrate to head")
        p.add_argument("--json", action="store_true")
        return
    if name == "show":
        p.add_argument("artifact", metavar="REF",
                       help="artifact id (6+ hex digits) or manifest digest, or a model (NAME:TAG, NAME or its digest) "
                            "with one artifact (for --target)")
        p.add_argument("--target", "-t", help="with a model: its artifact for this target, e.g. qnn:SM8650")
    else:
        p.add_argument("--model", "-m", help="only this model: NAME (every tag of it), NAME:TAG or a digest")
        p.add_argument("--target", "-t", help="only this target, e.g. qnn:SM8650")
        p.add_argument("--limit", type=int, default=200, choices=range(1, 100001), metavar="N")
    p.add_argument("--json", action="store_true")
    add_server_arguments(p)


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    if name == "db":
        return _db(args, settings)
    if args.server:
        from urllib.parse import quote

        api = client(args)
        if name == "show":
            doc = api.json("GET", f"/v1/artifacts/{quote(args.artifact, safe='')}", target=args.target)
            with answer_of("show"):
                return _show(_checked_show(doc), args.json)
        rows = api.json("GET", "/v1/artifacts", model=args.model, target=args.target, limit=str(args.limit))
        with answer_of("ls"):
            return _ls(rows, args.json)
    from registry.index import Registry
    from registry.views import artifact_document, ls_rows

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            if name == "show":
                info = artifact_document(s, reg.store, args.artifact, args.target)
            else:
                rows = ls_rows(s, model=args.model, target=args.target, limit=args.limit)
    finally:
        reg.close()
    return _show(info, args.json) if name == "show" else _ls(rows, args.json)


def _db(args: argparse.Namespace, settings: Settings) -> int:
    from registry.db import SCHEMA_HEAD, Database, current_revision, upgrade

    require_local_index("db", settings)
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


def _ls(rows: Any, as_json: bool) -> int:
    """The rows of `farm ls --json` (schema ls.json), from the index or the service, as JSON or a table."""
    if not isinstance(rows, list):
        from farm.core.errors import ServerError

        raise ServerError("the service's artifact list is not a JSON array")
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    table([{**r, "artifact": r["id"], "model": ", ".join(r["tags"]) or r["model"][:19],
            "options": " ".join(f"{k}={_text(v)}" for k, v in r["options"].items()),
            "compile_s": f"{r['compile_seconds']:.2f}", "size": human_size(r["size_bytes"]),
            "placement": f"{r['nodes_ep']} ctx / {r['nodes_cpu']} cpu", "created": _when(r["created_at"])}
           for r in rows],
          ["artifact", "model", "target", "toolchain", "options", "compile_s", "size", "placement", "status",
           "created"])
    return 0


def _when(text: str | None) -> str:
    """An ISO time of a document as text output shows it (``2026-11-22 07:07 UTC``)."""
    if not text:
        return ""
    try:
        return human(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except (TypeError, ValueError):
        return str(text)[:32]


def _text(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def _checked_show(doc: Any) -> dict[str, Any]:
    """The keys `farm show` reads, present before anything is printed (a service's answer)."""
    if not isinstance(doc, dict):
        raise TypeError("not an object")
    for key in ("artifact", "status", "model", "tags", "target", "toolchain", "options", "non_default_options",
                "compile_seconds", "nodes_ep", "nodes_cpu", "created_at", "verdicts", "files", "manifest"):
        doc[key]  # noqa: B018 - KeyError is the check
    for key in ("toolchain", "placement", "epcontext"):
        doc["manifest"][key]  # noqa: B018
    return doc


def _show(info: dict[str, Any], as_json: bool) -> int:
    """`farm show`: the document of registry.views.artifact_document (schema show.json), from the
    index or the service."""
    from farm.cli.offload import offload_text
    from farm.core.untrusted import clean_text

    if as_json:
        print(json.dumps(info, indent=2))
        return 0
    manifest = info["manifest"]
    backend = info["target"].split(":", 1)[0]
    options = info["options"]
    non_default = info["non_default_options"]
    print(f"artifact  {info['artifact']}  ({info['status']})")
    print(f"model     {info['model']}  {' '.join(info['tags'])}")
    print(f"target    {info['target']}   toolchain {backend.upper()} {info['toolchain']}  "
          f"(onnxruntime {manifest['toolchain']['ort_version']}, {manifest['toolchain']['ep_package']} "
          f"{manifest['toolchain']['ep_version']})")
    print(f"options   {' '.join(f'{k}={_text(v)}' for k, v in non_default.items()) or 'defaults'}  "
          f"(all: {json.dumps(options, sort_keys=True)})")
    print(f"compile   {info['compile_seconds']:.3f} s   placement {info['nodes_ep']} ctx / {info['nodes_cpu']} cpu "
          f"{manifest['placement']['cpu_op_types'] or ''}".rstrip())
    if (partial := offload_text(info.get("offload"))) is not None:
        print(f"offload   {partial}")
    for ep, value in sorted((info.get("compatibility") or {}).items()):
        print(f"compat    {clean_text(ep, 80)}: {clean_text(value, 400)}")
    print(f"created   {_when(info['created_at'])}")
    for n in manifest["epcontext"]:
        print(f"epcontext source={n.get('source')} ep_sdk_version={n.get('ep_sdk_version')} "
              f"embed_mode={n.get('embed_mode')} main_context={n.get('main_context')} "
              f"partition={n.get('partition_name')}")
    _show_description(info.get("description"), manifest.get("graphs"))
    _show_package(manifest.get("genai"), (info.get("description") or {}).get("twin"))
    verdicts = info["verdicts"]
    unverified = (info.get("description") or {}).get("unverified")
    if unverified:  # no runtime here can load it: examined (above), never "loads"
        print(f"verdict   unverified: {unverified}")
    if verdicts:
        print("verdicts  (probes: this artifact loaded, or not, under each runtime)")
        buf = io.StringIO()
        table([{"runtime": f"{RUNTIME_NAMES.get(v['runtime_backend'], v['runtime_backend'])} {v['runtime']}",
                "verdict": v["verdict"], "source": v["source"], "when": _when(v["recorded_at"]), "note": _note(v)}
               for v in verdicts],
              ["runtime", "verdict", "source", "when", "note"], out=buf)
        for line in buf.getvalue().splitlines():
            print(f"  {line}")
    elif not unverified:
        print("verdicts  none yet (no probe has loaded this artifact)")
    _show_evidence(info)
    print("files")
    genai = manifest.get("genai")
    labels = [_file_label(f, genai) for f in info["files"]]
    width = max([9, *(len(label) for label in labels)])
    for f, label in zip(info["files"], labels, strict=True):
        print(f"  {label:{width}s} {f['name']:40s} {human_size(f['size']):>10s}  {f['digest']}")
    return 0


def _file_label(f: dict[str, Any], genai: Any) -> str:
    """A file's role; in a genai package what it is in the folder (the index stores its payload
    as ``context`` files beside the ``ctx-model`` config, as any artifact's): the config, each
    stage by its role, each part's shared binary, the tokenizer files and what else the export
    carried as it was."""
    if not isinstance(genai, dict) or f["role"] not in ("ctx-model", "context"):
        return str(f["role"])
    from farm.core.genai import TOKENIZER_FILES
    from farm.core.untrusted import clean_text

    name = f["name"]
    if name == genai.get("config"):
        return "config"
    for st in genai.get("stages") or []:
        if isinstance(st, dict) and st.get("file") == name:
            return clean_text(st.get("role"), 24)
    for p in genai.get("parts") or []:
        if isinstance(p, dict) and name in (p.get("binaries") or []):
            part = p.get("part")
            return f"part{part}.binary" if isinstance(part, int) and not isinstance(part, bool) else "binary"
    return "tokenizer" if name in TOKENIZER_FILES else "carried"


RUNTIME_NAMES = {"qnn": "QNN", "trt": "TensorRT"}


def _tensors(ts: list[dict[str, Any]]) -> str:
    return ", ".join(f"{t['name']} {t['dtype']}[{','.join(str(d) for d in t['shape'])}]" for t in ts)


def _show_description(desc: dict[str, Any] | None, graphs: list[dict[str, Any]] | None) -> None:
    """The context binaries' own description (QNN System API) and each requested graph in it."""
    if graphs:
        print(f"graphs    {len(graphs)} compiled together, sharing weights:")
        for g in graphs:
            print(f"  {g['name']:16s} {g['ctxModel']:14s} uses {', '.join(g['contexts'])}  "
                  f"compile {g.get('compileSeconds', 0):.3f} s")
    if not desc or "check" not in desc:  # a genai package's description holds its stages and twin
        return
    print(f"described {desc.get('check')}")
    for name, b in (desc.get("binaries") or {}).items():
        ids = b.get("soc_models") or ([b["soc_model"]] if b.get("soc_model") else [])
        socs = f"soc_model {','.join(str(i) for i in ids)}" if ids else "soc_model -"
        socs += " (multi-SoC container)" if b.get("container") else ""
        print(f"  {name}: {b.get('build_id')} {socs} context blob {b.get('context_blob_version')} "
              f"{human_size(b.get('file_size'))} (System API {b.get('system_api')})")
    for g in desc.get("graphs") or []:
        print(f"  graph {g['name']}: {', '.join(g.get('qnn_graphs') or [])}")
        if g.get("inputs") is not None:
            print(f"    inputs  {_tensors(g['inputs'])}")
            print(f"    outputs {_tensors(g['outputs'])}")


def _show_package(genai: Any, twin: Any) -> None:
    """A genai package (farm.pipeline.genai): each stage's role and file, each part's binary and
    group artifact, and the twin's figures."""
    if not isinstance(genai, dict):
        return
    stages = [st for st in genai.get("stages") or [] if isinstance(st, dict)]
    print(f"genai     {genai.get('config')}: {len(stages)} stages")
    for st in stages:
        print(f"  {str(st.get('role')):16s} {st.get('file')}")
    for p in genai.get("parts") or []:
        print(f"  part {p.get('part')}: {', '.join(p.get('binaries') or [])} (group artifact "
              f"{str(p.get('artifact'))[7:19]}, build {p.get('build')})")
    if isinstance(twin, dict):
        if twin.get("status") == "ok":
            first = (twin.get("first_step") or {}).get("psnr_db")
            print(f"twin      {twin.get('tokens_matched')}/{twin.get('tokens_compared')} greedy tokens matched the "
                  f"CPU EP (the parts compiled without sharing, on the simulator); first step's logits PSNR {first} dB")
            for part in twin.get("parts") or []:  # each part's prefill and one decode step, against the CPU EP
                if isinstance(part, dict):
                    worst: dict[str, Any] = part["worst"] if isinstance(part.get("worst"), dict) else {}
                    figure = (f"lowest PSNR {worst.get('psnr_db')} dB ({worst.get('phase')} {worst.get('output')})"
                              if part.get("status") == "ok" else f"{part.get('status')}: {str(part.get('detail'))[:120]}")
                    print(f"  part {part.get('part')}: prefill and one decode step on the simulator, {figure}")
        else:
            print(f"twin      {twin.get('status')}: {str(twin.get('detail') or '')[:200]}")
    else:
        print("twin      not run (farm build --genai runs it unless --no-twin)")


def _note(v: dict[str, Any]) -> str:
    parts = []
    if v["self_probe"]:
        parts.append("self-probe: loaded right after the compile, by the toolchain that built it")
    if v["detail"]:
        first = v["detail"].strip().splitlines()[0] if v["detail"].strip() else ""
        parts.append(first[:120] + ("..." if len(first) > 120 else ""))
    return "; ".join(parts)


def _show_evidence(info: dict[str, Any]) -> None:
    """Accuracy against the CPU reference and device reports (docs/evidence.md)."""
    for acc in info.get("accuracy") or []:
        if acc["status"] == "ok":
            worst = f"worst output {acc['worst_output']!r}: " if acc.get("worst_output") else ""
            outs = "; ".join(f"{o['name']} PSNR {o['psnr_db']} dB, cosine {o['cosine']}, max abs error "
                             f"{o['max_abs_error']:.3g}" if isinstance(o.get("max_abs_error"), int | float)
                             else f"{o['name']} PSNR {o['psnr_db']} dB" for o in acc["outputs"][:4])
            print(f"accuracy  {acc['runtime']} vs CPU ({acc['inputs']}): {worst}{acc['min_psnr_db']} dB  [{outs}]")
        else:
            print(f"accuracy  {acc['runtime']}: {acc['status']}: {(acc.get('detail') or '')[:200]}")
    if not info.get("accuracy"):
        print("accuracy  not checked (farm build --accuracy, --min-psnr, or FARM_ACCURACY=after)")
    for d in info.get("devices") or []:
        times = f", load p50 {d['load_ms_p50']:g} ms" if d.get("load_ms_p50") is not None else ""
        from farm.core.text import printable  # stored device text: escaped, a device is not trusted

        err = f", last error: {printable(d['last_error'][:80])}" if d.get("last_error") else ""
        print(f"devices   {d['runtime']} {d['soc']}: {d['loads']} load, {d['fails']} fail, {d['crashed']} crashed "
              f"({d['devices']} device(s)){times}{err}")
    for cell in info.get("device_lab") or []:
        print(f"lab       {_lab_text(cell)}")
        if len(cell.get("sdks") or []) > 1:  # speed per SDK on this SoC
            print("  sdks    " + "; ".join(f"QNN {x['toolchain']} p50 {x['p50_ms']:g} ms ({x['devices']} device(s))"
                                          + (f" {slower_text(x['slower'])}" if x.get("slower") else "")
                                          for x in cell["sdks"] if x.get("p50_ms") is not None))


def _lab_text(cell: dict[str, Any]) -> str:
    """``SM8650: confirmed by 2 enrolled device(s), p50 48 ms, PSNR 61 dB, load 110 ms; slower: 1.6x vs
    QNN 2.49.40; 1 simulator report (not device evidence)``"""
    from farm.core.untrusted import clean_text

    figures = [f"{label} {cell[key]:g}{unit}" for key, label, unit in
               (("p50_ms", "p50", " ms"), ("psnr_db", "PSNR", " dB"), ("load_ms", "load", " ms"))
               if isinstance(cell.get(key), int | float)]
    parts = [f"{clean_text(cell['soc'], 64)}: confirmed by {cell['devices']} enrolled device(s)"
             + (", " + ", ".join(figures) if figures and cell["devices"] else "")]
    if cell.get("failed"):
        parts.append(f"failed on {cell['failed']}")
    if cell.get("slower"):
        parts.append(slower_text(cell["slower"]))
    if cell.get("simulator_reports"):
        parts.append(f"{cell['simulator_reports']} simulator report(s) (not device evidence)")
    return "; ".join(parts)


def slower_text(flag: dict[str, Any]) -> str:
    """``slower: 1.6x vs QNN 2.49.40`` (registry.lab.slower_text, on a document that may come from a service)."""
    from farm.core.untrusted import clean_text

    return f"slower: {float(flag['ratio']):g}x vs QNN {clean_text(flag['vs'], 64)}"
