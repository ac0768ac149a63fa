"""Ops commands: farm coverage | registry verify|gc | keys create|sign."""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from farm.cli import human_size, table
from farm.core.errors import UsageError
from farm.core.settings import Settings


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "coverage":
        p.add_argument("--backend", choices=["qnn", "trt"])
        p.add_argument("--model", "-m", action="append", default=[],
                       help="only these models: NAME (every tag of it), NAME:TAG or a digest (repeatable)")
        p.add_argument("--missing", action="store_true",
                       help="list what each model lacks for the newest toolchain the farm knows")
        p.add_argument("--verdicts", action="store_true",
                       help="the probe evidence: one row per (model, target, built with), a column per runtime")
        p.add_argument("--target", "-t", action="append", default=[],
                       help="with --missing: the wanted targets (default: those each model was built for)")
        p.add_argument("--summary", action="store_true",
                       help="SoC x SDK counts (built, failed, missing, verified) instead of every model's cells")
        p.add_argument("--tag", help="--summary/--missing: only models with a NAME:TAG of this TAG (e.g. stable)")
        p.add_argument("--prefix", help="--summary/--missing: only models whose name starts with this")
        p.add_argument("--json", action="store_true")
        from farm.cli.remote import add_server_arguments

        add_server_arguments(p)
    elif name == "registry":
        p.add_argument("action", choices=["verify", "gc"])
        p.add_argument("--quick", action="store_true", help="verify: sizes only, no re-hash")
        p.add_argument("--repair", action="store_true", help="verify: mark broken artifacts unresolvable")
        p.add_argument("--grace", default="24h", help="gc: keep unreferenced blobs younger than this (e.g. 30m, 24h)")
        p.add_argument("--dry-run", action="store_true", help="gc: report, delete nothing")
        p.add_argument("--json", action="store_true")
    elif name == "keys":
        p.add_argument("action", choices=["create", "sign", "public"])
        p.add_argument("arg", nargs="?", help="create: key path; sign: artifact id; public: key path")
        p.add_argument("--json", action="store_true")


MAX_GRACE_S = 10 * 366 * 86400


def parse_duration(text: str) -> timedelta:
    m = re.fullmatch(r"\s*(\d{1,12}(?:\.\d{1,6})?)\s*([smhd]?)\s*", text)
    if not m:
        raise UsageError(f"bad duration {text[:40]!r}", hint="e.g. 90s, 30m, 24h, 7d")
    seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2) or "s"]
    if seconds > MAX_GRACE_S:
        raise UsageError(f"duration {text[:40]!r} is longer than ten years", hint="e.g. 24h or 30d")
    return timedelta(seconds=seconds)


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    if name == "keys" and args.action in ("create", "public"):
        return _keys_local(args)
    if name == "coverage" and (args.summary or args.missing or args.tag or args.prefix):
        return _coverage_views(args, settings)
    if name == "coverage" and getattr(args, "server", None):
        from farm.cli.remote import client

        cov = client(args).json("GET", "/v1/coverage", model=args.model or None, backend=args.backend)
        if not isinstance(cov, dict) or not isinstance(cov.get("cells"), list):
            from farm.core.errors import ServerError

            raise ServerError("the service's coverage is not the document farm coverage --json prints")
        return _print_coverage(cov, args)
    if name != "coverage" and not (name == "keys" and args.action in ("create", "public")):
        from farm.cli.remote import require_local_index

        require_local_index(f"{name} {args.action}", settings)
    from registry.index import Registry

    reg = Registry.open(settings)
    try:
        if name == "coverage":
            return _coverage(reg, args)
        if name == "registry":
            return _registry(reg, args)
        return _sign(reg, args, settings)
    finally:
        reg.close()


def _coverage(reg: Any, args: argparse.Namespace) -> int:
    from registry.coverage import coverage

    with reg.db.session() as s:
        cov = coverage(s, backend=args.backend, models=args.model or None).to_dict()
    return _print_coverage(cov, args)


def _coverage_views(args: argparse.Namespace, settings: Settings) -> int:
    """--summary and --missing: the queries of registry.coverage (the summary kept up to date as
    builds finish, models paged by name), on the local index or through the service
    (/v1/coverage/summary|models): the same rows either way, at any size."""
    filters = {"tag": args.tag, "prefix": args.prefix, "model": args.model or None, "backend": args.backend}
    if getattr(args, "server", None):
        from farm.cli.remote import client

        c = client(args)

        def fetch(path: str, **query: Any) -> dict[str, Any]:
            doc = c.json("GET", path, **filters, **query)
            if not isinstance(doc, dict):
                from farm.core.errors import ServerError

                raise ServerError(f"the service's answer to {path} is not a JSON object")
            return doc

        if args.summary:
            return _print_summary(fetch("/v1/coverage/summary"), args)
        return _print_missing_pages(lambda state, cursor: fetch("/v1/coverage/models", state=state, cursor=cursor,
                                                                limit=200), args)
    from registry.coverage import models_page, scope, summary
    from registry.index import Registry

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            sc = scope(s, tag=args.tag, prefix=args.prefix, models=args.model or None, backend=args.backend)
            if args.summary:
                return _print_summary(summary(s, sc).to_dict(), args)
            return _print_missing_pages(lambda state, cursor: models_page(s, sc, state=state, cursor=cursor,
                                                                          limit=200).to_dict(), args)
    finally:
        reg.close()


def _print_summary(doc: dict[str, Any], args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    rows = doc.get("rows") or []
    if not rows:
        print("no builds yet")
        return 0
    table([{**r, "sdk": r["toolchain"], "probe": r["probe_verified"], "device": r["device_verified"]} for r in rows],
          ["target", "sdk", "models", "built", "building", "broken", "failed", "missing", "probe", "device"])
    print("models: built for the SoC with any SDK; missing: those without a build on this SDK; "
          "probe / device: built ones a probe or a device loaded")
    return 0


def _print_missing_pages(page_of: Any, args: argparse.Namespace) -> int:
    """`farm coverage --missing` from the model pages: per model, the wanted targets (``-t``, default
    those it was built for) without a good build on the newest SDK of their backend; exit 1 when
    anything is missing."""
    targets = None
    if args.target:
        from farm.core.catalog import parse_target

        # A wanted multi-SoC target (qnn:SM8650+SM8750) wants each of its SoCs' cells.
        refs = [parse_target(t).ref.partition(":") for t in args.target]
        targets = sorted({f"{b}:{soc}" for b, _, name in refs for soc in (name.split("+") if b == "qnn" else [name])})
    rows: list[dict[str, Any]] = []
    newest: dict[str, str] = {}
    cursor = None
    while True:
        # Without -t the query selects the models with something missing; with -t every model is looked at.
        page = page_of(None if targets else "missing", cursor)
        newest = {b: v[-1] for b, v in (page.get("toolchains") or {}).items() if v}
        for m in page.get("models") or []:
            if targets is None:
                rows += [{"model": m["digest"], "tags": m["tags"], **x} for x in m["missing"]]
                continue
            cells = {(c["target"], c["toolchain"]): c for c in m["cells"]}
            for target in targets:
                toolchain = newest.get(target.split(":", 1)[0])
                cell = cells.get((target, toolchain or ""))
                if toolchain is None or (cell is not None and cell["state"] in ("built", "building")):
                    continue
                state = "missing" if cell is None else (
                    f"failed({','.join(cell['codes'])})" if cell["state"] == "failed" and cell["codes"]
                    else cell["state"])
                rows.append({"model": m["digest"], "tags": m["tags"], "target": target, "toolchain": toolchain,
                             "state": state})
        cursor = page.get("next")
        if not cursor:
            break
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        table([{**r, "model": r["model"][7:19], "tags": ", ".join(r["tags"])} for r in rows],
              ["model", "tags", "target", "toolchain", "state"])
    else:
        print("nothing missing for the newest toolchains: " + ", ".join(f"{b} {v}" for b, v in sorted(newest.items())))
        _print_older_failures(page_of, newest)
    return 1 if rows else 0


def _print_older_failures(page_of: Any, newest: dict[str, str], shown: int = 20) -> None:
    """After "nothing missing": the cells that failed on an older SDK (an LLM that failed on two
    SDKs is not "nothing" to its owner), at most ``shown`` of them, and how many."""
    from farm.core.untrusted import clean_text

    failed: list[str] = []
    cursor = None
    while True:
        page = page_of("failed", cursor)
        for m in page.get("models") or []:
            who = ", ".join(m.get("tags") or []) or str(m.get("digest"))[:19]
            for c in m.get("cells") or []:
                if c.get("state") == "failed" and c.get("toolchain") != newest.get(str(c.get("target")).split(":")[0]):
                    codes = ",".join(c.get("codes") or [])
                    failed.append(f"{who} {c.get('target')} {c.get('toolchain')}" + (f" ({codes})" if codes else ""))
        cursor = page.get("next")
        if not cursor:
            break
    if failed:
        more = f" and {len(failed) - shown} more" if len(failed) > shown else ""
        print(f"failed on older SDKs ({len(failed)} cell(s); farm coverage shows them): "
              + "; ".join(clean_text(f, 300) for f in failed[:shown]) + more)


def _print_coverage(cov: dict[str, Any], args: argparse.Namespace) -> int:
    """Local or through the service, the same JSON (schemas/coverage.json) and the same tables."""
    from registry.lab import cell_label
    if args.json:
        print(json.dumps(cov, indent=2))
        return 0
    if not cov["cells"]:
        print("no builds yet")
        return 0
    names = {"qnn": "QNN", "trt": "TensorRT"}
    if args.verdicts:
        return _print_verdicts(cov, names)
    columns = [(b, v) for b, versions in sorted(cov["toolchains"].items()) for v in versions]
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for c in cov["cells"]:
        row = rows.setdefault((c["model"], c["target"]), {"model": c["model"][7:19], "tags": ", ".join(c["tags"]),
                                                          "target": c["target"]})
        label = f"failed({','.join(c['codes'])})" if c["state"] == "failed" else c["state"]
        label += " +cpu" if c.get("partial_offload") else ""
        label += " \u2713" if c["probe_verified"] else ""
        if c.get("devices"):  # device confirmations, as the page shows them
            label += f" \u2713device\u00d7{c['devices']}"
        if c.get("unverified"):  # built only as groups / multi-SoC binaries: nothing here can load it
            label += " unverified"
        if lab := cell_label(c.get("device_lab")):  # the device lab: enrolled devices, speed per SDK
            label += f" {lab}"
        if c.get("via"):  # built as a multi-SoC binary, as the page and the JSON say
            label += " via " + ",".join(v.partition(":")[2] for v in c["via"])
        if c.get("twin"):  # an LLM: the greedy tokens its twin matched
            label += f" twin {c['twin']}"
        column = f"{c['target'].split(':', 1)[0]} {c['toolchain']}"
        row[column] = label
        # An LLM's parts: rows under it (they are no models of their own).
        for p in c.get("parts") or []:
            part_row = rows.setdefault((c["model"], f"{c['target']} part{p['part']}"),
                                       {"model": f"  part{p['part']}", "tags": "", "target": c["target"]})
            part_row[column] = p["state"]
    for (_m, target), row in rows.items():
        target = target.split(" ", 1)[0]
        for b, v in columns:
            if target.startswith(b + ":"):
                row.setdefault(f"{b} {v}", "missing")
    headers = [f"{b} {v}" for b, v in columns]
    _table_with_headers(list(rows.values()), ["model", "tags", "target", *headers],
                        {h: f"{names.get(h.split()[0], h.split()[0])} {h.split()[1]}" for h in headers})
    print("\u2713: a probe loaded a built artifact of the cell (farm coverage --verdicts shows every verdict)")
    partial = sorted({op for c in cov["cells"] if c.get("partial_offload") for op in c.get("cpu_op_types") or []})
    if any(c.get("partial_offload") for c in cov["cells"]):
        print("+cpu: partial offload, a built artifact leaves ops on the device's CPU ("
              + (", ".join(partial) or "op types not recorded") + "; farm coverage --json names them per cell)")
    if any(c.get("unverified") for c in cov["cells"]):
        print("unverified: built only as weight-shared graph groups or multi-SoC binaries, which the x86_64 simulator "
              "can't load (--json says why per cell); via: the multi-SoC build it counts")
    if any(c.get("device_lab") for c in cov["cells"]):
        print("lab\u00d7N: N enrolled devices of the SoC ran a built artifact of the cell (p50: their median); slower: "
              "its SDK is 1.2x or more slower than another SDK on that SoC; sim: simulator reports, never device "
              "evidence (docs/device-lab.md)")
    _llm_legend(cov)
    return 0


def _llm_legend(cov: dict[str, Any], *, parts: bool = True) -> None:
    """What an LLM's row says: its twin's figure, and its parts under it."""
    if any(c.get("twin") for c in cov["cells"]):
        print("twin N/M: an LLM's twin (its parts compiled without sharing, run on the simulator) generated N of M "
              "greedy tokens as the CPU EP did; the shared package itself loads only on a device")
    if parts and any(c.get("parts") for c in cov["cells"]):
        print("partN: an LLM's part (a weight-shared group build), counted under the LLM, not as a model")


def _print_verdicts(cov: dict[str, Any], names: dict[str, str]) -> int:
    """Built with (rows) x runtime (columns): what probes measured; empty where nothing was probed."""
    runtimes: dict[str, set[str]] = {}
    for b, versions in {**cov["toolchains"]}.items():
        runtimes.setdefault(b, set()).update(versions)
    for b, versions in cov.get("runtimes", {}).items():
        runtimes.setdefault(b, set()).update(versions)
    from farm.core.keys import parse_version

    columns = [(b, v) for b in sorted(runtimes) for v in sorted(runtimes[b], key=parse_version)]
    rows = []
    for c in cov["cells"]:
        backend = c["target"].split(":", 1)[0]
        row: dict[str, Any] = {"model": c["model"][7:19], "tags": ", ".join(c["tags"]), "target": c["target"],
                               "built_with": f"{c['toolchain']} ({c['state']})" if c["state"] != "built"
                               else c["toolchain"]}
        for v in c["verdicts"]:
            mark = v["verdict"] if v["verdict"] != "mixed" else f"mixed {v['loads']}/{v['loads'] + v['fails']}"
            row[f"{v['runtime_backend']} {v['runtime']}"] = mark
        # Built, but nothing here can load it (weight-shared, multi-SoC; an LLM carries its twin):
        # not "-" (not probed yet), since no probe ever will.
        never = ("unverified" + (f" twin {c['twin']}" if c.get("twin") else "")
                 if c["state"] == "built" and c.get("unverified") else "-")
        for b, v in columns:
            if b == backend:
                row.setdefault(f"{b} {v}", never)
        rows.append(row)
    headers = [f"{b} {v}" for b, v in columns]
    _table_with_headers(rows, ["model", "tags", "target", "built_with", *headers],
                        {h: f"{names.get(h.split()[0], h.split()[0])} {h.split()[1]}" for h in headers}
                        | {"built_with": "built with"})
    print("loads / fails: a probe loaded the artifact under that runtime, or failed to; -: not probed")
    if any(c["state"] == "built" and c.get("unverified") for c in cov["cells"]):
        print("unverified: no probe here can load it (weight-shared groups, LLMs, multi-SoC binaries): devices confirm it")
    _llm_legend(cov, parts=False)
    return 0


def _table_with_headers(rows: list[dict[str, Any]], columns: list[str], titles: dict[str, str]) -> None:
    """``table`` upper-cases column keys; these keys carry versions, so titles are given."""
    cells = [[titles.get(c, c).upper() for c in columns]] + [["" if r.get(c) is None else str(r[c]) for c in columns]
                                                            for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _registry(reg, args) -> int:  # type: ignore[no-untyped-def]
    from registry.verify import gc, to_dict, verify

    if args.action == "verify":
        with reg.db.session() as s:
            rep = verify(s, reg.store, full=not args.quick, repair=args.repair)
        if args.json:
            print(json.dumps({"ok": rep.ok, "full": not args.quick, **to_dict(rep)}, indent=2))
        else:
            print(f"checked {rep.artifacts} artifact(s), {rep.blobs} good blob(s), {human_size(rep.bytes)}"
                  f"{' (sizes only)' if args.quick else ''}")
            if rep.problems:
                table([p.__dict__ | {"artifact": p.artifact[7:19]} for p in rep.problems],
                      ["artifact", "file", "problem", "digest"])
            if rep.marked_broken:
                print(f"marked {len(rep.marked_broken)} artifact(s) broken: resolve will not serve them, "
                      "the next build of each replaces it")
            elif rep.problems and not args.repair:
                print("run with --repair to mark them broken", file=sys.stderr)
            if rep.cleared:
                print(f"cleared the broken mark of {len(rep.cleared)} artifact(s): their blobs are whole again")
            for key in rep.foreign:
                print(f"warning: {key} in the store is not a blob of ours (skipped)", file=sys.stderr)
        return 0 if rep.ok else 1
    with reg.db.session() as s:
        grep_ = gc(s, reg.store, grace=parse_duration(args.grace), dry_run=args.dry_run)
    if args.json:
        print(json.dumps({"dry_run": bool(args.dry_run), "grace_seconds": parse_duration(args.grace).total_seconds(),
                          **to_dict(grep_)}, indent=2))
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(f"scanned {grep_.scanned} blob(s), {grep_.referenced} referenced; {verb} {len(grep_.deleted)} "
              f"({human_size(grep_.freed_bytes)}); kept {grep_.kept_young} younger than {args.grace}; "
              f"aborted {grep_.aborted_uploads} stale upload(s)")
        for key in grep_.foreign:
            print(f"warning: {key} in the store is not a blob of ours (skipped)", file=sys.stderr)
    return 0


def _keys_local(args) -> int:  # type: ignore[no-untyped-def]
    from registry.signing import key_id, load_signer

    if not args.arg:
        raise UsageError(f"keys {args.action} needs a key path")
    path = Path(args.arg)
    if args.action == "create":
        from registry.signing import create_key

        if path.exists():
            raise UsageError(f"{path} exists; not overwriting a key")
        pub = create_key(path)
        if args.json:
            print(json.dumps({"private_key": str(path), "public_key": pub, "key_id": key_id(pub)}, indent=2))
            return 0
        print(f"private key {path} (keep it secret; FARM_SIGNING_KEY={path})")
        print(f"public key  {pub}  (id {key_id(pub)}; give it to devices: FARM_TRUSTED_KEYS={pub})")
        return 0
    signer = load_signer(path)
    if args.json:
        print(json.dumps({"public_key": signer.public_b64, "key_id": signer.key_id}, indent=2))
        return 0
    print(signer.public_b64)
    return 0


def _sign(reg, args, settings: Settings) -> int:  # type: ignore[no-untyped-def]
    from registry.index import add_signature, find_artifact
    from registry.signing import load_signer

    if not settings.signing_key:
        raise UsageError("FARM_SIGNING_KEY is not set", hint="farm keys create KEY; export FARM_SIGNING_KEY=KEY")
    if not args.arg:
        raise UsageError("keys sign needs an artifact id")
    signer = load_signer(settings.signing_key)
    with reg.db.session() as s:
        art = find_artifact(s, args.arg)
        add_signature(s, art.digest, signer.public_b64, signer.sign(art.digest))
        if args.json:
            print(json.dumps({"artifact": art.digest, "key_id": signer.key_id, "public_key": signer.public_b64},
                             indent=2))
        else:
            print(f"signed {art.digest} with key {signer.key_id}")
    return 0
