"""The device lab from the farm's side: farm device enroll | list | revoke, and farm promote.

``farm device enroll NAME`` works as ``farm token create`` does (the index itself): the single-use
enrollment token alone on stdout's last line, the note on stderr. ``farm promote`` runs here or,
with ``--server``, through ``POST /v1/promotions`` (an admin token). docs/device-lab.md."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from farm.core.errors import UsageError
from farm.core.settings import Settings

EXIT_UNMET = 3  # promotion-unmet's exit status (farm.core.errors)


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "device":
        p.add_argument("action", choices=["enroll", "list", "revoke", "verify"])
        p.add_argument("name", nargs="?", help="enroll/revoke: the device's name, e.g. lab-pixel-8; verify: the "
                                               "model (NAME:TAG) whose every SDK the lab times, per SoC")
        p.add_argument("--devices", type=int, default=2, choices=range(1, 17), metavar="N",
                       help="verify: jobs per SoC and SDK, each done by a distinct device (default 2)")
        p.add_argument("--expires", default="24h", metavar="DURATION",
                       help="enroll: how long the enrollment token is good for (30m, 12h, 7d; default 24h)")
        p.add_argument("--json", action="store_true")
        return
    p.add_argument("ref", metavar="NAME:FROM", help="the tag whose model is promoted (with --rollback: NAME:TO)")
    p.add_argument("--to", metavar="TAG", help="the tag to move, e.g. stable")
    p.add_argument("--require", metavar="EXPR",
                   help="clauses joined by commas: 'devices>=N per soc', 'devices>=N', 'psnr>=DB', 'p50_ms<=MS'")
    p.add_argument("--allow-simulator", action="store_true",
                   help="count reports from simulator agents as device evidence (shown in the history)")
    p.add_argument("--rollback", action="store_true", help="point NAME:TO back where its newest promotion found it")
    p.add_argument("--wait", action="store_true", help="wait until the evidence is in (or --timeout)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="with --wait: give up after S seconds")
    p.add_argument("--json", action="store_true")
    from farm.cli.remote import add_server_arguments

    add_server_arguments(p)


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    if name == "device":
        return _device(args, settings)
    return _promote(args, settings)


def _device(args: argparse.Namespace, settings: Settings) -> int:
    from farm.cli.remote import require_local_index
    from registry.devices import create_enrollment, list_devices, parse_duration, revoke_device
    from registry.index import Registry

    if args.action in ("enroll", "revoke", "verify") and not args.name:
        raise UsageError(f"device {args.action} needs a NAME", hint="farm device enroll lab-pixel-8; "
                                                                    "farm device verify mm:stable")
    if args.action == "verify":
        return _verify(args, settings)
    expires_s = parse_duration(args.expires)
    require_local_index(f"device {args.action}", settings)
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            if args.action == "enroll":
                got = create_enrollment(s, args.name, expires_s=expires_s, by=user())
            elif args.action == "revoke":
                struck = revoke_device(s, args.name)
            else:
                rows = list_devices(s)
    finally:
        reg.close()
    if args.action == "enroll":
        if args.json:
            print(json.dumps({"name": got.name, "token": got.token, "expires": got.expires.isoformat()}))
        else:
            print(f"device {got.name}: enrollment token, single use, good until {got.expires:%Y-%m-%d %H:%M} UTC; "
                  "shown once (ctxfarm-agent enroll --server URL --token TOKEN --home DIR):", file=sys.stderr)
            print(got.token)
    elif args.action == "revoke":
        out = {"name": args.name, "revoked": True, "struck": struck}
        print(json.dumps(out) if args.json else f"revoked {args.name} ({struck} verification(s) struck)")
    elif args.json:
        print(json.dumps(rows, indent=2))
    else:
        from farm.cli import table

        table(rows, ["name", "state", "soc", "arch", "runtime", "key_id", "enrolled_at", "revoked_at"])
    return 0


def _verify(args: argparse.Namespace, settings: Settings) -> int:
    """``farm device verify NAME:TAG``: jobs on every SDK's artifact of the model, per SoC (the
    index itself, as the other device commands; over HTTP: ``POST /v1/device-jobs``)."""
    from farm.cli import table
    from farm.cli.remote import require_local_index
    from registry.index import Registry
    from registry.promotion import sdk_jobs

    require_local_index("device verify", settings)
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            rows = sdk_jobs(s, args.name, args.devices, prefer_fastest=settings.resolve_prefer_fastest)
    finally:
        reg.close()
    if args.json:
        print(json.dumps({"model": args.name, "jobs": rows}, indent=2))
        return 0
    table([{"soc": r["soc"], "sdk": f"QNN {r['toolchain']}", "artifact": r["artifact"][7:19],
            "made": r["jobs_made"], "open": r["jobs_open"]} for r in rows], ["soc", "sdk", "artifact", "made", "open"])
    print("agents take these jobs by SoC and by runtime: each SDK's artifact goes to devices whose QNN runtime "
          "resolve answers it (docs/device-lab.md)")
    return 0


def user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _promote(args: argparse.Namespace, settings: Settings) -> int:
    from farm.core.errors import PromotionUnmetError
    from farm.core.names import check_tag, split_ref
    from farm.core.requirements import parse

    name, tag = split_ref(args.ref)
    if not args.rollback:
        if not args.to or not args.require:
            raise UsageError("farm promote NAME:FROM --to TAG --require EXPR",
                             hint="e.g. farm promote m:candidate --to stable --require 'devices>=2 per soc,psnr>=30'")
        check_tag(args.to)
        parse(args.require)  # a usage error naming the clause, before anything is asked
    deadline = time.monotonic() + max(args.timeout, 0.0)
    while True:
        out = _remote(args, name, tag) if args.server else _local(args, settings, name, tag)
        if args.rollback or out["met"] or not args.wait or time.monotonic() >= deadline:
            break
        time.sleep(min(2.0, max(deadline - time.monotonic(), 0.0)))  # the agents report in seconds
    if not args.rollback and not out["met"] and "error" in out:
        raise out["error"]
    if not args.rollback and not out["met"]:
        from registry.promotion import unmet

        err: PromotionUnmetError = unmet(out, f"{name}:{tag}")
        if args.json:
            print(json.dumps({"error": err.to_dict(), "account": out["account"]}, default=str))
        else:
            _print_account(out["account"], sys.stderr)
            print(f"error[{err.code}]: {err.message}", file=sys.stderr)
            print(f"  hint: {err.hint}", file=sys.stderr)
        return EXIT_UNMET
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    elif args.rollback:
        print(f"rolled back {out['ref']}: {out['previous']} -> {out['digest']}")
    else:
        _print_account(out["account"], sys.stdout)
        sim = " (simulator evidence allowed)" if args.allow_simulator else ""
        print(f"promoted {out['ref']} -> {out['digest']}{sim}")
    return 0


def _local(args: argparse.Namespace, settings: Settings, name: str, tag: str) -> dict[str, Any]:
    from farm.cli.remote import require_local_index
    from registry.index import Registry
    from registry.promotion import promote, rollback

    require_local_index("promote", settings)
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            if args.rollback:
                return rollback(s, name, tag, by=user())
            return promote(s, name, tag, args.to, args.require, allow_simulator=args.allow_simulator, by=user(),
                           prefer_fastest=settings.resolve_prefer_fastest)
    finally:
        reg.close()


def _remote(args: argparse.Namespace, name: str, tag: str) -> dict[str, Any]:
    """``POST /v1/promotions``. Unmet, the service answers 409 ``promotion-unmet`` whose message
    holds the per-SoC account: it is raised as it came (after ``--wait`` ran out)."""
    from farm.cli.remote import answer_of, client
    from farm.core.errors import PromotionUnmetError

    body = {"model": f"{name}:{tag}", "to": args.to, "require": args.require,
            "allow_simulator": bool(args.allow_simulator), "rollback": bool(args.rollback)}
    try:
        out = client(args).json("POST", "/v1/promotions", body)
    except PromotionUnmetError as exc:
        return {"ref": f"{name}:{args.to}", "met": False, "require": args.require, "error": exc}
    with answer_of("promote"):
        out["digest"]  # noqa: B018 - KeyError is the check
        out.setdefault("met", True)
    return out  # type: ignore[no-any-return]


def _print_account(account: dict[str, Any], out: Any) -> None:
    from farm.cli import table

    rows = [{"soc": soc, "devices": ", ".join(c["devices"]) or "-", "missing": c["missing"],
             "jobs_open": c.get("jobs_open", 0),
             "not_counted": "; ".join(f"{r['device']}: {r['why']}" for r in c["not_counted"][:3])}
            for soc, c in account["socs"].items()]
    table(rows, ["soc", "devices", "missing", "jobs_open", "not_counted"], out=out)
