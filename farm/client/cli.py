"""``ctxfarm-install`` (and ``python -m farm.client``): ``farm install`` for a device that has only
the client wheel, and ``detect_qnn``, which reads the QNN version of the onnxruntime-qnn
installed here for ``--detect``."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from farm.client.downloads import CONNECTIONS, MAX_CONNECTIONS
from farm.client.install import install
from farm.client.packages import install_package
from farm.core.errors import UsageError

_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\s*=\s*(['\"])([^'\"]*)\2\s*$", re.MULTILINE)


def detect_qnn() -> str:
    """The QNN SDK version inside the onnxruntime-qnn installed here (for ``--detect``), read
    from the ``build_and_package_info.py`` the wheel carries, not imported."""
    import importlib.util

    from farm.core.catalog.runtimes import qnn_map_text

    spec = importlib.util.find_spec("onnxruntime_qnn")
    info: dict[str, str] = {}
    if spec is not None and spec.submodule_search_locations:
        try:
            text = (Path(next(iter(spec.submodule_search_locations))) / "build_and_package_info.py").read_text("utf-8")
            info = {m.group(1): m.group(3) for m in _ASSIGN.finditer(text)}
        except OSError:
            pass
    sdk = info.get("qnn_version", "")
    if not re.fullmatch(r"\d+(\.\d+){1,3}", sdk):
        found = f"onnxruntime-qnn {info['__version__']} does not say its QNN version" if info.get("__version__") \
            else "onnxruntime-qnn is not installed in this Python"
        raise UsageError(f"--detect: {found}",
                         hint=f"give the device's QNN runtime version with --qnn VERSION ({qnn_map_text()})")
    return sdk


def main(argv: list[str] | None = None) -> int:
    """``ctxfarm-install``: ``farm install`` for a device that has only this wheel. Every error
    is ``error[code]: message`` and its hint, exit 1 (2 for usage); a traceback only for a bug
    with FARM_DEBUG=1."""
    import argparse

    p = argparse.ArgumentParser(prog="ctxfarm-install",
                                description="Install a compiled context from a ctxfarm service into --dest.")
    p.add_argument("--server", default=os.environ.get("FARM_SERVER"), help="e.g. http://farm:8080 (FARM_SERVER)")
    p.add_argument("--token", default=os.environ.get("FARM_TOKEN"), help="read token (FARM_TOKEN)")
    p.add_argument("--model", "-m", help="NAME:TAG, NAME or a model digest")
    p.add_argument("--package", metavar="NAME:TAG",
                   help="instead of --model: the ORT model package of NAME:TAG (every variant; onnxruntime >= 1.32 "
                        "picks one)")
    p.add_argument("--soc", help="device SoC (Build.SOC_MODEL), e.g. SM8650")
    p.add_argument("--qnn", metavar="VERSION", help="the device's QNN runtime version, e.g. 2.51.0")
    p.add_argument("--detect", action="store_true", help="read --qnn from the onnxruntime-qnn installed here")
    p.add_argument("--gpu", help="device GPU, e.g. sm_89 (TensorRT)")
    p.add_argument("--trt", metavar="VERSION", help="TensorRT runtime version, all four parts")
    p.add_argument("--platform", default="linux-x86-64")
    p.add_argument("--dest", "-d", required=True, metavar="DIR", help="directory that will hold exactly this artifact")
    p.add_argument("--require-signature", action="store_true")
    p.add_argument("--allow-unsigned", action="store_true")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long any network operation may wait (default 60)")
    p.add_argument("--connections", type=int, default=CONNECTIONS, metavar="N",
                   help=f"ranges of one large file fetched at once (1 to {MAX_CONNECTIONS}, default {CONNECTIONS})")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    env = os.environ
    try:
        from farm.core.settings import parse_bool, parse_trusted_keys

        if not args.server:
            raise UsageError("ctxfarm-install needs --server (or FARM_SERVER)", hint="e.g. --server http://farm:8080")
        if bool(args.model) == bool(args.package):
            raise UsageError("ctxfarm-install needs --model NAME:TAG or --package NAME:TAG, one of them")
        policy = {"trusted_keys": list(parse_trusted_keys(env.get("FARM_TRUSTED_KEYS", ""))),
                  "require_signature": args.require_signature
                  or parse_bool("FARM_REQUIRE_SIGNATURE", env.get("FARM_REQUIRE_SIGNATURE")),
                  "allow_unsigned": args.allow_unsigned or parse_bool("FARM_ALLOW_UNSIGNED", env.get("FARM_ALLOW_UNSIGNED")),
                  "timeout": args.timeout}
        if args.package:
            result = install_package(args.server, args.token, args.package, dest=args.dest,
                                     connections=args.connections, **policy)
        else:
            qnn = detect_qnn() if args.detect else args.qnn
            result = install(args.server, args.token, args.model, dest=args.dest, soc=args.soc, qnn=qnn,
                             gpu=args.gpu, trt=args.trt, platform=args.platform, connections=args.connections,
                             **policy)
    except Exception as exc:  # the boundary: documented codes only
        from farm.core.errors import translate

        err = translate(exc)
        if err.code == "internal-error" and env.get("FARM_DEBUG"):
            raise
        print(f"error[{err.code}]: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"  hint: {err.hint}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": err.to_dict()}))
        return err.exit_code
    if args.json:
        print(json.dumps({"artifact": result.artifact, "ctx_model": str(result.ctx_model),
                          "files": [str(p) for p in result.files], "bytes": result.bytes,
                          "resumed_bytes": result.resumed_bytes, "downloaded_bytes": result.downloaded_bytes,
                          "reused_bytes": result.reused_bytes, "signed_by": result.signed_by}, indent=2))
    else:
        print(str(result.ctx_model))
    return 0
