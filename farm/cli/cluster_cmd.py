"""Cluster commands: farm submit | status | worker | workers."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from farm.cli import table
from farm.cli.progress import ReleaseProgress, part_of
from farm.cli.remote import add_server_arguments, answer_of
from farm.core.settings import Settings
from farm.core.text import strip_ansi


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "submit":
        p.add_argument("model", nargs="?", help="path to the .onnx (external-data files beside it)")
        from farm.cli.build_cmd import add_group_arguments

        add_group_arguments(p)
        p.add_argument("--genai", metavar="DIR",
                       help="an exported static decoder pipeline: each part's prefill + decode one weight-shared "
                            "group build on the workers, the package assembled into one onnxruntime-genai folder "
                            "when its parts are done; with --server each file goes up once per digest, only those "
                            "the service lacks (docs/shipping-llm.md)")
        p.add_argument("--target", "-t", action="append", default=[], metavar="BACKEND:NAME")
        p.add_argument("--sdk", action="append", default=[], metavar="VERSION",
                       help="toolchain version(s) to build with (repeatable); default: every one a live worker serves")
        p.add_argument("--matrix", help="TOML file with targets = [...], sdks = [...], options = {k = v}")
        p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                       help="build option (repeatable), e.g. graph_optimization=3")
        p.add_argument("--require-full-offload", action="store_true",
                       help="answer unsupported-ops (naming the op types) for builds that leave any node on the "
                            "CPU; a gate on the answer, not a build input (-o require_full_offload=true is the same)")
        p.add_argument("--min-psnr", type=float, metavar="DB",
                       help="accuracy gate: a build whose context, run on the HTP simulator, gives an output below "
                            "DB PSNR against the CPU EP is answered accuracy-below-threshold (published anyway)")
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
        p.add_argument("--log-level", "--loglevel", dest="loglevel", default="INFO",
                       help="Celery's log level (INFO, DEBUG, WARNING, ...)")
    elif name == "workers":
        p.add_argument("--all", action="store_true", help="include stopped and dead workers")
        p.add_argument("--json", action="store_true")
        add_server_arguments(p)


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    if name == "worker":
        from workers.main import serve

        return serve(settings, args.backend, concurrency=args.concurrency, loglevel=args.loglevel)
    if name == "workers":
        return _workers(args, settings)
    if name == "submit" and getattr(args, "genai", None):
        return _submit_genai(args, settings)
    if name == "submit" and (args.graph or args.group_file):
        return _submit_group(args, settings)
    if getattr(args, "server", None):
        return _remote(name, args, settings)
    if name == "status":
        return _status(args, settings)
    if not args.model:
        from farm.core.errors import UsageError

        raise UsageError("the following arguments are required: model (or --graph NAME=PATH ...)",
                         hint="farm submit MODEL.onnx -t qnn:SM8650, or --graph NAME=PATH ...")
    return _submit(args, settings)


def _submit_group(args: argparse.Namespace, settings: Settings) -> int:
    """``farm submit --graph NAME=PATH ...``: a graph group as one release (farm.core.groups)."""
    from farm.cli.build_cmd import group_of
    from farm.core.errors import AccuracyUnverifiedError, UsageError
    from farm.pipeline.plan import submit_release

    if getattr(args, "matrix", None):
        raise UsageError("--matrix is not read for a graph group", hint="give its targets with -t and --sdk")
    if getattr(args, "min_psnr", None) is not None:
        raise AccuracyUnverifiedError("--min-psnr can't check a weight-shared graph group here: the x86_64 "
                                      "simulator cannot load weight-shared contexts",
                                      hint="drop it for a group; only a device can verify it")
    if getattr(args, "server", None):
        return _submit_group_remote(args, settings)
    group = group_of(args, settings)
    try:
        st = submit_release(settings, group, list(args.target), list(args.sdk), list(args.option), name=args.name,
                            tag=args.tag, allow_queue=args.allow_queue, retry_failed=args.retry_failed,
                            force_tag=args.force_tag, require_full_offload=args.require_full_offload)
    finally:
        group.cleanup()  # its temporary group.json, however the submit ends
    if not args.json:
        print(f"release {st.release_id} ({st.model}): group of {len(group.names)} graphs "
              f"({', '.join(group.names)}): {_counts_text(st.builds)}", file=sys.stderr)
    answered = answered_builds(st)
    st = _wait_local(settings, st, args)
    doc = release_json(st.release_id, st.model, st.builds)
    doc["graphs"] = group.names
    _show_release(doc, args.json, header=False, answered=answered)  # the release line went to stderr
    return 0 if doc["ok"] or not args.wait else 1


def _wait_local(settings: Settings, st: Any, args: argparse.Namespace) -> Any:
    """--wait on the index: a row per build as it changes (not minutes of silence); builds final
    when submitted are answers from the index, shown as cached."""
    if not args.wait:
        return st
    with ReleaseProgress(live=False if args.json else None) as progress:
        progress.submitted(st)
        if not st.done:
            # Only now: a release answered from the index (farm.pipeline.cached) imports no SQLAlchemy.
            from farm.pipeline.plan import wait_release

            st = wait_release(settings, st.release_id, timeout=args.timeout, on_change=progress)
    return st


def _submit_genai(args: argparse.Namespace, settings: Settings) -> int:
    """``farm submit --genai DIR``: a genai package as one release on the cluster
    (farm.pipeline.genai.submit_package): its parts' group builds and the package's builds."""
    from farm.core.errors import UsageError
    from farm.pipeline.genai import submit_package

    if args.model or args.graph or args.group_file or getattr(args, "matrix", None):
        raise UsageError("--genai DIR is the whole model: give no model path, --graph or --matrix with it",
                         hint="farm submit --genai EXPORT_DIR -t qnn:SM8650 --name llm/tiny --tag t")
    if args.min_psnr is not None or args.require_full_offload:
        raise UsageError("--min-psnr/--require-full-offload gate one context; a genai package carries its twin")
    from farm.core.capabilities import check_genai_backends
    from farm.pipeline.submission import parse_targets

    check_genai_backends([t.backend for t in parse_targets(list(args.target))])  # before a byte is read or sent
    if getattr(args, "server", None):
        return _submit_genai_remote(args, settings)
    st = submit_package(settings, args.genai, list(args.target), list(args.sdk), list(args.option), name=args.name,
                        tag=args.tag, allow_queue=args.allow_queue, retry_failed=args.retry_failed,
                        force_tag=args.force_tag, warn=_warn)
    if not args.json:
        print(f"release {st.release_id} ({st.model}): genai package: {_counts_text(st.builds)}", file=sys.stderr)
    answered = answered_builds(st)
    st = _wait_local(settings, st, args)
    doc = release_json(st.release_id, st.model, st.builds, tag_moved=getattr(st, "tag_moved", None))
    _show_release(doc, args.json, header=False, answered=answered)  # the release line went to stderr
    return 0 if doc["ok"] or not args.wait else 1


def _submit_genai_remote(args: argparse.Namespace, settings: Settings) -> int:
    """Through the service: the export read here first (a folder that can't be mapped is
    ``bad-genai`` naming the file, before anything is sent), each of its files asked for by
    digest and sent only when the service lacks it (``PUT /v1/blobs/DIGEST``: a data file both
    graphs of a part share goes up once), then ``POST /v1/genai`` names them; the answer is the
    release, followed as any release."""
    import time

    from farm.client import Client
    from farm.core import genai
    from farm.core.digests import file_digests, memo_path
    from farm.core.options import parse_pairs

    t = time.perf_counter()
    export = genai.read_export(Path(args.genai))
    names: list[str] = [genai.CONFIG_FILE]
    for stage in export.stages:
        names += [n for n in (stage.graph.file, *stage.graph.data) if n not in names]
    names += [n for n in export.tokenizer if n not in names]
    paths = [export.path(n) for n in names]
    digests = file_digests(paths, memo_path(settings.home))
    client = Client(args.server, args.token)
    files, nbytes = client.send_blobs([(p, d, size) for p, (d, size) in zip(paths, digests, strict=True)])
    if not args.json:
        print(f"genai export: {len(names)} files, {files} sent ({nbytes / 2**20:.1f} MiB), the others held by the "
              f"service ({time.perf_counter() - t:.2f} s)", file=sys.stderr)
    st = _post_genai(client, {
        "files": [{"name": n, "digest": d, "size": size} for n, (d, size) in zip(names, digests, strict=True)],
        "targets": list(args.target), "sdks": list(args.sdk), "options": parse_pairs(args.option),
        "name": args.name, "tag": args.tag, "allow_queue": args.allow_queue, "retry_failed": args.retry_failed,
        "force_tag": args.force_tag})
    if not isinstance(st, dict) or not isinstance(st.get("builds"), list):
        from farm.core.errors import ServerError

        raise ServerError("the answer to POST /v1/genai is not a release")
    if moved := st.get("tag_moved"):
        print(f"moved {moved['tag']}: {moved['from']} -> {moved['to']}", file=sys.stderr)
    for line in st.get("warnings") or []:
        _warn(str(line))
    if not args.json:
        print(f"release {st['release']} ({st['model']}): genai package: {_counts_text(st['builds'])}", file=sys.stderr)
    answered = answered_builds(st)
    st = _wait_remote(client, st, args)
    doc = release_json(st["release"], st["model"], st["builds"], tag_moved=st.get("tag_moved"))
    doc["uploaded_bytes"] = client.sent
    _show_release(doc, args.json, header=False, answered=answered)  # the release line went to stderr
    return 0 if doc["ok"] or not args.wait else 1


def _warn(line: str) -> None:
    """One warning line on stderr (an SDK left out of an LLM release), before anything is followed."""
    from farm.core.text import strip_ansi

    print(f"warning: {strip_ansi(line)[:2000]}", file=sys.stderr, flush=True)


def _post_genai(client: Any, body: dict[str, Any]) -> Any:
    """``POST /v1/genai``; a service that predates it says so (not a bare HTTP 404)."""
    from farm.core.errors import ServerError, UsageError

    try:
        return client.json("POST", "/v1/genai", body)
    except ServerError as exc:
        if "HTTP 404" in exc.message or "HTTP 405" in exc.message:
            raise UsageError("this service takes no genai packages (it predates POST /v1/genai)",
                             hint="upgrade the service, or run farm submit --genai where the index is") from None
        raise


def _wait_remote(client: Any, st: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """--wait through the service: a row per build as it changes (not minutes of silence);
    builds final when submitted are answers from the index, shown as cached."""
    from farm.client import wait_release

    if not args.wait:
        return st
    with ReleaseProgress(live=False if args.json else None) as progress:
        progress.submitted(st)
        if not st.get("done"):
            st = wait_release(client, st["release"], timeout=args.timeout, on_change=progress)
    return st


def _submit_group_remote(args: argparse.Namespace, settings: Settings) -> int:
    """Through the service: each graph sent as a model of its own (hash first; nothing sent for
    one the service holds), then ``POST /v1/groups`` names them in order, then the release."""
    from farm.client import Client
    from farm.core.errors import FarmError, UsageError
    from farm.core.groups import check_members, parse_graph_args, read_group_file
    from farm.core.options import parse_pairs

    if args.model:
        raise UsageError("give the models either as paths or as --graph NAME=PATH, not both")
    members = check_members(parse_graph_args(args.graph) + (read_group_file(args.group_file) if args.group_file else []))
    client = Client(args.server, args.token)
    quiet = argparse.Namespace(**{**vars(args), "name": None, "tag": None, "force_tag": False})
    graphs = []
    for graph, path in members:
        try:
            _check_model_path(Path(path))
            graphs.append({"name": graph, "model": send_model(client, Path(path), quiet, settings)["digest"]})
        except FarmError as exc:
            exc.message = f"graph {graph!r}: {exc.message}"
            raise
    group = client.json("POST", "/v1/groups", {"graphs": graphs, "name": args.name, "tag": args.tag,
                                                "force_tag": args.force_tag})
    st = client.json("POST", "/v1/releases", {
        "model": group["digest"], "targets": list(args.target), "sdks": list(args.sdk),
        "options": parse_pairs(args.option), "allow_queue": args.allow_queue, "retry_failed": args.retry_failed,
        **({"require_full_offload": True} if args.require_full_offload else {})})
    if not args.json:
        print(f"release {st['release']} ({group['digest'][:19]}): group of {len(graphs)} graphs "
              f"({', '.join(g['name'] for g in graphs)}): {_counts_text(st['builds'])}", file=sys.stderr)
    answered = answered_builds(st)
    st = _wait_remote(client, st, args)
    doc = release_json(st["release"], st["model"], st["builds"], tag_moved=group.get("tag_moved"))
    doc["graphs"] = [g["name"] for g in graphs]
    _show_release(doc, args.json, header=False, answered=answered)  # the release line went to stderr
    return 0 if doc["ok"] or not args.wait else 1


def _remote(name: str, args: argparse.Namespace, settings: Settings | None = None) -> int:
    """submit/status through the HTTP service: no database, broker or store credentials."""
    from farm.client import Client
    from farm.core.options import parse_pairs

    client = Client(args.server, args.token)
    if name == "submit":
        if not args.model:
            from farm.core.errors import UsageError

            raise UsageError("the following arguments are required: model (or --graph NAME=PATH ...)",
                             hint="farm submit MODEL.onnx -t qnn:SM8650, or --graph NAME=PATH ...")
        _check_model_path(Path(args.model))
    if name == "status":
        if args.build is not None:
            info = client.json("GET", f"/v1/builds/{args.build}")
            with answer_of("status"):
                log = info.pop("log", None)
                _show_build(info, log if args.log else None, args.json)
            return 0
        if args.release is None:
            from farm.core.errors import UsageError

            raise UsageError("which release? farm status RELEASE_ID (or --build BUILD_ID)")
        st = client.json("GET", f"/v1/releases/{args.release}")
        with answer_of("status"):
            doc = release_json(st["release"], st["model"], st["builds"])
            _show_release(doc, args.json)
        return 0 if doc["ok"] or not doc["done"] else 1
    model = send_model(client, Path(args.model), args, settings)
    if moved := model.get("tag_moved"):
        print(f"moved {moved['tag']}: {moved['from']} -> {moved['to']}", file=sys.stderr)
    st = client.json("POST", "/v1/releases", {
        "model": model["digest"], "targets": list(args.target), "sdks": list(args.sdk),
        "options": parse_pairs(args.option), "allow_queue": args.allow_queue, "retry_failed": args.retry_failed,
        **({"require_full_offload": True} if args.require_full_offload else {}),
        **({"min_psnr": args.min_psnr} if args.min_psnr is not None else {})})
    if not args.json:
        print(f"release {st['release']} ({st['model']}): {_counts_text(st['builds'])}", file=sys.stderr)
    answered = answered_builds(st)
    st = _wait_remote(client, st, args)
    doc = release_json(st["release"], st["model"], st["builds"], tag_moved=model.get("tag_moved"))
    _show_release(doc, args.json, header=False, answered=answered)
    if args.wait:
        return 0 if doc["ok"] else 1
    return 0


ONE_REQUEST_MAX = 8 * 1024 * 1024  # a lone .onnx up to this size is uploaded in one request


def send_model(client: Any, path: Any, args: argparse.Namespace, settings: Settings | None) -> dict[str, Any]:
    """Hash first, then send only what the service lacks: a .onnx bundle's digest (remembered by
    its files' stat under FARM_HOME/cache, so an unchanged multi-GiB model is not read again) is
    offered with ``POST /v1/models/DIGEST``; only when the service does not hold it is the bundle
    uploaded (streamed; external data in a tar written on the way), through a resumable session,
    or in one request for a lone .onnx up to ``ONE_REQUEST_MAX``. An archive is uploaded as it is."""
    import time

    if path.suffix.lower() != ".onnx":
        return dict(client.upload(path, name=args.name, tag=args.tag, force_tag=args.force_tag))
    from farm.core.digests import local_bundle, memo_path

    t = time.perf_counter()
    memo = memo_path(settings.home) if settings is not None else None
    bundle = local_bundle(path, memo)
    held = client.held(bundle.digest, name=args.name, tag=args.tag, force_tag=args.force_tag)
    if held is not None:
        if not args.json:
            print(f"model {bundle.digest[:19]} ({bundle.size / 2**20:.1f} MiB) is held by the service: nothing "
                  f"uploaded ({time.perf_counter() - t:.2f} s)", file=sys.stderr)
        return held
    if len(bundle.files) > 1 and any(client.blob_held(d) for _, d, _ in bundle.files[1:]):
        # External data the service holds already (a data file the group's other graph shares):
        # only the files it lacks go up, each by its digest, then the model is recorded from them.
        by_name = dict(bundle.members)
        _, nbytes = client.send_blobs([(by_name[n], d, size) for n, d, size in bundle.files])
        model = client.json("POST", f"/v1/models/{bundle.digest}",
                            {"files": [{"path": n, "digest": d, "size": size} for n, d, size in bundle.files]},
                            name=args.name, tag=args.tag, force_tag="true" if args.force_tag else None)
        if not isinstance(model, dict) or model.get("digest") != bundle.digest:
            from farm.core.errors import ServerError

            raise ServerError("the answer to a model recorded from blobs names another model")
        if not args.json:
            print(f"uploaded {nbytes / 2**20:.1f} MiB (its other files are held by the service) in "
                  f"{time.perf_counter() - t:.2f} s", file=sys.stderr)
        return dict(model)
    # Resumable: the session of an upload of this bundle cut short earlier goes on where it stopped.
    sessions = settings.home / "cache" / "uploads.json" if settings is not None else None
    known = _load_json(sessions)
    if len(bundle.members) == 1 and bundle.size <= ONE_REQUEST_MAX and bundle.digest not in known:
        # A small lone .onnx goes in one request (POST /v1/models) rather than three (open a
        # session, send, complete): resending it whole after a cut costs less than the session.
        model = dict(client.upload_bundle(bundle.members, name=args.name, tag=args.tag, force_tag=args.force_tag))
        if not args.json:
            print(f"uploaded {bundle.size / 2**20:.1f} MiB in {time.perf_counter() - t:.2f} s", file=sys.stderr)
        return model

    def remember(session: str) -> None:
        if sessions is not None:
            _save_json(sessions, {**_load_json(sessions), bundle.digest: session})

    model = dict(client.upload_resumable(bundle.members, name=args.name, tag=args.tag, force_tag=args.force_tag,
                                         session=known.get(bundle.digest), on_session=remember))
    if sessions is not None:
        _save_json(sessions, {k: v for k, v in _load_json(sessions).items() if k != bundle.digest})
    if not args.json:
        print(f"uploaded {bundle.size / 2**20:.1f} MiB in {time.perf_counter() - t:.2f} s", file=sys.stderr)
    return model


def _load_json(path: Any) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_json(path: Any, data: dict[str, Any]) -> None:
    import os

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass  # an upload that can't be remembered starts over if cut: nothing else


def release_json(release: int, model: str, builds: list[dict[str, Any]], *,
                 tag_moved: dict[str, str] | None = None) -> dict[str, Any]:
    """`farm submit --json` and `farm status RELEASE --json` (schemas: submit.json, status.json),
    the same document whether the release was read from the index or through the service."""
    rows = [build_json(b) for b in builds]
    counts: dict[str, int] = {}
    for b in rows:
        counts[b["state"]] = counts.get(b["state"], 0) + 1
    from farm.cli.offload import warnings_of

    return {"release": int(release), "model": model, "done": all(b["state"] in FINAL for b in rows),
            "ok": all(b["state"] == "succeeded" for b in rows), "counts": counts, "tag_moved": tag_moved,
            "builds": rows, "warnings": warnings_of(rows, ("succeeded",))}


FINAL = ("succeeded", "failed")


def build_json(b: dict[str, Any]) -> dict[str, Any]:
    """One build as status shows it: typed, no escape sequences in the error message."""
    state = getattr(b["state"], "value", b["state"])
    return {"build": int(b["build"]), "target": b["target"], "toolchain": b["toolchain"], "state": str(state),
            "note": b.get("note"), "attempts": int(b["attempts"]), "error_code": b.get("error_code"),
            "error_message": None if b.get("error_message") is None else strip_ansi(b["error_message"]),
            "artifact": b.get("artifact"),
            "compile_seconds": None if b.get("compile_seconds") is None else float(b["compile_seconds"]),
            "worker": b.get("worker"), **_placement(b), "part": part_of(b)}


def _placement(b: dict[str, Any]) -> dict[str, Any]:
    """A build's ``nodes_cpu`` and ``cpu_op_types`` (from the index or a service: checked types)."""
    n = b.get("nodes_cpu")
    ops = b.get("cpu_op_types")
    return {"nodes_cpu": n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None,
            "cpu_op_types": [str(o)[:64] for o in ops[:64] if isinstance(o, str)] if isinstance(ops, list) else None}


def _counts_text(builds: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for b in builds:
        state = str(getattr(b["state"], "value", b["state"]))
        counts[state] = counts.get(state, 0) + 1
    return f"{len(builds)} build(s): " + ", ".join(f"{n} {s}" for s, n in counts.items()) if builds else "no builds"


def answered_builds(st: Any) -> set[int]:
    """The builds a submit's answer already has final: answered from the index, not built for
    this release (`farm build` calls them ``cached``)."""
    builds = st.builds if hasattr(st, "builds") else st["builds"]
    return {int(b["build"]) for b in builds if str(getattr(b["state"], "value", b["state"])) in FINAL}


def _state_text(b: dict[str, Any], answered: frozenset[int] | set[int]) -> str:
    if b["state"] == "succeeded" and b["build"] in answered:
        return "cached"
    return (b["state"] + (f" ({b['error_code']})" if b["error_code"] else "") + (f": {b['note']}" if b["note"] else "")
            + (" (answered from the index)" if b["build"] in answered else ""))


def _show_release(doc: dict[str, Any], as_json: bool, *, header: bool = True,
                  answered: frozenset[int] | set[int] = frozenset()) -> None:
    """The release table; ``answered``: builds final when it was submitted, shown as cached."""
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    if header:
        print(f"release {doc['release']} ({doc['model']}): {_counts_text(doc['builds'])}")
    rows = [{"build": b["build"], "part": b.get("part") or "", "target": b["target"], "toolchain": b["toolchain"],
             "state": _state_text(b, answered),
             "attempts": b["attempts"], "artifact": (b["artifact"] or "")[7:19],
             "compile_s": f"{b['compile_seconds']:.2f}" if b["compile_seconds"] is not None else ""}
            for b in doc["builds"]]
    # A genai package's release: which build is the package and which compiles each part.
    part = ["part"] if any(b.get("part") for b in doc["builds"]) else []
    table(rows, ["build", *part, "target", "toolchain", "state", "attempts", "artifact", "compile_s"])
    for b in doc["builds"]:
        if b["state"] == "failed":
            print(f"error[{b['error_code']}] {b['target']} {b['toolchain']}: {b['error_message']}", file=sys.stderr)
    from farm.cli.offload import print_warnings

    print_warnings(doc.get("warnings") or [])


def _submit(args: argparse.Namespace, settings: Settings) -> int:
    from farm.pipeline.cached import resubmit

    _check_model_path(Path(args.model))

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
    kwargs: dict[str, Any] = {"name": args.name, "tag": args.tag, "allow_queue": args.allow_queue,
                              "retry_failed": args.retry_failed, "force_tag": args.force_tag,
                              "require_full_offload": args.require_full_offload, "min_psnr": args.min_psnr}
    # A release the index answers whole is recorded over a bare connection (no SQLAlchemy, boto3
    # or Celery imported); anything else takes the full path.
    st = resubmit(settings, args.model, targets, sdks, options, **kwargs)
    if st is None:
        from farm.pipeline.plan import submit_release

        st = submit_release(settings, args.model, targets, sdks, options, **kwargs)
    if st.tag_moved:
        print(f"moved {st.tag_moved['tag']}: {st.tag_moved['from']} -> {st.tag_moved['to']}", file=sys.stderr)
    tag_moved = st.tag_moved
    if not args.json:
        print(f"release {st.release_id} ({st.model}): {_counts_text(st.builds)}", file=sys.stderr)
    answered = answered_builds(st)
    st = _wait_local(settings, st, args)  # a live table on a terminal; a line per state change otherwise
    doc = release_json(st.release_id, st.model, st.builds, tag_moved=tag_moved)
    _show_release(doc, args.json, header=False, answered=answered)
    if args.wait:
        return 0 if doc["ok"] else 1
    return 0


def _status(args: argparse.Namespace, settings: Settings) -> int:
    from farm.core.errors import UsageError

    if args.build is None and args.release is None:
        raise UsageError("which release? farm status RELEASE_ID (or --build BUILD_ID)")
    what = f"build {args.build}" if args.build is not None else f"release {args.release}"
    _local_ids(what, settings)
    if args.build is not None:
        from farm.pipeline.plan import build_view, check_id
        from registry.index import Registry, artifact_for_build, get_build

        check_id(args.build, "build")
        reg = Registry.open(settings)
        try:
            with reg.db.session() as s, _ids_on_a_server(what):
                b = get_build(s, args.build)
                art = artifact_for_build(s, b.id)
                info = {**build_view(b, art), "key": b.build_key, "model": b.model_digest, "options": b.options,
                        "queue": b.queue, "phases": b.phases}
                text_log = b.log or ""
        finally:
            reg.close()
        _show_build(info, text_log if args.log else None, args.json)
        return 0
    from farm.pipeline.plan import release_status

    with _ids_on_a_server(what):
        st = release_status(settings, args.release)
    doc = release_json(st.release_id, st.model, st.builds)
    _show_release(doc, args.json)
    return 0 if doc["ok"] or not doc["done"] else 1


_SERVER_HINT = ("release and build ids live where they were submitted: a service numbers its own. Ask it: "
                "farm status ID --server http://farm:8080 (or export FARM_SERVER, FARM_TOKEN)")


def _local_ids(what: str, settings: Settings) -> None:
    """`farm status ID` with no server and no index here: no release can be here, and opening the
    index would create an empty one. Say where release ids live instead."""
    from farm.core.errors import NotFoundError

    url = settings.database_url
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise NotFoundError(f"no {what} here: no server is configured (--server, FARM_SERVER) and this machine "
                            "has no index", hint=_SERVER_HINT)


@contextmanager
def _ids_on_a_server(what: str) -> Iterator[None]:
    """A release or build this index does not hold: perhaps it is a service's."""
    from farm.core.errors import NotFoundError

    try:
        yield
    except NotFoundError as exc:
        if exc.message.startswith(f"no {what.split()[0]} "):
            raise NotFoundError(f"no {what} in this machine's index (no server configured: --server, FARM_SERVER)",
                                hint=_SERVER_HINT) from None
        raise


# Phases that are counts, not milliseconds (by their last dotted part: ``child.page_faults``).
COUNT_PHASES = frozenset({"page_faults"})
# ... and those whose name ends in their unit (``child.peak_rss_kib``): shown in that unit.
SIZE_SUFFIXES = {"_kib": 1024, "_mib": 1 << 20, "_mb": 1 << 20, "_bytes": 1}


def phase_text(name: str, value: Any) -> str:
    """``ep_compile 5213.4 ms``, ``child.page_faults 4559`` (a count), ``child.peak_rss_kib
    412.5 MiB`` (a size, in KiB or MiB as it reads best), ``bundle_cache hit``. Time is ms."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} {value}"
    last = name.rsplit(".", 1)[-1]
    if last in COUNT_PHASES:
        return f"{name} {int(value)}"
    unit = next((u for suffix, u in SIZE_SUFFIXES.items() if last.endswith(suffix)), None)
    if unit is not None:
        size = float(value) * unit
        if size < 1 << 20:
            return f"{name} {size / 1024:.1f} KiB" if size >= 1024 else f"{name} {int(size)} bytes"
        return f"{name} {size / (1 << 20):.1f} MiB"
    return f"{name} {value:g} ms"


def _show_build(info: dict[str, Any], log: str | None, as_json: bool) -> None:
    """`farm status --build ID`: a two-column table of what is known (nothing shown as None), or
    the typed document (schema: status-build.json)."""
    doc: dict[str, Any] = build_json(info)
    doc.update({k: info[k] for k in ("key", "model", "options", "queue", "phases") if k in info})
    if log is not None:
        doc["log"] = strip_ansi(log)
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    rows: list[dict[str, Any]] = []

    def add(field: str, value: Any) -> None:
        if value is not None and value != "" and value != {} and value != []:
            rows.append({"field": field, "value": value})

    add("build", doc["build"])
    add("target", doc["target"])
    add("toolchain", doc["toolchain"])
    add("state", doc["state"] + (f" ({doc['note']})" if doc["note"] else ""))
    add("attempts", doc["attempts"])
    if doc["error_code"]:
        add("error", f"[{doc['error_code']}] {doc['error_message'] or ''}".strip())
    add("artifact", doc["artifact"])
    if doc["compile_seconds"] is not None:
        add("compile", f"{doc['compile_seconds']:.3f} s")
    add("worker", doc["worker"])
    add("model", doc.get("model"))
    add("key", doc.get("key"))
    add("queue", doc.get("queue"))
    options = doc.get("options") or {}
    add("options", " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(options.items())))
    phases = doc.get("phases") or {}
    # Where the last attempt's time went (farm.pipeline.execute.Phases): ms, but for the counts.
    add("phases", ", ".join(phase_text(n, t) for n, t in phases.items() if n != "uploads"))
    if isinstance(phases.get("uploads"), dict):
        add("uploads", ", ".join(phase_text(n, t) for n, t in phases["uploads"].items()))
    for r in rows:
        print(f"{r['field']:10s} {r['value']}")
    if log is not None:
        print(doc["log"], end="" if doc["log"].endswith("\n") else "\n")


def _workers(args: argparse.Namespace, settings: Settings) -> int:
    if args.server:
        from farm.cli.remote import client

        rows = client(args).json("GET", "/v1/workers", all="true" if args.all else None)
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            from farm.core.errors import ServerError

            raise ServerError("the service's worker list is not a JSON array of objects")
    else:
        from registry.index import Registry
        from registry.views import worker_rows

        reg = Registry.open(settings)
        try:
            with reg.db.session() as s:
                rows = worker_rows(s, stale_after=settings.worker_stale_after, include_all=args.all)
        finally:
            reg.close()
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        from farm.cli.registry_cmd import _when
        from farm.cli.remote import answer_of
        from farm.core.capabilities import ALL, short_list

        with answer_of("workers"):
            cells = [{**r, "ep": f"{r.get('ep_package')} {r.get('ep_version')}", "started": _when(r.get("started_at")),
                      "last_seen": f"{float(r.get('last_seen_seconds') or 0):.0f} s ago",
                      "makes": "?" if r.get("makes") is None else short_list([c for c in r["makes"] if c in ALL]),
                      "queues": " ".join(map(str, r.get("queues") or []))} for r in rows]
        table(cells, ["worker", "state", "toolchain", "onnxruntime", "ep", "makes", "jobs", "started", "last_seen",
                      "queues"])
        _print_lacks(rows)
    else:
        print("no workers registered" if args.all else "no live workers (--all shows stopped and dead ones)")
    return 0


def _print_lacks(rows: list[dict[str, Any]]) -> None:
    """Under the table, once per toolchain: why its workers can't make what the others make."""
    from farm.core.text import strip_ansi

    said: set[tuple[str, str, str]] = set()
    for r in rows:
        lacks = r.get("lacks")
        for cap, why in sorted(lacks.items() if isinstance(lacks, dict) else []):
            key = (str(r.get("toolchain")), str(cap), str(why))
            if cap == "genai-package" and key not in said and r.get("state") == "live":
                said.add(key)
                print(f"{str(r.get('backend')).upper()} {strip_ansi(key[0])} makes no genai package: "
                      f"{strip_ansi(key[2])[:300]}")


def _check_model_path(path: Path) -> None:
    """The model file, checked before anything is sent: a missing or unreadable path is
    ``invalid-model`` (as `farm build` and a local `farm submit` say), not an I/O error."""
    from farm.core.errors import InvalidModelError

    if not path.exists():
        raise InvalidModelError(f"{path}: no such file")
    if not path.is_file():
        raise InvalidModelError(f"{path}: not a regular file")
    if not os.access(path, os.R_OK):
        raise InvalidModelError(f"{path}: cannot read the model (permission denied)")
