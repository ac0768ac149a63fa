"""An LLM export built into one onnxruntime-genai folder, against a baseline measured in the
same run.

The export: bench/genai_export.py, 2 parts (default --hidden 2048 --layers 20: about 1.5 GiB
of fp32 weights per part, each part's prefill and decode sharing one external-data file).

Default (embedded): the **hand loop** (bench/genai_handloop.py: each part's prefill and decode
compiled weight-shared with onnxruntime-qnn in one process, one part after the other, no farm
code) vs embedded `farm build
--genai` in a fresh FARM_HOME:
  - **published**: command start to its `published` line (the package resolvable, the answer
    printed); goal <= 1.1x the hand loop;
  - **verified**: command start to the twin recorded (the command's end);
  - `farm build --genai --require-twin` in another fresh FARM_HOME: start to its answer; goal
    <= 3.0x;
  - the same in CPU seconds (the command and its children, getrusage), which the box's load
    inflates far less than wall time: publication's from a `--no-twin` run; the hand loop runs
    around each farm run (four times) and the baseline is their mean;
  - the breakdown, from the progress lines' arrival times and the twin's own figures: parts,
    assembly, folder check, twin compiles, the simulator's load/prefill/steps, the CPU reference.
Writes bench/out/genai-embedded.json with the box's load (uptime) before and after.

--cluster: `farm submit --genai --wait` on a farm of two QNN 2.51.0 workers (Redis broker, a
private PostgreSQL database, SeaweedFS store) against the same **hand loop**, run before and after
the farm in the same run (the baseline is their mean):
  - **published**: submit to its answer (the package resolvable: the answer comes at
    publication); goal <= 1.05x the hand loop;
  - **verified**: submit to the twin recorded on the artifact (polled through `farm resolve
    --json` once a second; the twin runs on the workers after publication); goal <= 2.0x;
  - the breakdown, from the build rows (parts, twin builds) and the twin's own figures: before
    the first compile, parts, assembly + folder check, twin compiles, per-part checks,
    generation on the simulator, CPU reference;
  - predicted (the memory planner's line) vs measured peak RSS of each part's compile;
  - bytes uploaded by a cached re-submit (blobs new in the store; goal 0), its answer, and the
    twin builds it queued (goal 0);
  - folder install (registry.install.fetch_artifact: every file verified, swapped into place)
    vs bare boto3 GETs of the same files from the same SeaweedFS;
  - ``--sequential`` adds the earlier comparison: the parts built one after the other in one
    process by the embedded farm (farm.pipeline.plan.build), against the farm's parts.
Writes bench/out/genai.json.

    python bench/genai.py --hidden 1024 --layers 8     # embedded vs the hand loop, a few minutes
    python bench/genai.py --cluster                     # default size on two workers, ~20 min
    python bench/genai.py --cluster --hidden 256 --layers 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MIB = 1 << 20
TARGET = "qnn:SM8650"
WORKER_FARM = ROOT / ".venvs" / "qnn-2.51.0" / "bin" / "farm"


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["PYTHONPATH"] = str(ROOT)
    env["FARM_HOME"] = str(home)
    env.update(extra)
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "farm.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"farm {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def _builds(settings: Any, ids: list[int] | None = None, *, twin: bool = False) -> list[dict[str, Any]]:
    """Build rows (``twin``: the twin builds' own table) as plain dicts."""
    from sqlalchemy import select

    from registry.index import Registry
    from registry.models import Build, TwinBuild

    table = TwinBuild if twin else Build
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            q = select(table).order_by(table.id)
            return [{"id": b.id, "model": b.model_digest, "state": str(b.state), "started": b.started_at,
                     "finished": b.finished_at, "worker": b.worker, "phases": dict(b.phases or {})}
                    for b in s.scalars(q) if ids is None or b.id in ids]
    finally:
        reg.close()


def _peak(phases: dict[str, Any]) -> tuple[float | None, float | None]:
    """(predicted, measured) peak RSS of a build's compile in MiB, from its phases (the memory
    planner's ``predicted_peak_mb``, the compile child's ``peak_rss_kib``)."""
    kib = phases.get("child.peak_rss_kib")
    return phases.get("predicted_peak_mb"), (float(kib) / 1024 if kib else None)


def sequential(export: Path, tmp: Path) -> dict[str, Any]:
    """The baseline: each part's group built with the embedded farm, one after the other, in
    this process (a private FARM_HOME: nothing cached)."""
    from farm.core import genai
    from farm.core.groups import inspect_group
    from farm.core.settings import Settings
    from farm.pipeline.plan import build

    settings = Settings.from_env({"FARM_HOME": str(tmp / "seq-home")})
    ex = genai.read_export(export)
    parts = []
    t0 = time.perf_counter()
    for i in range(len(ex.parts)):
        group = inspect_group(ex.group_members(i), display=f"part{i}")
        t = time.perf_counter()
        report = build(settings, group, [TARGET])
        (o,) = report.outcomes
        if o.state == "failed":
            raise SystemExit(f"sequential part {i}: {o.error_code}: {o.error_message}")
        (row,) = [b for b in _builds(settings) if b["id"] == o.build_id]
        predicted, measured = _peak(row["phases"])
        parts.append({"part": i, "wall_s": time.perf_counter() - t, "compile_s": o.compile_seconds,
                      "predicted_peak_mib": predicted, "measured_peak_mib": measured})
    return {"wall_s": time.perf_counter() - t0, "parts": parts}


def farm(export: Path, tmp: Path, workers: int) -> dict[str, Any]:
    """`farm submit --genai --wait` on a private farm of ``workers`` QNN 2.51.0 workers: when it
    answered (published), when the twin was recorded on the artifact (verified), where the time
    went; then a cached re-submit and the folder's install, against bare boto3."""
    import psycopg

    from farm.core.settings import Settings
    from infra.devfarm.services import start_redis, start_seaweedfs
    from registry.db import migrate

    db = f"ctxfarm_bench_{uuid.uuid4().hex[:10]}"
    admin = "postgresql://postgres@127.0.0.1:5432/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    db_url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
    redis = start_redis(tmp / "redis")
    weed = start_seaweedfs(tmp / "weed")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        migrate(db_url)
        store_url = f"s3://ctxfarm-bench/{uuid.uuid4().hex[:12]}?endpoint={weed.url}"
        env = _env(tmp / "farm-home", FARM_DATABASE_URL=db_url, FARM_STORE_URL=store_url, FARM_BROKER_URL=redis.url,
                   FARM_HEARTBEAT_SECONDS="2", FARM_ACCURACY_BUDGET=os.environ.get("FARM_ACCURACY_BUDGET", "300"))
        settings = Settings.from_env(env)
        for i in range(workers):
            log = open(tmp / f"worker-{i}.log", "wb")
            procs.append(subprocess.Popen([str(WORKER_FARM), "worker"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + 90
        while len(json.loads(_cli(env, "workers", "--json").stdout)) < workers:
            if time.monotonic() > deadline:
                raise SystemExit("the workers did not register: see " + str(tmp / "worker-0.log"))
            time.sleep(0.5)
        time.sleep(1.0)
        submitted = datetime.now(UTC)
        argv = [sys.executable, "-m", "farm.cli", "submit", "--genai", str(export), "-t", TARGET, "--name",
                "llm/bench", "--tag", "b", "--wait", "--json"]
        package_wall, lines, out, rc, _ = _timed_lines(argv, env)
        if rc != 0:
            raise SystemExit(f"farm submit --genai -> {rc}\n{out}\n" + "\n".join(x for _, x in lines))
        doc = json.loads(out)
        if not doc["ok"]:
            raise SystemExit(f"the package failed: {json.dumps(doc, indent=2)[:3000]}")
        twin, verified = _await_twin(env, submitted, float(env["FARM_ACCURACY_BUDGET"]) + 1800)
        rows = _builds(settings, [b["build"] for b in doc["builds"]])
        package_row = max(rows, key=lambda r: r["id"])  # queued last: the package's own build
        part_rows = [r for r in rows if r is not package_row]
        first_start = min(r["started"] for r in part_rows)
        last_part = max(r["finished"] for r in part_rows)
        parts_wall = (last_part - first_start).total_seconds()
        parts = []
        for i, r in enumerate(sorted(part_rows, key=lambda r: r["id"])):
            predicted, measured = _peak(r["phases"])
            parts.append({"part": i, "worker": r["worker"], "predicted_peak_mib": predicted,
                          "measured_peak_mib": measured,
                          "wall_s": (r["finished"] - r["started"]).total_seconds()})
        twin_rows = _builds(settings, twin=True)
        breakdown = _cluster_breakdown(submitted, first_start, last_part, package_row, twin_rows, twin, package_wall,
                                       verified)
        # A cached re-submit: what it sends to the store (new blobs), what it answers, and the
        # twin builds it queues (none: they are keyed and cached like the parts).
        before = _blob_sizes(settings)
        t = time.perf_counter()
        again = _cli(env, "submit", "--genai", str(export), "-t", TARGET, "--name", "llm/bench", "--tag", "b", "--wait")
        resubmit_s = time.perf_counter() - t
        after = _blob_sizes(settings)
        uploaded = sum(size for d, size in after.items() if d not in before)
        twin_queued = len(_builds(settings, twin=True)) - len(twin_rows)
        install = _install(settings, store_url, weed.url, tmp)
        return {"workers": workers, "package_wall_s": package_wall, "published_s": package_wall,
                "verified_s": verified, "twin_figures": {k: twin.get(k) for k in (
                    "status", "tokens_compared", "tokens_matched", "tokens_stopped", "wall_seconds", "detail")},
                "twin_parts": twin.get("parts"), "breakdown": breakdown,
                "lines": [f"{t:7.2f} {x}" for t, x in lines],
                "parts_wall_s": parts_wall, "parts": parts,
                "twin_builds": [{"id": r["id"], "worker": r["worker"], "wall_s": (r["finished"] - r["started"])
                                 .total_seconds() if r["finished"] and r["started"] else None,
                                 "state": r["state"]} for r in twin_rows],
                "package_build_s": (package_row["finished"] - package_row["started"]).total_seconds(),
                "resubmit": {"seconds": resubmit_s, "bytes_uploaded": uploaded, "twin_builds_queued": twin_queued,
                             "answer_cached": again.stdout.count("cached"), "answer_lines": again.stdout.splitlines()},
                "install": install}
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 15)
                p.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        weed.stop()
        redis.stop()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def _await_twin(env: dict[str, str], submitted: datetime, timeout: float) -> tuple[dict[str, Any], float | None]:
    """The twin on the published package once it is no longer ``pending`` (polled once a second),
    and when it was seen recorded (seconds from the submit)."""
    deadline = time.monotonic() + timeout
    while True:
        res = json.loads(_cli(env, "resolve", "--model", "llm/bench:b", "--soc", "SM8650", "--qnn", "2.51.0",
                              "--json").stdout)
        tw = res.get("twin") or {}
        if tw.get("status") not in (None, "pending"):
            return tw, (datetime.now(UTC) - submitted).total_seconds()
        if time.monotonic() > deadline:
            return {"status": "timed-out", **tw}, None
        time.sleep(1.0)


def _cluster_breakdown(submitted: datetime, first_start: datetime, last_part: datetime, package_row: dict[str, Any],
                       twin_rows: list[dict[str, Any]], twin: dict[str, Any], published: float,
                       verified: float | None) -> dict[str, Any]:
    """Where a cluster release's time went, in seconds from the submit (the build rows' times and
    the twin's own figures)."""
    def since(when: datetime | None) -> float | None:
        return (when - submitted).total_seconds() if when is not None else None

    timing = twin.get("timing") or {}
    sim, ref = timing.get("twin") or {}, timing.get("reference") or {}
    steps = max(0, int(twin.get("tokens_compared") or 0) - 1)
    started = [r["started"] for r in twin_rows if r["started"]]
    finished = [r["finished"] for r in twin_rows if r["finished"]]
    part_checks = [p.get("seconds") for p in twin.get("parts") or [] if isinstance(p, dict)]
    return {"before_compiling_s": since(first_start), "parts_s": (last_part - first_start).total_seconds(),
            "assembly_and_folder_check_s": _d(since(package_row["finished"]), since(last_part)),
            "published_s": published,
            "twin_compiles_from_s": since(min(started)) if started else None,
            "twin_compiles_to_s": since(max(finished)) if finished else None,
            "twin_compiles_s": (twin.get("twin_builds") or {}).get("compile_seconds"),
            "twin_check_s": twin.get("wall_seconds"),
            "per_part_checks_s": part_checks or None,
            "simulator_load_s": sim.get("load_seconds"), "simulator_prefill_s": sim.get("prefill_seconds"),
            "simulator_per_step_s": sim.get("decode_seconds_per_token"), "simulator_steps": steps,
            "cpu_reference_s": (ref.get("load_seconds") or 0) + (ref.get("prefill_seconds") or 0)
            + (ref.get("decode_seconds_per_token") or 0) * (steps + 1),
            "verified_s": verified}


def _blob_sizes(settings: Any) -> dict[str, int]:
    from registry.index import Registry

    reg = Registry.open(settings)
    try:
        return {b.digest: int(b.size) for b in reg.store.iter_blobs()}
    finally:
        reg.close()


def _install(settings: Any, store_url: str, endpoint: str, tmp: Path) -> dict[str, Any]:
    """fetch_artifact of the package (every file verified, placed atomically) vs bare boto3
    download_file of the same objects (the store's own keys), same SeaweedFS, same bytes."""
    import boto3
    from botocore.config import Config

    from farm.cli.device_cmd import _resolve
    from registry.index import Registry
    from registry.install import fetch_artifact
    from registry.store.base import blob_key
    from registry.store.s3 import S3BlobStore

    class Args:
        model, soc, qnn, gpu, trt, platform = "llm/bench:b", "SM8650", "2.51.0", None, None, "linux-x86-64"
        fail_devices = 3

    reg = Registry.open(settings)
    try:
        artifact, _, _ = _resolve(reg, Args())
        t = time.perf_counter()
        result = fetch_artifact(reg.store, artifact, tmp / "device" / "llm")
        farm_s = time.perf_counter() - t
    finally:
        reg.close()
    st = S3BlobStore.from_url(store_url)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      config=Config(request_checksum_calculation="when_required",
                                    response_checksum_validation="when_required", s3={"addressing_style": "path"}))
    raw_dir = tmp / "raw-get"
    raw_dir.mkdir()
    blobs = {f.digest: int(f.size) for f in artifact.files if f.role in ("ctx-model", "context")}
    t = time.perf_counter()
    for i, digest in enumerate(blobs):
        s3.download_file(st.bucket, st._key(blob_key(digest)), str(raw_dir / f"b{i}"))  # noqa: SLF001
    raw_s = time.perf_counter() - t
    size = sum(blobs.values())
    return {"files": len(result.files), "bytes": result.bytes, "farm_s": farm_s, "raw_s": raw_s,
            "farm_mib_s": result.bytes / MIB / farm_s, "raw_mib_s": size / MIB / raw_s, "ratio": farm_s / raw_s}


# ---- embedded farm build --genai vs the hand loop -------------------------------------------------

def _cpu() -> float:
    """CPU seconds of this process's finished children and theirs (what a shared box's load does
    not inflate as it inflates wall time)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def hand_loop(export: Path, tmp: Path) -> dict[str, Any]:
    out = tmp / f"hand-{uuid.uuid4().hex[:6]}"
    t, cpu = time.perf_counter(), _cpu()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "genai_handloop.py"), str(export), str(out), "--json"],
                          capture_output=True, text=True, timeout=3600, env=_env(tmp / "unused"))
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"the hand loop failed:\n{proc.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_wall_s": wall, "cpu_s": _cpu() - cpu}


def _timed_lines(argv: list[str], env: dict[str, str]) -> tuple[float, list[tuple[float, str]], str, int, float]:
    """Run ``argv``; every stderr line with its arrival time (seconds from the start), and its
    CPU seconds (its children's included)."""
    t, cpu = time.perf_counter(), _cpu()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    lines: list[tuple[float, str]] = []
    assert proc.stderr is not None and proc.stdout is not None
    for line in proc.stderr:
        lines.append((time.perf_counter() - t, line.rstrip("\n")))
    out = proc.stdout.read()
    rc = proc.wait()
    return time.perf_counter() - t, lines, out, rc, _cpu() - cpu


def _at(lines: list[tuple[float, str]], needle: str) -> float | None:
    return next((t for t, line in lines if needle in line), None)


def embedded(export: Path, env: dict[str, str], *, require: bool = False, twin: bool = True) -> dict[str, Any]:
    """`farm build --genai` of an export this FARM_HOME has not seen: when it published, when its
    twin was recorded, and where the time went."""
    argv = [sys.executable, "-m", "farm.cli", "build", "--genai", str(export), "-t", TARGET, "--name", "llm/bench",
            "--tag", export.name, *(["--require-twin"] if require else []), *([] if twin else ["--no-twin"])]
    wall, lines, out, rc, cpu = _timed_lines(argv, env)
    if rc != 0:
        raise SystemExit(f"farm build --genai -> {rc}\n{out}\n" + "\n".join(x for _, x in lines))
    res = json.loads(_cli(env, "resolve", "--model", f"llm/bench:{export.name}", "--soc", "SM8650", "--qnn",
                          "2.51.0", "--json").stdout)
    tw = res.get("twin") or {}
    assembling = _at(lines, ": assembling")
    folder = _at(lines, "checking (folder)")
    published = _at(lines, f"published {TARGET}")
    # "twin ...: checking" (the parts' twin builds, then the simulator); "compiling" before the
    # twin's compiles were builds of their own (farm.pipeline.genai.twin_builds).
    twin_start = _at(lines, f"twin {TARGET}: checking")
    if twin_start is None:
        twin_start = _at(lines, f"twin {TARGET}: compiling")
    twin_line = next((x for _, x in lines if x.strip().startswith(f"twin {TARGET}: ")
                      and "compiling" not in x and "checking" not in x), "")
    timing = tw.get("timing") or {}
    sim, ref = timing.get("twin") or {}, timing.get("reference") or {}
    steps = max(0, int(tw.get("tokens_compared") or 0) - 1)  # the prompt's step gives the first token
    compiling = _at(lines, ": compiling (with")
    return {"require_twin": require, "twin": twin, "wall_s": wall, "cpu_s": cpu, "published_s": published,
            "answer_s": wall if require else published, "lines": [f"{t:7.2f} {x}" for t, x in lines],
            "breakdown": {"before_compiling_s": compiling, "parts_s": _d(assembling, compiling),
                          "assembly_s": _d(folder, assembling),
                          "folder_check_s": _d(published, folder),
                          "twin_s": _d(wall, twin_start) if twin_start is not None else None,
                          # The twin builds' compiles (run in the pool beside the package's own
                          # work), else the check's own compiles (before they were builds).
                          "twin_compiles_s": (tw.get("twin_builds") or {}).get("compile_seconds",
                                                                               tw.get("compile_seconds")),
                          "twin_check_s": tw.get("wall_seconds"),
                          "simulator_load_s": sim.get("load_seconds"), "simulator_prefill_s": sim.get("prefill_seconds"),
                          "simulator_per_step_s": sim.get("decode_seconds_per_token"), "simulator_steps": steps,
                          "cpu_reference_s": (ref.get("load_seconds") or 0) + (ref.get("prefill_seconds") or 0)
                          + (ref.get("decode_seconds_per_token") or 0) * (steps + 1)},
            "twin_figures": {k: tw.get(k) for k in ("status", "tokens_compared", "tokens_matched", "tokens_stopped",
                                                    "wall_seconds")},
            "twin_line": twin_line.strip()}


def _d(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return ""


def main_embedded(args: argparse.Namespace, tmp: Path, export: Path, part_bytes: list[int]) -> dict[str, Any]:
    from farm.core.settings import Settings
    from registry.index import Registry

    # One FARM_HOME whose index exists (as a user's does), and an export of other weights (same
    # shapes, same compile) per farm run: nothing is cached, by digest or by stat.
    env = _env(tmp / "farm-home", FARM_ACCURACY_BUDGET=os.environ.get("FARM_ACCURACY_BUDGET", "300"))
    Registry.open(Settings.from_env(env)).close()
    exports = [_export(tmp / f"export-{seed}", args, seed) for seed in (1, 2, 3)]
    load = {"before": _uptime()}
    hand = [hand_loop(export, tmp)]
    plain = embedded(exports[0], env)
    hand.append(hand_loop(export, tmp))
    gated = embedded(exports[1], env, require=True)
    hand.append(hand_loop(export, tmp))
    no_twin = embedded(exports[2], env, twin=False)  # the CPU of publication alone
    hand.append(hand_loop(export, tmp))
    load["after"] = _uptime()
    base = sum(h["wall_s"] for h in hand) / len(hand)
    base_cpu = sum(h["cpu_s"] for h in hand) / len(hand)
    doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
           "cpus": os.cpu_count(), "load": load, "hidden": args.hidden, "layers": args.layers,
           "part_bytes": part_bytes, "hand_loop": hand, "hand_loop_s": base, "hand_loop_cpu_s": base_cpu,
           "build": plain, "require_twin": gated, "no_twin": no_twin,
           "published_ratio": plain["published_s"] / base, "verified_ratio": plain["wall_s"] / base,
           "require_twin_ratio": gated["wall_s"] / base,
           "cpu_ratios": {"published": no_twin["cpu_s"] / base_cpu, "require_twin": gated["cpu_s"] / base_cpu}}
    print(f"export: 2 parts of {', '.join(f'{b / 2**20:.0f} MiB' for b in part_bytes)} "
          f"(hidden {args.hidden}, {args.layers} layers); load {load['before'].split('load average:')[-1].strip()} "
          f"-> {load['after'].split('load average:')[-1].strip()}")
    walls = " / ".join(f"{h['wall_s']:.1f}" for h in hand)
    print(f"hand loop (baseline, around each)  {walls} s, mean {base:.1f} s; CPU {base_cpu:.1f} s")
    print(f"{'':35s}{'wall s':>8s}{'ratio':>7s}{'CPU s':>8s}{'ratio':>7s}")
    print(f"farm build --genai: published      {plain['published_s']:8.1f}{doc['published_ratio']:6.2f}x"
          f"{no_twin['cpu_s']:8.1f}{doc['cpu_ratios']['published']:6.2f}x  goal <= 1.1 (CPU: the --no-twin run)")
    print(f"farm build --genai: twin recorded  {plain['wall_s']:8.1f}{doc['verified_ratio']:6.2f}x{plain['cpu_s']:8.1f}")
    print(f"farm build --genai --require-twin  {gated['wall_s']:8.1f}{doc['require_twin_ratio']:6.2f}x"
          f"{gated['cpu_s']:8.1f}{doc['cpu_ratios']['require_twin']:6.2f}x  goal <= 3.0")
    for label, run in (("build", plain), ("--require-twin", gated), ("--no-twin", no_twin)):
        b = run["breakdown"]
        print(f"  {label}: " + ", ".join(f"{k.removesuffix('_s')} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in b.items() if v is not None))
        if run["twin_line"]:
            print(f"  {label}: {run['twin_line']}")
    return doc


def _export(out: Path, args: argparse.Namespace, seed: int = 0) -> Path:
    subprocess.run([sys.executable, str(ROOT / "bench" / "genai_export.py"), str(out), "--parts", "2", "--hidden",
                    str(args.hidden), "--layers", str(args.layers), "--seed", str(seed)], check=True,
                   capture_output=True, env={k: v for k, v in os.environ.items() if not k.startswith("FARM_")})
    return out


def main() -> int:
    # SeaweedFS without an IAM config accepts any key pair; boto3 insists on having one.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "ctxfarm-bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "ctxfarm-bench-secret")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cluster", action="store_true", help="farm submit --genai on two workers against the hand loop")
    p.add_argument("--sequential", action="store_true",
                   help="--cluster: also the parts built one after the other by the embedded farm")
    p.add_argument("--out")
    args = p.parse_args()
    out = Path(args.out or ROOT / "bench" / "out" / ("genai.json" if args.cluster else "genai-embedded.json"))
    tmp = Path(tempfile.mkdtemp(prefix="ctxfarm-bench-genai-"))
    try:
        export = tmp / "export"
        _export(export, args)
        from farm.core import genai

        ex = genai.read_export(export)
        part_bytes = [sum((export / f).stat().st_size for f in (p.prefill.graph.file, p.decode.graph.file, *p.data))
                      for p in ex.parts]
        if not args.cluster:
            doc = main_embedded(args, tmp, export, part_bytes)
        else:
            load = {"before": _uptime()}
            hand = [hand_loop(export, tmp)]
            fm = farm(export, tmp, args.workers)
            hand.append(hand_loop(export, tmp))
            seq = sequential(export, tmp) if args.sequential else None
            load["after"] = _uptime()
            base = sum(h["wall_s"] for h in hand) / len(hand)
            doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
                   "cpus": os.cpu_count(), "load": load, "hidden": args.hidden, "layers": args.layers,
                   "part_bytes": part_bytes, "hand_loop": hand, "hand_loop_s": base, "farm": fm,
                   "published_ratio": fm["published_s"] / base,
                   "verified_ratio": fm["verified_s"] / base if fm["verified_s"] is not None else None,
                   "sequential": seq, "parts_ratio": fm["parts_wall_s"] / seq["wall_s"] if seq else None}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    if not args.cluster:
        print(f"wrote {out}")
        return 0
    seq, fm, base = doc["sequential"], doc["farm"], doc["hand_loop_s"]
    print(f"export: 2 parts of {', '.join(f'{b / 2**30:.2f} GiB' for b in part_bytes)} "
          f"(hidden {args.hidden}, {args.layers} layers); {args.workers} workers; load "
          f"{doc['load']['before'].split('load average:')[-1].strip()} -> "
          f"{doc['load']['after'].split('load average:')[-1].strip()}")
    walls = " / ".join(f"{h['wall_s']:.1f}" for h in doc["hand_loop"])
    print(f"hand loop (baseline, before and after)  {walls} s, mean {base:.1f} s")
    vr = doc["verified_ratio"]
    print(f"farm submit --genai --wait: published    {fm['published_s']:8.1f} s {doc['published_ratio']:6.3f}x"
          "   goal <= 1.05")
    print(f"twin recorded on the artifact           {_n(fm['verified_s']):>8s} s "
          f"{(f'{vr:5.2f}x' if vr is not None else '    -')}   goal <= 2.0; twin {fm['twin_figures']}")
    b = fm["breakdown"]
    print("  breakdown (s from submit, or s): " + ", ".join(
        f"{k.removesuffix('_s')} {v:.1f}" if isinstance(v, float) else f"{k.removesuffix('_s')} {v}"
        for k, v in b.items() if v is not None))
    for t in fm["twin_builds"]:
        print(f"  twin build {t['id']}: {t['state']} in {_n(t['wall_s'])} s on {t['worker']}")
    if seq is not None:
        print(f"{'':34s}{'sequential':>12s}{'farm':>12s}{'ratio':>8s}")
        print(f"{'parts built (wall s)':34s}{seq['wall_s']:12.1f}{fm['parts_wall_s']:12.1f}{doc['parts_ratio']:8.2f}")
    for i, f_ in enumerate(fm["parts"]):
        s_ = seq["parts"][i] if seq else {}
        print(f"part {i} peak RSS MiB predicted/measured  farm {f_['predicted_peak_mib']}/{_n(f_['measured_peak_mib'])} "
              f"(worker {f_['worker']}, {f_['wall_s']:.1f} s)"
              + (f"  seq {s_['predicted_peak_mib']}/{_n(s_['measured_peak_mib'])}" if s_ else ""))
    rs = fm["resubmit"]
    print(f"cached re-submit: {rs['bytes_uploaded']} bytes uploaded (goal 0), {rs['twin_builds_queued']} twin "
          f"build(s) queued (goal 0), {rs['seconds']:.1f} s, {rs['answer_cached']} build(s) answered cached")
    ins = fm["install"]
    print(f"install: {ins['files']} files {ins['bytes'] / MIB:.1f} MiB in {ins['farm_s']:.2f} s "
          f"({ins['farm_mib_s']:.0f} MiB/s) vs raw S3 GET {ins['raw_s']:.2f} s ({ins['raw_mib_s']:.0f} MiB/s): "
          f"{ins['ratio']:.2f}x")
    print(f"wrote {out}")
    return 0


def _n(v: Any) -> str:
    return f"{v:.0f}" if isinstance(v, int | float) else "-"


if __name__ == "__main__":
    sys.exit(main())
