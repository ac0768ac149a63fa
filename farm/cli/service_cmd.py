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
        p.add_argument("--workers", type=int, metavar="N",
                       help="service processes sharing the port, each with its own connection pool and answer cache "
                            "(default: the cores this process may use, its CPU quota included, with a PostgreSQL "
                            "index; 1 with SQLite, whose one writer allows no more)")
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
    p.add_argument("--model", "-m", help="NAME:TAG, NAME or a model digest")
    p.add_argument("--package", metavar="NAME:TAG",
                   help="instead of --model and the device's SoC: the ORT model package of NAME:TAG (farm package "
                        "made it), every variant in one folder; onnxruntime >= 1.32 picks one on the device")
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
    p.add_argument("--connections", type=int, default=4, metavar="N",
                   help="ranges of one large file fetched at once (1 to 16, default 4; docs/device.md)")
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
        from farm.core.extras import install_hint

        raise MissingExtraError("farm serve needs the service extra", hint=install_hint("service")) from None
    workers = serve_processes(args.workers, settings)
    if workers == 1:
        from farm.api.app import create_app, serving

        app = serving(create_app(settings))
        print(f"ctxfarm service on http://{args.host}:{args.port} (OpenAPI at /openapi.json)", file=sys.stderr,
              flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
        return 0
    import tempfile
    from contextlib import ExitStack

    with ExitStack() as stack:
        # Each process counts its own requests; prometheus_client's multiprocess mode (its files in
        # this folder, read by every process's /metrics) adds them up, so a scrape that lands on any
        # process sees the whole service. The variable must be set before the processes start.
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="ctxfarm-metrics-"))
        from uvicorn.supervisors import Multiprocess

        # Every process builds its own app from the same FARM_* environment (farm.api.app.app_from_env);
        # uvicorn's supervisor restarts one that dies. The listener is ours, not uvicorn.run's: its
        # bind_socket leaves the socket's protocol at 0, so asyncio never sets TCP_NODELAY on the
        # accepted connections and every keep-alive answer after the first waits for the client's
        # delayed ACK (measured here: resolve p50 44 ms on a kept-alive connection against 1.2 ms with
        # one process; Kludex/uvicorn#3149).
        config = uvicorn.Config("farm.api.app:app_from_env", factory=True, workers=workers, host=args.host,
                                port=args.port, log_level=args.log_level, access_log=False)
        sock = listener(args.host, args.port)
        print(f"ctxfarm service on http://{args.host}:{sock.getsockname()[1]}, {workers} processes "
              "(OpenAPI at /openapi.json)", file=sys.stderr, flush=True)
        Multiprocess(config, sockets=[sock]).run()
    return 0


def listener(host: str, port: int) -> Any:
    """A TCP listening socket the service's processes share, with ``IPPROTO_TCP`` as its protocol
    (so each accepted connection gets TCP_NODELAY from asyncio)."""
    import socket

    from farm.core.errors import ConfigError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"farm serve can't listen on {host}:{port}: {exc.strerror or exc}",
                          hint="another process holds the port, or the host is not this machine's: "
                               "--host/--port") from None
    sock.set_inheritable(True)
    return sock


def available_cores() -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup v2 CPU quota (a container's
    CPU limit, ``cpu.max``) when there is one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def serve_processes(asked: int | None, settings: Settings, cores: int | None = None) -> int:
    """How many processes ``farm serve`` runs: ``--workers`` when given, else one per core with
    PostgreSQL. A SQLite index (the embedded service) takes one writer at a time: several processes
    would queue on its lock ("database is locked") and each would run builds of its own, so it
    runs one process and refuses more."""
    sqlite = settings.database_url.startswith("sqlite")
    if asked is not None and asked < 1:
        raise UsageError(f"--workers {asked}: needs at least 1 process", hint="leave it out for one per core")
    if sqlite:
        if asked is not None and asked > 1:
            raise UsageError(f"--workers {asked} with a SQLite index: SQLite has one writer, so the embedded "
                             "service runs one process",
                             hint="serve several processes from a PostgreSQL index (FARM_DATABASE_URL=postgresql://"
                                  "...; docs/operations.md), or leave --workers out")
        return 1
    return asked if asked is not None else (cores or available_cores())


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
    if bool(args.model) == bool(args.package):
        raise UsageError("farm install needs --model NAME:TAG (one artifact) or --package NAME:TAG (an ORT model "
                         "package), one of them", hint="e.g. farm install --model mynet:stable --soc SM8650 -d DIR")
    if args.package:
        if getattr(args, "report", False):
            raise UsageError("--report reports one artifact's load: it does not apply to --package")
        return _install_package(args, settings)
    qnn = detect_qnn() if args.detect else args.qnn
    result = install(args.server, args.token, args.model, dest=args.dest, soc=args.soc, qnn=qnn, gpu=args.gpu,
                     trt=args.trt, platform=args.platform, trusted_keys=list(settings.trusted_keys),
                     require_signature=args.require_signature or settings.require_signature,
                     allow_unsigned=args.allow_unsigned or settings.allow_unsigned, connections=args.connections)
    reported = None
    if getattr(args, "report", False):
        # A report that can't be sent (or won't be: a simulator host) never fails a good install:
        # the exit status and stdout stay as without --report, a warning says why.
        from farm.cli.report_cmd import NotReportingError, install_report
        from farm.core.errors import translate
        from farm.core.text import printable

        try:
            reported = install_report(args, result, qnn)
        except NotReportingError as exc:
            print(f"warning: not reporting: {exc}", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - any failure of the report is a warning here
            err = translate(exc)
            print(f"warning: the report was not sent ({err.code}): {printable(err.message)}", file=sys.stderr)
        else:
            if not args.json:
                print(f"reported {reported['outcome']} (report {reported['report']})", file=sys.stderr)
    if args.json:
        print(json.dumps({"artifact": result.artifact, "ctx_model": str(result.ctx_model),
                          "files": [str(p) for p in result.files], "bytes": int(result.bytes),
                          "downloaded_bytes": int(result.downloaded_bytes), "reused_bytes": int(result.reused_bytes),
                          "resumed_bytes": int(result.resumed_bytes), "signed_by": result.signed_by,
                          "stages": result.stages,
                          **({"report": reported} if reported is not None else {})}, indent=2))
    else:
        print(str(result.ctx_model))
    return 0


def _install_package(args: argparse.Namespace, settings: Settings) -> int:
    from farm.client import install_package

    result = install_package(args.server, args.token, args.package, dest=args.dest,
                             trusted_keys=list(settings.trusted_keys),
                             require_signature=args.require_signature or settings.require_signature,
                             allow_unsigned=args.allow_unsigned or settings.allow_unsigned,
                             connections=args.connections)
    if args.json:  # install.json: artifact is the package's digest, ctx_model its manifest.json
        print(json.dumps({"artifact": result.artifact, "ctx_model": str(result.ctx_model),
                          "files": [str(p) for p in result.files], "bytes": int(result.bytes),
                          "resumed_bytes": int(result.resumed_bytes), "signed_by": result.signed_by,
                          "downloaded_bytes": int(result.downloaded_bytes), "reused_bytes": int(result.reused_bytes)},
                         indent=2))
    else:
        print(str(result.ctx_model.parent))
    return 0


def _dt(text: str | None) -> Any:
    from datetime import datetime

    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))
