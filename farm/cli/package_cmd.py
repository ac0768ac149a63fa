"""farm package NAME:TAG -d DIR: an ORT model package of the model's published builds (docs/packages.md).

Here (the index and store of this machine: the package is made where onnxruntime >= 1.32 is) or
through the service (``--server``: ``POST /v1/packages``, then the record and every file fetched
by digest and verified, as ``farm install`` does). Either way ``-d DIR`` receives the package
atomically; without ``-d`` it is only made (or found) and described.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from farm.cli import human_size, table
from farm.cli.remote import add_server_arguments
from farm.core.settings import Settings

DEFAULT_TIMEOUT_S = 600.0
WAIT_S = 30.0  # each POST waits this long for a worker's package (the service's wait=)


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", metavar="NAME:TAG", help="the published model to package (NAME means NAME:latest)")
    p.add_argument("--dest", "-d", "--out", dest="dest", metavar="DIR",
                   help="directory that will hold exactly this package (swapped into place atomically)")
    add_server_arguments(p)
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help="with --server: give up after this many seconds while a worker makes the package "
                        f"(default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--json", action="store_true")


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    if args.server:
        answer = remote_package(args.server, args.token, args.ref, args.dest, settings, timeout=args.timeout)
    else:
        answer = local_package(settings, args.ref, args.dest)
    for out in answer.get("left_out") or []:
        # A build the package can't hold (ORT could not tell it from another SoC's): said, not hidden.
        print(f"warning: left out {out['target']} (QNN {out['toolchain']}): {out['why']}; a device that needs it "
              f"installs it directly: farm install --model {answer['ref']} --soc SOC ...", file=sys.stderr)
    if args.json:
        print(json.dumps(answer, default=str))
        return 0
    how = "cached: nothing new was published" if answer["cached"] else "made and verified"
    print(f"package {answer['ref']} {answer['digest']} ({how})")
    rows = [{"component": c["name"], "variant": v["name"], "ep": v["ep"], "device": v["device"],
             "compatibility": v.get("compatibility_string") or ""}
            for c in answer["components"] for v in c["variants"]]
    table(rows, ["component", "variant", "ep", "device", "compatibility"])
    shared = [d for d in answer["directories"] if d.startswith("shared_assets/")] or sorted(
        {"/".join(f["path"].split("/")[:2]) for f in answer["files"] if f["path"].startswith("shared_assets/")})
    print(f"{len(answer['files'])} files, {human_size(answer['size'])}; shared assets: {len(shared)}")
    for line in answer["evidence"].get("checked", []):
        print(f"checked   {line}")
    unchecked = {v.get("unchecked") for v in answer["evidence"].get("variants", []) if v.get("unchecked")}
    for line in sorted(unchecked):
        print(f"unchecked {line}")
    if answer.get("path"):
        print(answer["path"])
    return 0


def local_package(settings: Settings, ref: str, dest: str | None) -> dict[str, Any]:
    from farm.pipeline.execute import signer_for
    from farm.pipeline.packages import install_package, make_package
    from registry.index import Registry

    reg = Registry.open(settings)
    try:
        answer = make_package(settings, reg, ref, signer=signer_for(settings))
        if dest:
            answer["path"] = str(install_package(reg, answer, Path(dest)))
    finally:
        reg.close()
    return answer


def remote_package(server: str, token: str | None, ref: str, dest: str | None, settings: Settings, *,
                   timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """``POST /v1/packages`` (again after its Retry-After while the service answers 202: a
    worker is making it, until ``timeout``); then, with ``dest``, the record fetched by the
    digest the answer names (at most its size read, checked against the digest), every file by
    its digest (each verified), swapped into place."""
    from farm.client import HINT_SERVER, Client, install_package_files, shapes
    from farm.core.errors import ServerError

    client = Client(server, token)
    answer = _made(client, ref, timeout)
    # Every field read is of its type first (a digest, a whole record size, a list of signatures).
    shapes.conform(answer, shapes.PACKAGE_ANSWER, "the package answer", ServerError, HINT_SERVER)
    if dest:
        placed = install_package_files(client, answer["digest"], answer["record_size"], Path(dest),
                                       trusted=settings.trusted_keys, signatures=answer.get("signatures", []),
                                       required=settings.require_signature, allow_unsigned=settings.allow_unsigned)
        answer["path"] = str(placed.ctx_model.parent)
    return answer


def _made(client: Any, ref: str, timeout: float) -> Any:
    """The service's package of ``ref``, asked again while it answers 202 (a worker makes it)."""
    import time

    from farm.core.errors import CompileTimeoutError

    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        left = deadline - time.monotonic()
        answer, status, retry = client.json_status("POST", "/v1/packages", {"ref": ref},
                                                   wait=f"{max(0.0, min(WAIT_S, left)):.0f}")
        if status != 202:
            return answer
        # The service's Retry-After, within reason: it is not trusted to stall us or to spin us.
        pause = min(max(retry or 5.0, 1.0), 30.0)
        if time.monotonic() + pause > deadline:
            raise CompileTimeoutError(f"the package of {ref} was still being made by a worker after {timeout:g} s",
                                      hint=f"run `farm package {ref}` again later: it answers the package once made "
                                           "(one worker makes it, however many ask), or pass a longer --timeout")
        time.sleep(pause)
