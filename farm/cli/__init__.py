"""The ``farm`` command, a front door: this parser and one ``*_cmd`` module per group of subcommands.
May import every layer below (farm.pipeline, workers.backends, registry/, farm.core) and farm.client,
farm.api (``farm serve``), workers.main (``farm worker``); heavy modules only inside the commands.

``farm --help`` imports no SQLAlchemy, boto3 or onnx. User errors (FarmError) print code, message
and hint and exit non-zero without a traceback; any other exception is translated at the same
boundary (``translate``), and a real bug prints its traceback only with FARM_DEBUG=1."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from farm.core.errors import FarmError, InternalError, codes, translate

# name -> (module in farm.cli, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "targets": ("catalog_cmd", "list the targets the farm knows (SoCs, GPUs)"),
    "build": ("build_cmd", "compile a model for targets (embedded: here and now)"),
    "resolve": ("device_cmd", "which artifact a device should load"),
    "fetch": ("device_cmd", "download and verify the artifact a device should load"),
    "load-check": ("device_cmd", "load a context model with the local toolchain and time it"),
    "submit": ("cluster_cmd", "cluster: queue a release (targets x toolchains) to the workers"),
    "status": ("cluster_cmd", "cluster: progress of a release or a build"),
    "cancel": ("cancel_cmd", "stop the queued and running builds of a release (or one build)"),
    "worker": ("cluster_cmd", "cluster: run a worker for the toolchain installed here"),
    "workers": ("cluster_cmd", "cluster: live (and dead) workers and what they serve"),
    "ls": ("registry_cmd", "list artifacts"),
    "show": ("registry_cmd", "show one artifact (manifest, options, probe verdicts, files, build)"),
    "tag": ("tag_cmd", "point NAME:TAG at a model (an artifact's, or a digest); --history; moves need --force"),
    "untag": ("tag_cmd", "remove NAME:TAG (its history stays)"),
    "coverage": ("ops_cmd", "models x targets x toolchains: what is built, failed, missing"),
    "registry": ("ops_cmd", "verify blobs against the index, garbage-collect unreferenced blobs"),
    "keys": ("ops_cmd", "ed25519 signing keys: create, sign an artifact, print a public key"),
    "db": ("registry_cmd", "index database maintenance (upgrade)"),
    "serve": ("service_cmd", "run the HTTP service (FastAPI) for devices, pipelines and ops"),
    "token": ("service_cmd", "HTTP service tokens: create (shown once), list, revoke"),
    "install": ("service_cmd", "device: install an artifact from the HTTP service (URL + read token only)"),
    "report": ("report_cmd", "device: report what loading an artifact did (loads, fails, crashed; times)"),
    "reports": ("report_cmd", "what devices reported about an artifact; revoke a token's reports or one; "
                              "what reports quarantine, and lift it"),
    "help": ("help_cmd", "the error codes (farm help errors) or a command's arguments (farm help COMMAND)"),
    "device": ("devlab_cmd", "device lab: enroll an agent (single-use token), list, revoke; verify: jobs timing every SDK"),
    "promote": ("devlab_cmd", "move NAME:TO to NAME:FROM's model on device evidence (--require); gated; --rollback"),
    "package": ("package_cmd", "an ORT model package (onnxruntime >= 1.32) of a model's published builds, into -d DIR"),
}

# Short flags mean one thing on every command (a test walks every parser): -t --target, -m --model,
# -o --option KEY=VALUE (a build option, as ssh -o and mount -o), -d --dest DIR (where files go,
# as pip download -d), -f --force, -h --help. --out is --dest's other name.
# A short flag that used to mean something else on a command: (command, flag) -> what to use now.
RETIRED_FLAGS: dict[tuple[str, str], str] = {
    ("fetch", "-o"): "-d/--dest DIR (-o is --option KEY=VALUE on every command)",
}


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors in the one vocabulary: ``error[usage]`` and exit 2, and a
    "did you mean" for a typo'd command, flag or choice (difflib; argparse 3.11 has none)."""

    argv: list[str] = []  # what main() parses: the flags a subcommand did not know are looked up in it

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.command: str | None = None  # the subcommand this parser is for
        self.subparsers: dict[str, Parser] = {}

    def error(self, message: str) -> NoReturn:
        hint = "`farm COMMAND --help` lists the arguments"
        choice = _INVALID_CHOICE.search(message)
        if choice and self.command is None and message.startswith("argument COMMAND"):
            word = _unquote(choice.group(1))
            message = f"unknown command {word[:40]!r}" + suggest(word, list(COMMANDS))
            hint = "`farm --help` lists the commands"
        elif choice:
            word = _unquote(choice.group(1))
            choices = [_unquote(c) for c in choice.group(2).split(", ")]
            if len(choices) > 12:  # a range (--limit 1..100000): its ends, not every number
                message = message.replace(choice.group(0), f"invalid choice: {choice.group(1)} "
                                                           f"(choose from {choices[0]} to {choices[-1]})")
            else:
                message += suggest(word, choices)
        else:
            message += self._flag_suggestions()
        self.print_usage(sys.stderr)
        print(f"error[usage]: {self.prog}: {message}", file=sys.stderr)
        print(f"  hint: {hint}", file=sys.stderr)
        if "--json" in self.argv:
            print(json.dumps({"error": {"code": "usage", "message": f"{self.prog}: {message}", "hint": hint}}))
        sys.exit(2)

    def _flag_suggestions(self) -> str:
        """For each flag in argv this parser does not know: the one it most likely meant."""
        known = [s for s in self._option_string_actions if s.startswith("--")]
        out = []
        for token in self.argv:
            if token == "--":
                break
            flag = token.split("=", 1)[0]
            if not flag.startswith("-") or flag[1:2].isdigit() or flag in self._option_string_actions:
                continue
            if (retired := RETIRED_FLAGS.get((self.command or "", flag))) is not None:
                out.append(f"{flag} on {self.command} is now {retired}")
            elif flag in ("--server", "--token") and self.command:
                out.append(f"farm {self.command} has no remote form: it needs the index itself (run it where "
                           "FARM_DATABASE_URL points)")
            elif flag.startswith("--") and (hit := suggest(flag, known)):
                out.append(hit.removeprefix("; "))
        return "".join(f"; {s}" for s in dict.fromkeys(out))


_INVALID_CHOICE = re.compile(r"invalid choice: (.+?) \(choose from (.*)\)$")


def _unquote(text: str) -> str:
    text = text.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" else text


def suggest(word: str, candidates: Sequence[str]) -> str:
    """``"; did you mean build?"`` for the closest candidate, or ``""``."""
    import difflib

    hits = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {hits[0]}?" if hits else ""


def build_parser(selected: str | None = None) -> Parser:
    """The parser; only ``selected``'s module is imported to declare its arguments. A known
    ``selected`` gets only its own subparser (27 empty subparsers cost ~7 ms of every
    call); anything else (no command, a typo, ``--help``, ``--version``) gets them all, for the
    listing and the suggestion."""
    parser = Parser(
        prog="farm",
        description="ctxfarm: build farm and registry for ONNX Runtime EP context binaries",
        epilog="`farm help errors` lists the error codes; `farm COMMAND --help` a command's arguments.",
    )
    parser.add_argument("--version", action="version", version=f"ctxfarm {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if selected in COMMANDS and name != selected:
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        p.command = name
        parser.subparsers[name] = p
        # Each command module declares its own arguments, imported only when that command runs.
        if name == selected:
            importlib.import_module(f"farm.cli.{module}").add_arguments(name, p)
    return parser


def _version() -> str:
    from farm import __version__

    return __version__


def print_error(exc: FarmError) -> None:
    print(f"error[{exc.code}]: {exc.message}", file=sys.stderr)
    if exc.hint:
        print(f"  hint: {exc.hint}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """The one boundary: every exception that can reach it becomes a documented code, a message
    and a hint; a traceback only with FARM_DEBUG=1."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    Parser.argv = args_list
    parser = build_parser(args_list[0] if args_list else None)
    args, extra = parser.parse_known_args(args_list)
    if extra:
        args, extra = _reparse_intermixed(parser, args, args_list, extra)
    if extra:  # the subcommand's own usage and a suggestion, not the top-level usage
        parser.subparsers.get(getattr(args, "command", None) or "", parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        module = importlib.import_module(f"farm.cli.{args._module}")
        from farm.core.settings import Settings

        settings = Settings.from_env()
        rc: int = module.run(args.command, args, settings)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        return _broken_pipe()
    except BaseException as exc:  # noqa: BLE001 - this is the boundary
        if isinstance(exc, SystemExit):
            raise
        err = translate(exc)
        if err.code not in codes():  # the documented table is the whole vocabulary
            err = InternalError(f"undocumented error code {err.code!r}: {err.message}")
        if _debug() and not isinstance(exc, FarmError):
            import traceback

            traceback.print_exc()
        try:
            if getattr(args, "json", False):
                print(json.dumps({"error": err.to_dict()}, default=str))
            print_error(err)
        except BrokenPipeError:
            return _broken_pipe()
        return err.exit_code


def _reparse_intermixed(parser: Parser, args: argparse.Namespace, args_list: list[str],
                        extra: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Positionals after options: ``farm token create --scope submit NAME``.

    argparse matches positionals chunk by chunk, so an optional positional (NAME, ``nargs="?"``)
    is filled with nothing by the chunk before the first option and the NAME after it is left
    over. The subcommand's parser, parsing its own words intermixed, places it. A fresh
    namespace: appending options (``-o``) must not count twice."""
    command = getattr(args, "command", None)
    sub = parser.subparsers.get(command or "")
    if sub is None or not args_list or args_list[0] != command:
        return args, extra
    try:
        again, left = sub.parse_known_intermixed_args(args_list[1:])
    except TypeError:  # a parser argparse cannot intermix (REMAINDER): the first answer stands
        return args, extra
    if len(left) >= len(extra):
        return args, extra
    again.command = command
    return again, left


def _debug() -> bool:
    import os

    return os.environ.get("FARM_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def _broken_pipe() -> int:
    """The reader went away (`farm ls --json | head`): exit quietly, as Unix tools do."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    return 141


def table(rows: list[dict[str, Any]], columns: list[str], out: Any = None) -> None:
    """Print rows as an aligned text table (stored text escaped: no control, format or bidi character
    reaches the terminal, ``farm.core.text.printable``)."""
    from farm.core.text import printable

    out = out or sys.stdout
    cells = [[str(c).upper() for c in columns]] + [["" if r.get(c) is None else printable(str(r.get(c)))
                                                     for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(), file=out)


def human_size(n: int | None) -> str:
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


if __name__ == "__main__":
    sys.exit(main())
