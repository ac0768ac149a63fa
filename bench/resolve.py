"""Resolve latency with many artifacts in PostgreSQL (p50/p99), against a SELECT 1 round trip.

Creates a throwaway database, builds the schema with Alembic (``registry.db.Database``), bulk
inserts models (tagged ``name_i:stable``) x QNN SoCs of the catalog x 10 toolchain versions, two
artifact_files rows each, then times over the same random queries, interleaved:

    SELECT 1                  one round trip on the session's connection (the baseline)
    resolve                   registry.resolve.resolve(session, digest, Device) (hits and misses)
    device query              resolve_model_ref("name_i:stable") + resolve, same session
    device query, new session what `farm device resolve` does: Database.session() per query

    resolve, lab model        a model the device lab reported on (``--lab-every``): its
                              enrolled devices' figures read for the winner (registry.lab)
    resolve, lab, prefer fastest   the same with FARM_RESOLVE_PREFER_FASTEST: every candidate's read

and coverage(session) over all builds. Ratios are against the SELECT 1 p50 of this run. SQL
statements per call, the share of time inside cursor.execute and the calls during which a full
(generation 2) garbage collection ran are counted too, and EXPLAIN (ANALYZE, BUFFERS) of each
statement of one resolve is printed as evidence. Prints a table and writes JSON to
bench/out/resolve.json; the database is dropped at the end.

    python bench/resolve.py                       # 100 000 artifacts, 2000 queries
    python bench/resolve.py --artifacts 10000 --queries 500
    python bench/resolve.py --log-kib 16          # builds rows carry a compile log, as workers store

EXPLAIN ANALYZE does not detoast the columns it returns, so the cost of a large ``builds.log``
shows in the timings (and the "in SQL" share), not in the plans.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import platform
import random
import signal
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import event, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from farm.core.catalog import load_catalog  # noqa: E402
from farm.core.errors import NoMatchError  # noqa: E402
from farm.core.keys import options_digest  # noqa: E402
from farm.core.options import normalize  # noqa: E402
from registry.coverage import Scope, models_page, rebuild, summary  # noqa: E402
from registry.db import Database, migrate  # noqa: E402
from registry.index import resolve_model_ref  # noqa: E402
from registry.resolve import Device, resolve  # noqa: E402

TOOLCHAINS = [f"2.{m}.0" for m in range(40, 52)]  # 2.40.0 .. 2.51.0
PER_PAIR = 10  # toolchains built per (model, SoC): a window of 10 of the 12
RUNTIMES = [f"2.{m}.0" for m in range(38, 53)]  # device runtimes queried; < 2.40 never loads


def _hex(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def synthetic_log(kib: int) -> str | None:
    """A compile log of about ``kib`` KiB (text that compresses like a real one), or None."""
    if kib <= 0:
        return None
    lines, size, n = [], 0, 0
    while size < kib * 1024:
        line = (f"[{n * 0.0137:10.4f}] QnnHtp: op {n % 977:4d} Conv2d_{n % 53} mapped to HTP, vtcm {n * 37 % 8192:5d} "
                f"bytes, graph 'main' node {n}\n")
        lines.append(line)
        size += len(line)
        n += 1
    return "".join(lines)[: kib * 1024]


LAB_DEVICES_PER_SOC = 2  # enrolled devices per SoC; each reports on every artifact of a lab model there


def lab_model(i: int, every: int) -> bool:
    """Whether model ``i`` is one the device lab reported on (every ``every``-th; 0: none)."""
    return every > 0 and i % every == 0


def populate(db: Database, n_artifacts: int, socs: list[str], unbuilt: int, log_kib: int = 0,
             lab_every: int = 0) -> dict[str, int]:
    """Bulk load with COPY (PostgreSQL) in one transaction with triggers off (``session_replication_role
    = replica``: the coverage triggers and foreign-key checks), then the coverage tables rebuilt
    once (``registry.coverage.rebuild``) and ANALYZE; explicit ids, sequences moved past them."""
    log = synthetic_log(log_kib)
    per_model = len(socs) * PER_PAIR
    n_models = math.ceil(n_artifacts / per_model)
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    catalog = load_catalog()
    default_opts = {s: options_digest(normalize("qnn", {}, catalog.get(s, backend="qnn"))) for s in socs}
    counts = {"models": 0, "tags": 0, "builds": 0, "artifacts": 0, "artifact_files": 0, "devices": 0,
              "verification_jobs": 0, "device_verifications": 0}
    lab = {"sha256:" + _hex("model", i) for i in range(n_artifacts) if lab_model(i, lab_every)}
    raw = db.engine.raw_connection()
    try:
        conn = raw.driver_connection
        with conn.cursor() as cur:
            cur.execute("SET session_replication_role = replica")

            def copy(table: str, cols: str, rows: Any) -> None:
                with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
                    for row in rows:
                        cp.write_row(row)
                        counts[table] += 1

            def models() -> Any:
                for i in range(n_models + unbuilt):
                    onnx = "sha256:" + _hex("onnx", i)
                    yield ("sha256:" + _hex("model", i), onnx, 4_000_000 + i,
                           json.dumps([{"name": "model.onnx", "digest": onnx}]), f"name_{i}", t0)

            def tags() -> Any:
                for i in range(n_models + unbuilt):
                    yield i + 1, f"name_{i}", "stable", "sha256:" + _hex("model", i), t0

            def cells() -> Any:
                n = 0
                for i in range(n_models):
                    mdigest = "sha256:" + _hex("model", i)
                    for j, soc in enumerate(socs):
                        start = (i * 7 + j) % (len(TOOLCHAINS) - PER_PAIR + 1)
                        for tc in TOOLCHAINS[start:start + PER_PAIR]:
                            if n == n_artifacts:
                                return
                            n += 1
                            yield n, mdigest, soc, tc, t0 + timedelta(seconds=n)

            copy("models", "digest, onnx_digest, size, files, first_name, created_at", models())
            copy("tags", "id, name, tag, model_digest, updated_at", tags())
            copy("builds", "id, build_key, model_digest, backend, target, toolchain, options, options_digest, state,"
                 " attempts, created_at, started_at, finished_at, log",
                 ((n, _hex("build", m, soc, tc), m, "qnn", soc, tc, "{}", default_opts[soc], "succeeded", 1, at, at,
                   at, log) for n, m, soc, tc, at in cells()))
            copy("artifacts", "id, digest, build_id, model_digest, backend, target, toolchain, options_digest,"
                 " ctx_model, ep_sdk_version, compile_seconds, size, nodes_ep, nodes_cpu, status, created_at",
                 ((n, "sha256:" + _hex("manifest", n), n, m, "qnn", soc, tc, default_opts[soc], "model_ctx.onnx", tc,
                   12.5, 9_000_000, 120, 0, "active", at) for n, m, soc, tc, at in cells()))
            copy("artifact_files", "id, artifact_id, name, role, digest, size, media_type",
                 ((2 * n - 1 + k, n, name, role, "sha256:" + _hex("file", n, k), 4_500_000, mt)
                  for n, *_ in cells()
                  for k, (name, role, mt) in enumerate((
                      ("model_ctx.onnx", "ctx-model", "application/onnx"),
                      ("model_ctx_qnn.bin", "context", "application/octet-stream")))))
            # The device lab: LAB_DEVICES_PER_SOC enrolled devices per SoC, each with one job done
            # and its report on every artifact of a lab model on its SoC (p50 varying by SDK).
            dev_ids = {(soc, k): j * LAB_DEVICES_PER_SOC + k + 1 for j, soc in enumerate(socs)
                       for k in range(LAB_DEVICES_PER_SOC)}
            copy("devices", "id, name, enroll_hash, enroll_expires_at, enrolled_at, public_key, key_id, soc,"
                 " simulator, facts, created_at",
                 ((d, f"phone-{soc}-{k}", _hex("enroll", d), t0, t0, "A" * 44, _hex("key", d)[:16], soc, False,
                   json.dumps({"arch": "aarch64"}), t0) for (soc, k), d in dev_ids.items()))
            lab_cells = [(n, soc, tc) for n, m, soc, tc, _at in cells() if m in lab]
            copy("verification_jobs", "id, artifact_id, soc, slot, state, device_id, attempts, created_at, done_at",
                 ((LAB_DEVICES_PER_SOC * x + k + 1, n, soc, k + 1, "done", dev_ids[(soc, k)], 1, t0, t0)
                  for x, (n, soc, _tc) in enumerate(lab_cells) for k in range(LAB_DEVICES_PER_SOC)))
            copy("device_verifications", "id, job_id, device_id, artifact_id, soc, simulator, nonce, outcome, psnr_db,"
                 " load_ms, p50_ms, body, signature, created_at",
                 ((LAB_DEVICES_PER_SOC * x + k + 1, LAB_DEVICES_PER_SOC * x + k + 1, dev_ids[(soc, k)], n, soc, False,
                   _hex("nonce", n, k)[:32], "ok", 60.0, 100.0, 10.0 + int(_hex("p50", n, k)[:4], 16) % 40, "{}",
                   "sig", t0)
                  for x, (n, soc, _tc) in enumerate(lab_cells) for k in range(LAB_DEVICES_PER_SOC)))
            for table in ("tags", "builds", "artifacts", "artifact_files", "devices", "verification_jobs",
                          "device_verifications"):
                cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                            f"(SELECT coalesce(max(id), 1) FROM {table}))")
            cur.execute("SET session_replication_role = DEFAULT")
        conn.commit()
    finally:
        raw.close()
    with db.session() as s:
        rebuild(s)
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        # What autovacuum would have done on a live index, done now rather than inside a measure:
        # PostgreSQL 13+ vacuums a table after inserts alone (autovacuum_vacuum_insert_threshold),
        # and a VACUUM of the million rows just loaded took cores from the measures that followed.
        # Plans below use real statistics, and the visibility map lets index-only scans skip the heap.
        c.execute(text("VACUUM (ANALYZE)"))
    with db.engine.connect() as c:
        # The load's gigabytes written out now: a checkpoint that falls inside a measure (its
        # writes stall reads for tenths of a second here) would time the setup, not resolve.
        c.execute(text("CHECKPOINT"))
        c.commit()
    counts["built_models"] = n_models
    return counts


class SqlCounter:
    """Statements and seconds spent in cursor.execute (psycopg fetches results there)."""

    def __init__(self, engine: Any):
        self.n = 0
        self.seconds = 0.0
        self.capture: list[tuple[str, Any]] | None = None
        self._t = 0.0
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if self.capture is not None:
            self.capture.append((statement, params))
        self._t = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        self.seconds += time.perf_counter() - self._t
        self.n += 1

    def reset(self) -> None:
        self.n, self.seconds = 0, 0.0


class GcCounter:
    """Full (generation 2) collections and their seconds: what the tail latency is made of."""

    def __init__(self) -> None:
        self.full = 0
        self.seconds = 0.0
        self._t = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.full += 1
            self.seconds += time.perf_counter() - self._t

    def close(self) -> None:
        gc.callbacks.remove(self._cb)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def _clip(line: str, width: int = 200) -> str:
    """Plan lines with 100-id IN lists are long; the JSON keeps them whole."""
    return line if len(line) <= width else line[:width] + "..."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200, help="untimed queries first (caches, compiled SQL)")
    ap.add_argument("--coverage-runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-kib", type=int, default=0,
                    help="compile log stored in each builds row (workers keep up to 256 KiB); default none")
    ap.add_argument("--lab-every", type=int, default=100,
                    help="every Nth model has device lab reports on all its artifacts (0: none); default 100 (1%%)")
    ap.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/test",
                    help="an existing database to CREATE/DROP the throwaway one from")
    args = ap.parse_args()

    # SIGTERM unwinds like Ctrl-C, so the finally blocks still stop what this run started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import psycopg

    socs = [t.name for t in load_catalog().of_backend("qnn")]
    unbuilt = max(1, math.ceil(args.artifacts / (len(socs) * PER_PAIR)) // 100)  # ~1% of models: no artifact
    dbname = f"ctxfarm_bench_{os.getpid()}"
    base = args.admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    admin = psycopg.connect(args.admin_url, autocommit=True)
    admin.execute(f'CREATE DATABASE "{dbname}"')
    db: Database | None = None
    try:
        t0 = time.perf_counter()
        migrate(f"{base}/{dbname}")
        db = Database(f"{base}/{dbname}")
        schema_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        counts = populate(db, args.artifacts, socs, unbuilt, args.log_kib, args.lab_every)
        load_s = time.perf_counter() - t0
        print(f"database {dbname}: schema {schema_s:.1f} s; inserted {counts['models']} models, "
              f"{counts['artifacts']} builds/artifacts ({args.log_kib} KiB log each), "
              f"{counts['artifact_files']} artifact_files, {counts['device_verifications']} device lab reports "
              f"in {load_s:.1f} s (+ ANALYZE)", flush=True)
        result = measure(db, args, socs, counts, unbuilt)
        result.update(database=dbname, schema_seconds=schema_s, load_seconds=load_s, counts=counts)
    finally:
        if db is not None:
            db.dispose()
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.close()

    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "resolve.json").write_text(json.dumps(result, indent=2, default=str))
    return 0


def measure(db: Database, args: argparse.Namespace, socs: list[str], counts: dict[str, int],
            unbuilt: int) -> dict[str, Any]:
    catalog = load_catalog()
    rng = random.Random(args.seed)
    n_models = counts["built_models"] + unbuilt
    devices = {(s, r): Device("qnn", catalog.get(s, backend="qnn"), r) for s in socs for r in RUNTIMES}
    queries = [(rng.randrange(n_models), rng.choice(socs), rng.choice(RUNTIMES))
               for _ in range(args.warmup + args.queries)]
    digests = {i: "sha256:" + _hex("model", i) for i in range(n_models)}
    sql = SqlCounter(db.engine)
    gcs = GcCounter()
    names = ["SELECT 1", "resolve", "resolve (hit)", "resolve (miss: NoMatchError)",
             "device query (ref + resolve)", "device query, new session per query",
             "resolve, lab model", "resolve, lab model, prefer fastest"]
    lab_models = [i for i in range(counts["built_models"]) if lab_model(i, args.lab_every)]
    lat: dict[str, list[float]] = {k: [] for k in names}
    stmts: dict[str, list[int]] = {k: [] for k in names}
    sql_s: dict[str, list[float]] = {k: [] for k in names}
    full_gc: dict[str, list[int]] = {k: [] for k in names}
    gc_s: dict[str, float] = dict.fromkeys(names, 0.0)
    misses = 0

    def timed(name: str, fn: Any) -> Any:
        sql.reset()
        full0, gc0 = gcs.full, gcs.seconds
        t = time.perf_counter()
        try:
            return fn()
        finally:
            dt = time.perf_counter() - t
            if record:
                lat[name].append(dt)
                stmts[name].append(sql.n)
                sql_s[name].append(sql.seconds)
                full_gc[name].append(gcs.full - full0)
                gc_s[name] += gcs.seconds - gc0

    def resolve_or_miss(s: Session, digest: str, device: Device, prefer_fastest: bool = False) -> bool:
        try:
            resolve(s, digest, device, prefer_fastest=prefer_fastest)
            return True
        except NoMatchError:
            return False

    def device_query(s: Session, ref: str, device: Device) -> bool:
        return resolve_or_miss(s, resolve_model_ref(s, ref), device)

    def fresh_session(ref: str, device: Device) -> bool:
        with db.session() as s2:
            ok = device_query(s2, ref, device)
            s2.expunge_all()
        return ok

    with db.session() as s:
        for q, (i, soc, runtime) in enumerate(queries):
            record = q >= args.warmup
            device, ref = devices[(soc, runtime)], f"name_{i}:stable"
            timed("SELECT 1", lambda: s.execute(text("SELECT 1")).scalar())
            hit = timed("resolve", lambda: resolve_or_miss(s, digests[i], device))  # noqa: B023
            s.expunge_all()  # a fresh identity map per query, as a request would have
            if record:
                kind = "resolve (hit)" if hit else "resolve (miss: NoMatchError)"
                misses += not hit
                lat[kind].append(lat["resolve"][-1])
                stmts[kind].append(stmts["resolve"][-1])
                sql_s[kind].append(sql_s["resolve"][-1])
                full_gc[kind].append(full_gc["resolve"][-1])
            timed("device query (ref + resolve)", lambda: device_query(s, ref, device))  # noqa: B023
            s.expunge_all()
            timed("device query, new session per query", lambda: fresh_session(ref, device))  # noqa: B023
            if lab_models:
                lab_digest = digests[lab_models[q % len(lab_models)]]
                timed("resolve, lab model", lambda: resolve_or_miss(s, lab_digest, device))  # noqa: B023
                s.expunge_all()
                timed("resolve, lab model, prefer fastest",
                      lambda: resolve_or_miss(s, lab_digest, device, True))  # noqa: B023
                s.expunge_all()

        # Coverage: the summary (counters; a scope aggregates its cells) and pages of the drill-down.
        first = models_page(s)
        cursor = first.next_cursor
        for _ in range(8):
            cursor = models_page(s, cursor=cursor).next_cursor
        views = {
            "coverage summary (whole farm)": lambda: summary(s),
            "coverage summary (prefix name_12)": lambda: summary(s, Scope(prefix="name_12")),
            "coverage summary (tag stable: every model)": lambda: summary(s, Scope(tag="stable")),
            "coverage page 1 (20 models)": lambda: models_page(s),
            "coverage page 10 (cursor)": lambda: models_page(s, cursor=cursor),
            "coverage page, state missing": lambda: models_page(s, state="missing"),
            "coverage page, failed on SM8650 (none)": lambda: models_page(s, state="failed",
                                                                         target=f"qnn:{socs[0]}"),
        }
        cov_plans: dict[str, list[dict[str, Any]]] = {}
        for name, fn in views.items():
            values = []
            for run in range(max(1, args.coverage_runs)):
                sql.reset()
                sql.capture = [] if run == 0 else None
                t = time.perf_counter()
                fn()
                values.append(time.perf_counter() - t)
                if run == 0:
                    cov_plans[name] = [{"statement": " ".join(st.split()), "params": p} for st, p in sql.capture or []]
                    stmts[name] = [sql.n]
                    sql_s[name] = [sql.seconds]
                sql.capture = None
            lat[name] = values
            full_gc[name] = []
        cov_cells = s.execute(text("SELECT count(*) FROM coverage_cells")).scalar()

        # EXPLAIN ANALYZE of exactly the statements one resolve sends (a model with artifacts).
        sql.capture = []
        i = next(i for i, _, _ in queries if i < counts["built_models"])
        resolve_or_miss(s, digests[i], devices[(socs[0], RUNTIMES[-1])])
        captured, sql.capture = sql.capture, None
        s.expunge_all()
        if lab_models:  # and of one resolve of a lab model that prefers the fastest (its lab read)
            sql.capture = []
            resolve_or_miss(s, digests[lab_models[0]], devices[(socs[0], RUNTIMES[-1])], True)
            captured += sql.capture
            sql.capture = None
            s.expunge_all()
        plans: list[dict[str, Any]] = []
        for statement, params in captured:
            plan = s.connection().exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement, params).all()
            plans.append({"statement": " ".join(statement.split()), "plan": [r[0] for r in plan]})
        gcs.close()
        explain_coverage: dict[str, list[str]] = {}
        for name in ("coverage summary (whole farm)", "coverage summary (tag stable: every model)",
                     "coverage page 10 (cursor)", "coverage page, state missing"):
            lines: list[str] = []
            for st in cov_plans.get(name, []):
                lines += [r[0] for r in s.connection().exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + st["statement"],
                                                                     st["params"]).all()]
            explain_coverage[name] = lines

    base = statistics.median(lat["SELECT 1"])
    rows = []
    for name, values in lat.items():
        if not values:
            continue
        p50 = statistics.median(values)
        rows.append({"measure": name, "n": len(values), "p50_ms": p50 * 1e3, "p99_ms": pct(values, 0.99) * 1e3,
                     "max_ms": max(values) * 1e3, "p50_x_select1": p50 / base,
                     "sql_statements": statistics.median(stmts[name]),
                     "sql_share": statistics.median(sql_s[name]) / p50 if p50 else 0.0,
                     "calls_with_full_gc": sum(1 for g in full_gc[name] if g) if full_gc[name] else None,
                     "full_gc_seconds": gc_s.get(name)})

    print(f"\n{counts['artifacts']} artifacts ({counts['built_models']} models x {len(socs)} QNN SoCs x "
          f"{PER_PAIR} toolchains, {unbuilt} models without artifacts), {args.queries} random queries "
          f"after {args.warmup} warm-up, {misses} misses; coverage: {args.coverage_runs} runs each, {cov_cells} cells")
    print(f"{'measure':38s} {'n':>5s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'p50 x SELECT 1':>15s} "
          f"{'SQL stmts':>9s} {'in SQL':>7s} {'full GC':>8s}")
    for r in rows:
        fg = "" if r["calls_with_full_gc"] is None else str(r["calls_with_full_gc"])
        print(f"{r['measure']:38s} {r['n']:5d} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['max_ms']:8.3f} "
              f"{r['p50_x_select1']:15.1f} {r['sql_statements']:9.0f} {r['sql_share']:7.0%} {fg:>8s}")
    print("in SQL: median seconds inside cursor.execute / p50 (the rest is Python: ORM loading, ranking); "
          "full GC: calls during which a generation-2 collection ran")
    n_full = sum(sum(v) for v in full_gc.values())
    if n_full:
        print(f"full collections inside timed calls: {n_full}, {sum(gc_s.values()) / n_full * 1e3:.1f} ms each "
              f"on average ({len(gc.get_objects())} objects tracked by the GC at the end)")
    print("\nEXPLAIN (ANALYZE, BUFFERS) of the statements of one resolve:")
    for p in plans:
        print("  " + p["statement"][:160] + ("..." if len(p["statement"]) > 160 else ""))
        for line in p["plan"]:
            print("    " + _clip(line))
    for name, lines in explain_coverage.items():
        print(f"{name}:")
        for line in lines:
            print("    " + _clip(line))

    import sqlalchemy

    by = {r["measure"]: r for r in rows}

    def target(what: str, measure: str, field: str, limit: float) -> dict[str, Any]:
        value = by[measure][field] if measure in by else None
        return {"target": what, "measure": measure, "value_ms": value, "limit_ms": limit,
                "met": value is not None and value <= limit}

    targets = [target("coverage summary <= 50 ms (in-process; the HTTP figure is bench/api.py's)",
                      "coverage summary (whole farm)", "p50_ms", 50.0),
               target("one page of detail <= 100 ms (in-process)", "coverage page 10 (cursor)", "p50_ms", 100.0),
               target("a missing-filtered page <= 100 ms (in-process)", "coverage page, state missing", "p50_ms", 100.0)]
    for t in targets:
        print(f"target: {t['target']}: {t['value_ms']:.1f} ms -> {'met' if t['met'] else 'MISSED'}")
    return {"name": "resolve", "what": "resolve and coverage queries in-process against PostgreSQL",
            "artifacts": counts["artifacts"], "log_kib": args.log_kib, "queries": args.queries,
            "warmup": args.warmup, "misses": misses, "seed": args.seed, "baseline": "SELECT 1 p50",
            "targets": targets,
            "baseline_ms": base * 1e3, "rows": rows,
            "coverage_cells": cov_cells, "explain": plans, "explain_coverage": explain_coverage,
            "env": {"python": platform.python_version(), "sqlalchemy": sqlalchemy.__version__,
                    "postgres": db.engine.dialect.server_version_info, "cpus": os.cpu_count()}}


if __name__ == "__main__":
    sys.exit(main())
