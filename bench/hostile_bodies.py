"""Service memory under hostile request bodies (big samples, huge JSON, oversized uploads), this code
against another checkout in the same run.

    python bench/hostile_bodies.py [--code DIR] [--out NAME]

For each tree (``--code DIR``, e.g. ``git worktree add /tmp/before main``, then this checkout)
starts a real `farm serve` on a fresh FARM_HOME, makes its tokens with that tree's own
`farm token create`, then sends, one case at a time, and reads the service's peak RSS (VmHWM)
before (reset: ``clear_refs``) and after each:

- an ``.npz`` of 250,000 entries (22 MiB) with a submit token to ``POST /v1/models/DIGEST/samples``
  (first: a heap already grown by a later case would hide its cost);
- a 96 MiB JSON body with no token to ``POST /v1/groups`` and ``POST /v1/releases``;
- 37 routes x (96 MiB declared, 8 MiB chunked) with an admin token (this tree's route list).

Prints a table of the growth per case and the answer's status, writes bench/out/NAME.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.devfarm.services import free_port  # noqa: E402
from tests.common.hostile_archives import many_entries  # noqa: E402
from tests.common.hostile_requests import peak_rss_mib, reset_peak, route_requests, send  # noqa: E402
from tests.common.service import serve  # noqa: E402

HUGE = 96 * 1024 * 1024


def _token(env: dict[str, str], name: str, scope: str) -> str:
    out = subprocess.run([sys.executable, "-m", "farm.cli", "token", "create", name, "--scope", scope, "--json"],
                         env=env, check=True, capture_output=True, text=True).stdout
    return str(json.loads(out)["token"])


def measure(code: Path, work: Path) -> list[dict[str, Any]]:
    # `python -m` puts the working directory first on sys.path: run from the tree measured.
    os.chdir(code)
    home = work / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update({"FARM_HOME": str(home), "FARM_MAX_UPLOAD_MB": "4", "PYTHONPATH": str(code)})
    subprocess.run([sys.executable, "-m", "farm.cli", "db", "upgrade"], env=env, check=False, capture_output=True)
    tokens = {scope: _token(env, f"t-{scope}", scope) for scope in ("submit", "admin")}
    from tests.common.onnx_models import conv_relu_add

    model = conv_relu_add(work / "m.onnx").read_bytes()
    port = free_port()
    proc = serve(env, port, work / "serve.log")
    rows = []
    try:
        pid = proc.pid

        def case(label: str, method: str, path: str, headers: dict[str, str], size: int, chunked: bool,
                 body: bytes | None = None) -> None:
            before = reset_peak(pid)
            if body is None:
                status, _ = send(port, method, path, headers, size, chunked=chunked)
            else:
                import urllib.error
                import urllib.request

                req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers,
                                             method=method)
                try:
                    with urllib.request.urlopen(req, timeout=120) as resp:
                        status = resp.status
                except urllib.error.HTTPError as exc:
                    status = exc.code
            rows.append({"case": label, "status": status, "peak_growth_mib": round(peak_rss_mib(pid) - before, 1)})

        for method, path in (("GET", "/v1/workers"), ("POST", "/v1/groups"), ("POST", "/v1/releases")):
            send(port, method, path, {"Authorization": f"Bearer {tokens['admin']}"}, 0, chunked=False)  # warm-up
        import urllib.request

        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", data=model, method="POST", headers={
            "Authorization": f"Bearer {tokens['submit']}", "Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            digest = json.loads(resp.read())["digest"]
        case(".npz of 250,000 entries to samples", "POST", f"/v1/models/{digest}/samples",
             {"Authorization": f"Bearer {tokens['submit']}"}, 0, False, body=many_entries(250_000))
        case("POST /v1/groups, 96 MiB JSON, no token", "POST", "/v1/groups", {"Content-Type": "application/json"},
             HUGE, False)
        case("POST /v1/releases, 96 MiB JSON, no token", "POST", "/v1/releases",
             {"Content-Type": "application/json"}, HUGE, False)
        from farm.api.app import create_app
        from farm.core.settings import Settings

        before = reset_peak(pid)
        statuses: dict[int, int] = {}
        routes = route_requests(create_app(Settings.from_env({"FARM_HOME": str(work / "routes")})))
        for method, path in routes:
            for size, chunked in ((HUGE, False), (8 << 20, True)):
                status, _ = send(port, method, path, {"Authorization": f"Bearer {tokens['admin']}",
                                                      "Content-Type": "application/json"}, size, chunked=chunked)
                statuses[status] = statuses.get(status, 0) + 1
        rows.append({"case": f"{len(routes)} routes x (96 MiB declared, 8 MiB chunked), admin",
                     "status": statuses, "peak_growth_mib": round(peak_rss_mib(pid) - before, 1)})
        rows.append({"case": "tracebacks in the service log",
                     "status": (work / "serve.log").read_text().count("Traceback"), "peak_growth_mib": None})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--code", type=Path, help="another checkout to measure first (the code before)")
    ap.add_argument("--out", default="hostile_bodies")
    args = ap.parse_args()
    trees = ([("before", args.code.resolve())] if args.code else []) + [("this", ROOT)]
    result: dict[str, Any] = {}
    here = os.getcwd()
    for label, code in trees:
        with tempfile.TemporaryDirectory(prefix="ctxfarm-bench-") as work:
            result[label] = measure(code, Path(work))
        os.chdir(here)
    print(f"{'case':60} " + " ".join(f"{label:>28}" for label, _ in trees))
    for i, row in enumerate(result[trees[-1][0]]):
        cells = []
        for label, _ in trees:
            r = result[label][i]
            grown = "" if r["peak_growth_mib"] is None else f"+{r['peak_growth_mib']:.1f} MiB"
            cells.append(f"{r['status']!s:>16} {grown:>11}")
        print(f"{row['case']:60} " + " ".join(cells))
    out = ROOT / "bench" / "out" / f"{args.out}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
