"""Device-side commands: farm resolve | fetch | load-check."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from farm.core.errors import UsageError
from farm.core.settings import Settings


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "load-check":
        p.add_argument("ctx_model", help="a *_ctx.onnx, or the DIR that farm install --dest DIR (or farm fetch) filled")
        p.add_argument("--target", "-t", required=True, help="the device, e.g. qnn:SM8650")
        p.add_argument("--json", action="store_true")
        return
    if name == "fetch":
        p.add_argument("artifact", nargs="?", help="an artifact id; or resolve from --model/--soc/--qnn")
    p.add_argument("--model", "-m", help="NAME:TAG, NAME or a model digest")
    p.add_argument("--soc", help="device SoC (Build.SOC_MODEL), e.g. SM8650 or snapdragon-8-gen-3")
    p.add_argument("--qnn", metavar="VERSION", help="QNN runtime SDK version on the device, e.g. 2.51.0")
    p.add_argument("--gpu", help="device GPU by compute capability, e.g. sm_89 (TensorRT)")
    p.add_argument("--trt", metavar="VERSION",
                   help="TensorRT runtime version on the device, all four parts (tensorrt.__version__), e.g. 10.14.1.48")
    p.add_argument("--platform", default="linux-x86-64", help="with --trt: the device's OS-CPU (default linux-x86-64)")
    p.add_argument("--json", action="store_true")
    if name == "fetch":
        p.add_argument("--dest", "-d", "--out", dest="out", required=True, metavar="DIR",
                       help="directory that will hold exactly this artifact (swapped into place atomically)")
        p.add_argument("--load-check", action="store_true",
                       help="load the fetched context model with the local toolchain and time it")
        p.add_argument("--require-signature", action="store_true",
                       help="refuse an artifact without a valid signature by a key in FARM_TRUSTED_KEYS")
        p.add_argument("--allow-unsigned", action="store_true",
                       help="with FARM_TRUSTED_KEYS set, accept an artifact that carries no signature at all")
    if name == "resolve":
        from farm.cli.service_cmd import add_server_arguments

        add_server_arguments(p)
        p.add_argument("--presign", type=int, metavar="TTL_S",
                       help="add presigned GET URLs (S3 stores) valid for TTL_S seconds, for devices to fetch directly")


def _device(args: argparse.Namespace) -> Any:
    from farm.core.catalog import load_catalog
    from farm.core.names import check_name
    from farm.pipeline.submission import check_versions
    from registry.resolve import Device

    if args.gpu or args.trt:
        if not args.gpu or not args.trt:
            raise UsageError("a GPU device is described by --gpu and --trt", hint="e.g. --gpu sm_89 --trt 10.14.1.48")
        check_versions([args.trt])
        check_name(args.platform)  # the same grammar: lowercase words joined by '-'
        return Device("trt", load_catalog().get(args.gpu, backend="trt"), f"{args.trt}+{args.platform}")
    if not args.soc or not args.qnn:
        raise UsageError("a device is described by --soc and --qnn (or --gpu and --trt)",
                         hint="e.g. --soc SM8650 --qnn 2.51.0")
    check_versions([args.qnn])
    return Device("qnn", load_catalog().get(args.soc, backend="qnn"), args.qnn)


def _resolve(reg: Any, args: argparse.Namespace) -> tuple[Any, Any, str]:
    from registry.index import resolve_model_ref
    from registry.resolve import FAIL_DEVICES, resolve

    if not args.model:
        raise UsageError("which model? give --model NAME:TAG (or a digest)")
    device = _device(args)
    with reg.db.session() as s:
        digest = resolve_model_ref(s, args.model)
        artifact, verdict = resolve(s, digest, device, model_label=args.model,
                                    fail_devices=getattr(args, "fail_devices", FAIL_DEVICES),
                                    prefer_fastest=getattr(args, "prefer_fastest", False))
        s.expunge_all()
    return artifact, verdict, digest


def _resolve_lite(settings: Settings, args: argparse.Namespace) -> bool:
    """``farm resolve`` on a bare connection to the index (``registry.lite``: no SQLAlchemy
    import), running the same resolve. False, having printed nothing, where only the full path
    answers: an index it cannot open (fresh, another schema, unreachable) or a reference that
    names no model (``resolve_model_ref`` explains the miss)."""
    from registry.lite import open_index
    from registry.reads import model_ref_hit
    from registry.resolve import resolve

    if not args.model:
        raise UsageError("which model? give --model NAME:TAG (or a digest)")
    device = _device(args)
    index = open_index(settings.database_url)
    if index is None:
        return False
    with index:
        digest = model_ref_hit(index, args.model)
        if digest is None:
            return False
        artifact, verdict = resolve(index, digest, device, model_label=args.model,
                                    fail_devices=settings.report_fail_devices,
                                    prefer_fastest=settings.resolve_prefer_fastest)
        from registry.reports import accuracy_brief

        accuracy = accuracy_brief(index, artifact.id)
    info = {**_resolved_info(artifact, verdict), "accuracy": accuracy}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_resolved(info)
    return True


def _resolved_info(artifact: Any, verdict: Any) -> dict[str, Any]:
    from registry.resolve import describe

    info = describe(artifact, verdict)
    info["files"] = [{"name": f.name, "digest": f.digest, "size": f.size}
                     for f in artifact.files if f.role in ("ctx-model", "context")]
    return info


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    args.fail_devices = settings.report_fail_devices  # resolve skips what this many devices saw fail
    args.prefer_fastest = settings.resolve_prefer_fastest
    if name == "load-check":
        return _load_check(args)
    if name == "resolve" and getattr(args, "server", None):
        from farm.client import Client, check_answer, question

        # A device's question to a service it does not trust: the answer is checked and bound
        # to the question as `farm install` does, and its text cleaned before it is printed.
        asked = question(args.model, args.soc, args.qnn, args.gpu, args.trt, args.platform)
        info = check_answer(Client(args.server, args.token).json(
            "GET", "/v1/resolve", model=args.model, soc=args.soc, qnn=args.qnn, gpu=args.gpu, trt=args.trt,
            platform=args.platform if args.gpu else None, manifest="true" if args.json else "false"), asked)
        info["files"] = _answered_files(info.get("files"))
        if args.json:
            print(json.dumps(info, indent=2))
        else:
            _print_resolved(info)
        return 0
    if name == "resolve" and not args.presign and _resolve_lite(settings, args):
        return 0
    from registry.index import Registry, find_artifact

    reg = Registry.open(settings)
    try:
        if name == "resolve":
            artifact, verdict, _ = _resolve(reg, args)
            info = _resolved_info(artifact, verdict)
            from registry.lite import SessionRows
            from registry.reports import accuracy_brief

            with reg.db.session() as s:
                info["accuracy"] = accuracy_brief(SessionRows(s), artifact.id)
            if args.presign:
                presign = getattr(reg.store, "presign", None)
                if presign is None:
                    raise UsageError("this store cannot presign URLs", hint="presigned URLs need an s3:// store")
                # A URL serves the object as stored: ``encoding`` zstd for a blob stored compressed
                # (digest and size are of the decoded file; `curl --compressed` decodes it).
                info["manifest_url"] = presign(artifact.digest, args.presign)
                if (encoding := reg.store.stat(artifact.digest).encoding) is not None:
                    info["manifest_encoding"] = encoding
                for f in info["files"]:
                    f["url"] = presign(f["digest"], args.presign)
                    if (encoding := reg.store.stat(f["digest"]).encoding) is not None:
                        f["encoding"] = encoding
            if args.json:
                print(json.dumps(info, indent=2))
            else:
                _print_resolved(info)
            return 0
        # fetch
        from registry.index import signatures_of
        from registry.install import Expected, fetch_artifact, receipt

        picked: dict[str, Any] | None = None
        if args.artifact:
            with reg.db.session() as s:
                artifact = find_artifact(s, args.artifact)
                s.expunge_all()
            expected = None
        else:
            from registry.resolve import describe

            artifact, verdict, model_digest = _resolve(reg, args)
            picked = {k: v for k, v in describe(artifact, verdict).items()
                      if k in ("verdict", "source", "reason", "probed_at")}
            # The manifest must be for the model that was asked for: a re-pointed index row can't
            # hand out another model's artifact, signed or not.
            expected = Expected(model_digest, artifact.backend, artifact.target, artifact.toolchain)
        with reg.db.session() as s:
            signatures = signatures_of(s, artifact.digest)
        result = fetch_artifact(reg.store, artifact, Path(args.out), expected=expected, signatures=signatures,
                                trusted=list(settings.trusted_keys),
                                require_signature=args.require_signature or settings.require_signature,
                                allow_unsigned=args.allow_unsigned or settings.allow_unsigned)
        from farm.cli import human_size

        doc = {**receipt(result, {}), "model": artifact.model_digest, "backend": artifact.backend,
               "target": artifact.target, "toolchain": artifact.toolchain, "picked": picked}
        signed = f", signed by {result.signed_by}" if result.signed_by else ""
        lines = [f"fetched {artifact.short_id} ({human_size(result.bytes)}, digests verified{signed}) "
                 f"-> {result.ctx_model}"] + ([f"  {_picked_text(picked)}"] if picked is not None else [])
        if args.load_check:
            from farm.core.catalog import load_catalog
            from farm.core.errors import FarmError

            target = load_catalog().get(f"{artifact.backend}:{artifact.target}")
            try:
                from farm.cli.folder_check import check_folder, is_folder_artifact

                if is_folder_artifact(result.ctx_model.parent):
                    # A graph group or genai package: every context in the folder, one outcome.
                    doc["load"] = check_folder(result.ctx_model.parent, target, checked_load)
                else:
                    doc["load"] = checked_load(result.ctx_model, target)
            except FarmError as exc:
                # The files are in place (digests verified); the load check failed: say both.
                if args.json:
                    exc.details = {**exc.details, "fetched": doc}
                else:
                    print("\n".join(lines))
                raise
            lines += folder_lines(doc["load"]) if "contexts" in doc["load"] else load_lines(doc["load"])
        print(json.dumps(doc, indent=2) if args.json else "\n".join(lines))
        return 0
    finally:
        reg.close()


def _answered_files(files: Any) -> list[dict[str, Any]]:
    """The files of a service's resolve answer, each field checked, for printing."""
    from farm.core.errors import ManifestError, ServerError
    from farm.core.untrusted import check_digest, check_file_name, check_size, clean_text

    if not isinstance(files, list) or len(files) > 4096 or not all(isinstance(f, dict) for f in files):
        raise ServerError("the resolve answer's files are malformed",
                          hint="the service sent an answer this client refuses: tell the service's operators")
    try:
        return [{"name": check_file_name(f.get("name")), "digest": check_digest(f.get("digest")),
                 "size": check_size(f.get("size")),
                 **({"url": clean_text(f["url"], 2000)} if isinstance(f.get("url"), str) else {}),
                 **({"encoding": clean_text(f["encoding"], 40)} if isinstance(f.get("encoding"), str) else {})}
                for f in files]
    except ManifestError as exc:
        raise ServerError(f"the resolve answer is malformed: {exc.message}",
                          hint="the service sent an answer this client refuses: tell the service's operators") from None


def _picked_text(info: dict[str, Any]) -> str:
    """``picked by probe: loaded under QNN 2.51.0 on 2026-11-22 07:07 UTC`` (or ``by rule: …``);
    cleaned: it may come from a service."""
    from farm.core.untrusted import clean_text

    return f"picked by {clean_text(info.get('source'), 40)}: {clean_text(info.get('reason'), 1000)}"


def _print_resolved(info: dict[str, Any]) -> None:
    from farm.cli import human_size

    runtime = {"qnn": "QNN", "trt": "TensorRT"}.get(info.get("backend", ""), "")
    print(f"{info['artifact'][7:19]}  {info.get('backend', '')}:{info['target']}  {runtime} {info['toolchain']}")
    print(f"  {_picked_text(info)}")
    from farm.cli.offload import offload_text

    if (partial := offload_text(info.get("offload"))) is not None:
        print(f"  {partial}")
    _print_lab(info)
    acc = info.get("accuracy")
    if isinstance(acc, dict):  # the local index's (the service's answer has none)
        figure = f"{acc.get('min_psnr_db')} dB (worst output {acc.get('worst_output')!r})" \
            if acc.get("status") == "ok" else str(acc.get("status"))
        print(f"  accuracy vs CPU on {acc.get('runtime')}: {figure}")
    for f in info["files"]:
        url = f"  {f['url']}" + (f" ({f['encoding']})" if f.get("encoding") else "") if f.get("url") else ""
        print(f"  {f['name']}  {human_size(f['size'])}  {f['digest']}{url}")
    if info.get("manifest_url") and "url" in (info["files"][0] if info["files"] else {}):
        from farm.core.untrusted import clean_text

        encoding = f" ({clean_text(info['manifest_encoding'], 40)})" if info.get("manifest_encoding") else ""
        print(f"  manifest  {clean_text(info['manifest_url'], 2000)}{encoding}")


def _print_lab(info: dict[str, Any]) -> None:
    """What enrolled devices of the device lab confirmed, and a pick made for speed
    (FARM_RESOLVE_PREFER_FASTEST); a service's answer: every field checked before it is shown."""
    from farm.core.untrusted import clean_text
    from registry.lab import cell_label

    for cell in info.get("device_lab") or []:
        if isinstance(cell, dict) and (label := cell_label(cell)):
            print(f"  device lab {clean_text(cell.get('soc'), 64)}: {label}")
    pref = info.get("preferred")
    if isinstance(pref, dict) and isinstance(pref.get("p50_ms"), int | float):
        over = pref.get("over_p50_ms")
        print(f"  preferred by device latency: p50 {float(pref['p50_ms']):g} ms over "
              f"{clean_text(pref.get('over'), 71)[7:19]} (QNN {clean_text(pref.get('over_toolchain'), 64)}"
              + (f", p50 {float(over):g} ms)" if isinstance(over, int | float) else ")"))


def checked_load(ctx_model: Path, target: Any) -> dict[str, Any]:
    """Load a context model for ``target`` with the local runtime and run it once; every way it
    would not work on the device is an error (not-found, not-a-context, target-mismatch,
    runtime-too-old, runtime-crashed, toolchain-error), never a zero exit."""
    from farm.core.errors import RuntimeCrashedError
    from workers.backends import get_runner, open_context

    runner = get_runner(target.backend)
    check = getattr(runner, "check_load", None)
    if check is not None:
        return dict(check(ctx_model, target))
    # A runner without its own check: the file checks every backend shares, then its load.
    open_context(ctx_model)
    result = dict(runner.load_check(ctx_model, target))
    if result.get("crashed"):
        raise RuntimeCrashedError(f"{ctx_model.name} loaded, then running it crashed the runtime: "
                                  f"{result['crashed']}", details=result)
    return {"ok": True, "ctx_model": str(ctx_model), "target": target.ref, **result}


def load_lines(load: dict[str, Any]) -> list[str]:
    """``loaded … in 93.3 ms on the QNN HTP simulator (x86_64), QNN 2.51.0; ran once in …`` and
    what the file says about itself."""
    runtime, context = load.get("runtime") or {}, load.get("context") or {}
    on = f" on the {runtime['device']}, QNN {runtime['sdk']}" if runtime.get("device") else ""
    ran = (f"; ran once in {load['run_seconds'] * 1000:.1f} ms, outputs {load['outputs']}"
           if "run_seconds" in load else "")
    lines = [f"loaded {load['ctx_model']} for {load['target']} in {load['load_seconds'] * 1000:.1f} ms{on}{ran}"]
    if context:
        said = [f"built with QNN {context['sdk']}" if context.get("sdk") else "",
                f"for {context['soc']} (HTP {context['htp_arch']})" if context.get("soc") else "",
                ", ".join(context.get("files") or []) or ("embedded" if context.get("embedded") else "")]
        lines.append("  context: " + ", ".join(b for b in said if b))
    lines += [f"  note: {n}" for n in load.get("notes") or []]
    return lines


def folder_lines(report: dict[str, Any]) -> list[str]:
    """A folder's load check: each context model's outcome, each CPU stage's presence."""
    loaded = sum(1 for c in report["contexts"] if c["outcome"] == "loads")
    stages = len(report["contexts"]) - loaded
    lines = [f"checked {report['folder']} ({report['kind']}) for {report['target']}: "
             f"{loaded} context model(s) loaded" + (f", {stages} cpu stage(s) present" if stages else "")]
    for c in report["contexts"]:
        lines.append(f"  {c['file']}: {c['outcome']}")
    return lines


def _load_check(args: argparse.Namespace) -> int:
    from farm.core.catalog import parse_target
    from farm.core.errors import MissingExtraError

    target = parse_target(args.target)
    ctx_model = Path(args.ctx_model)
    if ctx_model.is_dir() and (ctx_model / "model_ctx.onnx").is_file():
        ctx_model = ctx_model / "model_ctx.onnx"  # the DIR that `farm install --dest DIR` filled
    try:
        if ctx_model.is_dir():
            from farm.cli.folder_check import check_folder

            # A genai package or a graph group's folder: every context in it, one outcome.
            result = check_folder(ctx_model, target, checked_load)
            print(json.dumps(result, indent=2) if args.json else "\n".join(folder_lines(result)))
            return 0
        result = checked_load(ctx_model, target)
    except MissingExtraError as exc:
        # The runner says what a build host lacks; a device loads with the runtime it has.
        from farm.core.catalog.runtimes import qnn_map_text

        runtime = "onnxruntime-qnn" if target.backend == "qnn" else "onnxruntime-gpu and tensorrt"
        raise MissingExtraError(f"load-check loads the context with {runtime}, which is not installed in this "
                                f"Python ({exc.message})",
                                hint=(f"pip install the onnxruntime-qnn release of this device's QNN ({qnn_map_text()})"
                                      if target.backend == "qnn" else exc.hint)) from None
    print(json.dumps(result, indent=2) if args.json else "\n".join(load_lines(result)))
    return 0
