"""Device reports (issue 23): what a device saw when it loaded an artifact, and what the fleet's
reports add up to.

A report is attributed to the token that sent it and the device id it names. One row per
(artifact, token, device, runtime): a device that reports again replaces its row (``count`` goes
up), so one device counts once however often it reports. Aggregates count distinct devices per
artifact x runtime (x SoC) by outcome, with load time p50/p90 and peak memory; revoked reports
(an admin struck a token's, or one report) count for nothing.

What resolve reads (``device_verdicts``): per artifact, for one runtime, how many distinct devices
loaded it and how many failed or crashed. Device evidence beats probes, probes beat the rules; an
artifact that failed on ``fail_devices`` devices of a runtime and loaded on none is not served to it.
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
FIELDS = ("device_id", "device_model", "soc", "os", "runtime_backend", "runtime_version", "ort_version", "ep_package",
          "ep_version", "driver", "outcome", "error", "load_ms", "first_inference_ms", "peak_memory_mb",
          "fingerprint", "psnr_db", "reported_at")


@dataclass(frozen=True)
class DeviceEvidence:
    """What devices said about one artifact under one runtime version."""

    loads: int = 0  # distinct devices
    fails: int = 0  # distinct devices that failed or crashed
    last_error: str | None = None
    last_at: datetime | None = None


def artifact_ref(rows: Rows, digest: str) -> tuple[int, str, str] | None:
    """(id, backend, target) of an artifact by its manifest digest."""
    hit = rows.rows("SELECT id, backend, target FROM artifacts WHERE digest = :d", {"d": digest})
    return (int(hit[0][0]), str(hit[0][1]), str(hit[0][2])) if hit else None


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
    key within the batch collapse to the last one (``count`` adds up). Plain SQL on the session's
    connection (the same text on PostgreSQL and SQLite): the ORM's bulk path cost more CPU than
    the database did (1.4 ms a report in batches of 8, measured)."""
    from registry.lite import pyformat

    now = datetime.now(UTC)
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    keys = []
    for artifact_id, token_id, fields in reports:
        values = {k: fields.get(k) for k in FIELDS}
        values.update(artifact_id=artifact_id, token_id=token_id, received_at=now, revoked_at=None)
        key = tuple(values[k] for k in KEY)
        keys.append(key)
        values["count"] = rows[key]["count"] + 1 if key in rows else 1
        rows[key] = values
    dialect = s.get_bind().dialect.name
    params: dict[str, Any] = {}
    groups = []
    for i, row in enumerate(rows.values()):
        names = []
        for c in _COLUMNS:
            v = row[c]
            if dialect == "sqlite" and isinstance(v, datetime):
                v = v.astimezone(UTC).replace(tzinfo=None).isoformat(" ")  # as SQLAlchemy stores them
            params[f"p{i}_{c}"] = v
            names.append(f":p{i}_{c}")
        groups.append("(" + ", ".join(names) + ")")
    sql = (f"INSERT INTO device_reports ({', '.join(_COLUMNS)}) VALUES {', '.join(groups)}"
           f" ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET "
           + ", ".join(f"{c} = excluded.{c}" for c in (*FIELDS, "received_at"))
           + ", count = device_reports.count + excluded.count, revoked_at = NULL"
           f" RETURNING id, {', '.join(KEY)}")
    if dialect == "postgresql":
        sql = pyformat(sql)
    ids = {tuple(r[1:]): int(r[0]) for r in s.connection().exec_driver_sql(sql, params).fetchall()}
    return [ids[k] for k in keys]


_COLUMNS = (*FIELDS, "artifact_id", "token_id", "received_at", "revoked_at", "count")


class ReportWriter:
    """Writes reports in batches from one thread: every report that arrives while a batch is
    being written goes into the next one (one statement, one commit), so a burst of devices
    costs a few transactions, not one each. On PostgreSQL the commit does not wait for the WAL
    flush (``synchronous_commit = off``): a report is telemetry, and a crash of the database
    server loses at most the last moments of them, never the index's consistency."""

    def __init__(self, db: Any, max_batch: int = 500, linger: float = 0.02):
        import queue
        import threading

        # ``linger``: how long a batch waits for more reports once one arrived. Fewer, larger
        # transactions cost less CPU per report and bump the model's resolve generation (the
        # coverage triggers) less often: cached resolve answers live longer while reports arrive.
        self.db, self.max_batch, self.linger = db, max_batch, linger
        self.queue: queue.SimpleQueue[tuple[int, int, dict[str, Any], Any]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="report-writer", daemon=True)
        self.thread.start()

    def submit(self, artifact_id: int, token_id: int, fields: dict[str, Any]) -> Any:
        """A ``concurrent.futures.Future`` of the report's row id."""
        from concurrent.futures import Future

        fut: Future[int] = Future()
        self.queue.put((artifact_id, token_id, fields, fut))
        return fut

    def _run(self) -> None:
        import queue
        import time

        while True:
            batch = [self.queue.get()]
            deadline = time.monotonic() + self.linger
            while len(batch) < self.max_batch:
                left = deadline - time.monotonic()
                try:
                    batch.append(self.queue.get(timeout=left) if left > 0 else self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                ids = self._write([(a, t, f) for a, t, f, _ in batch])
            except Exception:  # a bad row must not fail its neighbours: one by one
                for a, t, f, fut in batch:
                    try:
                        fut.set_result(self._write([(a, t, f)])[0])
                    except Exception as exc:  # noqa: BLE001 - handed to the waiting request
                        fut.set_exception(exc)
                continue
            for (_a, _t, _f, fut), report_id in zip(batch, ids, strict=True):
                fut.set_result(report_id)

    def _write(self, reports: list[tuple[int, int, dict[str, Any]]]) -> list[int]:
        with self.db.session() as s:
            if s.get_bind().dialect.name == "postgresql":
                from sqlalchemy import text

                s.execute(text("SET LOCAL synchronous_commit = off"))
            return record_many(s, reports)


def revoke(s: Any, *, token_name: str | None = None, report_id: int | None = None) -> int:
    """Strike a token's reports (all of them) or one report; returns how many were struck."""
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
    n = s.execute(q.values(revoked_at=datetime.now(UTC)).execution_options(synchronize_session=False)).rowcount
    if report_id is not None and not n:
        raise NotFoundError(f"no active report {report_id}")
    return int(n or 0)


def device_verdicts(rows: Rows, artifact_ids: list[int], backend: str, runtime: str, soc: str
                    ) -> dict[int, DeviceEvidence]:
    """Artifact id -> distinct devices with ``soc`` that loaded it / failed, under exactly this
    runtime (one statement)."""
    if not artifact_ids:
        return {}
    placeholders, params = in_params("a", artifact_ids)
    out: dict[int, dict[str, Any]] = {}
    for artifact_id, outcome, n, last_error, last_at in rows.rows(
            "SELECT artifact_id, outcome, COUNT(*), MAX(error), MAX(received_at) FROM device_reports"
            f" WHERE artifact_id IN ({placeholders}) AND runtime_backend = :backend AND runtime_version = :runtime"
            " AND soc = :soc AND revoked_at IS NULL GROUP BY artifact_id, outcome",
            {**params, "backend": backend, "runtime": runtime, "soc": soc}):
        d = out.setdefault(int(artifact_id), {"loads": 0, "fails": 0, "last_error": None, "last_at": None})
        if outcome == "loads":
            d["loads"] += int(n)
        else:
            d["fails"] += int(n)
            d["last_error"] = d["last_error"] or last_error
        from registry.lite import as_datetime

        at = as_datetime(last_at)
        if at is not None and (d["last_at"] is None or at > d["last_at"]):
            d["last_at"] = at
    return {k: DeviceEvidence(**v) for k, v in out.items()}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))], 3)


def summary(s: Any, artifact_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Artifact id -> one entry per (runtime, SoC): distinct devices by outcome, load time p50/p90,
    first-inference p50, peak memory max, device models, the last error; what `farm show`,
    resolve's answer, the API and the coverage data show."""
    from sqlalchemy import select

    from farm.core.times import iso
    from registry.models import DeviceReport

    out: dict[int, list[dict[str, Any]]] = {}
    if not artifact_ids:
        return out
    groups: dict[tuple[int, str, str, str], list[Any]] = {}
    for r in s.scalars(select(DeviceReport).where(DeviceReport.artifact_id.in_(artifact_ids),
                                                  DeviceReport.revoked_at.is_(None))
                       .order_by(DeviceReport.received_at)):
        groups.setdefault((r.artifact_id, r.runtime_backend, r.runtime_version, r.soc), []).append(r)
    for (artifact_id, backend, version, soc), rs in sorted(groups.items()):
        loads = [r for r in rs if r.outcome == "loads"]
        failed = [r for r in rs if r.outcome in FAILED]
        out.setdefault(artifact_id, []).append({
            "runtime": f"{backend}:{version}", "soc": soc,
            "devices": len(rs), "loads": len(loads), "fails": sum(r.outcome == "fails" for r in rs),
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
