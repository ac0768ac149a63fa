"""The one executor: claim -> compile -> publish -> self-probe, for every transport.

``farm build`` runs ``Executor.execute`` in its own process; a Celery worker runs the same call
in its task. One claim, one failure path, one attempts policy (``farm.pipeline.states``):

- the claim hands out a lease, renewed every lease/3 s by ``LeaseKeeper``; when a renewal finds
  the lease taken over, the compile child is killed and nothing is published;
- the compile reads only the model snapshot stored by digest (fetched once per executor host:
  ``farm.pipeline.bundles``), laid out under fixed names in a fresh temp dir, in a child process
  capped in memory and time that dies with us;
- publication uploads every blob at once (each verified) and then, in one transaction, inserts
  the artifact, the self-probe verdict and the worker's count, and moves the build to
  ``succeeded`` with a guarded UPDATE;
- a deterministic failure (or one at the attempt cap) fails the build, any other is requeued
  with backoff; SIGTERM/SIGINT release the lease at once and the temp dir is removed;
- every transition is announced after its commit (``farm.pipeline.events``): waiters are woken,
  nobody polls; and where the attempt's time went is recorded on the row (``Phases``).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from farm.core.catalog import Target, load_catalog
from farm.core.errors import (
    DETERMINISTIC_FAILURES,
    FarmError,
    Interrupted,
    LeaseLostError,
    StorageError,
)
from farm.core.keys import sha256_bytes, sha256_file
from farm.core.options import check_embed_size
from farm.core.settings import Settings
from farm.pipeline import states
from farm.pipeline.bundles import JOB_PREFIX, BundleCache, download_bundle, open_cache
from farm.pipeline.early import interruptible  # noqa: F401 - the pipeline's callers find it here
from farm.pipeline.events import Publisher
from farm.pipeline.memory import MemoryGate, PeakModel, fit
from farm.pipeline.memory import history as peak_history
from registry.index import Registry
from workers.backends import get_runner
from workers.runner import CompileJob, CompileOutput, Runner, Toolchain

log = logging.getLogger("ctxfarm.pipeline")
PEAKS_TTL_S = 60.0
RENEW_MAX_S = 5.0
# A worker's background publication waits, at most this long, until the worker's next compile has
# started (or it has no next build): see ``Executor._hand_over``.
YIELD_MAX_S = 0.25


def backoff(attempt: int, base: float = 5.0) -> float:
    """Seconds before a build whose attempt ``attempt`` died is run again: ``base``
    (FARM_RETRY_BACKOFF_SECONDS), doubled each attempt, at most 300."""
    return float(min(base * 2 ** max(attempt - 1, 0), 300))


@dataclass(frozen=True)
class Result:
    """What ``execute`` did: ``succeeded``, ``failed``, ``retry`` (requeued; ``countdown`` s),
    ``done`` (already final), ``busy`` (another executor holds it), ``exhausted`` (attempt cap:
    failed/worker-lost), ``lost`` (our lease was taken over; we changed nothing) or
    ``publishing`` (compiled; publication goes on in the background, ``execute``'s ``then``)."""

    outcome: str
    build_id: int
    countdown: float = 0.0
    artifact_id: int | None = None


@dataclass(frozen=True)
class BuildRow:
    """What an executor needs of a claimed build (read in the claim's transaction)."""

    backend: str
    target: str
    toolchain: str
    options: dict[str, Any]
    options_digest: str
    build_key: str
    model_digest: str
    files: list[dict[str, Any]]
    enqueued_at: datetime | None = None
    queue: str | None = None


@dataclass
class Phases:
    """Where one attempt's time went, in ms; stored on the build row (``builds.phases``).

    ``queued`` (enqueue to claim, by the database's clocks: it includes waiting behind other
    builds), ``dispatch`` (the part of it this executor could have been running: the broker's
    queue-to-start latency), ``claim``, ``bundle_fetch`` (+ ``bundle_cache``: hit, miss or off),
    ``child_start`` (the compile child's start, imports, EP registration and result I/O: its wall
    time less the compile and the self-probe, with any ``child.*`` detail the runner reports, e.g.
    a warm host's ``child.host_wait``, ``child.fork``, ``child.job`` and the count
    ``child.page_faults``),
    ``ep_compile`` (session creation = the EP's compile), ``self_probe``, ``collect`` (reading the
    context model back), ``hash`` (digests and manifest), ``upload`` (all blobs, in parallel;
    ``uploads`` per blob), ``sql`` (the publishing transaction up to its final UPDATE), ``total``
    (claim to that UPDATE; the commit itself is not in it) and ``outside_compile`` (total less
    ``ep_compile``). A worker publishing in the background adds ``critical`` (claim to the
    hand-over: what its compile slot spent) and ``publish_wait`` (waiting for the publication
    before it, on the critical path too). A build that adopted an early compile (farm.pipeline.early)
    has no ``bundle_fetch`` and adds ``early_ahead`` (from the compile's start to its adoption) and
    ``early_wait`` (what was left of it then): its ``ep_compile`` may exceed ``total``."""

    started: float = field(default_factory=time.perf_counter)
    ms: dict[str, Any] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.ms[name] = _ms(time.perf_counter() - t)

    def compile(self, out: CompileOutput, call_seconds: float) -> None:
        """Split the runner's call into what the child and the parent spent."""
        ep = out.compile_seconds
        probe = float((out.self_load or {}).get("load_seconds") or 0.0)
        self.ms["ep_compile"] = _ms(ep)
        self.ms["self_probe"] = _ms(probe)
        self.ms["child_start"] = _ms(max(out.wall_seconds - ep - probe, 0.0))
        detail = getattr(out, "timings", None) or {}  # finer timings, where the runner has them
        # Waiting for a warm host (busy, or being started) comes before the child's wall.
        waited = float(detail.get("host_wait_seconds") or 0.0)
        self.ms["collect"] = _ms(max(call_seconds - out.wall_seconds - waited, 0.0))
        for k, v in detail.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                # ``*_seconds`` in ms; anything else is a count (``page_faults``: minor faults
                # during the EP compile, what a warm standby saves).
                self.ms[f"child.{k.removesuffix('_seconds')}"] = _ms(float(v)) if k.endswith("_seconds") else int(v)

    def final(self) -> dict[str, Any]:
        self.ms["total"] = _ms(time.perf_counter() - self.started)
        if "ep_compile" in self.ms:
            self.ms["outside_compile"] = round(self.ms["total"] - self.ms["ep_compile"], 1)
        return dict(self.ms)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


class LeaseKeeper:
    """Renews the lease every lease/3 s; ``lost`` is set when a renewal finds it taken over."""

    def __init__(self, registry: Registry, lease: states.Lease, lease_seconds: float):
        self.registry, self.lease, self.lease_seconds = registry, lease, lease_seconds
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{lease.build_id}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def interval(self) -> float:
        """A third of the lease, at most RENEW_MAX_S: a cancelled build (states.cancel) stops within
        seconds however long the lease."""
        return max(min(self.lease_seconds / 3, RENEW_MAX_S), 0.2)

    def _run(self) -> None:
        interval = self.interval
        while not self._stop.wait(interval):
            try:
                with self.registry.db.session() as s:
                    ok = states.renew(s, self.lease, self.lease_seconds)
            except Exception:  # the DB blipping must not kill the compile; the next renewal retries
                log.warning("lease renewal for build %s failed", self.lease.build_id, exc_info=True)
                continue
            if not ok:
                log.warning("build %s: lease of attempt %s was taken over; stopping", self.lease.build_id,
                            self.lease.attempt)
                self.lost.set()
                return

    def check(self) -> None:
        if self.lost.is_set():
            raise LeaseLostError(f"build {self.lease.build_id}: lease lost during the compile")


def fetch_bundle(registry: Registry, files: list[dict[str, Any]], dest: Path, *, cache: BundleCache | None = None,
                 model_digest: str | None = None) -> tuple[Path, str]:
    """Lay the stored model snapshot out in ``dest`` (each file verified by digest) under its
    canonical names; returns (the .onnx path, ``hit`` | ``miss`` | ``off``). Every name was
    validated when the model was recorded, and is checked again here: a tampered row can't
    write outside ``dest``. With a cache the bundle comes from the store once per digest."""
    if cache is None or model_digest is None:
        return download_bundle(registry.store, files, dest), "off"
    path, hit = cache.fetch(registry.store, model_digest, files, dest)
    return path, "hit" if hit else "miss"


UPLOAD_THREADS = 4


def upload_blobs(store: Any, blobs: list[tuple[str, Path | bytes, str]]) -> dict[str, float]:
    """Upload (name, file or bytes, digest) blobs concurrently, each verified against its digest
    by the store; returns ms per name. Every upload has finished (or failed) when this returns;
    any failure raises (StorageError for an OSError) and nothing may be indexed."""
    from registry.store.base import put_bytes, put_file

    def one(name: str, source: Path | bytes, digest: str) -> float:
        t = time.perf_counter()
        if isinstance(source, bytes):
            put_bytes(store, source, expected=digest)
        else:
            put_file(store, source, expected=digest)
        return _ms(time.perf_counter() - t)

    if len(blobs) <= 1:
        return {name: one(name, src, d) for name, src, d in blobs}
    times: dict[str, float] = {}
    errors: list[Exception] = []
    pool = ThreadPoolExecutor(max_workers=min(UPLOAD_THREADS, len(blobs)), thread_name_prefix="upload")
    try:
        futures = [(name, pool.submit(one, name, src, d)) for name, src, d in blobs]
        for name, fut in futures:
            try:
                times[name] = fut.result()
            except Exception as exc:  # keep waiting: every upload ends before we answer
                errors.append(exc)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if errors:
        first = errors[0]
        if isinstance(first, OSError):
            raise StorageError(f"publishing the artifact failed: {first}") from None
        raise first
    return times


def publish(registry: Registry, lease: states.Lease, row: BuildRow, target: Target, out: CompileOutput,
            signer: Any = None, *, phases: Phases | None = None, probe_version: str | None = None,
            worker_id: int | None = None) -> tuple[int, str]:
    """Blobs first, all at once (each verified), then one transaction: artifact rows, signature,
    the self-probe verdict (``probe_version``: the toolchain the compile child loaded it under),
    the worker's job count and the guarded running -> succeeded. Returns (artifact id, manifest
    digest). A failed upload raises before any row is written."""
    from registry import manifest as mf
    from registry.index import add_signature, heartbeat, insert_artifact
    from registry.models import CompatVerdict

    ph = phases or Phases()
    try:
        with ph.timed("hash"):
            # Every digest is known before anything is sent (the manifest needs them): then all
            # blobs go at once.
            files: list[dict[str, Any]] = []
            blobs: list[tuple[str, Path | bytes, str]] = []
            for f in out.files:
                digest, size = sha256_file(f.path)
                files.append({"name": f.name, "role": f.role, "digest": digest, "size": size,
                              "mediaType": f.media_type})
                blobs.append((f.name, f.path, digest))
            log_data = out.log.encode("utf-8")
            log_digest = sha256_bytes(log_data)
            log_info = {"digest": log_digest, "size": len(log_data), "mediaType": "text/plain"}
            manifest = mf.make_manifest(
                model_digest=row.model_digest, build_key=row.build_key, backend=row.backend,
                target={"ref": target.ref, "name": target.name, "soc_model": target.soc_model,
                        "htp_arch": target.htp_arch, "compute_capability": target.compute_capability},
                toolchain=out.toolchain.to_dict(), options=row.options, options_digest=row.options_digest,
                ctx_model=out.ctx_model, files=files, epcontext=out.epcontext, placement=out.placement,
                compile_seconds=out.compile_seconds, built_at=datetime.now(UTC).isoformat(timespec="seconds"),
                log=log_info, graphs=out.graphs, description=out.description, compatibility=out.compatibility,
            )
            data, manifest_digest = mf.encode(manifest)
            blobs += [("build.log", log_data, log_digest), ("manifest.json", data, manifest_digest)]
        with ph.timed("upload"):
            ph.ms["uploads"] = upload_blobs(registry.store, blobs)
    except OSError as exc:
        raise StorageError(f"publishing the artifact failed: {exc}") from None
    all_files = [*files, {"name": "build.log", "role": "log", "digest": log_digest, "size": len(log_data),
                          "mediaType": "text/plain; charset=utf-8"}]
    ep_sdk = next((n.get("ep_sdk_version") for n in out.epcontext if n.get("ep_sdk_version")), None)
    t_sql = time.perf_counter()
    with registry.db.session() as s:
        art = insert_artifact(s, lease.build_id, manifest_digest=manifest_digest, manifest_size=len(data),
                              ctx_model=out.ctx_model, files=all_files, ep_sdk_version=ep_sdk,
                              compile_seconds=out.compile_seconds, nodes_ep=out.placement["ep_nodes"],
                              nodes_cpu=out.placement["cpu_nodes"], description=out.description,
                              cpu_op_types=out.placement["cpu_op_types"], compatibility=out.compatibility)
        if signer is not None:
            add_signature(s, manifest_digest, signer.public_b64, signer.sign(manifest_digest))
        if probe_version is not None and not out.unverified:
            # The compile child loaded the fresh context under its own toolchain: evidence. The
            # artifact row is new (a replaced one took its verdicts along), so a plain insert.
            loaded = out.self_load or {"ok": False, "error": "the compile child did not load the context"}
            ok = bool(loaded.get("ok"))
            s.add(CompatVerdict(artifact_id=art.id, runtime_backend=row.backend, runtime_version=probe_version,
                                verdict="loads" if ok else "fails", source="probe",
                                detail=None if ok else str(loaded.get("error"))[:2000]))
        if worker_id:
            heartbeat(s, worker_id, jobs_done_delta=1)
        ph.ms["sql"] = _ms(time.perf_counter() - t_sql)
        # raises LeaseLostError: the inserts roll back too
        states.succeed(s, lease, log=out.log, phases=ph.final())
        return art.id, manifest_digest


def signer_for(settings: Settings) -> Any:
    """The configured manifest signer, or None (FARM_SIGNING_KEY unset)."""
    if not settings.signing_key:
        return None
    from registry.signing import load_signer

    return load_signer(settings.signing_key)


class Executor:
    """Runs builds of one toolchain. One per process (SQL engines must not cross a fork)."""

    def __init__(self, settings: Settings, registry: Registry, runner: Runner | None = None, *,
                 backend: str = "qnn", worker_id: int | None = None, owner: str | None = None,
                 background_publish: bool = False, early: Any = None):
        self.settings = settings
        # Compiles embedded ``farm build`` started before its pipeline (farm.pipeline.early): a
        # claimed build adopts the one that is exactly its own compile instead of starting another.
        self.early = early
        self.registry = registry
        # A worker publishes (uploads, then the one transaction) in the background, while its
        # next build claims and compiles: see ``execute``'s ``then``. One publication at a time.
        self._publisher = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish")
                           if background_publish else None)
        self._pending: Future[None] | None = None
        # Set while no claim and compile start is under way on this executor's thread: the
        # publisher waits for it before it starts (``_hand_over``).
        self._clear = threading.Event()
        self._clear.set()
        self._prefetcher: ThreadPoolExecutor | None = None
        self._prefetching: Future[None] | None = None
        self.runner: Runner = runner or get_runner(backend)
        self.toolchain: Toolchain = self.runner.toolchain()
        self.owner = owner or states.owner_base()
        self.worker_id = worker_id
        self.signer = signer_for(settings)
        self.gpu = os.environ.get("CTXFARM_GPU_TARGET")
        self.bundles: BundleCache | None = open_cache(settings.home, settings.bundle_cache_mb)
        self.events = Publisher(settings.broker_url)
        # Compiles of this process (the embedded pool's threads, a worker's builds) admitted so
        # that their predicted peaks fit the memory this host had free (farm.pipeline.memory).
        self.memory = MemoryGate.for_host()
        self._peaks: dict[tuple[str, str], tuple[float, PeakModel]] = {}
        self._last_end: float | None = None  # when this executor's previous build ended
        # Set by embedded ``farm build`` while it compiles in several threads: SIGTERM/SIGINT reach
        # the main thread only, which sets it; each compile then stops and unwinds as Interrupted.
        self.interrupt: Interruption | None = None
        sweep_job_dirs()

    # -- the one path ----------------------------------------------------------------------------

    def execute(self, build_id: int, *, then: Callable[[Result], None] | None = None) -> Result:
        """Run one build. With ``then`` and background publishing on (a worker), a compiled build
        is handed to the publisher thread and ``Result("publishing")`` comes back at once: the
        caller's next build compiles while this one uploads and commits (its lease still held
        and renewed), and ``then`` gets the final result from that thread. Any other outcome is
        returned here and ``then`` is not called."""
        result = self._settled(build_id, then, None)
        assert result is not None
        return result

    def execute_next(self, queue: str, *, then: Callable[[Result], None] | None = None) -> Result | None:
        """Claim and run the oldest queued build of ``queue`` (``states.next_queued``), or None
        when there is none: a worker that just handed a build over takes its next one from the
        index, without the broker's round trip (~20 ms a build). The build's message
        is still in the broker; it finds the build taken or final and is dropped."""
        return self._settled(None, then, queue)

    def _settled(self, build_id: int | None, then: Callable[[Result], None] | None,
                 queue: str | None) -> Result | None:
        """``_execute``, then: when this executor's previous build ended, and, unless a build
        was handed to the publisher, no publication waits for a compile start any longer."""
        result = None
        try:
            result = self._execute(build_id, then, queue=queue)
            return result
        finally:
            self._last_end = time.perf_counter()
            if result is None or result.outcome != "publishing":
                self._clear.set()

    def warm(self) -> None:
        """Before the first build arrives (a worker starting): a connection of the index's pool
        opened and the statements every build starts with (the genai check, the next build, the
        claim's read) planned. Measured on a fresh worker under six pipelines' uploads: its first
        build's claim came 85-220 ms after the message was queued, the next ones' ~20 ms."""
        from registry.models import Build, Model

        with self.registry.db.session() as s:
            states.part_builds(s, 0)
            states.next_queued(s, "")
            s.get(Build, 0)
            s.get(Model, "")

    def _prefetch_next(self, queue: str | None) -> None:
        """A worker's next build's model snapshot placed in the bundle cache while this build
        compiles (one thread; the cache is safe for concurrent fetchers): the next claim links it
        (a miss cost 10-25 ms on the critical path, measured). Only on a worker (one that
        publishes in the background), whose next build is its queue's oldest."""
        if queue is None or self.bundles is None or self._publisher is None:
            return
        if self._prefetcher is None:
            self._prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        if self._prefetching is not None and not self._prefetching.done():
            return
        bundles, store = self.bundles, self.registry.store

        def run() -> None:
            try:
                with self.registry.db.session() as s:
                    nxt = states.next_queued(s, queue, lock=False)
                    row = _read_row(s, nxt) if nxt is not None else None
                if row is not None:
                    bundles.place(store, row.model_digest, row.files)
            except Exception:  # the claim fetches it (or says why it cannot), as without this
                log.debug("prefetching the next bundle of %s failed", queue, exc_info=True)

        self._prefetching = self._prefetcher.submit(run)

    def idle(self) -> None:
        """The caller takes no further build now: a publication waiting for the next compile's
        start goes ahead."""
        self._clear.set()

    def drain(self, timeout: float | None = None) -> None:
        """Wait for the publication in flight (a worker stopping)."""
        self._clear.set()
        pending = self._pending
        if pending is not None:
            try:
                pending.result(timeout=timeout)
            except Exception:
                log.warning("background publication failed", exc_info=True)

    def _execute(self, build_id: int | None, then: Callable[[Result], None] | None = None, *,
                 queue: str | None = None) -> Result | None:
        """``build_id``, or (None) the next queued build of ``queue``: None if it has none."""
        s_ = self.settings
        ph = Phases()
        idle = None if self._last_end is None else ph.started - self._last_end
        with ph.timed("claim"), self.registry.db.session() as s:
            if build_id is None:
                build_id = states.next_queued(s, queue or "")
                if build_id is None:
                    return None
                ph.ms["taken_from"] = "index"
            c = states.claim(s, build_id, owner=self.owner, lease_seconds=s_.lease_seconds,
                             max_attempts=s_.max_attempts)
            row = _read_row(s, build_id) if c.action == "run" else None
        if c.action == "exhausted":
            self.events.publish(build_id, states.BuildState.FAILED.value)
        if c.lease is None or row is None:
            return Result(c.action, build_id)
        self.events.publish(build_id, states.BuildState.RUNNING.value)
        enqueued = states.aware(row.enqueued_at)
        if enqueued is not None:
            queued = max((states.now() - enqueued).total_seconds(), 0.0)
            ph.ms["queued"] = _ms(queued)
            ph.ms["dispatch"] = _ms(queued if idle is None else min(queued, idle))
        lease = c.lease
        try:
            return self._run(lease, row, ph, then)
        except BaseException as exc:
            # Ctrl-C, SIGTERM (Interrupted), SystemExit: give the build back at once.
            reason = f"signal {exc.signum}" if isinstance(exc, Interrupted) else type(exc).__name__
            try:
                with self.registry.db.session() as s:
                    states.release(s, lease, reason)
                self.events.publish(build_id, states.BuildState.QUEUED.value)
            except Exception:
                log.warning("could not release build %s after %s", build_id, reason, exc_info=True)
            raise

    def _run(self, lease: states.Lease, row: BuildRow, ph: Phases,
             then: Callable[[Result], None] | None = None) -> Result:
        s_ = self.settings
        try:
            self._check_route(row)
            target = load_catalog().get(row.target, backend=row.backend)
            # Refusals on declared sizes, before a byte is fetched or a compile started.
            model_bytes = sum(int(f.get("size") or 0) for f in row.files)
            check_embed_size(row.options, model_bytes)
            peaks = self._peak_model(row.backend, row.toolchain)
            need_mb = peaks.predict_mb(model_bytes)
            what = f"build {lease.build_id} ({model_bytes / 2**30:.2f} GiB model)"
            self.memory.check(need_mb, what)
            ph.ms["predicted_peak_mb"] = need_mb
            cap_mb = peaks.cap_mb(model_bytes, s_.compile_memory_mb) if s_.compile_memory_auto else s_.compile_memory_mb
            with ExitStack() as stack:
                keeper = stack.enter_context(LeaseKeeper(self.registry, lease, s_.lease_seconds))
                cancel = keeper.lost if self.interrupt is None else _Either(keeper.lost, self.interrupt)
                # The same compile, started before the claim: its copy of the model was hashed as
                # it was written and equals this row's snapshot (checked by ``take``), so fetching
                # the snapshot again would lay out the same bytes.
                early = (self.early.take(row.build_key, row.files, memory_mb=cap_mb, timeout=s_.compile_timeout,
                                         verify_load=True) if self.early is not None else None)
                if early is None:
                    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{JOB_PREFIX}{os.getpid()}-"))
                    with ph.timed("bundle_fetch"):
                        model_path, ph.ms["bundle_cache"] = fetch_bundle(
                            self.registry, row.files, Path(tmp) / "model", cache=self.bundles,
                            model_digest=row.model_digest)
                    job = CompileJob(model_path, target, row.options, s_.compile_timeout, cap_mb,
                                     verify_load=True, cancel=cancel)
                else:
                    stack.callback(early.remove)
                waited = time.perf_counter()
                with self.memory.admit(need_mb, what, stop=cancel):
                    t = time.perf_counter()
                    if t - waited >= 0.001:
                        ph.ms["memory_wait"] = _ms(t - waited)
                    self._clear.set()  # the publication before this build goes on beside the compile
                    self._prefetch_next(row.queue)
                    if early is None:
                        out = self.runner.compile(job, Path(tmp) / "work")
                    else:
                        # Started this long before it was adopted; the wait is what remained of it.
                        ph.ms["early_ahead"] = _ms(t - early.started)
                        out = early.result(cancel)
                        ph.ms["early_wait"] = _ms(time.perf_counter() - t)
                ph.compile(out, time.perf_counter() - t if early is None else early.call_seconds)
                keeper.check()
                if then is not None and self._publisher is not None:
                    # The lease keeper and the job dir go with the publication; this thread is free.
                    self._hand_over(stack.pop_all(), lease, row, target, out, ph, then)
                    return Result("publishing", lease.build_id)
                return self._publish(lease, row, target, out, ph)
        except LeaseLostError:
            if self.interrupt is not None and self.interrupt.is_set():
                raise Interrupted(self.interrupt.signum) from None  # execute() releases the lease
            log.warning("build %s attempt %s: lease lost; nothing published", lease.build_id, lease.attempt)
            return Result("lost", lease.build_id)
        except FarmError as exc:
            return self._failed(lease, exc.code if not isinstance(exc, StorageError) else "storage-error",
                                exc.message, exc.details.get("log"), ph)
        except Exception as exc:  # a bug or an unexpected library error: bounded retries, then failed
            log.error("build %s: unexpected error", lease.build_id, exc_info=True)
            return self._failed(lease, "toolchain-error", f"unexpected {type(exc).__name__}: {exc}",
                                traceback.format_exc()[-8000:], ph)

    def _peak_model(self, backend: str, toolchain: str) -> PeakModel:
        """This toolchain's peak line, fitted on its recorded builds (read again after a minute)."""
        key = (backend, toolchain)
        cached = self._peaks.get(key)
        if cached is not None and time.monotonic() - cached[0] < PEAKS_TTL_S:
            return cached[1]
        try:
            with self.registry.db.session() as s:
                model = fit(peak_history(s, backend, toolchain))
        except Exception:  # planning must not fail a build: the defaults are measured facts
            log.warning("could not read the recorded compile peaks", exc_info=True)
            model = PeakModel()
        self._peaks[key] = (time.monotonic(), model)
        return model

    def _publish(self, lease: states.Lease, row: BuildRow, target: Target, out: CompileOutput,
                 ph: Phases) -> Result:
        """Publication and its failure path (the same inline and in the background)."""
        try:
            artifact_id, digest = publish(self.registry, lease, row, target, out, self.signer, phases=ph,
                                          probe_version=self.toolchain.version, worker_id=self.worker_id)
        except LeaseLostError:
            log.warning("build %s attempt %s: lease lost; nothing published", lease.build_id, lease.attempt)
            return Result("lost", lease.build_id)
        except FarmError as exc:
            return self._failed(lease, exc.code if not isinstance(exc, StorageError) else "storage-error",
                                exc.message, exc.details.get("log"), ph)
        except Exception as exc:
            log.error("build %s: unexpected error while publishing", lease.build_id, exc_info=True)
            return self._failed(lease, "storage-error", f"unexpected {type(exc).__name__}: {exc}",
                                traceback.format_exc()[-8000:], ph)
        self.events.publish(lease.build_id, states.BuildState.SUCCEEDED.value)
        log.info("build %s published %s (%s)", lease.build_id, digest,
                 ", ".join(f"{k} {v}" for k, v in ph.ms.items() if isinstance(v, int | float)))
        return Result("succeeded", lease.build_id, artifact_id=artifact_id)

    def _hand_over(self, owned: ExitStack, lease: states.Lease, row: BuildRow, target: Target,
                   out: CompileOutput, ph: Phases, then: Callable[[Result], None]) -> None:
        """Queue the publication on the publisher thread, after the one before it (at most one
        compiled build waits: its wait, if any, is recorded as ``publish_wait``).

        The publication starts once this thread has started its next compile, or has none to
        start (``execute_next`` found no build, ``idle``), at most ``YIELD_MAX_S`` later: hashing
        and uploading in the same interpreter as the next build's claim, bundle fetch and job
        start holds the GIL against them (measured, six pipelines to one worker: 25-35 ms from a
        build's end to the next one's claim with both at once), and that time is on every
        build's critical path, while the publication has the whole next compile to run in
        (``publish_yield``: how long it waited)."""
        assert self._publisher is not None
        ph.ms["critical"] = _ms(time.perf_counter() - ph.started)
        if self._pending is not None and not self._pending.done():
            with ph.timed("publish_wait"):
                self.drain()
        self._clear.clear()

        def run() -> None:
            with ph.timed("publish_yield"):
                self._clear.wait(YIELD_MAX_S)
            try:
                with owned:  # the lease keeper stops and the job dir goes when this ends
                    result = self._publish(lease, row, target, out, ph)
            except BaseException:
                log.error("build %s: background publication failed", lease.build_id, exc_info=True)
                return  # the lease lapses and the reconciler sends the build again
            try:
                then(result)
            except Exception:
                log.error("build %s: after publication", lease.build_id, exc_info=True)

        self._pending = self._publisher.submit(run)

    def _check_route(self, row: BuildRow) -> None:
        tc = self.toolchain
        if (row.backend, row.toolchain) != (tc.backend, tc.version):
            raise _Misrouted(f"misrouted: this executor serves {tc.backend} {tc.version}, the build needs "
                             f"{row.backend} {row.toolchain}")
        if row.backend == "trt" and self.gpu:
            from workers.backends import trt_serves

            if not trt_serves(self.gpu, row.target, row.options):
                raise _Misrouted(f"misrouted: this worker's GPU is {self.gpu}, the build is for {row.target}")

    def _failed(self, lease: states.Lease, code: str, message: str, text: str | None,
                ph: Phases | None = None) -> Result:
        s_ = self.settings
        phases = ph.final() if ph is not None else None
        with self.registry.db.session() as s:
            if code in DETERMINISTIC_FAILURES or code == "no-worker" or lease.attempt >= s_.max_attempts:
                ok = states.fail(s, lease, code, message, text, phases)
                result = Result("failed" if ok else "lost", lease.build_id)
            else:
                delay = backoff(lease.attempt, s_.retry_backoff_seconds)
                ok = states.requeue(s, lease, code, message, text, delay=delay, phases=phases)
                result = Result("retry" if ok else "lost", lease.build_id, countdown=delay)
        if ok:
            self.events.publish(lease.build_id, states.BuildState.FAILED.value if result.outcome == "failed"
                                else states.BuildState.QUEUED.value)
        return result

    # -- probes of artifacts other toolchains built --------------------------------------------

    def probe(self, artifact_id: int) -> str | None:
        """Load an artifact under this toolchain and record the verdict as evidence."""
        from sqlalchemy import select
        from sqlalchemy.orm import selectinload

        from registry.index import record_verdict, verdicts_for
        from registry.install import download_artifact
        from registry.models import Artifact

        tc = self.toolchain
        with self.registry.db.session() as s:
            if (artifact_id, tc.version) in verdicts_for(s, [artifact_id], tc.backend):
                return None
            art = s.scalar(select(Artifact).options(selectinload(Artifact.files)).where(Artifact.id == artifact_id))
            if art is None or art.backend != tc.backend or (art.description or {}).get("unverified"):
                return None  # unverified: no runtime here loads it (weight-shared, multi-SoC)
            s.expunge_all()
        target = load_catalog().get(art.target, backend=art.backend)
        with tempfile.TemporaryDirectory(prefix="ctxfarm-probe-") as tmp:
            ctx_model = download_artifact(self.registry.store, art, Path(tmp))
            try:
                loaded = self.runner.load_check(ctx_model, target, timeout=self.settings.compile_timeout)
                verdict = "loads"
                detail = f"loaded; running it failed ({loaded['crashed']})" if loaded.get("crashed") else None
            except FarmError as exc:
                verdict, detail = "fails", exc.message[:2000]
        with self.registry.db.session() as s:
            record_verdict(s, artifact_id, tc.backend, tc.version, verdict, "probe", detail)
        log.info("probe of artifact %s under %s %s: %s", artifact_id, tc.backend, tc.version, verdict)
        return verdict


class Interruption:
    """A signal the main thread received, for builds running in other threads (a CancelFlag)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum = 0

    def set(self, signum: int) -> None:
        self.signum = signum
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


class _Either:
    def __init__(self, *flags: Any):
        self.flags = flags

    def is_set(self) -> bool:
        return any(f.is_set() for f in self.flags)


def sweep_job_dirs(root: Path | None = None) -> list[Path]:
    """Remove job dirs left by executors that were SIGKILLed (they can't clean up): each dir
    names its owner's pid, and only dirs whose owner is gone are removed."""
    import shutil

    removed: list[Path] = []
    base = root or Path(tempfile.gettempdir())
    try:
        entries = list(base.glob(f"{JOB_PREFIX}*-*"))
    except OSError:
        return removed
    for d in entries:
        pid_text = d.name[len(JOB_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit() or not d.is_dir() or d.is_symlink():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # its owner is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, another user's
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


class _Misrouted(FarmError):
    code = "no-worker"


def _read_row(s: Any, build_id: int) -> BuildRow:
    from registry.models import Model

    b = states.get_build(s, build_id)
    model = s.get(Model, b.model_digest)
    return BuildRow(b.backend, b.target, b.toolchain, dict(b.options), b.options_digest, b.build_key,
                    b.model_digest, [dict(f) for f in (model.files if model else [])], b.enqueued_at, b.queue)


def wait_until_final_or_free(registry: Registry, build_id: int, *, poll: float = 0.25,
                             deadline: float | None = None) -> None:
    """Embedded: another process holds this build's lease; wait until it finishes or its lease
    lapses (then our next claim takes it over)."""
    while deadline is None or time.monotonic() < deadline:
        with registry.db.session() as s:
            b = states.get_build(s, build_id)
            if b.state in states.FINAL or b.state == states.BuildState.QUEUED or states.lease_expired(b):
                return
        time.sleep(poll)

