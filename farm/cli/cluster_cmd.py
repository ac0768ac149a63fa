"""Cluster commands: farm submit | status | worker | workers."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from farm.cli import table
from farm.cli.service_cmd import add_server_arguments
from farm.core.settings import Settings


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "submit":
        p.add_argument("model", help="path to the .onnx (external-data files beside it)")
        p.add_argument("--target", "-t", action="append", default=[], metavar="BACKEND:NAME")
        p.add_argument("--sdk", action="append", default=[], metavar="VERSION",
                       help="toolchain version(s) to build with (repeatable); default: every one a live worker serves")
        p.add_argument("--matrix", help="TOML file with targets = [...], sdks = [...], options = {k = v}")
        p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument("--name")
        p.add_argument("--tag")
        p.add_argument("--force-tag", action="store_true", help="move NAME:TAG if it points at another model")
        p.add_argument("--allow-queue", action="store_true",
                       help="accept toolchains no live worker serves (builds wait in their queue)")
        p.add_argument("--wait", action="store_true", help="show progress; exit 1 if any build fails")
        p.add_argument("--retry-failed", action="store_true", help="queue again builds that failed (any code)")
        p.add_argument("--timeout", type=float, help="with --wait: give up waiting after this many seconds")
        p.add_argument("--json", action="store_true")
        add_server_arguments(p)
    elif name == "status":
        p.add_argument("release", type=int, nargs="?", help="release id")
        p.add_argument("--build", type=int, help="one build instead of a release")
        p.add_argument("--log", action="store_true", help="with --build: print the build log")
        p.add_argument("--json", action="store_true")
        add_server_arguments(p)
    elif name == "worker":
        p.add_argument("--backend", choices=["qnn", "trt"], default="qnn")
        p.add_argument("--concurrency", type=int, default=1)
        p.add_argument("--loglevel", default="INFO")
    elif name == "workers":
        p.add_argument("--all", action="store_true", help="include stopped and dead workers")
        p.add_argument("--json", action="store_true")


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    if name == "worker":
        from workers.main import serve

        return serve(settings, args.backend, concurrency=args.concurrency, loglevel=args.loglevel)
    if name == "workers":
        return _workers(args, settings)
    if getattr(args, "server", None):
        return _remote(name, args)
    if name == "status":
        return _status(args, settings)
    return _submit(args, settings)


def _remote(name: str, args: argparse.Namespace) -> int:
    """submit/status through the HTTP service: no database, broker or store credentials."""
    from pathlib import Path
    from types import SimpleNamespace

    from farm.client import Client, wait_release
    from farm.core.options import parse_pairs

    client = Client(args.server, args.token)
    if name == "status":
        if args.build is not None:
            info = client.json("GET", f"/v1/builds/{args.build}")
            print(json.dumps(info, indent=2) if args.json else "\n".join(f"{k:14s} {v}" for k, v in info.items()
                                                                          if k != "log" or args.log))
            return 0
        if args.release is None:
            from farm.core.errors import UsageError

            raise UsageError("which release? farm status RELEASE_ID (or --build BUILD_ID)")
        st = client.json("GET", f"/v1/releases/{args.release}")
    else:
        model = client.upload(Path(args.model), name=args.name, tag=args.tag, force_tag=args.force_tag)
        if moved := model.get("tag_moved"):
            print(f"moved {moved['tag']}: {moved['from']} -> {moved['to']}", file=sys.stderr)
        st = client.json("POST", "/v1/releases", {
            "model": model["digest"], "targets": list(args.target), "sdks": list(args.sdk),
            "options": parse_pairs(args.option), "allow_queue": args.allow_queue, "retry_failed": args.retry_failed})
        if args.wait:
            st = wait_release(client, st["release"], timeout=args.timeout)
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        print(f"release {st['release']} ({st['model']})", file=sys.stderr)
        _print_status(SimpleNamespace(builds=st["builds"]))
    return 0 if st["ok"] or not st["done"] else 1


def _print_status(st: Any, out: Any = sys.stdout) -> None:
    rows = [{"build": b["build"], "target": b["target"], "toolchain": b["toolchain"],
             "state": b["state"] + (f" ({b['error_code']})" if b["error_code"] else "")
             + (f": {b['note']}" if b.get("note") else ""),
             "attempts": b["attempts"], "artifact": (b["artifact"] or "")[7:19],
             "compile_s": f"{b['compile_seconds']:.2f}" if b["compile_seconds"] is not None else ""}
            for b in st.builds]
    table(rows, ["build", "target", "toolchain", "state", "attempts", "artifact", "compile_s"], out=out)


def _submit(args: argparse.Namespace, settings: Settings) -> int:
    from farm.pipeline.plan import submit_release, wait_release

    targets, sdks, options = list(args.target), list(args.sdk), list(args.option)
    if args.matrix:
        import tomllib

        from farm.core.errors import BadOptionsError

        try:
            with open(args.matrix, "rb") as f:
                m = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise BadOptionsError(f"matrix file {args.matrix}: {exc}") from None
        targets += list(m.get("targets", []))
        sdks += list(m.get("sdks", []))
        options += [f"{k}={v}" for k, v in m.get("options", {}).items()]
    st = submit_release(settings, args.model, targets, sdks, options, name=args.name, tag=args.tag,
                        allow_queue=args.allow_queue, retry_failed=args.retry_failed, force_tag=args.force_tag)
    if st.tag_moved:
        print(f"moved {st.tag_moved['tag']}: {st.tag_moved['from']} -> {st.tag_moved['to']}", file=sys.stderr)
    if not args.json:
        print(f"release {st.release_id} ({st.model}): {len(st.builds)} build(s) {st.counts()}", file=sys.stderr)
    if args.wait:
        def show(s: Any) -> None:
            if not args.json:
                print(f"  release {s.release_id}: {s.counts()}", file=sys.stderr)

        st = wait_release(settings, st.release_id, timeout=args.timeout, on_change=show)
    if args.json:
        print(json.dumps({"release": st.release_id, "model": st.model, "builds": st.builds}, indent=2))
    else:
        _print_status(st)
        for b in st.builds:
            if b["state"] == "failed":
                print(f"error[{b['error_code']}] {b['target']} {b['toolchain']}: {b['error_message']}", file=sys.stderr)
    if args.wait:
        return 0 if st.ok else 1
    return 0


def _status(args: argparse.Namespace, settings: Settings) -> int:
    from farm.core.errors import UsageError

    if args.build is not None:
        from farm.pipeline.plan import build_view, check_id
        from registry.index import Registry, artifact_for_build, get_build

        check_id(args.build, "build")
        reg = Registry.open(settings)
        try:
            with reg.db.session() as s:
                b = get_build(s, args.build)
                art = artifact_for_build(s, b.id)
                info = {**build_view(b, art), "key": b.build_key, "model": b.model_digest, "options": b.options,
                        "queue": b.queue, "phases": b.phases}
                text_log = b.log or ""
        finally:
            reg.close()
        if args.json:
            print(json.dumps(info | ({"log": text_log} if args.log else {}), indent=2, default=str))
        else:
            for k, v in info.items():
                if k == "phases" and isinstance(v, dict):
                    # Where the last attempt's time went (farm.pipeline.execute.Phases), in ms.
                    print(f"{k:14s} " + ", ".join(f"{n} {t:g} ms" if isinstance(t, int | float) else f"{n} {t}"
                                                  for n, t in v.items() if n != "uploads"))
                    if v.get("uploads"):
                        print(f"{'uploads':14s} " + ", ".join(f"{n} {t:g} ms" for n, t in v["uploads"].items()))
                    continue
                print(f"{k:14s} {v}")
            if args.log:
                print(text_log)
        return 0
    if args.release is None:
        raise UsageError("which release? farm status RELEASE_ID (or --build BUILD_ID)")
    from farm.pipeline.plan import release_status

    st = release_status(settings, args.release)
    if args.json:
        print(json.dumps({"release": st.release_id, "model": st.model, "builds": st.builds}, indent=2))
    else:
        print(f"release {st.release_id} ({st.model}): {st.counts()}")
        _print_status(st)
    return 0 if st.ok or not st.done else 1


def _workers(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import UTC, datetime

    from registry.index import Registry, all_workers

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            now = datetime.now(UTC)
            rows = []
            for w in all_workers(s):
                seen = w.last_seen if w.last_seen.tzinfo else w.last_seen.replace(tzinfo=UTC)
                age = (now - seen).total_seconds()
                state = "stopped" if w.stopped_at else ("live" if age <= settings.worker_stale_after else "dead")
                if state != "live" and not args.all:
                    continue
                rows.append({"worker": w.name, "state": state, "backend": w.backend, "toolchain": w.toolchain,
                             "onnxruntime": w.ort_version, "ep": f"{w.ep_package} {w.ep_version}",
                             "host": w.host, "pid": w.pid, "jobs": w.jobs_done,
                             "started": w.started_at.strftime("%Y-%m-%d %H:%M:%S"), "last_seen_s": round(age, 1),
                             "queues": ",".join(w.queues)})
    finally:
        reg.close()
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        table(rows, ["worker", "state", "backend", "toolchain", "onnxruntime", "ep", "jobs", "last_seen_s", "queues"])
    else:
        print("no live workers" + ("" if args.all else " (--all shows stopped and dead ones)"))
    return 0
