"""The HTTP service and its clients: farm serve | token | install."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from farm.cli import table
from farm.core.errors import UsageError
from farm.core.settings import Settings


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "serve":
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=8080, choices=range(0, 65536), metavar="PORT")
        p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
        return
    if name == "token":
        p.add_argument("action", choices=["create", "list", "revoke"])
        p.add_argument("name", nargs="?", help="create/revoke: the token's name, e.g. pixel-fleet")
        p.add_argument("--scope", choices=["read", "submit", "admin", "report"], default="read",
                       help="read (devices) < submit (pipelines) < admin (ops); report: devices posting load "
                            "reports, nothing else")
        p.add_argument("--json", action="store_true")
        return
    # install
    add_server_arguments(p)
    p.add_argument("--model", "-m", required=True, help="NAME:TAG, NAME or a model digest")
    p.add_argument("--soc", help="device SoC, e.g. SM8650")
    p.add_argument("--qnn", metavar="VERSION", help="QNN runtime version on the device, e.g. 2.51.0")
    p.add_argument("--detect", action="store_true", help="read --qnn from the onnxruntime-qnn installed here")
    p.add_argument("--gpu", help="device GPU, e.g. sm_89 (TensorRT)")
    p.add_argument("--trt", metavar="VERSION", help="TensorRT runtime version, all four parts")
    p.add_argument("--platform", default="linux-x86-64")
    p.add_argument("--dest", "-d", "--out", dest="dest", required=True, metavar="DIR",
                   help="directory that will hold exactly this artifact (swapped into place atomically)")
    p.add_argument("--require-signature", action="store_true")
    p.add_argument("--allow-unsigned", action="store_true")
    p.add_argument("--report", action="store_true",
                   help="then load it here (as farm load-check does) and report the outcome to the service "
                        "(needs a report token: --report-token or FARM_REPORT_TOKEN; docs/evidence.md)")
    p.add_argument("--report-token", default=os.environ.get("FARM_REPORT_TOKEN"),
                   help="the report token for --report (default: FARM_REPORT_TOKEN)")
    p.add_argument("--json", action="store_true")


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=os.environ.get("FARM_SERVER"),
                   help="the ctxfarm service, e.g. http://farm:8080 (default: FARM_SERVER)")
    p.add_argument("--token", default=os.environ.get("FARM_TOKEN"), help="bearer token (default: FARM_TOKEN)")


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    if name == "serve":
        return _serve(args, settings)
    if name == "token":
        return _token(args, settings)
    return _install(args, settings)


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    try:
        import uvicorn
    except ModuleNotFoundError:
        from farm.core.errors import MissingExtraError

        raise MissingExtraError("farm serve needs the service extra", hint="pip install 'ctxfarm[service]'") from None
    from farm.api.app import create_app

    app = create_app(settings)
    print(f"ctxfarm service on http://{args.host}:{args.port} (OpenAPI at /openapi.json)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


def _token(args: argparse.Namespace, settings: Settings) -> int:
    from registry.index import Registry
    from registry.tokens import create_token, list_tokens, revoke_token

    if args.action in ("create", "revoke") and not args.name:
        raise UsageError(f"token {args.action} needs a NAME", hint="farm token create NAME --scope read|submit|admin")
    from farm.cli.remote import require_local_index

    # A token made in an index created on the spot is one no service knows.
    require_local_index(f"token {args.action}", settings)
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            if args.action == "create":
                token = create_token(s, args.name, args.scope)
            elif args.action == "revoke":
                revoke_token(s, args.name)
            else:
                from farm.core.times import iso

                rows = [{"name": t.name, "scope": t.scope, "created_at": iso(t.created_at),
                         "revoked_at": iso(t.revoked_at)} for t in list_tokens(s)]
    finally:
        reg.close()
    if args.action == "create":
        if args.json:
            print(json.dumps({"name": args.name, "scope": args.scope, "token": token}))
        else:
            print(f"token {args.name} ({args.scope}); shown once, store it now:", file=sys.stderr)
            print(token)
    elif args.action == "revoke":
        print(json.dumps({"name": args.name, "revoked": True}) if args.json else f"revoked {args.name}")
    elif args.json:
        print(json.dumps(rows, indent=2))
    else:
        from farm.core.times import human

        table([{**r, "created": human(_dt(r["created_at"])), "revoked": human(_dt(r["revoked_at"]))} for r in rows],
              ["name", "scope", "created", "revoked"])
    return 0


def _install(args: argparse.Namespace, settings: Settings) -> int:
    from farm.client import detect_qnn, install

    if not args.server:
        raise UsageError("farm install needs --server (or FARM_SERVER)", hint="e.g. --server http://farm:8080")
    qnn = detect_qnn() if args.detect else args.qnn
    result = install(args.server, args.token, args.model, dest=args.dest, soc=args.soc, qnn=qnn, gpu=args.gpu,
                     trt=args.trt, platform=args.platform, trusted_keys=list(settings.trusted_keys),
                     require_signature=args.require_signature or settings.require_signature,
                     allow_unsigned=args.allow_unsigned or settings.allow_unsigned)
    reported = None
    if getattr(args, "report", False):
        from farm.cli.report_cmd import install_report

        reported = install_report(args, result, qnn)
        if not args.json:
            print(f"reported {reported['outcome']} (report {reported['report']})", file=sys.stderr)
    if args.json:
        print(json.dumps({"artifact": result.artifact, "ctx_model": str(result.ctx_model),
                          "files": [str(p) for p in result.files], "bytes": int(result.bytes),
                          "resumed_bytes": int(result.resumed_bytes), "signed_by": result.signed_by,
                          "stages": result.stages,
                          **({"report": reported} if reported is not None else {})}, indent=2))
    else:
        print(str(result.ctx_model))
    return 0


def _dt(text: str | None) -> Any:
    from datetime import datetime

    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))
