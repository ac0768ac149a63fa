"""farm report (a device: send what loading an artifact did) | farm reports (ops: what devices said,
strike a token's reports or one report). docs/evidence.md."""

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
    if name == "reports":
        p.add_argument("action", choices=["show", "revoke", "quarantined", "lift"])
        p.add_argument("artifact", nargs="?", help="show, lift: artifact id (6+ hex digits) or manifest digest")
        p.add_argument("--token", dest="token_name", metavar="NAME", help="revoke: every report this token sent")
        p.add_argument("--id", dest="report_id", type=int, metavar="N", help="revoke: one report")
        p.add_argument("--soc", help="lift: the SoC the quarantine is for")
        p.add_argument("--runtime", metavar="VERSION", help="lift: the runtime version the quarantine is for")
        p.add_argument("--json", action="store_true")
        return
    p.add_argument("--server", default=os.environ.get("FARM_SERVER") or None,
                   help="the ctxfarm service (default: FARM_SERVER)")
    p.add_argument("--token", default=os.environ.get("FARM_REPORT_TOKEN") or None,
                   help="a report token (default: FARM_REPORT_TOKEN)")
    p.add_argument("--artifact", required=True, help="the manifest digest (sha256:...) install or resolve gave")
    p.add_argument("--soc", required=True, help="the device SoC, e.g. SM8650")
    p.add_argument("--qnn", "--runtime", dest="runtime", required=True, metavar="VERSION",
                   help="the runtime's QNN SDK (or TensorRT) version, e.g. 2.51.0")
    p.add_argument("--outcome", required=True, choices=["loads", "fails", "crashed"])
    p.add_argument("--error", help="the runtime's error text (fails, crashed); its last 4000 characters are sent")
    p.add_argument("--load-ms", type=float)
    p.add_argument("--first-inference-ms", type=float)
    p.add_argument("--peak-memory-mb", type=float)
    p.add_argument("--psnr", type=float, metavar="DB", help="an accuracy figure measured on the device")
    p.add_argument("--fingerprint", help="e.g. sha256 of the first output")
    p.add_argument("--device-id", help="default: a hash of /etc/machine-id")
    p.add_argument("--device-model")
    p.add_argument("--os", dest="os_name")
    p.add_argument("--arch", help="the CPU architecture the runtime ran on (default: this machine's, e.g. aarch64); "
                                  "a QNN runtime on x86_64 is the simulator, never device evidence")
    p.add_argument("--onnxruntime", default=None, help="default: the installed onnxruntime's version")
    p.add_argument("--ep-package")
    p.add_argument("--ep-version")
    p.add_argument("--driver")
    p.add_argument("--json", action="store_true")


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    if name == "reports":
        return _reports(args, settings)
    from farm.client_report import report

    if not args.server:
        raise UsageError("farm report needs --server (or FARM_SERVER)", hint="e.g. --server http://farm:8080")
    answer = report(args.server, args.token, artifact=args.artifact, soc=args.soc, runtime_version=args.runtime,
                    outcome=args.outcome, onnxruntime=args.onnxruntime or installed_ort() or "unknown",
                    device=args.device_id, device_model=args.device_model, os_name=args.os_name, arch=args.arch,
                    ep_package=args.ep_package, ep_version=args.ep_version, driver=args.driver, error=args.error,
                    load_ms=args.load_ms, first_inference_ms=args.first_inference_ms,
                    peak_memory_mb=args.peak_memory_mb, fingerprint=args.fingerprint, psnr_db=args.psnr)
    print(json.dumps(answer, indent=2) if args.json else
          f"report {answer['report']}: {args.outcome} on {answer.get('soc')} with {answer['runtime']}")
    return 0


def installed_ort() -> str | None:
    """onnxruntime's version from its build info file, without importing it."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        try:
            with open(os.path.join(base, "capi", "build_and_package_info.py")) as f:
                m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read())
            if m:
                return m.group(1)
        except OSError:
            continue
    return None


def _reports(args: argparse.Namespace, settings: Settings) -> int:
    from registry.index import Registry, find_artifact
    from registry.lite import SessionRows
    from registry.reports import lift, quarantined, revoke, summary

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            if args.action == "quarantined":
                cells = quarantined(SessionRows(s), settings.report_fail_devices)
                return _print_quarantined(cells, args)
            if args.action == "lift":
                if not (args.artifact and args.soc and args.runtime):
                    raise UsageError("lift what? farm reports lift ARTIFACT --soc SOC --runtime VERSION",
                                     hint="`farm reports quarantined` lists them")
                from farm.core.catalog import load_catalog

                a = find_artifact(s, args.artifact)
                n = lift(s, a.id, a.backend, args.runtime, load_catalog().get(args.soc, backend=a.backend).name)
                print(json.dumps({"lifted": n}) if args.json else
                      f"lifted: struck {n} failed report(s) of {a.digest[7:19]} on {args.soc} with {args.runtime}")
                return 0
            if args.action == "revoke":
                if (args.token_name is None) == (args.report_id is None):
                    raise UsageError("revoke what? --token NAME (all its reports) or --id N (one report)")
                n = revoke(s, token_name=args.token_name, report_id=args.report_id)
                print(json.dumps({"revoked": n}) if args.json else f"revoked {n} report(s)")
                return 0
            if not args.artifact:
                raise UsageError("which artifact? farm reports show ARTIFACT")
            a = find_artifact(s, args.artifact)
            entries = summary(s, [a.id]).get(a.id, [])
            digest = a.digest
    finally:
        reg.close()
    if args.json:
        print(json.dumps({"artifact": digest, "devices": entries}, indent=2))
        return 0
    print(f"artifact {digest}")
    if not entries:
        print("no device reports yet")
        return 0
    table([_row(e) for e in entries], ["runtime", "soc", "devices", "loads", "fails", "crashed", "load_ms",
                                       "peak_mb", "last_error"], out=sys.stdout)
    return 0


def _print_quarantined(cells: list[dict[str, Any]], args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps({"quarantined": cells}, indent=2))
        return 0
    if not cells:
        print("nothing quarantined: no artifact is withheld on device reports")
        return 0
    table([{**c, "artifact": c["artifact"][7:19], "failed": f"{c['failed_devices']} dev / {c['failed_tokens']} tok",
            "loaded": f"{c['loaded_devices']} dev / {c['loaded_tokens']} tok",
            "last_error": (c["last_error"] or "")[:60]} for c in cells],
          ["artifact", "target", "toolchain", "soc", "runtime", "failed", "loaded", "since", "last_error"],
          out=sys.stdout)
    print("withheld from resolve for that SoC and runtime; lift one: farm reports lift ARTIFACT --soc SOC "
          "--runtime VERSION (strikes its failed reports)")
    return 0


def _row(e: dict[str, Any]) -> dict[str, Any]:
    p50, p90 = e["load_ms_p50"], e["load_ms_p90"]
    return {**e, "load_ms": "" if p50 is None else f"p50 {p50:g} / p90 {p90:g}",
            "peak_mb": "" if e["peak_memory_mb_max"] is None else f"{e['peak_memory_mb_max']:g}",
            "last_error": (e["last_error"] or "")[:60]}


class NotReportingError(Exception):
    """``farm install --report`` on a host whose reports would not be device evidence."""


def install_report(args: argparse.Namespace, result: Any, qnn: str | None) -> dict[str, Any]:
    """``farm install --report``: load the installed context here as ``farm load-check`` does (a
    child process: a crashing runtime cannot take this one down), then report the outcome, the
    load and first-inference times. QNN devices only (``--soc`` and ``--qnn``/``--detect``)."""
    from farm.client_report import host_arch, is_simulator_host, report
    from farm.core.catalog import load_catalog
    from farm.core.errors import FarmError, RuntimeCrashedError
    from workers.backends import get_runner

    if not (args.soc and qnn):
        raise UsageError("--report needs a QNN device: --soc and --qnn (or --detect)")
    if is_simulator_host():
        raise NotReportingError(f"this host is {host_arch()}: a QNN runtime here is the HTP simulator, not a device, "
                                "and its loads are no evidence for devices (the farm probes the simulator itself)")
    token = args.report_token or os.environ.get("FARM_REPORT_TOKEN")
    runner = get_runner("qnn")
    toolchain = runner.toolchain()
    target = load_catalog().get(args.soc, backend="qnn")
    fields: dict[str, Any] = {"outcome": "loads"}
    try:
        loaded = runner.load_check(result.ctx_model, target)
        fields["load_ms"] = float(loaded["load_seconds"]) * 1000
        if loaded.get("crashed"):
            fields.update(outcome="crashed", error=f"loaded, then running it crashed: {loaded['crashed']}")
        elif loaded.get("run_seconds") is not None:
            fields["first_inference_ms"] = float(loaded["run_seconds"]) * 1000
    except RuntimeCrashedError as exc:
        fields.update(outcome="crashed", error=exc.message)
    except FarmError as exc:
        fields.update(outcome="fails", error=exc.message)
    return report(args.server, token, artifact=result.artifact, soc=target.name, runtime_version=toolchain.version,
                  onnxruntime=toolchain.ort_version, ep_package=toolchain.ep_package, ep_version=toolchain.ep_version,
                  timeout=REPORT_TIMEOUT, **fields)


REPORT_TIMEOUT = 10.0  # seconds: the install is done; a report waits this long, then is given up (a warning)
