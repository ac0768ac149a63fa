"""Device resolve: ``GET /v1/resolve`` (read), the artifact a device should load."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, NamedTuple

from fastapi import APIRouter, Header, Query, Request, Response
from starlette.routing import Route

from farm.api.answers import Answer, AnswerCache, etag_of, none_match
from farm.api.deps import NO_BODY, read
from farm.api.loopconn import LoopConnection
from farm.core import errors as E
from farm.pipeline import plan
from registry.index import Registry

router = APIRouter(tags=["read"])


@router.get("/v1/resolve", dependencies=[read], response_class=Response,
            responses={200: {"description": "the artifact to load; ETag names what to install",
                             "content": {"application/json": {"schema": {"type": "object"}}}},
                       304: {"description": "If-None-Match matched: nothing new to install"}})
async def resolve(request: Request, model: Annotated[str, Query(max_length=300)],
                  soc: Annotated[str | None, Query(max_length=64)] = None,
                  qnn: Annotated[str | None, Query(max_length=64)] = None,
                  gpu: Annotated[str | None, Query(max_length=64)] = None,
                  trt: Annotated[str | None, Query(max_length=64)] = None,
                  platform: Annotated[str, Query(max_length=64)] = "linux-x86-64",
                  manifest: bool = True,
                  if_none_match: Annotated[str | None, Header(max_length=4096)] = None) -> Response:
    """The artifact this device should load: manifest, signatures, where to get each file.
    ``manifest=false`` leaves the manifest out (a device that fetches and verifies the
    manifest blob itself saves the service a store read). The answer's weak ``ETag`` changes
    exactly when what the device should install changes (the artifact or its signatures); a poll
    with ``If-None-Match`` (a tag it holds, or ``*``) gets ``304`` while it has not. (Served by
    ``fast_route``, which ``include`` puts first; this one documents it in the OpenAPI schema.)"""
    return await _respond(request, _Question(model, soc, qnn, gpu, trt, platform, manifest), if_none_match)


class _Question(NamedTuple):
    model: str
    soc: str | None
    qnn: str | None
    gpu: str | None
    trt: str | None
    platform: str
    manifest: bool


# The route's declared limits (above), checked by hand on the fast route: the same 400 ``usage``.
_LIMITS = (("model", 300), ("soc", 64), ("qnn", 64), ("gpu", 64), ("trt", 64), ("platform", 64))
# What pydantic reads as a boolean from a query string (lax mode).
_BOOLS = {"0": False, "off": False, "f": False, "false": False, "n": False, "no": False,
          "1": True, "on": True, "t": True, "true": True, "y": True, "yes": True}


def _invalid(where: str, what: str) -> E.UsageError:
    return E.UsageError(f"{where}: {what}"[:300], hint="see /openapi.json")


def _question(request: Request) -> tuple[_Question, str | None]:
    """The query and If-None-Match as the documented route declares them: each within its
    length, ``model`` required, ``manifest`` a boolean (the last of a repeated parameter counts,
    unknown ones are ignored, as FastAPI does)."""
    q = request.query_params
    got: dict[str, str | None] = {}
    for name, limit in _LIMITS:
        value = q.get(name)
        if value is not None and len(value) > limit:
            raise _invalid(f"query.{name}", f"String should have at most {limit} characters")
        got[name] = value
    if got["model"] is None:
        raise _invalid("query.model", "Field required")
    raw_manifest = q.get("manifest")
    manifest = True if raw_manifest is None else _BOOLS.get(raw_manifest.strip().lower())
    if manifest is None:
        raise _invalid("query.manifest", "Input should be a valid boolean, unable to interpret input")
    inm = request.headers.get("if-none-match")
    if inm is not None and len(inm) > 4096:
        raise _invalid("header.if-none-match", "String should have at most 4096 characters")
    return _Question(got["model"] or "", got["soc"], got["qnn"], got["gpu"], got["trt"],
                     got["platform"] if got["platform"] is not None else "linux-x86-64", manifest), inm


async def _fast_get(request: Request) -> Response:
    """``GET /v1/resolve`` as a plain Starlette route: the same checks and answer as the documented
    one, without FastAPI's dependency solving and its walk over every router (a device's hottest
    read). ``RouteGuard`` checks its read token and that no body comes (the route's ``needed`` and
    ``body_limit``); the answer is computed on this module's own threads."""
    question, inm = _question(request)
    return await _respond(request, question, inm)


async def _respond(request: Request, question: _Question, if_none_match: str | None) -> Response:
    metrics = request.app.state.metrics
    started = time.perf_counter()
    try:
        answer = await _kept(request, question)
        if answer is None:
            answer = await asyncio.wrap_future(_pool().submit(_answer, request, request.app.state.registry,
                                                              *question))
        answer.raise_miss()
        headers = {"ETag": answer.etag, "Cache-Control": "no-cache"}
        if none_match(if_none_match, answer.etag):
            return Response(status_code=304, headers=headers)
        return Response(answer.body, media_type="application/json", headers=headers)
    finally:
        metrics.resolve_seconds.observe(time.perf_counter() - started)


# Resolve's own threads: its reads wait on the database there, never on the event loop. As many as
# the reader's pool holds connections (``_reader``), so none waits for a connection.
RESOLVE_THREADS = 8
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(RESOLVE_THREADS, thread_name_prefix="resolve")
    return _POOL


fast_route = Route("/v1/resolve", _fast_get, methods=["GET"])
fast_route.needed = "read"  # type: ignore[attr-defined]  # RouteGuard: a read token ...
fast_route.body_limit = lambda _request: NO_BODY  # type: ignore[attr-defined]  # ... and no body


def include(app: Any) -> None:
    """The routes of this module on ``app``: the documented router, and ``fast_route`` first of all
    routes."""
    app.include_router(router)
    app.router.routes.insert(0, fast_route)


def _device(soc: str | None, qnn: str | None, gpu: str | None, trt: str | None, platform: str) -> Any:
    from farm.core.catalog import load_catalog
    from farm.core.names import check_name
    from registry.resolve import Device

    if gpu or trt:
        if not (gpu and trt):
            raise E.UsageError("a GPU device is described by gpu and trt")
        plan.check_versions([trt])
        check_name(platform)
        return Device("trt", load_catalog().get(gpu, backend="trt"), f"{trt}+{platform}")
    if not (soc and qnn):
        raise E.UsageError("a device is described by soc and qnn (or gpu and trt)")
    plan.check_versions([qnn])
    return Device("qnn", load_catalog().get(soc, backend="qnn"), qnn)


def _answers(request: Request) -> AnswerCache:
    cache = getattr(request.app.state, "resolve_answers", None)
    if cache is None:
        cache = request.app.state.resolve_answers = AnswerCache()
    return cache  # type: ignore[no-any-return]


def _reader(request: Request, reg: Registry) -> Any:
    """PostgreSQL: the service's engine of autocommit connections for resolve, without the ping
    each checkout of the main pool sends: a poll answered from the cache is one round trip (the
    generation read), a fresh answer one per statement. None on SQLite (local, no round trips)."""
    return _reader_of(request.app.state, reg)


def _reader_of(state: Any, reg: Registry) -> Any:
    reader = getattr(state, "resolve_reader", None)
    if reader is None and reg.db.engine.dialect.name == "postgresql":
        from sqlalchemy import create_engine

        with _READER_LOCK:
            reader = getattr(state, "resolve_reader", None)
            if reader is None:
                reader = state.resolve_reader = create_engine(
                    reg.db.engine.url, isolation_level="AUTOCOMMIT", pool_pre_ping=False, pool_size=RESOLVE_THREADS,
                    max_overflow=RESOLVE_THREADS)
    return reader


_READER_LOCK = threading.Lock()
# What a resolve answer reads: each warmed connection has planned a read of every one.
_TABLES = ("tags", "models", "model_generations", "artifacts", "artifact_targets", "artifact_files", "signatures",
           "compat_verdicts", "builds", "device_reports", "workers", "device_verifications", "devices")


def warm(state: Any, reg: Registry) -> None:
    """PostgreSQL, at start: resolve's threads started and each given a connection of its own
    that has planned a read of every table an answer reads. Opened lazily instead, a connection
    (a server process forked, its catalog caches filled) was opened by whichever request first
    found every other one busy: 20-35 ms in that request, the p99 of a fresh service's first
    minutes. Any failure here is logged; requests open what they need as before."""
    import logging

    reader = _reader_of(state, reg)
    if reader is None:
        return
    gate = threading.Barrier(RESOLVE_THREADS)

    def one() -> None:
        with reader.connect() as conn:
            rows = DriverRows(conn)
            for table in _TABLES:
                rows.rows(f"SELECT 1 FROM {table} WHERE false")
            gate.wait(timeout=30)  # all held at once: as many connections as threads

    try:
        for f in [_pool().submit(one) for _ in range(RESOLVE_THREADS)]:
            f.result(timeout=60)
    except Exception as exc:  # noqa: BLE001 - a database slow to answer is no reason not to start
        gate.abort()
        logging.getLogger("ctxfarm.api").warning("resolve connections not warmed up at start: %s", exc)


class DriverRows:
    """``Rows`` on the driver's own connection (psycopg, autocommit) under a pooled SQLAlchemy
    connection: each statement goes straight to the driver, without SQLAlchemy's per-statement
    execution context (about a quarter of a millisecond of CPU each, measured), and psycopg
    prepares the statements a process repeats. A driver error becomes SQLAlchemy's, so the
    pool's handling (a dead connection invalidated) stays as it is."""

    dialect = "postgresql"

    def __init__(self, conn: Any):
        self.conn = conn
        self.driver = conn.connection.driver_connection

    def rows(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        from registry.lite import pyformat

        try:
            with self.driver.cursor() as cur:
                cur.execute(pyformat(sql), dict(params or {}))
                return list(cur.fetchall()) if cur.description is not None else []
        except Exception as exc:
            _raise_as_sqlalchemy(self.conn, exc, sql, params)
            raise


def _raise_as_sqlalchemy(conn: Any, exc: Exception, sql: str, params: Any) -> None:
    """A driver error as SQLAlchemy's DBAPIError, the connection invalidated when it is dead."""
    from sqlalchemy.exc import DBAPIError

    dbapi = conn.dialect.loaded_dbapi
    if not isinstance(exc, dbapi.Error):
        return
    dead = conn.dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)
    if dead:
        conn.invalidate(exc)
    raise DBAPIError.instance(sql, params, exc, dbapi.Error, connection_invalidated=dead,
                              dialect=conn.dialect) from exc


def _on_reader(reader: Any, work: Any) -> Any:
    """``work(rows)`` on a reader connection; once more on a fresh one if the first was dead (the
    server restarted: no ping found it out). A dead one drops every pooled connection (as
    SQLAlchemy does on a disconnect): they were opened together at start and went together."""
    from sqlalchemy.exc import DBAPIError

    for attempt in (0, 1):
        try:
            with reader.connect() as conn:
                return work(DriverRows(conn))
        except DBAPIError as exc:
            if attempt or not exc.connection_invalidated:
                raise
            reader.dispose(close=False)  # a new pool; the old one's connections are let go
    raise AssertionError("unreachable")


def _answer(request: Request, reg: Registry, model: str, soc: str | None, qnn: str | None, gpu: str | None,
            trt: str | None, platform: str, with_manifest: bool) -> Answer:
    """The cached answer while the model's (digest, generation) holds, else a fresh one (kept)."""
    from registry.index import resolve_model_ref
    from registry.lite import SessionRows
    from registry.reads import model_generation

    device = _device(soc, qnn, gpu, trt, platform)
    base = str(request.base_url).rstrip("/")
    key = _key(base, model, device, with_manifest)
    cache = _answers(request)
    fail_devices = request.app.state.settings.report_fail_devices
    prefer_fastest = request.app.state.settings.resolve_prefer_fastest

    def work(rows: Any) -> Answer | None:
        found = model_generation(rows, model)
        if found is None:
            return None
        digest, generation = found
        hit = cache.get(key, digest, generation)
        if hit is None:
            try:
                hit = _fresh(reg, rows, base, model, digest, generation, device, with_manifest, fail_devices, prefer_fastest)
            except E.NoMatchError as exc:
                cache.miss(key, digest, generation, exc)
                raise
            cache.put(key, hit)
        return hit

    reader = _reader(request, reg)
    if reader is not None:
        hit = _on_reader(reader, work)
    else:
        with reg.db.session() as s:
            hit = work(SessionRows(s))
    if hit is None:
        # Names nothing: resolve_model_ref explains the miss (bad name, unknown tag, the tags there
        # are); should it find a model after all (it was just recorded), answer without keeping it.
        with reg.db.session() as s:
            digest = resolve_model_ref(s, model)
            hit = _fresh(reg, SessionRows(s), base, model, digest, -1, device, with_manifest, fail_devices, prefer_fastest)
    hit.raise_miss()
    return hit


def _key(base: str, model: str, device: Any, with_manifest: bool) -> tuple[Any, ...]:
    return (base, model, device.backend, device.target.name, device.runtime, with_manifest)


async def _kept(request: Request, question: _Question) -> Answer | None:
    """A kept answer whose model generation still holds, its generation read on the event loop
    (``LoopReader``, PostgreSQL): a device's repeated question (a poll) goes to no thread. Any
    other case, or any failure here, is None: the question goes to resolve's threads, which
    answer it, or explain why not, as always."""
    loop_reader = getattr(request.app.state, "resolve_loop_reader", None)
    cache = getattr(request.app.state, "resolve_answers", None)
    if loop_reader is None or cache is None:
        return None
    try:
        device = _device(question.soc, question.qnn, question.gpu, question.trt, question.platform)
    except E.FarmError:
        return None
    key = _key(str(request.base_url).rstrip("/"), question.model, device, question.manifest)
    if not cache.holds(key):
        return None  # first asked: no generation read here, the threads read it with the answer
    found = await loop_reader.generation(question.model)
    return cache.get(key, *found) if found is not None else None


class LoopReader(LoopConnection):
    """The generation read of ``_kept`` on the event loop: one psycopg ``AsyncConnection``
    (autocommit) of the loop that opened it (a later loop opens its own), the same statements as
    ``registry.reads.model_generation``. A cached answer then costs no thread hop and no GIL
    hand-off: under load (reports arriving) each hop waited up to the interpreter's 5 ms switch
    interval. Any error closes the connection (the next read opens another) and answers None."""

    def __init__(self, url: Any):
        super().__init__(url.set(drivername="postgresql").render_as_string(hide_password=False))

    async def generation(self, ref: str) -> tuple[str, int] | None:
        from registry.lite import pyformat
        from registry.reads import generation_hit, generation_statements

        try:
            conn = await self._connection()
            for sql, params, unique in generation_statements(ref):
                cur = await conn.execute(pyformat(sql), params)
                found = generation_hit(await cur.fetchall(), unique)
                if found is not None:
                    return found
        except Exception:  # noqa: BLE001 - the threads answer instead, and say what is wrong
            await self.close()
        return None

    async def open(self) -> None:
        """Its connection opened now (at start), not by a device's first poll; a failure is left
        to the first read (which answers None and the threads answer)."""
        try:
            await self._connection()
        except Exception:  # noqa: BLE001
            await self.close()


def _fresh(reg: Registry, rows: Any, base: str, model: str, digest: str, generation: int, device: Any,
           with_manifest: bool, fail_devices: int, prefer_fastest: bool = False) -> Answer:
    from registry.resolve import describe
    from registry.resolve import resolve as resolve_artifact

    # Plain SQL, no ORM objects (registry.reads): candidates, device reports, the winner's files and signatures.
    artifact, verdict = resolve_artifact(rows, digest, device, model_label=model, fail_devices=fail_devices,
                                         prefer_fastest=prefer_fastest)
    files = [{"name": f.name, "digest": f.digest, "size": f.size, "url": f"{base}/v1/blobs/{f.digest}"}
             for f in artifact.files if f.role in ("ctx-model", "context")]
    sigs = artifact.signatures
    manifest_size = next((f.size for f in artifact.files if f.role == "manifest"), 0)
    body = {**describe(artifact, verdict), "model": digest, "ctx_model": artifact.ctx_model,
            "manifest": _manifest(reg, artifact.digest) if with_manifest else None,
            "manifest_url": f"{base}/v1/blobs/{artifact.digest}", "manifest_size": manifest_size,
            "signatures": [{"public_key": p, "signature": g} for p, g in sigs],
            "files": files}
    return Answer(digest, generation, json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(),
                  etag_of(artifact.digest, sigs))


_MANIFESTS: OrderedDict[tuple[str, str], bytes] = OrderedDict()
_MANIFESTS_MAX = 4096


def _manifest(reg: Registry, digest: str) -> dict[str, Any]:
    """Manifests are content-addressed, hence immutable: cached by digest once verified."""
    from registry.store.base import read_bytes

    key = (reg.store.url, digest)
    data = _MANIFESTS.get(key)
    if data is None:
        data = read_bytes(reg.store, digest)
        _MANIFESTS[key] = data
        if len(_MANIFESTS) > _MANIFESTS_MAX:
            _MANIFESTS.popitem(last=False)
    return dict(json.loads(data))
