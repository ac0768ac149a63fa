"""A PEP 517 backend that builds the ctxfarm-client wheel from the repository's sources: the
modules the device client imports, and nothing else (the standard library only; no setuptools,
so it builds offline with an empty build environment). ``pyproject.toml`` beside it holds the
name, the command and the extra; the version is ``farm.__version__``.

A test (tests/integration/test_client_wheel.py) builds it, installs it alone in a bare venv and
installs an artifact from a live service with it: a module missing from ``MODULES`` fails there.
"""

from __future__ import annotations

import base64
import hashlib
import re
import tomllib
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# The client's import closure (the farm.client package, every module of it, and what it imports
# from farm.core), with its data.
MODULES = [
    "farm/__init__.py",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "farm" / "client").glob("*.py")),
    "farm/client_report.py",  # device reports: report() for apps that load artifacts themselves
    "farm/core/__init__.py",
    "farm/core/errors.py",
    "farm/core/keys.py",
    "farm/core/names.py",
    "farm/core/packages.py",  # ctxfarm-install --package (an ORT model package)
    "farm/core/placement.py",
    "farm/core/settings.py",
    "farm/core/untrusted.py",
    "farm/core/catalog/__init__.py",
    "farm/core/catalog/targets.toml",
    "farm/core/catalog/runtimes.py",
    "farm/core/catalog/runtimes.toml",
]
TAG = "py3-none-any"


def _project() -> dict[str, Any]:
    project = tomllib.loads((HERE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    text = (ROOT / "farm" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    if match is None:
        raise RuntimeError("farm/__init__.py has no __version__")
    return {**project, "version": match.group(1)}


def _metadata(p: dict[str, Any]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p['description']}", f"Requires-Python: {p['requires-python']}"]
    for extra, reqs in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    return "\n".join(lines) + "\n"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None) -> str:
    p = _project()
    dist = p["name"].replace("-", "_")
    info = f"{dist}-{p['version']}.dist-info"
    name = f"{dist}-{p['version']}-{TAG}.whl"
    entries: list[tuple[str, bytes]] = [(m, (ROOT / m).read_bytes()) for m in MODULES]
    scripts = "".join(f"{k} = {v}\n" for k, v in p.get("scripts", {}).items())
    entries += [
        (f"{info}/METADATA", _metadata(p).encode()),
        (f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: ctxfarm-client-backend\nRoot-Is-Purelib: true\nTag: {TAG}\n"
         .encode()),
        (f"{info}/entry_points.txt", f"[console_scripts]\n{scripts}".encode()),
    ]
    record = [_record_line(n, d) for n, d in entries] + [f"{info}/RECORD,,"]
    entries.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    out = Path(wheel_directory) / name
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, data in entries:
            # A fixed timestamp: the same sources make the same wheel.
            zi = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return name
