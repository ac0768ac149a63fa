"""farm help [errors | COMMAND]: the error codes (made from farm/core/errors.py, the one source of
the table of docs/errors.md) or one command's help."""

from __future__ import annotations

import argparse
import json

from farm.core.errors import UsageError
from farm.core.settings import Settings


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("topic", nargs="?", metavar="errors|COMMAND",
                   help="errors: every error code, its exit status and meaning; COMMAND: its arguments")
    p.add_argument("--markdown", action="store_true", help="errors: the Markdown table (docs/errors.md)")
    p.add_argument("--json", action="store_true", help="errors: machine-readable output")


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    from farm.cli import COMMANDS, build_parser, suggest

    if args.topic == "errors" or (args.topic is None and (args.json or args.markdown)):
        return _errors(args)
    if args.topic is None:
        build_parser().print_help()
        return 0
    if args.topic not in COMMANDS:
        raise UsageError(f"no help topic {args.topic[:40]!r}" + suggest(args.topic, ["errors", *COMMANDS]),
                         hint="farm help errors, or farm help COMMAND (farm --help lists them)")
    build_parser(args.topic).parse_args([args.topic, "--help"])  # prints and exits 0
    return 0


def _errors(args: argparse.Namespace) -> int:
    from farm.cli import table
    from farm.core.errors import markdown_table, table_rows

    rows = table_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
    elif args.markdown:
        print(markdown_table(), end="")
    else:
        print("Errors print `error[CODE]: message` and a hint; scripts match on the code.\n")
        table([{**r, "meaning": r["meaning"].replace("`", "")} for r in rows], ["code", "exit", "meaning"])
    return 0
