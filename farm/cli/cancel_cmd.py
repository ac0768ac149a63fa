"""farm cancel RELEASE | --build ID [--server URL]: stop queued and running builds.

Queued builds fail at once with code ``cancelled``; a running compile is killed by its executor
within seconds (its lease renewal finds the row changed). Through ``--server`` the service does
the same (``POST /v1/releases/ID/cancel``, ``POST /v1/builds/ID/cancel``, a submit token)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from farm.cli import table
from farm.cli.remote import add_server_arguments
from farm.core.settings import Settings


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("release", type=int, nargs="?", help="release id: cancel every build of it still queued or running")
    p.add_argument("--build", type=int, help="one build instead of a release")
    p.add_argument("--json", action="store_true")
    add_server_arguments(p)


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    from farm.core.errors import UsageError

    if (args.release is None) == (args.build is None):
        raise UsageError("cancel a release or a build", hint="farm cancel RELEASE_ID, or farm cancel --build BUILD_ID")
    for value in (args.release, args.build):
        if value is not None and not 0 < value < 2**31:
            raise UsageError(f"{value} is not a release or build id")
    if args.server:
        from farm.client import Client

        client = Client(args.server, args.token)
        path = f"/v1/releases/{args.release}/cancel" if args.release is not None else f"/v1/builds/{args.build}/cancel"
        answer: Any = client.json("POST", path)
        rows = [dict(r) for r in answer.get("builds", [])] if isinstance(answer, dict) else []
    else:
        from farm.pipeline.cancel import cancel

        rows = [c.to_dict() for c in cancel(settings, release_id=args.release, build_id=args.build)]
    if args.json:
        print(json.dumps({"builds": rows}, indent=2))
    else:
        twins = [r for r in rows if "twin_build" in r]
        rows = [r for r in rows if "twin_build" not in r]
        table(rows, ["build", "was", "now"])
        stopped = sum(1 for r in rows if r.get("now") == "cancelled")
        kept = sum(1 for r in rows if r.get("now") == "kept")
        print(f"{stopped} build(s) cancelled, {len(rows) - stopped - kept} already finished"
              + (f", {kept} kept (another release still wants them)" if kept else ""))
        if twins:  # a genai package's twin builds (the parts compiled alone for its twin check)
            t_stopped = sum(1 for r in twins if r.get("now") == "cancelled")
            t_kept = sum(1 for r in twins if r.get("now") == "kept")
            print(f"{t_stopped} twin build(s) cancelled" + (f", {t_kept} kept (another release waits on them)"
                                                            if t_kept else ""))
    return 0
