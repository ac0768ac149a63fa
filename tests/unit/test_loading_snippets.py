"""The device loading snippets of the docs agree: docs/groups.md's group loading uses
the README's single-model lines (the QNN plugin registered, its devices, the same provider
options, no CPU fallback), and neither uses a name it does not define."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _snippet(path: Path, marker: str) -> ast.Module:
    """The first python block after ``marker`` in ``path``."""
    text = path.read_text()
    after = text[text.index(marker):]
    code = re.search(r"```python\n(.*?)```", after, re.S)
    assert code is not None, (path, marker)
    return ast.parse(code.group(1))


def _undefined(tree: ast.Module) -> set[str]:
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef):
            defined.add(node.name)
            defined |= {a.arg for a in node.args.args}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.comprehension):
            defined |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - defined


def _calls(tree: ast.Module, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == name]


def _provider_options(tree: ast.Module) -> dict[str, str]:
    (call,) = _calls(tree, "add_provider_for_devices")
    opts = call.args[1]
    assert isinstance(opts, ast.Dict)
    return {ast.literal_eval(k): ast.unparse(v) for k, v in zip(opts.keys, opts.values, strict=True)}  # type: ignore[arg-type]


def test_group_loading_matches_the_readme_and_defines_every_name() -> None:
    readme = _snippet(ROOT / "README.md", "### Load it on the device")
    group = _snippet(ROOT / "docs" / "groups.md", "## How a device loads a group")
    for tree in (readme, group):
        assert _undefined(tree) == set(), ast.unparse(tree)[:300]
        assert _calls(tree, "register_execution_provider_library")
        sessions = _calls(tree, "InferenceSession")
        assert sessions and all(any(k.arg == "enable_fallback" and ast.literal_eval(k.value) == 0
                                    for k in c.keywords) for c in sessions)
    assert _provider_options(group) == _provider_options(readme)
    shared = _calls(group, "add_session_config_entry")
    assert [ast.literal_eval(a) for c in shared for a in c.args] == ["ep.share_ep_contexts", "1"]
