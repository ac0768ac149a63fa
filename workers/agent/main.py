"""``ctxfarm-agent enroll | run`` (docs/device-lab.md). Reads no FARM_TOKEN: the agent's only
credentials are the enrollment token it is given once and the identity that makes in ``--home``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from farm.core.errors import FarmError, InternalError, translate


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctxfarm-agent", description="a device that works for the farm: enroll it once, "
                                "then run verification jobs and post signed reports")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("enroll", help="make this device's key pair and register it with an enrollment token")
    e.add_argument("--server", required=True, help="the ctxfarm service, e.g. http://farm:8080")
    e.add_argument("--token", required=True, help="the enrollment token (farm device enroll NAME)")
    e.add_argument("--home", required=True, type=Path, help="where the key and identity are kept (mode 0600)")
    e.add_argument("--soc", help="this device's SoC when it can't be detected (an x86 host is always 'simulator')")
    r = sub.add_parser("run", help="lease verification jobs, run them, post signed reports")
    r.add_argument("--server", help="the service (default: the one enrolled with)")
    r.add_argument("--home", required=True, type=Path)
    r.add_argument("--once", action="store_true", help="take the jobs there are now, run them, exit 0")
    r.add_argument("--simulate", action="append", default=[], metavar="SOC",
                   help="a simulator agent: take only this SoC's jobs (repeatable; default: any SoC)")
    r.add_argument("--runs", type=int, default=10, help="steady-state runs per job (the median is reported)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "enroll":
            from workers.agent.identity import enroll

            print(json.dumps(enroll(args.server, args.token, args.home, args.soc), indent=2))
            return 0
        from dataclasses import replace

        from farm.core.catalog import load_catalog
        from workers.agent.identity import load
        from workers.agent.jobs import run

        ident = load(args.home)
        if args.server:
            ident = replace(ident, server=args.server)
        simulate = [load_catalog().get(s, backend="qnn").name for s in args.simulate]
        done = run(ident, args.home, once=args.once, simulate=simulate, runs=max(1, args.runs))
        print(json.dumps({"device": ident.name, "reports": done}))
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the boundary: a code, a message, a hint
        err = translate(exc)
        if not isinstance(exc, FarmError) and isinstance(err, InternalError):
            import traceback

            traceback.print_exc()
        print(f"error[{err.code}]: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"  hint: {err.hint}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
