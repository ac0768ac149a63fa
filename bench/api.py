"""The HTTP service under load, with baselines measured in the same run.

    python bench/api.py [--artifacts 100000] [--rate 200] [--seconds 10] [--workers 1,2] [--install-mib 1024]
                        [--stream-mib 2048]

1. resolve over HTTP with 100k artifacts in PostgreSQL, from concurrent loopback clients at a
   fixed rate (open loop): p50/p99 of hits and of explained misses, against `SELECT 1` over
   HTTP-free SQL (the floor); once per process count in ``--workers`` (`farm serve --workers N`,
   a fresh service each, questions no run asked before), the last count's service going on to
   the measures below (the targets read the last count: list the service's default last);
2. /v1/coverage and the /coverage page at that size;
3. `farm.client.install` of a large artifact from SeaweedFS (presigned redirect) against a raw
   boto3 GET of the same object (a ratio);
4. the service's peak RSS while it streams a large blob from a local store.
Prints a table and writes bench/out/api.json.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.resolve import RUNTIMES, populate  # noqa: E402
from infra.devfarm.services import free_port, start_seaweedfs  # noqa: E402
from tests.common.service import serve  # noqa: E402


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


def rss_kib(pid: int, key: str = "VmRSS") -> int:
    """The largest RSS among ``pid`` and its children (`farm serve --workers N`: the process
    that streams)."""
    best = 0
    pids = [pid]
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            pids += [int(k) for k in (task / "children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    best = max(best, int(line.split()[1]))
        except OSError:
            continue
    return best


def load(port: int, token: str, queries: list[str], rate: float, threads: int,
         etags: dict[str, str] | None = None) -> list[tuple[str, float, int]]:
    """Open loop: request i is due at i / rate; latency counts from when it was due, over
    ``threads`` keep-alive connections (a request due while all are busy waits for one, and that
    wait counts). One asyncio loop writes prepared requests: Python threads of http.client queued
    on their own GIL (up to its 5 ms switch interval) and put that wait into the measure.
    ``etags``: If-None-Match per query (a device's conditional poll)."""
    import asyncio

    async def run() -> list[tuple[str, float, int]]:
        conns: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
        for _ in range(threads):
            conns.put_nowait(await asyncio.open_connection("127.0.0.1", port))
        start = time.perf_counter() + 0.2
        out: list[tuple[str, float, int]] = []

        async def one(i: int, q: str) -> None:
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            reader, writer = await conns.get()
            extra = f"If-None-Match: {etags[q]}\r\n" if etags and q in etags else ""
            writer.write(f"GET {q} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n{extra}\r\n"
                         .encode())
            head = (await reader.readuntil(b"\r\n\r\n")).lower()
            length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0]) if b"content-length:" in head else 0
            await reader.readexactly(length)
            out.append((q, time.perf_counter() - due, int(head.split(b" ", 2)[1])))
            conns.put_nowait((reader, writer))

        await asyncio.gather(*(one(i, q) for i, q in enumerate(queries)))
        while not conns.empty():
            conns.get_nowait()[1].close()
        return out

    return asyncio.run(run())


def get(port: int, path: str, token: str, headers: dict[str, str] | None = None
        ) -> tuple[int, bytes, float, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}", **(headers or {})})
    resp = conn.getresponse()
    body = resp.read()
    took = time.perf_counter() - t0
    conn.close()
    return resp.status, body, took, {k.lower(): v for k, v in resp.getheaders()}


def resolve_histogram(port: int, token: str) -> dict[str, float]:
    """The service's ctxfarm_resolve_seconds (sum, count, buckets) from /metrics."""
    _, body, _, _ = get(port, "/metrics", token)
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("ctxfarm_resolve_seconds_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def service_side(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Mean resolve time inside the service between two scrapes, and the share under each bucket."""
    n = after.get("ctxfarm_resolve_seconds_count", 0) - before.get("ctxfarm_resolve_seconds_count", 0)
    total = after.get("ctxfarm_resolve_seconds_sum", 0) - before.get("ctxfarm_resolve_seconds_sum", 0)
    shares = {}
    for key, value in after.items():
        if key.startswith("ctxfarm_resolve_seconds_bucket") and n:
            le = key.split('le="', 1)[1].split('"', 1)[0]
            shares[f"share_le_{le}s"] = (value - before.get(key, 0)) / n
    return {"requests": n, "mean_ms": total / n * 1e3 if n else None, **shares}


def big_artifact(reg: Any, size_mib: int, name: str) -> str:
    """Publish a synthetic artifact with one large context file (blobs first, then rows)."""
    from farm.core.keys import sha256_file
    from farm.pipeline import states
    from farm.pipeline.states import BuildSpec
    from registry import manifest as mf
    from registry.index import insert_artifact, record_model, set_tag
    from registry.store.base import put_bytes, put_file

    with tempfile.NamedTemporaryFile(dir=ROOT / "bench" / "out", delete=False) as f:
        rng = random.Random(7)
        block = bytes(rng.getrandbits(8) for _ in range(1 << 20))
        for i in range(size_mib):
            f.write(hashlib.sha256(i.to_bytes(8, "big")).digest() + block[32:])
        path = Path(f.name)
    try:
        digest, size = sha256_file(path)
        put_file(reg.store, path, expected=digest)
    finally:
        path.unlink()
    ctx = b"ctx model placeholder " + name.encode()
    ctx_info = put_bytes(reg.store, ctx)
    model = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    files = [{"name": "model_ctx.onnx", "role": "ctx-model", "digest": ctx_info.digest, "size": len(ctx),
              "mediaType": "application/onnx"},
             {"name": "model_ctx_qnn.bin", "role": "context", "digest": digest, "size": size,
              "mediaType": "application/octet-stream"}]
    manifest = mf.make_manifest(model_digest=model, build_key="0" * 64, backend="qnn",
                                target={"ref": "qnn:SM8650", "name": "SM8650"}, toolchain={"version": "2.51.0"},
                                options={}, options_digest="sha256:" + "0" * 64, ctx_model="model_ctx.onnx",
                                files=files, epcontext=[], placement={"ep_nodes": 1, "cpu_nodes": 0},
                                compile_seconds=1.0, built_at="2026-01-01T00:00:00+00:00", log=None)
    data, mdigest = mf.encode(manifest)
    put_bytes(reg.store, data, expected=mdigest)
    from farm.core.catalog import parse_target
    from farm.core.keys import build_key, options_digest
    from farm.core.options import normalize

    opts = normalize("qnn", {}, parse_target("qnn:SM8650"))
    od = options_digest(opts)
    spec = BuildSpec(build_key(model, "qnn", "SM8650", "2.51.0", od), model, "qnn", "SM8650", "2.51.0", opts, od)
    with reg.db.session() as s:
        record_model(s, digest=model, onnx_digest=model, size=1, files=[], name=name)
        set_tag(s, name, "latest", model)
        build_id, _ = states.enqueue(s, spec, None)
        lease = states.claim(s, build_id, owner="bench", lease_seconds=60, max_attempts=3).lease
        assert lease is not None
        insert_artifact(s, build_id, manifest_digest=mdigest, manifest_size=len(data), ctx_model="model_ctx.onnx",
                        files=files, ep_sdk_version="2.51.0", compile_seconds=1.0, nodes_ep=1, nodes_cpu=0)
        states.succeed(s, lease, log=None)
    return digest


class _Done(Exception):
    """The measures asked for are taken: skip the rest."""


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the table; add the issue's targets (value, limit, met) and what they are measured against."""
    r = results.get("resolve")
    targets: list[dict[str, Any]] = []

    def target(what: str, value: float | None, limit: float) -> None:
        targets.append({"target": what, "value_ms": value, "limit_ms": limit,
                        "met": value is not None and value == value and value <= limit})

    for row in results.get("resolve by processes", []):
        print(f"resolve, first asked, {row['processes']} service process(es): hits p50 {row['hit_p50_ms']:.1f} ms "
              f"p99 {row['hit_p99_ms']:.1f} ms; misses p50 {row['miss_p50_ms']:.1f} ms p99 {row['miss_p99_ms']:.1f} ms;"
              f" service mean {(row['service'].get('mean_ms') or 0):.2f} ms")
    if r and r["requests"]:
        print(f"resolve over HTTP, {args.artifacts} artifacts, {r['requests']} first-asked requests at {args.rate:g}/s "
              f"({args.threads} clients): done at {r['rate_done']:.0f}/s")
        print(f"  hits   p50 {r['hit_p50_ms']:.1f} ms  p99 {r['hit_p99_ms']:.1f} ms  ({r['hits']})")
        print(f"  misses p50 {r['miss_p50_ms']:.1f} ms  p99 {r['miss_p99_ms']:.1f} ms  ({r['misses']})")
        print(f"  SELECT 1 p50 {r['select1_p50_ms']:.2f} ms (floor, same run); in the service: mean "
              f"{(r['service'].get('mean_ms') or 0):.2f} ms")
        target("resolve hits p99 <= 10 ms at the rate", r["hit_p99_ms"], 10.0)
        target("resolve explained misses p99 <= 10 ms at the rate", r["miss_p99_ms"], 10.0)
    c = results.get("resolve conditional")
    if c:
        sv = c["service"]
        print(f"conditional polls (If-None-Match): {c['answered_304']}/{c['requests']} answered 304, client p50 "
              f"{c['p50_ms']:.2f} ms p99 {c['p99_ms']:.2f} ms; in the service mean {(sv.get('mean_ms') or 0):.2f} ms, "
              f"{sv.get('share_le_0.001s', 0):.0%} under 1 ms, {sv.get('share_le_0.0025s', 0):.0%} under 2.5 ms")
        rp = results["resolve repeated (cached answer)"]
        print(f"repeated questions (cached answer, 200): p50 {rp['p50_ms']:.2f} ms p99 {rp['p99_ms']:.2f} ms")
        # The service's histogram has no 2 ms bucket: p50 <= 2 ms is claimed when half the polls took
        # under 1 ms, or the mean is under 2 ms.
        service_p50 = 1.0 if sv.get("share_le_0.001s", 0) >= 0.5 else sv.get("mean_ms")
        target("conditional poll answered 304 in <= 2 ms p50 at the service (<=1 ms if half under the 1 ms "
               "bucket, else the mean)", service_p50, 2.0)
    for k, v in results.items():
        if k.startswith("coverage "):
            print(f"{k}: {v['median_ms']:.1f} ms ({v['bytes']} bytes)")
    for key, what, limit in (("coverage /v1/coverage/summary", "/v1/coverage summary <= 50 ms", 50.0),
                             ("coverage /v1/coverage/summary?tag=stable", "summary for a tag <= 50 ms", 50.0),
                             ("coverage /v1/coverage/models?cursor=CURSOR", "one page of detail <= 100 ms", 100.0),
                             ("coverage /coverage?cursor=CURSOR", "the /coverage page <= 150 ms", 150.0)):
        if key in results:
            target(what, results[key]["median_ms"], limit)
    i = results.get("install")
    if i:
        print(f"install {i['mib']} MiB: {i['install_s']:.1f} s vs raw S3 GET {i['raw_get_s']:.1f} s "
              f"-> {i['throughput_vs_raw']:.2f}x of raw throughput")
    st = results.get("stream")
    if st:
        print(f"stream {st['mib']:.0f} MiB from the service: {st['seconds']:.1f} s, server RSS "
              f"{st['rss_before_mib']:.0f} -> peak {st['rss_peak_mib']:.0f} MiB")
    for t in targets:
        print(f"target: {t['target']}: {t['value_ms'] if t['value_ms'] is None else round(t['value_ms'], 2)} ms "
              f"-> {'met' if t['met'] else 'MISSED'}")
    results.update(name="api", what="the HTTP service under load (service, PostgreSQL and clients on one box)",
                   artifacts=args.artifacts, rate=args.rate, baseline="SELECT 1 p50 over the same PostgreSQL "
                   "(resolve); raw S3 GET (install)", targets=targets,
                   env={"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg()})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--workers", default="1,2",
                    help="service process counts to compare, comma-separated; the last serves the rest of the bench")
    ap.add_argument("--install-mib", type=int, default=1024, help="0: skip the install measure")
    ap.add_argument("--stream-mib", type=int, default=2048, help="0: skip the streaming RSS measure")
    ap.add_argument("--full-coverage-max", type=int, default=100_000,
                    help="time the whole-matrix /v1/coverage only up to this many artifacts (it grows with them)")
    ap.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()

    import psycopg

    from farm.core.settings import Settings
    from registry.db import Database, migrate
    from registry.index import Registry
    from registry.tokens import create_token

    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    dbname = f"ctxfarm_api_{os.getpid()}"
    admin = psycopg.connect(args.admin_url, autocommit=True)
    admin.execute(f'CREATE DATABASE "{dbname}"')
    base = args.admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    db_url = f"{base}/{dbname}"
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="ctxfarm-api-") as tmp_s:
            tmp = Path(tmp_s)
            migrate(db_url)
            db = Database(db_url)
            socs = ["SM8650", "SM8750", "SM8550", "SC8380XP", "SM8450", "SM8475", "SM8350", "QCS9100", "SA8295",
                    "SM8850"]
            t0 = time.perf_counter()
            if args.artifacts:
                populate(db, args.artifacts, socs, unbuilt=50)
            results["populate_s"] = time.perf_counter() - t0
            db.dispose()
            env_local = {**os.environ, "FARM_HOME": str(tmp / "home"), "FARM_DATABASE_URL": db_url,
                         "FARM_STORE_URL": f"file://{tmp / 'blobs'}"}
            settings = Settings.from_env(env_local)
            reg = Registry.open(settings)
            with reg.db.session() as s:
                token = create_token(s, "bench", "read")
            # 1. resolve, hits and explained misses, open loop at --rate (--artifacts 0: skipped), once per
            # process count, each on a fresh service. Warm-up on other random questions: the service caches
            # answers per question, and the measured ones must be first asked (the cost of a device's first
            # poll after a change); each run asks questions no earlier run asked (seeded apart).
            n_models = max(1, args.artifacts // (len(socs) * 10))
            n = int(args.rate * args.seconds) if args.artifacts else 0

            def questions(seed: int, k: int) -> list[str]:
                rng = random.Random(seed)
                return [f"/v1/resolve?model=name_{rng.randrange(n_models)}:stable"
                        f"&soc={rng.choice(socs)}&qnn={rng.choice(RUNTIMES)}&manifest=false" for _ in range(k)]

            from sqlalchemy import text

            counts = [int(w) for w in args.workers.split(",") if w.strip()]
            by_processes: list[dict[str, Any]] = []
            for run, workers in enumerate(counts):
                port = free_port()
                procs.append(serve(env_local, port, tmp / f"serve-{workers}.log", workers=workers))
                pid = procs[-1].pid
                queries = list(dict.fromkeys(questions(1 + 1000 * run, n)))
                if n:
                    load(port, token, questions(2 + 1000 * run, min(400, n)), args.rate * 4, args.threads)  # warm-up
                before = resolve_histogram(port, token)
                got = load(port, token, queries, args.rate, args.threads)
                first_service = service_side(before, resolve_histogram(port, token))
                hits = [t for _, t, st in got if st == 200]
                misses = [t for _, t, st in got if st == 404]
                wall = max(1e-9, args.seconds)
                floor = []
                for _ in range(500):
                    with reg.db.session() as s:
                        a = time.perf_counter()
                        s.execute(text("SELECT 1"))
                        floor.append(time.perf_counter() - a)
                results["resolve"] = {"processes": workers, "requests": len(got), "rate_asked": args.rate,
                                      "rate_done": len(got) / wall,
                                      "hit_p50_ms": pct(hits, 50) * 1e3, "hit_p99_ms": pct(hits, 99) * 1e3,
                                      "miss_p50_ms": pct(misses, 50) * 1e3, "miss_p99_ms": pct(misses, 99) * 1e3,
                                      "hits": len(hits), "misses": len(misses),
                                      "other": len(got) - len(hits) - len(misses),
                                      "select1_p50_ms": pct(floor, 50) * 1e3, "service": first_service,
                                      "load_avg": os.getloadavg()}
                by_processes.append(results["resolve"])
                if run < len(counts) - 1:
                    os.killpg(pid, signal.SIGTERM)
                    procs[-1].wait(30)
            results["resolve by processes"] = by_processes
            # 1b. The same questions again as devices poll: with If-None-Match (their ETag) -> 304,
            # and without (a repeated question: the cached answer).
            etags: dict[str, str] = {}
            for q in queries[: min(len(queries), 300)]:
                status, _body, _t, headers = get(port, q, token)
                if status == 200:
                    etags[q] = headers["etag"]
            polls = [q for q in queries if q in etags]
            if polls:
                rounds = max(1, n // len(polls))
                before = resolve_histogram(port, token)
                got304 = load(port, token, polls * rounds, args.rate, args.threads, etags)
                cond_service = service_side(before, resolve_histogram(port, token))
                before = resolve_histogram(port, token)
                repeat = load(port, token, polls * rounds, args.rate, args.threads)
                rep_service = service_side(before, resolve_histogram(port, token))
                t304 = [t for _, t, st in got304 if st == 304]
                rep = [t for _, t, st in repeat if st == 200]
                results["resolve conditional"] = {
                    "requests": len(got304), "answered_304": len(t304),
                    "p50_ms": pct(t304, 50) * 1e3, "p99_ms": pct(t304, 99) * 1e3, "service": cond_service}
                results["resolve repeated (cached answer)"] = {
                    "requests": len(repeat), "p50_ms": pct(rep, 50) * 1e3, "p99_ms": pct(rep, 99) * 1e3,
                    "service": rep_service}
            # 2. coverage: the summary, pages of the drill-down, the page; the whole matrix where small.
            paths = ["/v1/coverage/summary", "/v1/coverage/summary?tag=stable", "/v1/coverage/summary?prefix=name_12",
                     "/v1/coverage/models", "/v1/coverage/models?state=missing", "/coverage"]
            _st, first_page, _t, _h = get(port, "/v1/coverage/models", token)
            cursor = json.loads(first_page).get("next")
            if cursor:
                paths.append(f"/v1/coverage/models?cursor={cursor}")
                paths.append(f"/coverage?cursor={cursor}")
            if args.artifacts <= args.full_coverage_max:
                paths.append("/v1/coverage")
            for path in paths:
                times = []
                for _ in range(5):
                    status, body, took, _h = get(port, path, token)
                    assert status == 200, body[:300]
                    times.append(took)
                label = path.replace(cursor or "\0", "CURSOR")
                results[f"coverage {label}"] = {"median_ms": pct(times, 50) * 1e3, "bytes": len(body)}
            # 4. RSS while streaming a large blob (local store: the service streams it itself).
            if not args.stream_mib:
                reg.close()
                os.killpg(pid, signal.SIGTERM)
                procs[-1].wait(30)
                raise _Done
            big = big_artifact(reg, args.stream_mib, "stream-me")
            before = rss_kib(pid)
            peak = before
            stop = threading.Event()

            def watch() -> None:
                nonlocal peak
                while not stop.is_set():
                    peak = max(peak, rss_kib(pid))
                    time.sleep(0.05)

            w = threading.Thread(target=watch)
            w.start()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            t1 = time.perf_counter()
            conn.request("GET", f"/v1/blobs/{big}", headers={"Authorization": f"Bearer {token}"})
            resp = conn.getresponse()
            total = 0
            while chunk := resp.read(1 << 20):
                total += len(chunk)
            took = time.perf_counter() - t1
            stop.set()
            w.join()
            results["stream"] = {"mib": total / 2**20, "seconds": took, "rss_before_mib": before / 1024,
                                 "rss_peak_mib": peak / 1024}
            reg.close()
            os.killpg(pid, signal.SIGTERM)
            procs[-1].wait(30)

            # 3. install over HTTP (presigned S3) vs raw boto3 GET of the same object.
            if not args.install_mib:
                raise _Done
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
            s3 = start_seaweedfs(tmp / "weed")
            try:
                store_url = f"s3://ctxfarm-bench/api?endpoint={s3.url}"
                env_s3 = {**env_local, "FARM_STORE_URL": store_url, "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
                          "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"]}
                reg3 = Registry.open(Settings.from_env(env_s3))
                blob = big_artifact(reg3, args.install_mib, "install-me")
                port3 = free_port()
                procs.append(serve(env_s3, port3, tmp / "serve3.log"))
                from farm.client import install

                t1 = time.perf_counter()
                install(f"http://127.0.0.1:{port3}", token, "install-me", soc="SM8650", qnn="2.51.0",
                        dest=tmp / "device")
                install_s = time.perf_counter() - t1
                from registry.store.base import blob_key

                client = reg3.store.client  # type: ignore[attr-defined]
                key = reg3.store._key(blob_key(blob))  # type: ignore[attr-defined]
                t1 = time.perf_counter()
                body = client.get_object(Bucket=reg3.store.bucket, Key=key)["Body"]  # type: ignore[attr-defined]
                h = hashlib.sha256()
                with open(tmp / "raw.bin", "wb") as f:
                    while chunk := body.read(1 << 20):
                        h.update(chunk)
                        f.write(chunk)
                raw_s = time.perf_counter() - t1
                results["install"] = {"mib": args.install_mib, "install_s": install_s, "raw_get_s": raw_s,
                                      "throughput_vs_raw": raw_s / install_s}
                reg3.close()
            finally:
                s3.stop()
    except _Done:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.close()

    report(results, args)
    (out_dir / "api.json").write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
