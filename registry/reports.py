"""Device reports (docs/evidence.md): what a device saw when it loaded an artifact, and what the
fleet's reports add up to.

A report is attributed to the token that sent it and the device id it names. One row per
(artifact, token, device, runtime): a device that reports again replaces its row (``count`` goes
up), so one device counts once however often it reports. Aggregates count distinct devices per
artifact x runtime (x SoC) by outcome, with load time p50/p90 and peak memory.

What counts as device evidence (docs/evidence.md "What makes reports independent"):

- only reports that say their platform (``arch``) and were admitted: not from a host the farm
  itself could be (QNN on x86_64/x86 is the HTP simulator: refused, ``not-device-evidence``), for
  an SoC the artifact covers, from a runtime the compatibility rule allows for that build
  (``registry.resolve.admit``). Rows stored before migration 0010 have no platform: shown, never counted;
- not struck (``revoked_at``: an admin struck them, a quarantine was lifted, or their token was
  revoked) and sent by a token that is not revoked;
- **independent**: device ids are whatever a token says, so distinct ids behind one token are
  not independent devices. Evidence changes what resolve serves only when it comes from at least
  ``MIN_TOKENS`` distinct tokens: a token can't make resolve prefer an artifact, nor take one
  away from the fleet, however many ids it invents.

What resolve reads (``device_verdicts``): per artifact, for one runtime and SoC, distinct devices
(and distinct tokens) that loaded it or failed. The rule stays the floor (``registry.resolve``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from farm.core.errors import NotFoundError, UsageError
from registry.lite import Rows, in_params

OUTCOMES = ("loads", "fails", "crashed")
FAILED = ("fails", "crashed")

# The fields a report carries (besides artifact, token and timestamps), as stored.
FIELDS = ("device_id", "device_model", "soc", "os", "arch", "runtime_backend", "runtime_version", "ort_version",
          "ep_package", "ep_version", "driver", "outcome", "error", "load_ms", "first_inference_ms", "peak_memory_mb",
          "fingerprint", "psnr_db", "reported_at")


# Distinct report tokens evidence must come from before it changes what resolve serves (either
# way: preferred as device-verified, or withheld as failing). Not a setting: one is never enough.
MIN_TOKENS = 2

# CPU architectures a report may name, by the spellings platforms use (uname -m, Android ABIs,
# Windows' PROCESSOR_ARCHITECTURE, Python's platform.machine()) -> the one stored.
ARCHES = {"aarch64": "aarch64", "arm64": "aarch64", "arm64-v8a": "aarch64", "armv8": "aarch64", "armv8l": "aarch64",
          "armv7": "armv7", "armv7l": "armv7", "armeabi-v7a": "armv7", "arm": "armv7",
          "x86_64": "x86_64", "amd64": "x86_64", "x64": "x86_64", "x86-64": "x86_64",
          "x86": "x86", "i386": "x86", "i686": "x86",
          "riscv64": "riscv64"}
# Hosts the farm itself could be, per backend: a QNN HTP "device" on x86 is the simulator the
# farm probes with. (TensorRT devices are GPUs on any CPU; the farm has none, and its rule binds
# an engine to the runtime's platform already.)
FARM_HOSTS = {"qnn": frozenset({"x86_64", "x86"})}


def canonical_arch(raw: str) -> str | None:
    """The stored name of a CPU architecture (``arm64`` -> ``aarch64``); None if unknown."""
    return ARCHES.get(raw.strip().lower())


def is_farm_host(backend: str, arch: str) -> bool:
    """Whether a runtime on ``arch`` could be the farm itself for ``backend`` (never device evidence)."""
    return arch in FARM_HOSTS.get(backend, frozenset())


@dataclass(frozen=True)
class DeviceEvidence:
    """What devices said about one artifact under one runtime version (counted reports only)."""

    loads: int = 0  # distinct devices
    fails: int = 0  # distinct devices that failed or crashed
    last_error: str | None = None
    last_at: datetime | None = None
    load_tokens: int = 0  # distinct tokens behind ``loads``
    fail_tokens: int = 0  # distinct tokens behind ``fails``


@dataclass(frozen=True)
class ArtifactRef:
    """What admitting a report needs of its artifact (immutable by digest: cached by the service)."""

    id: int
    backend: str
    target: str
    toolchain: str
    ctx_model: str
    options: dict[str, Any]


def artifact_ref(rows: Rows, digest: str) -> ArtifactRef | None:
    """An artifact by its manifest digest, with its build's options (the TensorRT rule reads them)."""
    from registry.lite import as_json

    hit = rows.rows("SELECT a.id, a.backend, a.target, a.toolchain, a.ctx_model, b.options FROM artifacts a"
                    " LEFT JOIN builds b ON b.id = a.build_id WHERE a.digest = :d", {"d": digest})
    if not hit:
        return None
    aid, backend, target, toolchain, ctx_model, options = hit[0]
    options = as_json(options)
    return ArtifactRef(int(aid), str(backend), str(target), str(toolchain), str(ctx_model or ""),
                       dict(options or {}))



def record(s: Any, artifact_id: int, token_id: int, fields: dict[str, Any]) -> int:
    """Insert or replace the report of (artifact, token, device, runtime); returns its row id.
    One statement: INSERT .. ON CONFLICT DO UPDATE (PostgreSQL and SQLite alike)."""
    from sqlalchemy.dialects import postgresql, sqlite

    from registry.models import DeviceReport

    now = datetime.now(UTC)
    values = {k: fields.get(k) for k in FIELDS}
    values.update(artifact_id=artifact_id, token_id=token_id, received_at=now, count=1, revoked_at=None)
    dialect = s.get_bind().dialect.name
    ins = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(DeviceReport).values(**values)
    update: dict[str, Any] = {k: ins.excluded[k] for k in (*FIELDS, "received_at")}
    update["count"] = DeviceReport.count + 1
    update["revoked_at"] = None
    stmt = ins.on_conflict_do_update(
        index_elements=["artifact_id", "token_id", "device_id", "runtime_backend", "runtime_version"],
        set_=update).returning(DeviceReport.id)
    return int(s.execute(stmt).scalar_one())


KEY = ("artifact_id", "token_id", "device_id", "runtime_backend", "runtime_version")


def record_many(s: Any, reports: list[tuple[int, int, dict[str, Any]]]) -> list[int]:
    """Insert or replace many reports in one statement; their row ids, in order. Reports of one
    key within the batch collapse to the last one (``count`` adds up). A token revoked while its
    reports waited in the writer (their token was checked as they came) has them stored
    struck (``revoked_at``), in the same statement, so they never count, even for a moment.
    Plain SQL on the session's connection: the ORM's bulk path cost more CPU than the database did
    (1.4 ms a report in batches of 8, measured). PostgreSQL: one statement text whatever the batch
    size (columns as arrays, ``unnest``), which the driver prepares once per connection."""
    now = datetime.now(UTC)
    conn = s.connection()
    if s.get_bind().dialect.name == "postgresql":
        with conn.connection.driver_connection.cursor() as cur:
            return _pg_batch(cur, reports)
    keys, rows = _collapse(reports)
    ids = {tuple(r[1:]): int(r[0]) for r in _sqlite_batch(conn, list(rows.values()), now)}
    return [ids[k] for k in keys]


def _collapse(reports: list[tuple[int, int, dict[str, Any]]]
              ) -> tuple[list[tuple[Any, ...]], dict[tuple[Any, ...], dict[str, Any]]]:
    """(each report's key, in order; key -> its row, the last of a key's reports, ``count`` of them)."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    keys = []
    for artifact_id, token_id, fields in reports:
        values = {k: fields.get(k) for k in FIELDS}
        values.update(artifact_id=artifact_id, token_id=token_id)
        key = tuple(values[k] for k in KEY)
        keys.append(key)
        values["count"] = rows[key]["count"] + 1 if key in rows else 1
        rows[key] = values
    return keys, rows


def _pg_batch(cur: Any, reports: list[tuple[int, int, dict[str, Any]]]) -> list[int]:
    """``record_many`` on a psycopg cursor: the batch as ``_PG_BATCH``."""
    keys, rows = _collapse(reports)
    now = datetime.now(UTC)
    cur.execute(_PG_BATCH, [now, now, *([row[c] for row in rows.values()] for c, _type in _ARRAYS)])
    ids = {tuple(r[1:]): int(r[0]) for r in cur.fetchall()}
    return [ids[k] for k in keys]


# Each column the batch carries and its PostgreSQL array type (unnest's input).
_ARRAYS = tuple((c, "float8[]" if c in ("load_ms", "first_inference_ms", "peak_memory_mb", "psnr_db")
                 else "timestamptz[]" if c == "reported_at" else "text[]") for c in FIELDS) + (
    ("artifact_id", "int[]"), ("token_id", "int[]"), ("count", "int[]"))
_PG_BATCH = (
    f"INSERT INTO device_reports ({', '.join(c for c, _ in _ARRAYS)}, received_at, revoked_at, revoked_why)"
    f" SELECT {', '.join('x.' + c for c, _ in _ARRAYS)}, %s::timestamptz,"
    " CASE WHEN t.revoked_at IS NULL THEN NULL ELSE %s::timestamptz END,"
    " CASE WHEN t.revoked_at IS NULL THEN NULL ELSE 'token revoked' END"
    f" FROM unnest({', '.join(f'%s::{t}' for _, t in _ARRAYS)}) AS x({', '.join(c for c, _ in _ARRAYS)})"
    " LEFT JOIN api_tokens t ON t.id = x.token_id"
    f" ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in (*FIELDS, "received_at", "revoked_at", "revoked_why"))
    + ", count = device_reports.count + excluded.count"
    f" RETURNING id, {', '.join(KEY)}")


def _sqlite_batch(conn: Any, rows: list[dict[str, Any]], now: datetime) -> list[Any]:
    """SQLite: the batch as one multi-row INSERT, then the struck tokens' reports (SQLite stores
    naive UTC text, as SQLAlchemy does)."""
    stamp = now.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
    params: dict[str, Any] = {}
    groups = []
    for i, row in enumerate(rows):
        names = []
        for c in _COLUMNS:
            v = row.get(c) if c not in ("received_at", "revoked_at") else (stamp if c == "received_at" else None)
            if isinstance(v, datetime):
                v = v.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
            params[f"p{i}_{c}"] = v
            names.append(f":p{i}_{c}")
        groups.append("(" + ", ".join(names) + ")")
    sql = (f"INSERT INTO device_reports ({', '.join(_COLUMNS)}) VALUES {', '.join(groups)}"
           f" ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET "
           + ", ".join(f"{c} = excluded.{c}" for c in (*FIELDS, "received_at"))
           + ", count = device_reports.count + excluded.count, revoked_at = NULL"
           f" RETURNING id, {', '.join(KEY)}")
    got = conn.exec_driver_sql(sql, params).fetchall()
    tokens = sorted({row["token_id"] for row in rows})
    conn.exec_driver_sql(
        "UPDATE device_reports SET revoked_at = :now, revoked_why = 'token revoked'"
        f" WHERE revoked_at IS NULL AND token_id IN ({', '.join(f':t{i}' for i in range(len(tokens)))})"
        " AND token_id IN (SELECT id FROM api_tokens WHERE revoked_at IS NOT NULL)",
        {"now": stamp, **{f"t{i}": t for i, t in enumerate(tokens)}})
    return got


_COLUMNS = (*FIELDS, "artifact_id", "token_id", "received_at", "revoked_at", "count")


class ReportWriter:
    """Writes reports in batches from one thread: every report that arrives while a batch is
    being written goes into the next one (one statement, one commit; no waiting for more: an
    idle service writes a lone report at once, a busy one in batches as large as the arrivals
    during one write), so a burst of devices costs a few transactions, not one each. A report
    is answered 201 only once its batch has committed: a crash of the service never loses an
    answered report (an unanswered one was never acknowledged, and a device that sends it again
    counts once). On PostgreSQL the commit does not wait for the WAL flush
    (``synchronous_commit = off``): a crash of the *database server* may lose the last moments of
    answered reports (a few hundred ms), never the index's consistency. The waiting requests are
    woken once per batch and event loop (``call_soon_threadsafe``), not once each."""

    def __init__(self, db: Any, max_batch: int = 500):
        import queue
        import threading

        self.db, self.max_batch = db, max_batch
        self.queue: queue.SimpleQueue[tuple[int, int, dict[str, Any], Any, Any]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="report-writer", daemon=True)
        self.thread.start()

    async def write(self, artifact_id: int, token_id: int, fields: dict[str, Any]) -> int:
        """The report's row id, once its batch has committed."""
        import asyncio

        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        self.queue.put((artifact_id, token_id, fields, loop, fut))
        return await fut

    def _run(self) -> None:
        import queue

        while True:
            batch = [self.queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            outcomes: list[Any] = []
            try:
                outcomes = self._write([(a, t, f) for a, t, f, _l, _f in batch])
            except Exception:  # a bad row must not fail its neighbours: one by one
                for a, t, f, _loop, _fut in batch:
                    try:
                        outcomes.append(self._write([(a, t, f)])[0])
                    except Exception as exc:  # noqa: BLE001 - handed to the waiting request
                        outcomes.append(exc)
            by_loop: dict[Any, list[tuple[Any, Any]]] = {}
            for (_a, _t, _f, loop, fut), outcome in zip(batch, outcomes, strict=True):
                by_loop.setdefault(loop, []).append((fut, outcome))
            for loop, settled in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:  # that loop is closed: nobody waits there any more
                    pass

    def _write(self, reports: list[tuple[int, int, dict[str, Any]]]) -> list[int]:
        if self.db.engine.dialect.name == "postgresql":
            # The pooled driver connection itself: no ORM session to set up and tear down per batch.
            raw = self.db.engine.raw_connection()
            try:
                with raw.driver_connection.cursor() as cur:
                    cur.execute("SET LOCAL synchronous_commit = off")
                    ids = _pg_batch(cur, reports)
                raw.commit()
                return ids
            except BaseException:
                raw.rollback()
                raise
            finally:
                raw.close()  # back to the pool
        with self.db.session() as s:
            return record_many(s, reports)


def _settle(settled: list[tuple[Any, Any]]) -> None:
    for fut, outcome in settled:
        if fut.done():  # the request went away (cancelled)
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)


def revoke(s: Any, *, token_name: str | None = None, report_id: int | None = None) -> int:
    """Strike a token's reports (all of them) or one report; returns how many were struck.
    (Revoking the token itself, ``registry.tokens.revoke_token``, strikes them too.)"""
    from sqlalchemy import select, update

    from registry.models import ApiToken, DeviceReport

    q = update(DeviceReport).where(DeviceReport.revoked_at.is_(None))
    if token_name is not None:
        token_id = s.scalar(select(ApiToken.id).where(ApiToken.name == token_name))
        if token_id is None:
            raise NotFoundError(f"no token named {token_name!r}", hint="`farm token list` shows them")
        q = q.where(DeviceReport.token_id == token_id)
    elif report_id is not None:
        q = q.where(DeviceReport.id == report_id)
    else:
        raise UsageError("name a token or a report id to revoke")
    n = s.execute(q.values(revoked_at=datetime.now(UTC), revoked_why="revoked by an admin")
                  .execution_options(synchronize_session=False)).rowcount
    if report_id is not None and not n:
        raise NotFoundError(f"no active report {report_id}")
    return int(n or 0)


# The reports that count (module docstring): admitted with a platform, not struck, their token live.
COUNTED = ("r.revoked_at IS NULL AND r.arch IS NOT NULL"
           " AND EXISTS (SELECT 1 FROM api_tokens t WHERE t.id = r.token_id AND t.revoked_at IS NULL)")


def device_verdicts(rows: Rows, artifact_ids: list[int], backend: str, runtime: str, soc: str
                    ) -> dict[int, DeviceEvidence]:
    """Artifact id -> distinct devices (and tokens) with ``soc`` that loaded it / failed, under
    exactly this runtime, counted reports only (one statement)."""
    from registry.lite import as_datetime

    if not artifact_ids:
        return {}
    placeholders, params = in_params("a", artifact_ids)
    out: dict[int, dict[str, Any]] = {}
    for artifact_id, failed, n, tokens, last_error, last_at in rows.rows(
            "SELECT r.artifact_id, CASE WHEN r.outcome = 'loads' THEN 0 ELSE 1 END AS failed, COUNT(*),"
            " COUNT(DISTINCT r.token_id), MAX(r.error), MAX(r.received_at) FROM device_reports r"
            f" WHERE r.artifact_id IN ({placeholders}) AND r.runtime_backend = :backend"
            f" AND r.runtime_version = :runtime AND r.soc = :soc AND {COUNTED}"
            " GROUP BY r.artifact_id, CASE WHEN r.outcome = 'loads' THEN 0 ELSE 1 END",
            {**params, "backend": backend, "runtime": runtime, "soc": soc}):
        d = out.setdefault(int(artifact_id), {})
        if int(failed):
            d.update(fails=int(n), fail_tokens=int(tokens), last_error=last_error)
        else:
            d.update(loads=int(n), load_tokens=int(tokens))
        at = as_datetime(last_at)
        if at is not None and (d.get("last_at") is None or at > d["last_at"]):
            d["last_at"] = at
    return {k: DeviceEvidence(**v) for k, v in out.items()}


def independent(ev: DeviceEvidence, fail_devices: int) -> str | None:
    """What counted evidence says, once it is independent (``MIN_TOKENS`` distinct tokens):
    ``loads``, ``fails`` (failed on ``fail_devices`` distinct devices and not independently
    loaded: withheld from that runtime and SoC), or None (not enough to change anything)."""
    if ev.loads and ev.load_tokens >= MIN_TOKENS:
        return "loads"
    if ev.fails >= fail_devices and ev.fail_tokens >= MIN_TOKENS:
        return "fails"
    return None


def quarantined(rows: Rows, fail_devices: int) -> list[dict[str, Any]]:
    """Every (artifact, runtime, SoC) that counted, independent reports withhold from resolve,
    with why: devices and tokens that failed, devices that loaded, the last error, since when."""
    from farm.core.times import iso
    from registry.lite import as_datetime

    cells: dict[tuple[Any, ...], dict[str, Any]] = {}
    for aid, digest, model, target, toolchain, backend, version, soc, failed, n, tokens, last_error, first, last in \
            rows.rows(
                "SELECT r.artifact_id, a.digest, a.model_digest, a.target, a.toolchain, r.runtime_backend,"
                " r.runtime_version, r.soc, CASE WHEN r.outcome = 'loads' THEN 0 ELSE 1 END, COUNT(*),"
                " COUNT(DISTINCT r.token_id), MAX(r.error), MIN(r.received_at), MAX(r.received_at)"
                f" FROM device_reports r JOIN artifacts a ON a.id = r.artifact_id WHERE {COUNTED}"
                " GROUP BY r.artifact_id, a.digest, a.model_digest, a.target, a.toolchain, r.runtime_backend,"
                " r.runtime_version, r.soc, CASE WHEN r.outcome = 'loads' THEN 0 ELSE 1 END", {}):
        key = (int(aid), backend, version, soc)
        c = cells.setdefault(key, {"artifact": digest, "model": model, "target": target, "toolchain": toolchain,
                                   "runtime": f"{backend}:{version}", "soc": soc, "ev": {}})
        if int(failed):
            c["ev"].update(fails=int(n), fail_tokens=int(tokens), last_error=last_error)
            c["since"] = iso(as_datetime(first))
            c["last_report_at"] = iso(as_datetime(last))
        else:
            c["ev"].update(loads=int(n), load_tokens=int(tokens))
    out = []
    for c in cells.values():
        ev = DeviceEvidence(**c.pop("ev"))
        if independent(ev, fail_devices) != "fails":
            continue
        c.update(failed_devices=ev.fails, failed_tokens=ev.fail_tokens, loaded_devices=ev.loads,
                 loaded_tokens=ev.load_tokens, last_error=(ev.last_error or "")[:500] or None,
                 why=f"failed on {ev.fails} device(s) behind {ev.fail_tokens} token(s) with {c['soc']} and "
                     f"{c['runtime']}; loaded on {ev.loads} device(s) behind {ev.load_tokens} token(s) "
                     f"(needs {MIN_TOKENS})")
        out.append(c)
    return sorted(out, key=lambda c: (c["artifact"], c["runtime"], c["soc"]))


def lift(s: Any, artifact_id: int, backend: str, runtime: str, soc: str) -> int:
    """Lift a quarantine: strike the failed reports of (artifact, runtime, SoC) (``revoked_why``
    says so); new independent failures quarantine it again. Returns how many were struck."""
    from sqlalchemy import update

    from registry.models import DeviceReport

    n = s.execute(update(DeviceReport).where(
        DeviceReport.artifact_id == artifact_id, DeviceReport.runtime_backend == backend,
        DeviceReport.runtime_version == runtime, DeviceReport.soc == soc, DeviceReport.outcome.in_(FAILED),
        DeviceReport.revoked_at.is_(None)).values(revoked_at=datetime.now(UTC), revoked_why="quarantine lifted")
        .execution_options(synchronize_session=False)).rowcount
    if not n:
        raise NotFoundError(f"no failed reports to lift for {soc} and {backend}:{runtime}",
                            hint="`farm reports quarantined` lists what is withheld")
    return int(n)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))], 3)


def summary(s: Any, artifact_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Artifact id -> one entry per (runtime, SoC), counted reports only: distinct devices by outcome
    (and the distinct tokens behind them), load time p50/p90,
    first-inference p50, peak memory max, device models, the last error; what `farm show`,
    resolve's answer, the API and the coverage data show."""
    from sqlalchemy import select

    from farm.core.times import iso
    from registry.models import DeviceReport

    out: dict[int, list[dict[str, Any]]] = {}
    if not artifact_ids:
        return out
    from sqlalchemy import exists

    from registry.models import ApiToken

    groups: dict[tuple[int, str, str, str], list[Any]] = {}
    live = exists().where(ApiToken.id == DeviceReport.token_id, ApiToken.revoked_at.is_(None))
    for r in s.scalars(select(DeviceReport).where(DeviceReport.artifact_id.in_(artifact_ids),
                                                  DeviceReport.revoked_at.is_(None), DeviceReport.arch.is_not(None),
                                                  live)
                       .order_by(DeviceReport.received_at)):
        groups.setdefault((r.artifact_id, r.runtime_backend, r.runtime_version, r.soc), []).append(r)
    for (artifact_id, backend, version, soc), rs in sorted(groups.items()):
        loads = [r for r in rs if r.outcome == "loads"]
        failed = [r for r in rs if r.outcome in FAILED]
        out.setdefault(artifact_id, []).append({
            "runtime": f"{backend}:{version}", "soc": soc,
            "devices": len(rs), "tokens": len({r.token_id for r in rs}), "loads": len(loads),
            "fails": sum(r.outcome == "fails" for r in rs),
            "crashed": sum(r.outcome == "crashed" for r in rs), "reports": sum(r.count for r in rs),
            "load_ms_p50": _pct([r.load_ms for r in loads if r.load_ms is not None], 0.5),
            "load_ms_p90": _pct([r.load_ms for r in loads if r.load_ms is not None], 0.9),
            "first_inference_ms_p50": _pct([r.first_inference_ms for r in loads if r.first_inference_ms is not None],
                                           0.5),
            "peak_memory_mb_max": max((r.peak_memory_mb for r in rs if r.peak_memory_mb is not None), default=None),
            "psnr_db_min": min((r.psnr_db for r in rs if r.psnr_db is not None), default=None),
            "device_models": sorted({r.device_model for r in rs})[:20],
            "last_error": failed[-1].error[:500] if failed and failed[-1].error else None,
            "last_report_at": iso(rs[-1].received_at),
        })
    return out


def headline(entries: list[dict[str, Any]]) -> str:
    """One cell: ``3 devices load, 1 fails`` or ``-``."""
    if not entries:
        return "-"
    loads = sum(e["loads"] for e in entries)
    failed = sum(e["fails"] + e["crashed"] for e in entries)
    parts = [f"{loads} device(s) load"] if loads else []
    if failed:
        parts.append(f"{failed} fail")
    return ", ".join(parts) or "-"


def accuracy_brief(rows: Rows, artifact_id: int) -> dict[str, Any] | None:
    """The newest accuracy figure of an artifact, for resolve's answer (plain SQL: the CLI's fast
    path imports no SQLAlchemy): ``{"runtime", "status", "min_psnr_db", "worst_output"}``."""
    hit = rows.rows("SELECT runtime_backend, runtime_version, status, min_psnr_db, worst_output FROM accuracy_results"
                    " WHERE artifact_id = :a ORDER BY recorded_at DESC, id DESC LIMIT 1", {"a": artifact_id})
    if not hit:
        return None
    backend, version, status, psnr, worst = hit[0]
    return {"runtime": f"{backend}:{version}", "status": status,
            "min_psnr_db": None if psnr is None else float(psnr), "worst_output": worst}
