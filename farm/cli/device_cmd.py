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
        p.add_argument("ctx_model", help="a *_ctx.onnx")
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
        p.add_argument("--out", "-o", required=True,
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
    from farm.pipeline.plan import check_versions
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
    from registry.resolve import resolve

    if not args.model:
        raise UsageError("which model? give --model NAME:TAG (or a digest)")
    device = _device(args)
    with reg.db.session() as s:
        digest = resolve_model_ref(s, args.model)
        artifact, verdict = resolve(s, digest, device, model_label=args.model)
        s.expunge_all()
    return artifact, verdict, digest


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    if name == "load-check":
        return _load_check(args)
    if name == "resolve" and getattr(args, "server", None):
        from farm.client import Client

        info = Client(args.server, args.token).json("GET", "/v1/resolve", model=args.model, soc=args.soc, qnn=args.qnn,
                                                    gpu=args.gpu, trt=args.trt,
                                                    platform=args.platform if args.gpu else None,
                                                    manifest="true" if args.json else "false")
        print(json.dumps(info, indent=2) if args.json else
              f"{info['artifact'][7:19]}  {info['target']}  {info['toolchain']}  ({info['source']}: {info['reason']})")
        return 0
    from registry.index import Registry, find_artifact

    reg = Registry.open(settings)
    try:
        if name == "resolve":
            artifact, verdict, _ = _resolve(reg, args)
            from registry.resolve import describe

            info = describe(artifact, verdict)
            info["files"] = [{"name": f.name, "digest": f.digest, "size": f.size}
                             for f in artifact.files if f.role in ("ctx-model", "context")]
            if args.presign:
                presign = getattr(reg.store, "presign", None)
                if presign is None:
                    raise UsageError("this store cannot presign URLs", hint="presigned URLs need an s3:// store")
                info["manifest_url"] = presign(artifact.digest, args.presign)
                for f in info["files"]:
                    f["url"] = presign(f["digest"], args.presign)
            if args.json:
                print(json.dumps(info, indent=2))
            else:
                print(f"{artifact.short_id}  {artifact.backend}:{artifact.target}  "
                      f"{'QNN' if artifact.backend == 'qnn' else 'TensorRT'} {artifact.toolchain}  "
                      f"({verdict.source}: {verdict.reason})")
                for f in info["files"]:
                    print(f"  {f['name']}  {f['size']} B  {f['digest']}")
            return 0
        # fetch
        from registry.index import signatures_of
        from registry.install import Expected, fetch_artifact, receipt

        if args.artifact:
            with reg.db.session() as s:
                artifact = find_artifact(s, args.artifact)
                s.expunge_all()
            expected = None
        else:
            artifact, _, model_digest = _resolve(reg, args)
            # The manifest must be for the model that was asked for: a re-pointed index row can't
            # hand out another model's artifact, signed or not.
            expected = Expected(model_digest, artifact.backend, artifact.target, artifact.toolchain)
        with reg.db.session() as s:
            signatures = signatures_of(s, artifact.digest)
        result = fetch_artifact(reg.store, artifact, Path(args.out), expected=expected, signatures=signatures,
                                trusted=list(settings.trusted_keys),
                                require_signature=args.require_signature or settings.require_signature,
                                allow_unsigned=args.allow_unsigned or settings.allow_unsigned)
        extra: dict[str, Any] = {}
        if args.load_check:
            from farm.core.catalog import load_catalog
            from workers.runner import get_runner

            target = load_catalog().get(f"{artifact.backend}:{artifact.target}")
            extra["load"] = get_runner(artifact.backend).load_check(result.ctx_model, target)
        if args.json:
            print(json.dumps(receipt(result, extra), indent=2))
        else:
            signed = f", signed by {result.signed_by}" if result.signed_by else ""
            print(f"fetched {artifact.short_id} ({result.bytes} B, digests verified{signed}) -> {result.ctx_model}")
            if "load" in extra:
                load = extra["load"]
                ran = (f"ran once in {load['run_seconds'] * 1000:.1f} ms, outputs {load['outputs']}"
                       if "run_seconds" in load else f"running it failed: {load.get('run')} ({load.get('crashed')})")
                print(f"loaded with {artifact.backend} in {load['load_seconds'] * 1000:.1f} ms, {ran}")
        return 0
    finally:
        reg.close()


def _load_check(args: argparse.Namespace) -> int:
    from farm.core.catalog import parse_target
    from workers.runner import get_runner

    target = parse_target(args.target)
    result = get_runner(target.backend).load_check(Path(args.ctx_model), target)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        ran = (f"one run {result['run_seconds'] * 1000:.1f} ms; outputs {result['outputs']}"
               if "run_seconds" in result else f"running it failed: {result.get('run')} ({result.get('crashed')})")
        print(f"loaded {args.ctx_model} on {target.ref} in {result['load_seconds'] * 1000:.1f} ms; {ran}")
    return 0
