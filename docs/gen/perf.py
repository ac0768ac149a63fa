"""The Performance page's figures, made from what the benches wrote (bench/out/<name>.json), so a
figure in the docs is always one a bench printed. Each bench's JSON is laid out as tables as it
is (no figure is typed by hand); long per-run series are summarised as count, median, min, max.

    python docs/gen/perf.py [bench/out]      # print the Markdown
"""

from __future__ import annotations

import ast
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# Fields that say how a run was made on one machine, not what it measured (argv holds local paths).
NOISE = frozenset({"argv", "pid"})
MAX_ROWS = 24  # a list of more rows than this (one per build, per request) is summarised, not listed


def _num(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value).lower()
    if isinstance(value, float):
        if value == 0 or 0.001 <= abs(value) < 1000:
            return f"{value:.4g}"
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.2e}"
    return str(value)


def _cell(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        if value and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value) and len(value) > 6:
            return _series(value)
        value = ", ".join(_num(v) for v in value)
    return " ".join(_num(value).split()).replace("|", "\\|")


def _series(values: list[Any]) -> str:
    return (f"{len(values)} values: median {_num(statistics.median(values))}, "
            f"min {_num(min(values))}, max {_num(max(values))}")


def _measured(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in NOISE}


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool) or (
        isinstance(value, list) and all(isinstance(v, str | int | float | bool) for v in value))


def _table(rows: list[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    rows = [_measured(row) for row in rows]
    for row in rows:
        columns += [k for k, v in row.items() if _scalar(v) and k not in columns]
    if not columns:
        return []
    out = ["| " + " | ".join(c.replace("_", " ") for c in columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return out + [""]


def _summary(title: str, records: list[dict[str, Any]], heading: str) -> list[str]:
    """Count, median, min and max of each numeric field over many rows (one per build, per request)."""
    keys = [k for k, v in records[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    if not keys:
        return []
    out = [f"{heading} {title}", "", f"{len(records)} rows; each field over the rows:", "",
           "| field | median | min | max |", "|---|---|---|---|"]
    for k in keys:
        vals = [r[k] for r in records if isinstance(r.get(k), int | float) and not isinstance(r.get(k), bool)]
        if vals:
            out.append(f"| {k.replace('_', ' ')} | {_num(statistics.median(vals))} | {_num(min(vals))} | "
                       f"{_num(max(vals))} |")
    return out + [""]


def _walk(title: str, data: Any, level: int, out: list[str]) -> None:
    """A dict's scalars in one key/value table; a family of like dicts (modes, phases, queries) as one
    table, a row each; lists of records as tables, summarised when long or deep. The per-run series
    nested under a family's rows stay in the JSON (the page says so)."""
    heading = "#" * min(level, 6)
    if isinstance(data, dict):
        data = _measured(data)
        scalars = {k: v for k, v in data.items() if _scalar(v)}
        nested = {k: v for k, v in data.items() if not _scalar(v)}
        if title:
            out += [f"{heading} {title}", ""]
        if scalars:
            out += ["| measure | value |", "|---|---|"]
            out += [f"| {k.replace('_', ' ')} | {_cell(v)} |" for k, v in scalars.items()]
            out.append("")
        family = {k: v for k, v in nested.items() if isinstance(v, dict) and any(_scalar(x) for x in v.values())}
        shapes = [{f for f, x in v.items() if _scalar(x)} for v in family.values()]
        # Like records (modes, phases, queries) share most of their fields; unrelated dicts do not.
        if len(family) >= 2 and len(set.intersection(*shapes)) * 2 >= max(len(s) for s in shapes):
            out += _table([{"": k, **v} for k, v in family.items()])
            if any(not _scalar(x) for v in family.values() for x in v.values()):
                out += ["(Each row's per-run series are in the JSON.)", ""]
            nested = {k: v for k, v in nested.items() if k not in family}
        for key, value in nested.items():
            _walk(key.replace("_", " "), value, level + 1, out)
    elif isinstance(data, list):
        records = [r for r in data if isinstance(r, dict)]
        if not records:
            out += [f"{heading} {title}", "", _series(data) if all(isinstance(v, int | float) for v in data)
                    else ", ".join(_num(v) for v in data), ""]
            return
        if len(records) > MAX_ROWS or level > 4:
            out += _summary(title, records, heading)
            return
        if title:
            out += [f"{heading} {title}", ""]
        out += _table(records)
        for i, record in enumerate(records):
            for key, value in record.items():
                if not _scalar(value) and level < 4:
                    label = record.get("label") or record.get("mode") or record.get("name") or f"{title} {i + 1}"
                    _walk(f"{label}: {key.replace('_', ' ')}", value, level + 1, out)


def bench_of(stem: str) -> Path:
    """bench/NAME.py for bench/out/NAME.json, or for NAME-LABEL.json (a labelled run of NAME)."""
    exact = ROOT / "bench" / f"{stem}.py"
    return exact if exact.exists() else ROOT / "bench" / f"{stem.split('-', 1)[0]}.py"


def usage(bench: Path) -> str:
    """The bench's own command line, from the first ``python bench/...`` line of its docstring."""
    if not bench.exists():
        return ""
    doc = ast.get_docstring(ast.parse(bench.read_text())) or ""
    for line in doc.splitlines():
        if line.strip().startswith(f"python bench/{bench.name}"):
            return line.split("#", 1)[0].strip()
    return f"python bench/{bench.name}"


def summary(bench: Path) -> str:
    doc = ast.get_docstring(ast.parse(bench.read_text())) if bench.exists() else None
    return " ".join(doc.split("\n\n")[0].split()) if doc else ""


def render(out_dir: Path) -> str:
    """One section per bench/out/*.json: what the bench measures, how to rerun it, its figures."""
    files = sorted(out_dir.glob("*.json")) if out_dir.is_dir() else []
    lines: list[str] = []
    benches = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))
    recorded = {bench_of(p.stem).stem for p in files}
    for path in files:
        bench = bench_of(path.stem)
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path}: not JSON ({exc}); rerun the bench") from None
        lines += [f"## {path.stem}", ""]
        if summary(bench):
            lines += [summary(bench), ""]
        rerun = f"; rerun: `{usage(bench)}`" if bench.exists() else ""
        lines += [f"From `bench/out/{path.name}`{rerun}.", ""]
        if isinstance(data, dict) and isinstance(data.get("summary"), dict):
            # A bench that sums up its own run (bench/farm.py): its settings, then that summary; the
            # rounds it was made from stay in the JSON.
            _walk("", {k: v for k, v in data.items() if _scalar(v)}, 2, lines)
            _walk("summary", data["summary"], 3, lines)
            lines += ["(Each round's own figures are in the JSON.)", ""]
        else:
            _walk("", data, 2, lines)
    missing = [b for b in benches if b not in recorded]
    if missing:
        lines += ["## Not recorded", "",
                  "These benches have no recorded run in `bench/out/`, so this page shows no figure of theirs: "
                  + ", ".join(f"`python bench/{b}.py`" for b in missing) + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench" / "out"), end="")
