"""The coverage page, rendered on the server (no JavaScript build chain): models (one table per
model digest, captioned with its tags) x targets x SDK versions, each cell built, failed (with
its code), missing, building or broken, with the probe verdicts as its tooltip; filters by
model, SoC and SDK through the query string."""

from __future__ import annotations

import html
from typing import Any

STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#1b1f24}
table{border-collapse:collapse}th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:center}
th{background:#f6f8fa}td.built{background:#dafbe1}td.failed{background:#ffebe9}td.missing{background:#fff8c5}
td.building{background:#ddf4ff}td.broken{background:#ffd8b5}td{white-space:nowrap}
caption{text-align:left;font-weight:600;margin:8px 0}
form{margin-bottom:12px}
"""


def render(cov: dict[str, Any], *, soc: str | None = None, sdk: str | None = None) -> str:
    cells = {(c["model"], c["target"], c["toolchain"]): c for c in cov["cells"]}
    targets = sorted({c["target"] for c in cov["cells"]})
    if soc:
        targets = [t for t in targets if t.split(":", 1)[-1].lower() == soc.lower()]
    columns = [(b, v) for b, versions in sorted(cov["toolchains"].items()) for v in versions if not sdk or v == sdk]
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>ctxfarm coverage</title>",
           f"<style>{STYLE}</style></head><body><h1>ctxfarm coverage</h1>",
           "<form method='get'><label>model <input name='model'></label> <label>SoC <input name='soc'></label> "
           "<label>SDK <input name='sdk'></label> <button>filter</button></form>"]
    for m in cov["models"]:
        model = m["digest"]
        caption = (", ".join(m["tags"]) + " \u00b7 " if m["tags"] else "") + model[:19]
        out.append(f"<table data-model='{e(model)}'><caption>{e(caption)}</caption><tr><th>target</th>")
        out.extend(f"<th>{e(b)} {e(v)}</th>" for b, v in columns)
        out.append("</tr>")
        for t in targets:
            out.append(f"<tr><th>{e(t)}</th>")
            for b, v in columns:
                c = cells.get((model, t, v))
                if not t.startswith(b + ":"):
                    out.append("<td></td>")
                    continue
                state = c["state"] if c else "missing"
                label = state + (f" ({', '.join(c['codes'])})" if c and c["codes"] and state == "failed" else "")
                if c and c.get("probe_verified"):
                    label += " \u2713 probe-verified"
                probes = "; ".join(f"{p['verdict']} under {b.upper()} {p['runtime']}" for p in (c or {}).get("verdicts", []))
                title = f" title='{e(probes)}'" if probes else ""
                out.append(f"<td class='{e(state)}' data-target='{e(t)}' data-sdk='{e(v)}'{title}>{e(label)}</td>")
            out.append("</tr>")
        out.append("</table>")
    out.append("</body></html>")
    return "".join(out)
