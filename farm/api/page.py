"""The coverage page, rendered on the server (no JavaScript build chain), from the same queries
as `farm coverage` and /v1/coverage/summary|models (registry.coverage):

1. the filter form (tag, name prefix, model, SoC, SDK, state): a plain GET, so the browser's
   session cookie authenticates it; no link or form here ever carries a token;
2. the summary: per backend, SoC (rows) x SDK (columns), each cell the count of models built,
   building, broken, failed, missing and verified by a probe or a device, each count a link to
   the drill-down of exactly those models;
3. the legend;
4. the drill-down: one page of models (by name), a row per (model, SoC), a column per SDK, each
   cell its state with the probe verdicts per runtime written out, and a link to the next page.
"""

from __future__ import annotations

import html
from typing import Any
from urllib.parse import urlencode

STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#1b1f24}
table{border-collapse:collapse;margin-bottom:16px}th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:center;
vertical-align:top}th{background:#f6f8fa}td{white-space:nowrap}
td.built{background:#dafbe1}td.failed{background:#ffebe9}td.missing{background:#fff8c5}
td.building{background:#ddf4ff}td.broken{background:#ffd8b5}td.model{text-align:left}
td.partial{outline:2px dashed #9a6700;outline-offset:-3px}
.v{font-size:12px;color:#57606a}.n{display:block}.n.zero{color:#8c959f}
span.built{color:#1a7f37}span.failed{color:#cf222e}span.missing{color:#9a6700}span.broken{color:#bc4c00}
span.building{color:#0969da}
form{margin-bottom:12px}form label{margin-right:8px}dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}
dt{font-weight:600}caption{text-align:left;font-weight:600;margin:8px 0}
"""

STATES = ("built", "building", "broken", "failed", "missing")
LEGEND = (
    ("built", "a build for this SoC with this SDK succeeded and its artifact is whole"),
    ("building", "queued or compiling"),
    ("broken", "it was built, but `farm registry verify` found its blobs damaged: resolve does not serve it"),
    ("failed (code)", "every build of the cell failed; the error codes say why (`farm help errors`)"),
    ("missing", "the model was built for this SoC with another SDK, not with this one"),
    ("\u2713probe", "a probe on the farm loaded the built artifact (its verdicts per runtime are listed)"),
    ("\u2713device", "a device reported that it loaded the artifact (POST /v1/reports)"),
    ("lab\u00d7N p50", "N enrolled devices of the device lab (this SoC, not simulators, not revoked) ran the built "
                     "artifact; p50 is their median latency (docs/device-lab.md)"),
    ("slower: 1.6x vs QNN v", "speed per SDK: enrolled devices measured this SDK's artifact 1.2x or more slower than "
                              "SDK v's on the same SoC"),
    ("+N sim", "reports of simulator agents: shown, never counted as device evidence"),
    ("unverified", "built only as weight-shared graph groups or multi-SoC binaries: the x86_64 simulator can't load "
                   "them, so only devices can confirm the cell (hover for why)"),
    ("loads / fails", "what probes measured under a runtime version: QNN 2.51.0 loads"),
    ("+cpu (ops)", "partial offload: a built artifact leaves these ops on the device's CPU (built without "
                   "--require-full-offload)"),
    ("twin N/M", "an LLM (genai package): its twin, the parts compiled without sharing and run on the simulator, "
                 "chose what the CPU EP chose at N of M greedy generation steps (the shared package itself loads only on a "
                 "device); "
                 "its parts are counted under it, not as models"),
)
RUNTIME_NAMES = {"qnn": "QNN", "trt": "TensorRT"}


def render_page(session: Any, *, tag: str | None = None, prefix: str | None = None,
                model: list[str] | None = None, soc: str | None = None, sdk: str | None = None,
                state: str | None = None, cursor: str | None = None, limit: int = 20) -> str:
    """The whole page for these filters (bad ones raise the usual usage / not-found errors)."""
    from registry.coverage import models_page, scope, summary

    target = _target(soc) if soc else None
    sc = scope(session, tag=tag, prefix=prefix, models=model)
    summ = summary(session, sc)
    page = models_page(session, sc, target=target, toolchain=sdk or None, state=state or None, cursor=cursor,
                       limit=limit)
    filters = {"tag": tag, "prefix": prefix, "model": model or None, "soc": soc, "sdk": sdk}
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>ctxfarm coverage</title>",
           f"<style>{STYLE}</style></head><body><h1>ctxfarm coverage</h1>", _form(filters, state)]
    out.append("<h2>Summary</h2>")
    if not summ.rows:
        out.append("<p>no builds yet" + (" for these filters" if not sc.whole else "") + "</p>")
    for backend, versions in summ.toolchains.items():
        columns = [v for v in versions if not sdk or v == sdk]
        rows = [r for r in summ.rows if r.backend == backend and (target is None or r.target == target.split(":")[1])]
        if not rows or not columns:
            continue
        name = RUNTIME_NAMES.get(backend, backend)
        out.append(f"<table class='summary' data-backend='{e(backend)}'><caption>{e(name)}: models per SoC and SDK"
                   f"</caption><tr><th>SoC</th>" + "".join(f"<th>{e(name)} {e(v)}</th>" for v in columns) + "</tr>")
        by = {(r.target, r.toolchain): r for r in rows}
        for soc_name in sorted({r.target for r in rows}):
            out.append(f"<tr><th>{e(soc_name)}</th>")
            for v in columns:
                r = by.get((soc_name, v))
                if r is None:
                    out.append("<td></td>")
                    continue
                counts = [(s, getattr(r, s)) for s in STATES]
                marks = "".join(
                    f"<span class='n{' zero' if n == 0 else ''}'>"
                    + (f"<a href='?{e(_query(filters, soc=f'{backend}:{soc_name}', sdk=v, state=s))}'>"
                       f"<span class='{s}'>{n} {s}</span></a>" if n else f"{n} {s}") + "</span>"
                    for s, n in counts)
                verified = f"<span class='n v'>\u2713probe {r.probe_verified} \u00b7 \u2713device {r.device_verified}"
                out.append(f"<td data-target='{e(backend)}:{e(soc_name)}' data-sdk='{e(v)}'>{marks}{verified}"
                           "</span></td>")
            out.append("</tr>")
        out.append("</table>")
    out.append("<h2>Legend</h2><dl>" + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in LEGEND) + "</dl>")
    out.append(_drill_down(page, summ.toolchains, sdk, state, filters))
    out.append("</body></html>")
    return "".join(out)


def _target(soc: str) -> str:
    """``qnn:SM8650``, or a bare SoC / GPU name (or alias) as the catalog knows it."""
    from farm.core.catalog import load_catalog, parse_target
    from farm.core.errors import UnknownTargetError

    if ":" in soc:
        return parse_target(soc).ref
    try:
        return load_catalog().get(soc, backend="qnn").ref
    except UnknownTargetError:
        return load_catalog().get(soc, backend="trt").ref


def _query(filters: dict[str, Any], **more: Any) -> str:
    """The query string of a link: the filters and ``more``, never a token."""
    items: list[tuple[str, str]] = []
    for k, v in {**filters, **more}.items():
        if v is None or v == "":
            continue
        for one in (v if isinstance(v, list) else [v]):
            items.append((k, str(one)))
    return urlencode(items)


def _form(filters: dict[str, Any], state: str | None) -> str:
    e = html.escape

    def field(name: str, label: str, value: Any) -> str:
        v = value[0] if isinstance(value, list) and value else (value or "")
        return f"<label>{e(label)} <input name='{name}' value='{e(str(v))}'></label>"

    options = "".join(f"<option value='{s}'{' selected' if s == state else ''}>{s}</option>"
                      for s in ("", *STATES))
    return ("<form method='get' action='/coverage'>"
            + field("tag", "tag", filters["tag"]) + field("prefix", "name prefix", filters["prefix"])
            + field("model", "model", filters["model"]) + field("soc", "SoC", filters["soc"])
            + field("sdk", "SDK", filters["sdk"])
            + f"<label>state <select name='state'>{options}</select></label> <button>filter</button>"
            " <a href='/coverage'>clear</a></form>")


def _drill_down(page: Any, toolchains: dict[str, list[str]], sdk: str | None, state: str | None,
                filters: dict[str, Any]) -> str:
    from registry.lab import cell_label

    e = html.escape
    title = "Models" + (f" with a {state} cell" if state and state != "missing" else "")
    if state == "missing":
        title = "Models missing a build" + ("" if sdk else " on the newest SDK")
    out = [f"<h2>{e(title)}</h2>"]
    if not page.models:
        out.append("<p>no models match</p>")
        return "".join(out)
    for m in page.models:
        caption = (", ".join(m.tags) + " \u00b7 " if m.tags else "") + m.digest[:19]
        backends = sorted({c["target"].split(":", 1)[0] for c in m.cells}
                          | {x["target"].split(":", 1)[0] for x in m.missing})
        columns = [(b, v) for b in backends for v in toolchains.get(b, []) if not sdk or v == sdk]
        out.append(f"<table class='model' data-model='{e(m.digest)}'><caption>{e(caption)}</caption>"
                   "<tr><th>SoC</th>" + "".join(f"<th>{e(RUNTIME_NAMES.get(b, b))} {e(v)}</th>" for b, v in columns)
                   + "</tr>")
        cells = {(c["target"], c["toolchain"]): c for c in m.cells}
        targets = sorted({c["target"] for c in m.cells} | {x["target"] for x in m.missing})
        for t in targets:
            out.append(f"<tr><th>{e(t)}</th>")
            for b, v in columns:
                if not t.startswith(b + ":"):
                    out.append("<td></td>")
                    continue
                c = cells.get((t, v))
                st = c["state"] if c else "missing"
                label = st + (f" ({', '.join(c['codes'])})" if c and c["codes"] and st == "failed" else "")
                if c and c.get("probe_verified"):
                    label += " \u2713probe"
                if c and c.get("device_verified"):  # how many distinct devices said it loads
                    n = int(c.get("devices") or 0)
                    label += f" \u2713device \u00d7{n}" if n else " \u2713device"
                if c and c.get("unverified"):  # built only as groups / multi-SoC binaries: no runtime here verifies them
                    label += " unverified"
                if c and (lab := cell_label(c.get("device_lab"))):  # enrolled devices; speed per SDK
                    label += f" {lab}"
                if c and c.get("twin"):  # a genai package: greedy tokens its twin matched
                    label += f" twin {c['twin']}"
                if c and c.get("via"):  # built as a multi-SoC binary (qnn:SM8650+SM8750)
                    label += " via " + ", ".join(v.partition(":")[2] for v in c["via"])
                if c and c.get("partial_offload"):  # ops left on the device's CPU
                    label += " +cpu (" + (", ".join(c.get("cpu_op_types") or []) or "ops not recorded") + ")"
                verdicts = "".join(
                    f"<div class='v'>{e(RUNTIME_NAMES.get(p['runtime_backend'], p['runtime_backend']))} "
                    f"{e(p['runtime'])} {e(p['verdict'])}"
                    + (f" ({p['loads']}/{p['loads'] + p['fails']})" if p["verdict"] == "mixed" else "") + "</div>"
                    for p in (c or {}).get("verdicts", []))
                partial = " partial" if c and c.get("partial_offload") else ""
                why = f" title='{e(c['unverified'])}'" if c and c.get("unverified") else ""
                out.append(f"<td class='{e(st)}{partial}' data-target='{e(t)}' data-sdk='{e(v)}'{why}>"
                           f"{e(label)}{verdicts}</td>")
            out.append("</tr>")
        out.append("</table>")
    if page.next_cursor:
        out.append(f"<p><a rel='next' href='?{e(_query(filters, state=state, cursor=page.next_cursor))}'>"
                   "next page</a></p>")
    return "".join(out)
