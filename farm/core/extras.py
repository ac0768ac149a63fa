"""The command that installs an optional extra, as the user can run it here: in a checkout
(the package imported from a source tree with its pyproject.toml, as the quick start's
editable install is) that is the checkout's own editable install, since `pip install
'ctxfarm[service]'` would fetch another ctxfarm from an index beside it (or find none);
elsewhere the published package's extra."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def checkout() -> Path | None:
    """The source tree this ctxfarm runs from, or None for an installed wheel."""
    project = ROOT / "pyproject.toml"
    try:
        return ROOT if project.is_file() and 'name = "ctxfarm"' in project.read_text(errors="replace") else None
    except OSError:
        return None


def install_hint(extra: str) -> str:
    """``pip install 'ctxfarm[EXTRA]'``, or in a checkout ``.venv/bin/pip install -e '.[EXTRA]'``
    (run in the checkout; with this interpreter's pip when it is not the checkout's .venv)."""
    root = checkout()
    if root is None:
        return f"pip install 'ctxfarm[{extra}]'"
    venv = root / ".venv"
    if Path(sys.prefix).resolve() == venv.resolve():
        return f"cd {root} && .venv/bin/pip install -e '.[{extra}]'"
    return f"cd {root} && {sys.executable} -m pip install -e '.[{extra}]'"
