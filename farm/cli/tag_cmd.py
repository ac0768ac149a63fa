"""Tags: farm tag NAME:TAG SOURCE [--force] | farm tag --history NAME:TAG | farm untag NAME:TAG.

A tag points at a model digest; devices resolve by tag, so moving one changes what they load:
a move needs --force and says what moved. SOURCE is an artifact id (its model), a model digest
or prefix, or another NAME:TAG / NAME."""

from __future__ import annotations

import argparse
import json
from typing import Any

from farm.core.settings import Settings


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", metavar="NAME:TAG", help="the tag (a bare NAME means NAME:latest)")
    if name == "tag":
        p.add_argument("source", nargs="?", metavar="ARTIFACT|DIGEST",
                       help="an artifact id (tags its model), a model digest or prefix, or another NAME:TAG")
        p.add_argument("--force", "-f", action="store_true", help="move the tag if it points at another model")
        p.add_argument("--history", action="store_true",
                       help="print every change of the tag, oldest first (and its promotions: who, when, which evidence)")
        p.add_argument("--ungate", action="store_true",
                       help="let plain farm tag --force move a tag farm promote moved (docs/device-lab.md)")
    p.add_argument("--json", action="store_true")
    from farm.cli.remote import add_server_arguments

    add_server_arguments(p)


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    from farm.core.errors import UsageError
    from farm.core.names import split_ref

    tag_name, tag = split_ref(args.ref)
    ungate = name == "tag" and args.ungate
    if name == "tag" and not args.history and not args.source and not ungate:
        raise UsageError("what should the tag point at? farm tag NAME:TAG ARTIFACT|DIGEST",
                         hint="or farm tag --history NAME:TAG")
    if name == "tag" and args.history and args.source:
        raise UsageError("--history takes only NAME:TAG")
    if ungate and (args.source or args.history):
        raise UsageError("--ungate takes only NAME:TAG")
    if args.server and ungate:
        from farm.core.errors import LocalOnlyError

        raise LocalOnlyError("farm tag --ungate has no remote form: it needs the index itself")
    if args.server:
        return _print(name, args, _remote(name, args, tag_name, tag))
    from farm.cli.remote import require_local_index
    from registry.index import Registry, delete_tag, set_tag, tag_source, tag_view

    require_local_index(name, settings)
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            if name == "untag":
                digest = delete_tag(s, tag_name, tag)
                out: dict[str, Any] = {"ref": f"{tag_name}:{tag}", "name": tag_name, "tag": tag, "deleted": True,
                                       "digest": digest}
            elif ungate:
                from farm.cli.devlab_cmd import user
                from registry.promotion import ungate as lift

                out = {**tag_view(s, tag_name, tag), "ungated": lift(s, tag_name, tag, by=user())}
            elif args.history:
                from registry.promotion import history

                out = {**tag_view(s, tag_name, tag), "promotions": history(s, tag_name, tag)}
            else:
                digest, artifact = tag_source(s, args.source)
                move = set_tag(s, tag_name, tag, digest, force=args.force)
                out = {**tag_view(s, tag_name, tag), "previous": move.previous if move.moved else None,
                       "moved": move.moved, "changed": move.changed, "artifact": artifact}
    finally:
        reg.close()
    return _print(name, args, out)


def _remote(name: str, args: argparse.Namespace, tag_name: str, tag: str) -> dict[str, Any]:
    """The same documents through ``/v1/tags/NAME/TAG`` (an admin token)."""
    from urllib.parse import quote

    from farm.cli.remote import answer_of, client

    api = client(args)
    path = f"/v1/tags/{quote(tag_name, safe='/')}/{quote(tag, safe='')}"
    if name == "untag":
        got = api.json("DELETE", path)
        with answer_of("untag"):
            return {"ref": f"{tag_name}:{tag}", "name": tag_name, "tag": tag, "deleted": True,
                    "digest": got["digest"]}
    if args.history:
        out = api.json("GET", path)
    else:
        out = api.json("PUT", path, {"digest": args.source, "force": bool(args.force)})
    with answer_of("tag"):
        if not isinstance(out, dict):
            raise TypeError("not an object")
        for key in ("ref", "digest", "history") + (() if args.history else ("moved", "changed", "previous")):
            out[key]  # noqa: B018 - KeyError is the check
        out.pop("tag_moved", None)
    return out


def _print(name: str, args: argparse.Namespace, out: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    if name == "untag":
        print(f"untagged {out['ref']} (was {out['digest']})")
    elif "ungated" in out:
        print(f"{out['ref']}: " + ("ungated: farm tag --force moves it again" if out["ungated"] else "was not gated"))
    elif args.history:
        _print_history(out)
    elif out["moved"]:
        print(f"moved {out['ref']}: {out['previous']} -> {out['digest']}")
    elif out["changed"]:
        print(f"tagged {out['ref']} -> {out['digest']}")
    else:
        print(f"{out['ref']} already points at {out['digest']} (unchanged)")
    return 0


def _print_history(view: dict[str, Any]) -> None:
    from farm.cli import table

    now = view["digest"] or "nothing (deleted)"
    print(f"{view['ref']} -> {now}")
    table([{"when": e["at"], "action": e["action"], "digest": e["digest"], "previous": e["previous"] or ""}
           for e in view["history"]], ["when", "action", "digest", "previous"])
    if view.get("promotions"):
        print("promotions (farm promote):")
        table([{"when": p["at"], "kind": p["kind"], "by": p["by"], "from": p["from"] or "", "require": p["require"] or "",
                "simulator": "allowed" if p["allow_simulator"] else "",
                "evidence": "; ".join(f"{soc}: {', '.join(d) or '-'}" for soc, d in p["devices"].items())}
               for p in view["promotions"]], ["when", "kind", "by", "from", "require", "simulator", "evidence"])
