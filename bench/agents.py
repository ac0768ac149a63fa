"""The device lab under load: agents draining verification jobs from one service with a million
artifacts in its index, and what that costs resolve, against resolve on the same service while no
agent runs (same run).

    python bench/agents.py [--agents 4] [--jobs 200] [--artifacts 1000000] [--real-agents 2]

Set up as bench/resolve.py and bench/api.py do: a throwaway PostgreSQL database (Alembic schema,
``--artifacts`` rows bulk-loaded with COPY by ``bench.resolve.populate``), SeaweedFS as the blob
store (``infra.devfarm.services.start_seaweedfs``), ``farm serve`` in front (``--serve-workers``
processes; default the service's own, one per core). One real model is built embedded
(``tests.common.accuracy_models.matmul_model`` on SM8650 and SM8750: real QNN compiles), given
sample inputs and checked (``farm.pipeline.accuracy.evaluate``), which keeps its CPU reference
outputs as a blob: real samples and a real reference in SeaweedFS.

1. Real agents: ``--real-agents`` ``ctxfarm-agent`` processes, enrolled with ``ctxfarm-agent
   enroll``, each ``run --once`` on the real artifacts' jobs (one job per agent per SoC): install
   from the service, the stored reference fetched and checked, the simulator run, a signed report.
   Seconds per job, end to end, as a device of this box would take them.
2. The service draining jobs: first one agent loop alone takes ``--baseline-jobs`` (the baseline
   of the same run), then ``--agents`` agent loops in this process (threads), each enrolled
   over HTTP with its own Ed25519 key, take ``--jobs`` jobs through the real API (lease, download
   the samples and the reference with ``farm.client``'s verified download from a fresh work
   directory per job, post a report signed as the agent signs it). The jobs are seeded: model rows
   of the million-artifact index get the real model's samples and reference (rows pointing at the
   real blobs), and ``ensure_jobs`` makes ``--agents`` slots on ``(--jobs + --baseline-jobs) /
   --agents`` of their artifacts. The loops do not install or run the (synthetic) artifacts: their
   reports carry the figures the real agents measured. Then ``--paced-jobs`` more, each agent
   waiting the real agents' measured seconds per job before its report (a fleet at a device's
   pace, not flat out). Last, ``--jobs`` more flat out against a second ``farm serve`` on the same
   index with FARM_DEVICE_LAB_CONCURRENCY=0 (every lease and report at once, against the default
   one at a time per process). What is measured is the service: jobs
   drained per second, its own time per lease and per report (``ctxfarm_device_job_seconds`` from
   /metrics, p50/p99 interpolated in its buckets) and the agents' round trip per report.
3. Resolve p50/p99 over HTTP (a probe process asking questions of the index no one asked before,
   one every 10 ms, as bench/evidence.py's probe) while the agents drain (flat out, paced), against
   the same probe with no agent running (before and after). Goal: p99 <= 15 ms during.

Prints a table and writes bench/out/agents.json with the box's load (``uptime``) before and after.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.resolve import PER_PAIR, RUNTIMES, populate  # noqa: E402
from infra.devfarm.services import free_port, start_seaweedfs  # noqa: E402
from tests.common.service import serve  # noqa: E402

RESOLVE_GOAL_MS = 15.0
REAL_SOCS = ["SM8650", "SM8750"]

_PROBE = r"""
import http.client, json, os, sys, time
port, token, duration, stop = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
paths = [line.strip() for line in sys.stdin if line.strip()]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
out, i, end = [], 0, time.perf_counter() + duration
while time.perf_counter() < end and i < len(paths) and not (stop and os.path.exists(stop)):
    t = time.perf_counter()
    conn.request("GET", paths[i], headers={"Authorization": "Bearer " + token})
    resp = conn.getresponse()
    resp.read()
    out.append([(time.perf_counter() - t) * 1000, resp.status])
    i += 1
    time.sleep(0.01)
print(json.dumps(out))
"""


def probe(port: int, token: str, paths: list[str], duration: float, stop: Path | None = None
          ) -> list[tuple[float, int]]:
    """Resolve latencies (ms, status) from a process of its own (a thread here would wait on the
    agent loops' GIL), each question asked once, one every 10 ms, for ``duration`` s or until the
    file ``stop`` exists."""
    out = subprocess.run([sys.executable, "-c", _PROBE, str(port), token, str(duration), str(stop or "")],
                         input="\n".join(paths), capture_output=True, text=True, timeout=duration + 120, check=True)
    return [(float(ms), int(st)) for ms, st in json.loads(out.stdout)]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q / 100 * len(s)))], 3) if s else float("nan")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# ---- the service's own time: a histogram from /metrics -------------------------------------------------

def scrape(port: int, token: str) -> dict[tuple[str, str], float]:
    """``ctxfarm_device_job_seconds`` buckets, sums and counts by (series, step)."""
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line.startswith("ctxfarm_device_job_seconds_"):
            continue
        name, _, value = line.rpartition(" ")
        series = name.split("{", 1)[0].removeprefix("ctxfarm_device_job_seconds_")
        labels = dict(kv.split("=", 1) for kv in name.split("{", 1)[1].rstrip("}").split(",")) if "{" in name else {}
        labels = {k: v.strip('"') for k, v in labels.items()}
        key = labels.get("step", "")
        if series == "bucket":
            key += "|" + labels["le"]
        out[(series, key)] = out.get((series, key), 0.0) + float(value)
    return out


def step_figures(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float],
                 step: str) -> dict[str, Any]:
    """Count, mean and p50/p99 (linear within the bucket) of one step between two scrapes."""
    n = after.get(("count", step), 0) - before.get(("count", step), 0)
    total = after.get(("sum", step), 0) - before.get(("sum", step), 0)
    buckets = sorted(((float(k.split("|", 1)[1]), v - before.get((s, k), 0))
                      for (s, k), v in after.items() if s == "bucket" and k.startswith(step + "|")),
                     key=lambda b: b[0])

    def quantile(q: float) -> float | None:
        if not n:
            return None
        want, lo, below = q * n, 0.0, 0.0
        for le, cum in buckets:
            if cum >= want:
                if math.isinf(le):
                    return round(lo * 1000, 3)  # past the last bound: at least it
                inside = cum - below
                return round((lo + (le - lo) * ((want - below) / inside if inside else 1.0)) * 1000, 3)
            lo, below = le, cum
        return None

    return {"n": int(n), "mean_ms": round(total / n * 1000, 3) if n else None, "p50_ms": quantile(0.5),
            "p99_ms": quantile(0.99)}


# ---- agents ------------------------------------------------------------------------------------------

def enroll_http(url: str, enrollment: str) -> dict[str, Any]:
    """An agent's enrollment as ``ctxfarm-agent enroll`` does it: a fresh Ed25519 key, its public
    half registered with the single-use token."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from workers.agent.wire import call

    key = ed25519.Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(serialization.Encoding.Raw,
                                                            serialization.PublicFormat.Raw)).decode()
    _st, answer = call(url, "/v1/devices/enroll", enrollment, {"public_key": public, "soc": "simulator",
                                                               "facts": {"arch": "x86_64"}})
    return {**answer, "key": key}


def agent_loop(url: str, dev: dict[str, Any], work: Path, figures: dict[str, Any], stop: threading.Event,
               out: dict[str, Any], limit: int | None = None, pace: float = 0.0) -> None:
    """Lease, fetch the samples and the reference (verified), sign, report; until no job is left
    (or ``limit`` jobs are done). ``pace``: seconds a job takes on the device before its report."""
    from farm.client import Client
    from farm.core.signed_reports import canonical, message
    from workers.agent.wire import call

    client = Client(url, dev["token"])
    rt, fetch, done = out.setdefault("report_ms", []), out.setdefault("fetch_ms", []), 0
    lease_ms = out.setdefault("lease_ms", [])
    while not stop.is_set() and (limit is None or done < limit):
        t = time.perf_counter()
        status, job = call(url, "/v1/device-jobs/lease", dev["token"], {"socs": None, "wait_s": 0.0})
        lease_ms.append((time.perf_counter() - t) * 1000)
        if status == 204 or job is None:
            break
        shutil.rmtree(work, ignore_errors=True)  # a fresh work directory per job, as the agent keeps
        work.mkdir(parents=True)
        t = time.perf_counter()
        body: dict[str, Any] = {"job": job["job"], "nonce": job["nonce"], "device": dev["name"],
                                "artifact": job["artifact"], "soc": job["soc"], "runtime": figures["runtime"]}
        if job.get("samples"):
            client.download(job["samples"]["digest"], work / "samples.npz", size=job["samples"]["size"])
            body["inputs"] = job["samples"]["digest"]
        if job.get("reference"):
            client.download(job["reference"]["digest"], work / "reference.npz", size=job["reference"]["size"])
            body["reference"] = "stored"
        else:
            body |= {"reference": "device-cpu", "reference_why": str(job.get("reference_why") or "")[:300]}
        fetch.append((time.perf_counter() - t) * 1000)
        if pace:
            time.sleep(pace)  # the device's run (install, load, runs): the service is not asked meanwhile
        body |= {k: v for k, v in figures.items() if k in ("outcome", "load_ms", "first_inference_ms", "p50_ms",
                                                              "peak_memory_mb", "psnr_db", "runs")}
        text = canonical(body)
        signature = base64.b64encode(dev["key"].sign(message(text))).decode()
        t = time.perf_counter()
        call(url, f"/v1/device-jobs/{job['job']}/report", dev["token"], {"body": text, "signature": signature})
        rt.append((time.perf_counter() - t) * 1000)
        done += 1
    out["done"] = out.get("done", 0) + done


def real_agents(url: str, env: dict[str, str], tmp: Path, n: int, enrollments: list[str]) -> dict[str, Any]:
    """``ctxfarm-agent enroll`` then ``run --once`` per agent, one after another (each job on this
    box's two cores alone: seconds per job as one device takes it)."""
    per_job, reports = [], []
    for i in range(n):
        home = tmp / f"real-agent-{i}"
        got = subprocess.run([sys.executable, "-m", "workers.agent.main", "enroll", "--server", url, "--token",
                              enrollments[i], "--home", str(home)], env=env, capture_output=True, text=True,
                             timeout=120)
        if got.returncode != 0:
            raise RuntimeError(f"ctxfarm-agent enroll: {got.stderr[-2000:]}")
        t = time.perf_counter()
        got = subprocess.run([sys.executable, "-m", "workers.agent.main", "run", "--home", str(home), "--once",
                              "--runs", "10"], env=env, capture_output=True, text=True, timeout=900)
        took = time.perf_counter() - t
        if got.returncode != 0:
            raise RuntimeError(f"ctxfarm-agent run: {got.stderr[-2000:]}")
        done = json.loads(got.stdout.strip().splitlines()[-1])["reports"]
        reports.append(done)
        if done:
            per_job.append(took / done)
    return {"agents": n, "reports": sum(reports), "seconds_per_job": [round(s, 2) for s in per_job],
            "median_seconds_per_job": round(statistics.median(per_job), 2) if per_job else None}


# ---- main --------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=4, help="agent loops draining the seeded jobs")
    ap.add_argument("--jobs", type=int, default=200, help="seeded verification jobs they drain")
    ap.add_argument("--paced-jobs", type=int, default=40,
                    help="jobs the agents then take paced as the real agents ran (0: skip)")
    ap.add_argument("--baseline-jobs", type=int, default=40,
                    help="jobs drained first by one agent alone (the baseline of the same run)")
    ap.add_argument("--artifacts", type=int, default=1_000_000, help="artifact rows in the index")
    ap.add_argument("--real-agents", type=int, default=2,
                    help="ctxfarm-agent processes run --once on the real artifacts' jobs (0: none)")
    ap.add_argument("--quiet-seconds", type=float, default=8.0, help="resolve with no agent: before and after each")
    ap.add_argument("--serve-workers", type=int, default=None, help="farm serve --workers (default: one per core)")
    ap.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import numpy as np
    import psycopg
    from sqlalchemy import select, text

    from farm.core.catalog import load_catalog
    from farm.core.settings import Settings
    from farm.pipeline.accuracy import evaluate
    from farm.pipeline.plan import build
    from registry.db import Database, migrate
    from registry.devices import create_enrollment
    from registry.evidence import record_samples
    from registry.index import Registry, find_artifact
    from registry.models import Artifact, ModelSample
    from registry.store.base import put_file
    from registry.tokens import create_token
    from registry.verification import ensure_jobs
    from tests.common.accuracy_models import matmul_model

    out: dict[str, Any] = {"host": os.uname().nodename, "cpus": os.cpu_count(), "uptime_before": uptime(),
                           "load_before": os.getloadavg(), "args": vars(args)}
    socs = [t.name for t in load_catalog().of_backend("qnn")]
    dbname = f"ctxfarm_agents_{os.getpid()}"
    base = args.admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    db_url = f"{base}/{dbname}"
    admin = psycopg.connect(args.admin_url, autocommit=True)
    admin.execute(f'CREATE DATABASE "{dbname}"')
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    procs: list[subprocess.Popen[bytes]] = []
    s3 = None
    try:
        with tempfile.TemporaryDirectory(prefix="ctxfarm-agents-") as tmp_s:
            tmp = Path(tmp_s)
            t0 = time.perf_counter()
            migrate(db_url)
            db = Database(db_url)
            unbuilt = max(1, math.ceil(args.artifacts / (len(socs) * PER_PAIR)) // 100)
            counts = populate(db, args.artifacts, socs, unbuilt) if args.artifacts else {}
            db.dispose()
            out["populate"] = {"seconds": round(time.perf_counter() - t0, 1), **counts}
            print(f"index: {counts.get('artifacts', 0)} artifacts in {out['populate']['seconds']} s", flush=True)
            s3 = start_seaweedfs(tmp / "weed")
            env_vars = {"FARM_HOME": str(tmp / "home"), "FARM_DATABASE_URL": db_url,
                        "FARM_STORE_URL": f"s3://ctxfarm-bench/agents?endpoint={s3.url}",
                        "FARM_REPORTS_PER_MINUTE": "10000000"}
            settings = Settings.from_env(env_vars)
            env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | env_vars

            # The real model: built, sample inputs recorded, checked (the reference kept as a blob).
            t0 = time.perf_counter()
            report = build(settings, matmul_model(tmp / "mm.onnx"), [f"qnn:{s}" for s in REAL_SOCS], name="mm",
                           tag="cand")
            reg = Registry.open(settings)
            samples = tmp / "samples.npz"
            np.savez(samples, x=np.full((1, 64), 0.25, np.float32))
            info = put_file(reg.store, samples)
            with reg.db.session() as s:
                record_samples(s, report.model_digest, info.digest, info.size,
                               [{"name": "x", "dtype": "float32", "shape": [1, 64]}])
            real_ids = []
            for o in report.outcomes:
                assert o.artifact, o
                with reg.db.session() as s:
                    real_ids.append(find_artifact(s, o.artifact).id)
                evaluate(settings, reg, real_ids[-1])
            with reg.db.session() as s:
                sample = s.get(ModelSample, report.model_digest)
                assert sample is not None and sample.reference_digest, "the check kept no reference"
                ref = (sample.reference_digest, sample.reference_size, sample.digest, sample.size)
                read = create_token(s, "bench-read", "read")
                enrollments = [create_enrollment(s, f"real-{i}").token for i in range(args.real_agents)]
                enrollments += [create_enrollment(s, f"loop-{i}").token for i in range(args.agents)]
                enrollments += [create_enrollment(s, "loop-alone").token]
                for art_id, soc in zip(real_ids, REAL_SOCS, strict=True):
                    ensure_jobs(s, art_id, soc, args.real_agents)
            out["setup_seconds"] = round(time.perf_counter() - t0, 1)
            print(f"real model built and checked; reference {ref[0][:19]} ({ref[1]} bytes) in SeaweedFS", flush=True)

            port = free_port()
            procs.append(serve(env, port, tmp / "serve.log", workers=args.serve_workers))
            url = f"http://127.0.0.1:{port}"
            # The same index behind a second service that takes every lease and report at once
            # (FARM_DEVICE_LAB_CONCURRENCY=0): the flat-out drain again there, for comparison.
            port_open = free_port()
            procs.append(serve({**env, "FARM_DEVICE_LAB_CONCURRENCY": "0"}, port_open, tmp / "serve-open.log",
                               workers=args.serve_workers))

            # 1. Real agents on the real artifacts' jobs.
            figures: dict[str, Any] = {"outcome": "ok", "runtime": "2.51.0", "p50_ms": 1.0, "psnr_db": 70.0}
            if args.real_agents:
                out["real_agents"] = real_agents(url, env, tmp, args.real_agents, enrollments[:args.real_agents])
                with reg.db.session() as s:
                    from registry.models import DeviceVerification

                    row = s.scalar(select(DeviceVerification).where(DeviceVerification.outcome == "ok")
                                   .order_by(DeviceVerification.id))
                    if row is not None:
                        figures = {k: v for k, v in row.body.items() if k in (
                            "outcome", "runtime", "load_ms", "first_inference_ms", "p50_ms", "peak_memory_mb",
                            "psnr_db", "runs")}
                        out["real_agents"]["report"] = dict(row.body)
                print(f"real agents: {out['real_agents']}", flush=True)

            # 2. Seeded jobs: index rows of the million get the real samples and reference.
            slots = max(1, args.agents)
            used: set[int] = set(real_ids)

            def seed_jobs(n_jobs: int) -> int:
                """``n_jobs`` jobs (``slots`` per artifact) on index artifacts no phase used yet."""
                from sqlalchemy import update

                from registry.models import Model

                with reg.db.session() as s:
                    picked = list(s.execute(select(Artifact.id, Artifact.model_digest, Artifact.target)
                                            .where(Artifact.id.notin_(used), Artifact.status == "active")
                                            .order_by(Artifact.id.desc()).limit(math.ceil(n_jobs / slots))))
                    used.update(a for a, _m, _t in picked)
                    # The seeded models' files are the real model's (real blobs: a lease names them).
                    real_files = s.get(Model, report.model_digest).files  # type: ignore[union-attr]
                    digests = {m for _a, m, _t in picked}
                    s.execute(update(Model).where(Model.digest.in_(digests)).values(files=real_files))
                    for model_digest in digests:
                        if s.get(ModelSample, model_digest) is None:
                            s.add(ModelSample(model_digest=model_digest, digest=ref[2], size=ref[3],
                                              inputs=[{"name": "x", "dtype": "float32", "shape": [1, 64]}],
                                              reference_digest=ref[0], reference_size=ref[1]))
                    made = sum(ensure_jobs(s, art_id, target, slots) for art_id, _m, target in picked)
                    s.execute(text("ANALYZE verification_jobs"))
                return made

            made = seed_jobs(args.jobs + args.baseline_jobs)
            devs = [enroll_http(url, tok) for tok in enrollments[args.real_agents:]]
            alone = devs.pop()
            print(f"{made} seeded jobs; {len(devs)} agent loops enrolled", flush=True)

            rng = random.Random(7)
            n_models = max(1, counts.get("built_models", 1))

            def questions(k: int) -> list[str]:
                return [f"/v1/resolve?model=name_{rng.randrange(n_models)}:stable&soc={rng.choice(socs)}"
                        f"&qnn={rng.choice(RUNTIMES)}&manifest=false" for _ in range(k)]

            probe(port, read, questions(200), 3.0)  # warm-up: connections, compiled statements
            quiet = probe(port, read, questions(int(args.quiet_seconds * 100) + 50), args.quiet_seconds)

            def drain(agents: list[dict[str, Any]], jobs: int, label: str, *, pace: float = 0.0,
                      limit: int | None = None, port: int = port) -> tuple[dict[str, Any], list[tuple[float, int]]]:
                """The agents drain what is open, resolve probed beside them; their figures."""
                before = scrape(port, read)
                stop = threading.Event()
                results: list[dict[str, Any]] = [{} for _ in agents]
                url = f"http://127.0.0.1:{port}"
                threads = [threading.Thread(target=agent_loop, args=(url, d, tmp / f"{label}-{i}", figures, stop,
                                                                     results[i], limit, pace))
                           for i, d in enumerate(agents)]
                during: list[tuple[float, int]] = []
                drained = tmp / f"drained-{label}"  # the probe stops once this exists
                prober = threading.Thread(target=lambda: during.extend(probe(port, read, questions(60_000), 600.0,
                                                                             drained)))
                load_start = os.getloadavg()
                t0 = time.perf_counter()
                for th in threads:
                    th.start()
                time.sleep(0.5)
                prober.start()
                for th in threads:
                    th.join()
                took = time.perf_counter() - t0
                drained.touch()
                load_end = os.getloadavg()
                after = scrape(port, read)
                prober.join()
                done = sum(r.get("done", 0) for r in results)

                def both(key: str) -> dict[str, float]:
                    values = [x for r in results for x in r.get(key, [])]
                    return {"p50": pct(values, 50), "p99": pct(values, 99)}

                return {"agents": len(agents), "jobs": jobs, "reported": done, "seconds": round(took, 2),
                        "pace_s": pace, "jobs_per_s": round(done / took, 1) if took else None,
                        "service_report": step_figures(before, after, "report"),
                        "service_lease": step_figures(before, after, "lease"),
                        "agent_report_round_trip_ms": both("report_ms"),
                        "agent_lease_round_trip_ms": both("lease_ms"),
                        "agent_fetch_samples_and_reference_ms": both("fetch_ms"),
                        "load_at_start": load_start, "load_at_end": load_end}, during

            # 2a. The baseline: one agent alone. 2b. All agents flat out (no device time between
            # jobs: the most the service is asked). 2c. All agents paced as the real agents ran
            # (each job takes a real agent's measured seconds on the device before its report).
            out["baseline"], _ = drain([alone], args.baseline_jobs, "alone", limit=args.baseline_jobs)
            out["drain"], during = drain(devs, made - out["baseline"]["reported"], "flat")
            pace = float((out.get("real_agents") or {}).get("median_seconds_per_job") or 1.0)
            paced_jobs = seed_jobs(args.paced_jobs) if args.paced_jobs else 0
            out["paced"], during_paced = drain(devs, paced_jobs, "paced", pace=pace) if paced_jobs else ({}, [])
            open_jobs = seed_jobs(args.jobs)
            out["drain_ungated"], during_open = drain(devs, open_jobs, "open", port=port_open)
            quiet += probe(port, read, questions(int(args.quiet_seconds * 100) + 50), args.quiet_seconds)

            def figures_of(values: list[tuple[float, int]]) -> dict[str, Any]:
                ms = [m for m, _ in values]
                return {"n": len(values), "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99),
                        "statuses": sorted({st for _, st in values})}

            out["resolve"] = {"quiet": figures_of(quiet), "during": figures_of(during),
                              "during_paced": figures_of(during_paced),
                              "during_ungated": figures_of(during_open), "goal_p99_ms": RESOLVE_GOAL_MS}
            for k in ("during", "during_paced", "during_ungated"):
                out["resolve"][f"met_{k}"] = bool(out["resolve"][k]["p99_ms"] <= RESOLVE_GOAL_MS)
            reg.close()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)
        if s3 is not None:
            s3.stop()
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.close()
    out["uptime_after"], out["load_after"] = uptime(), os.getloadavg()
    show(out)
    dest = ROOT / "bench" / "out" / "agents.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"\nwrote {dest.relative_to(ROOT)}")
    return 0


def show(out: dict[str, Any]) -> None:
    r = out["resolve"]
    print(f"\nindex: {out['populate'].get('artifacts', 0)} artifacts; box: {out['cpus']} CPUs")
    print(f"load before: {out['uptime_before']}\nload after:  {out['uptime_after']}\n")
    if out.get("real_agents"):
        ra = out["real_agents"]
        print(f"real ctxfarm-agent run --once: {ra['reports']} jobs, {ra['median_seconds_per_job']} s per job "
              f"(install, stored reference, simulator run, signed report)\n")
    phases = [("1 agent alone", out["baseline"]), (f"{out['drain']['agents']} agents", out["drain"])]
    if out.get("paced"):
        phases.append((f"{out['paced']['agents']} paced {out['paced']['pace_s']:g} s", out["paced"]))
    phases.append((f"{out['drain_ungated']['agents']} ungated", out["drain_ungated"]))
    print(f"{'drain':32s}" + "".join(f" {label:>18s}" for label, _ in phases))

    def row(label: str, cell: Any) -> None:
        print(f"{label:32s}" + "".join(f" {cell(x):>18s}" for _, x in phases))

    row("jobs reported / made", lambda x: f"{x['reported']} / {x['jobs']}")
    row("seconds", lambda x: f"{x['seconds']:.2f}")
    row("jobs/s drained", lambda x: str(x["jobs_per_s"]))
    row("service ms per report p50/p99", lambda x: f"{x['service_report']['p50_ms']} / {x['service_report']['p99_ms']}")
    row("service ms per lease p50/p99", lambda x: f"{x['service_lease']['p50_ms']} / {x['service_lease']['p99_ms']}")
    for label, key in (("agent report round trip p50/p99", "agent_report_round_trip_ms"),
                       ("agent lease round trip p50/p99", "agent_lease_round_trip_ms"),
                       ("agent fetch samples+ref p50/p99", "agent_fetch_samples_and_reference_ms")):
        row(label, lambda x, k=key: f"{x[k]['p50']} / {x[k]['p99']}")
    print(f"\n{'resolve ms':22s} {'n':>6s} {'p50':>8s} {'p99':>8s}")
    for k in ("quiet", "during", "during_paced", "during_ungated"):
        if r[k]["n"]:
            print(f"{k:22s} {r[k]['n']:6d} {r[k]['p50_ms']:8.2f} {r[k]['p99_ms']:8.2f}"
                  + (f"  {r[k]['p99_ms'] / r['quiet']['p99_ms']:.2f}x quiet p99; goal <= {RESOLVE_GOAL_MS:g} ms: "
                     f"{'met' if r['met_' + k] else 'MISSED'}" if k != "quiet" else ""))


if __name__ == "__main__":
    sys.exit(main())
