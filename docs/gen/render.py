"""Markdown made from the code itself, for the documentation site (``docs/gen/hooks.py`` puts it
into the pages at build time, where a page says ``<!-- gen:NAME -->``), so the site can never
describe a flag, an error code, an endpoint or a state that the code does not have.

    python docs/gen/render.py NAME     # print one block: cli, errors, error-tree, api, states, layers, perf
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _cell(text: object) -> str:
    """One Markdown table cell: no newlines, no stray pipes."""
    return " ".join(str(text).split()).replace("|", "\\|")


@contextlib.contextmanager
def _clean_env() -> Iterator[None]:
    """No FARM_* of the machine building the docs leaks into a default, and argparse formats its
    usage at a fixed width (it reads COLUMNS)."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("FARM_")]:
        del os.environ[key]
    os.environ["COLUMNS"] = "100"
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --- CLI reference: walks the real parser ------------------------------------------------------

def _flag_row(action: argparse.Action) -> str | None:
    if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
        return None
    if action.option_strings:
        names = ", ".join(f"`{s}`" for s in action.option_strings)
        if action.nargs != 0:
            names += f" `{action.metavar or action.dest.upper()}`"
    else:
        names = f"`{action.metavar or action.dest}`"
    choices = ""
    if action.choices is not None and not isinstance(action.choices, range):
        choices = "one of " + ", ".join(f"`{c}`" for c in action.choices)
    elif isinstance(action.choices, range):
        choices = f"{action.choices.start} to {action.choices.stop - 1}"
    default = action.default
    shown = "" if default in (None, False, [], argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
    if isinstance(action, argparse._AppendAction | argparse._ExtendAction):
        names += " (repeatable)"
    help_text = (action.help or "") % {"default": default, "prog": ""} if action.help else ""
    return f"| {names} | {_cell(help_text)} | {_cell(choices)} | {_cell(shown)} |"


def _usage(parser: argparse.ArgumentParser) -> str:
    """argparse's usage without its ``usage: `` prefix (continuation lines dedented to match)."""
    first, *rest = parser.format_usage().strip().split("\n")
    return "\n".join([first.removeprefix("usage: "), *(line.removeprefix(" " * 7) for line in rest)])


def _parser_section(prog: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    out = [f"{'#' * level} `{prog}`", ""]
    if parser.description:
        out += [parser.description[:1].upper() + parser.description[1:] + ".", ""]
    out += ["```", _usage(parser), "```", ""]
    rows = [r for a in parser._actions if not isinstance(a, argparse._SubParsersAction) and (r := _flag_row(a))]
    if rows:
        out += ["| argument | meaning | values | default |", "|---|---|---|---|", *rows, ""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parser_section(f"{prog} {name}", sub, level + 1)
    return out


def cli() -> str:
    """Every `farm` command with its usage and arguments, from ``farm.cli.build_parser``."""
    from farm.cli import COMMANDS, build_parser

    with _clean_env():
        top = build_parser()
        out = ["| command | what it does |", "|---|---|"]
        out += [f"| [`farm {n}`](#farm-{n}) | {_cell(h)} |" for n, (_m, h) in COMMANDS.items()]
        out += ["", "Every command takes `-h`/`--help`. Global: `farm --version`.", ""]
        out += ["```", _usage(top), "```", ""]
        for name in COMMANDS:
            sub = build_parser(name).subparsers[name]  # declares only this command's arguments
            out += _parser_section(f"farm {name}", sub, 2)
    return "\n".join(out) + "\n"


# --- Errors: farm/core/errors.py ---------------------------------------------------------------

def errors() -> str:
    """The table `farm help errors --markdown` prints (``errors.markdown_table``)."""
    from farm.core.errors import markdown_table

    return markdown_table()


def error_tree() -> str:
    """The class tree from the errors module's docstring (read, not imported)."""
    doc = ast.get_docstring(ast.parse((ROOT / "farm/core/errors.py").read_text())) or ""
    lines = [line for line in doc.splitlines() if line.startswith("    ")]
    return "```\n" + "\n".join(line[4:] for line in lines) + "\n```\n"


# --- Build states: the diagram in farm/pipeline/states.py --------------------------------------

def states() -> str:
    """The state diagram of the build state machine, as its module's docstring draws it."""
    doc = ast.get_docstring(ast.parse((ROOT / "farm/pipeline/states.py").read_text())) or ""
    block = doc.split("::", 1)[1] if "::" in doc else doc
    lines = block.split("\n")[1:]
    body: list[str] = []
    for line in lines:
        if line.strip() and not line.startswith("    "):
            break
        body.append(line[4:])
    text = "\n".join(body).strip("\n")
    rest = doc.split(text.split("\n")[-1].strip(), 1)[-1].strip() if text else ""
    # The docstring is reStructuredText: ``code`` is Markdown's `code`, and plain text in the diagram.
    return f"```\n{text.replace('``', '')}\n```\n\n{' '.join(rest.replace('``', '`').split())}\n"


# --- Layers: the import-linter contracts and each package's docstring ---------------------------

def layers() -> str:
    """The import contracts the suite enforces (pyproject.toml) and what each package says it holds."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    out: list[str] = []
    for contract in config.get("contracts", []):
        out += [f"**{contract['name']}** (`{contract['type']}`)", ""]
        if contract["type"] == "layers":
            out += ["```"]
            out += [f"{'↓ ' if i else '  '}{layer}" for i, layer in enumerate(contract["layers"])]
            out += ["```", ""]
        else:
            for key in ("source_modules", "forbidden_modules", "modules", "containers"):
                if key in contract:
                    out += [f"- {key.replace('_', ' ')}: " + ", ".join(f"`{m}`" for m in contract[key])]
            out += [""]
    packages = []
    for pkg in config.get("root_packages", []):
        init = ROOT / pkg / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) if init.exists() else None
        if doc:
            packages.append(f"- `{pkg}/`: {' '.join(doc.split())}")
    if packages:
        out += ["What each top-level package says of itself (its `__init__.py`):", "", *packages, ""]
    return "\n".join(out)


# --- HTTP API: the service's own OpenAPI document -----------------------------------------------

def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_schema_type(s) for s in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_schema_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    return str(kind)


def openapi() -> dict[str, Any]:
    """``create_app(settings).openapi()`` on a throwaway embedded registry."""
    from farm.api.app import create_app
    from farm.core.settings import Settings

    with _clean_env(), tempfile.TemporaryDirectory(prefix="ctxfarm-docs-") as home:
        app = create_app(Settings.from_env({"FARM_HOME": home}))
        doc: dict[str, Any] = app.openapi()
        app.state.registry.close()
        return doc


def api() -> str:
    """Every endpoint (scope, parameters, body, answers) and every schema of the OpenAPI document."""
    doc = openapi()
    out = [f"OpenAPI {doc['openapi']}, `{doc['info']['title']}` version {doc['info']['version']}; "
           "the live document is at `/openapi.json` on every service.", ""]
    out += ["| method | path | scope | summary |", "|---|---|---|---|"]
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            scope = ", ".join(op.get("tags", [])) or ""
            anchor = f"{method}-{path}".lower().replace("/", "").replace("{", "").replace("}", "").replace("_", "")
            out.append(f"| {method.upper()} | [`{path}`](#{anchor}) | {scope} | {_cell(op.get('summary', ''))} |")
    out.append("")
    common = None
    for methods in doc["paths"].values():
        for op in methods.values():
            codes = set(op.get("responses", {}))
            common = codes if common is None else common & codes
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            anchor = f"{method}-{path}".lower().replace("/", "").replace("{", "").replace("}", "").replace("_", "")
            out += [f"## {method.upper()} {path} {{#{anchor}}}", ""]
            scope = ", ".join(op.get("tags", []))
            if scope:
                how = " (a bearer token)" if op.get("security") else ""
                out += [f"Scope: **{scope}**" + ("" if scope == "ops" else how) + ".", ""]
            if op.get("description"):
                out += [" ".join(op["description"].split()), ""]
            params = [p for p in op.get("parameters", []) if p["name"] not in ("token", "authorization")]
            if params:
                out += ["| parameter | in | required | type | meaning |", "|---|---|---|---|---|"]
                for p in params:
                    out.append(f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} | "
                               f"{_cell(_schema_type(p.get('schema', {})))} | {_cell(p.get('description', ''))} |")
                out.append("")
            body = op.get("requestBody")
            if body:
                kinds = ", ".join(f"`{k}` {_schema_type(v.get('schema', {}))}" for k, v in body["content"].items())
                out += [f"Body: {kinds}.", ""]
            answers = []
            for code, resp in op.get("responses", {}).items():
                if common and code in common and code not in ("200",):
                    continue
                content = resp.get("content", {})
                kinds = ", ".join(f"`{k}` {_schema_type(v.get('schema', {}))}" for k, v in content.items())
                answers.append(f"| {code} | {_cell(resp.get('description', ''))} | {_cell(kinds)} |")
            if answers:
                out += ["| status | answer | content |", "|---|---|---|", *answers, ""]
    if common:
        out += ["## Error answers", "", "Every endpoint may also answer these, with an "
                "[`ErrorResponse`](#errorresponse) body (`{\"error\": {\"code\", \"message\", \"hint\"}}`, "
                "the codes of the [error table](errors.md)):", "",
                "| status | answer |", "|---|---|"]
        first = next(iter(doc["paths"].values()))
        sample = next(iter(first.values()))["responses"]
        out += [f"| {c} | {_cell(sample[c].get('description', ''))} |" for c in sorted(common) if c != "200"]
        out.append("")
    out += ["## Schemas", ""]
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [" ".join(schema["description"].split()), ""]
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        if props:
            out += ["| field | type | required | meaning |", "|---|---|---|---|"]
            for field, spec in props.items():
                out.append(f"| `{field}` | {_cell(_schema_type(spec))} | {'yes' if field in required else 'no'} | "
                           f"{_cell(spec.get('description', ''))} |")
            out.append("")
    return "\n".join(out)


def readme() -> str:
    """The README from its first paragraph to its journeys (what, why, the picture, the quick start),
    so the site's home page and the README cannot tell two stories; links to docs/ made relative."""
    text = (ROOT / "README.md").read_text()
    body = text.split("\n", 1)[1].split("\n## Journeys", 1)[0].strip("\n")
    return body.replace("](docs/", "](") + "\n"


def perf() -> str:
    """The current performance figures, from bench/out/*.json (``docs/gen/perf.py``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import perf as perf_tables

    return perf_tables.render(ROOT / "bench" / "out")


BLOCKS: dict[str, Callable[[], str]] = {
    "cli": cli, "errors": errors, "error-tree": error_tree, "api": api, "states": states, "layers": layers,
    "perf": perf, "readme": readme,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("block", choices=sorted(BLOCKS))
    args = ap.parse_args(argv)
    print(BLOCKS[args.block](), end="")
    return 0


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
