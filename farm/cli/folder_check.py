"""`farm load-check DIR` on a folder `farm install`/`farm fetch` filled with a graph group
(``g<i>_ctx.onnx`` sharing ``.bin`` files) or a genai package (``genai_config.json`` naming its
stages): every file the folder must hold is checked, every context model is checked as
``farm load-check FILE`` checks one, and the folder gets ONE outcome:

- a folder with no context model at all (an exporter's folder that was never built):
  ``not-a-context``, exit 1, with the hint to build it first;
- a file missing (a stage the config names, the tokenizer): ``not-found`` naming every one;
- every context loaded: exit 0;
- a context failed a check (missing file, wrong SoC, newer SDK, crashed): that error, exit 1;
- everything checkable passed but this runtime cannot load the contexts (weight-shared or
  multi-SoC on the x86_64 simulator): ``load-unverified``, exit 4, naming what was checked and
  why it was not loaded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from farm.core.errors import LoadUnverifiedError, NotAContextError, NotFoundError
from farm.core.names import UnsafePathError, UnusablePathError, inside

CONFIG = "genai_config.json"
CPU_STAGE = "cpu stage (present; runs on the CPU EP)"
# One of these is the tokenizer onnxruntime-genai opens (farm.core.genai checks the same when it builds).
TOKENIZERS = ("tokenizer.json", "tokenizer.model")
GROUP_CTX = re.compile(r"g\d{1,2}_ctx\.onnx")


def is_folder_artifact(folder: Path) -> bool:
    """Whether ``folder`` holds a genai package or a graph group (not one model_ctx.onnx)."""
    return (folder / CONFIG).is_file() or any(GROUP_CTX.fullmatch(p.name) for p in folder.glob("g*_ctx.onnx"))


def config_files(folder: Path) -> list[str]:
    """Every file a genai_config.json names (each ``filename`` in it), in order; a config that
    is not JSON, or names a path outside the folder, is ``not-found`` naming it."""
    path = folder / CONFIG
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError) as exc:
        raise NotFoundError(f"{path} is not a readable genai config ({type(exc).__name__}: {str(exc)[:200]})",
                            hint="fetch it again: farm fetch --model NAME:TAG --soc SOC --qnn V --dest DIR") from None
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "filename" and isinstance(x, str):
                    out.append(x)
                else:
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(doc.get("model") if isinstance(doc, dict) else None)
    return list(dict.fromkeys(out))


def _present(folder: Path, kind: str, names: list[str]) -> list[tuple[str, Path]]:
    """Each file the folder must hold, checked present; ``not-found`` naming EVERY missing one
    (a genai package also needs its tokenizer, which genai_config.json does not name)."""
    paths: list[tuple[str, Path]] = []
    missing: list[str] = []
    for name in names:
        try:
            path = inside(folder, name)
        except UnusablePathError as exc:
            raise NotFoundError(f"{CONFIG} names {name[:120]!r}, which can't be read: {exc.reason}") from None
        except UnsafePathError:
            raise NotFoundError(f"{CONFIG} names {name[:120]!r}, a path outside {folder}") from None
        if path.is_file():
            paths.append((name, path))
        else:
            missing.append(name)
    if kind == "genai package" and not any((folder / t).is_file() for t in TOKENIZERS):
        missing.append(TOKENIZERS[0])  # og.Tokenizer(model) loads it from the folder
    if missing:
        raise NotFoundError(f"{folder} lacks {len(missing)} file(s) the {kind} needs: {', '.join(missing)}",
                            hint="fetch it again: farm fetch verifies every file's digest")
    return paths


def check_folder(folder: Path, target: Any, checked_load: Callable[[Path, Any], dict[str, Any]]) -> dict[str, Any]:
    """One outcome for the folder (see the module docstring); ``checked_load`` checks one
    context model (farm.cli.device_cmd.checked_load)."""
    if (folder / CONFIG).is_file():
        kind = "genai package"
        names = config_files(folder)
        if not names:
            raise NotFoundError(f"{folder / CONFIG} names no stage file (no 'filename' under 'model')",
                                hint="fetch the package again, or rebuild it (farm build --genai)")
    else:
        kind = "graph group"
        names = sorted((p.name for p in folder.glob("g*_ctx.onnx") if GROUP_CTX.fullmatch(p.name)),
                       key=lambda n: int(n[1:].split("_", 1)[0]))
        if not names:
            raise NotFoundError(f"{folder} holds no context model (no model_ctx.onnx, g<i>_ctx.onnx or {CONFIG})",
                                hint="give the DIR that farm install --dest DIR (or farm fetch --dest DIR) filled, "
                                     "or a *_ctx.onnx")
    paths = _present(folder, kind, names)
    contexts: list[dict[str, Any]] = []
    unverified: list[str] = []
    for name, path in paths:
        try:
            loaded = checked_load(path, target)
            contexts.append({"file": name, "outcome": "loads",
                             "load_seconds": loaded.get("load_seconds"), "notes": loaded.get("notes") or []})
        except NotAContextError:
            contexts.append({"file": name, "outcome": CPU_STAGE})
        except LoadUnverifiedError as exc:
            why = str(exc.details.get("unverified") or exc.message)
            unverified.append(why)
            contexts.append({"file": name, "outcome": f"checked (files, SoC and SDK), not loaded: {why}",
                             "context": exc.details.get("context")})
    if not any(c["outcome"] != CPU_STAGE for c in contexts):
        # An exporter's folder (or any folder of plain models): nothing in it was compiled.
        raise NotAContextError(
            f"{folder} ({kind}) holds no context model: its {len(contexts)} model(s) are plain ONNX graphs "
            "(no EPContext node), so it is not a built folder; nothing was loaded",
            hint="build it first (farm build --genai DIR -t qnn:SOC, or --graph for a group), install the answer "
                 "(farm fetch --dest DIR / farm install --dest DIR) and load-check that folder")
    report = {"ok": not unverified, "folder": str(folder), "kind": kind, "target": target.ref,
              "contexts": contexts}
    if unverified:
        report["unverified"] = unverified[0]
        n = sum(1 for c in contexts if c["outcome"].startswith("checked"))
        raise LoadUnverifiedError(
            f"{folder} ({kind}): {len(contexts)} file(s) present, {n} context model(s) checked for {target.ref} "
            f"(their files, SoC and SDK); none loaded here: {unverified[0]}", details=report)
    return report
