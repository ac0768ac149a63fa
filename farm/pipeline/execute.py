"""The one executor: claim -> compile -> publish -> self-probe, for every transport.

``farm build`` runs ``Executor.execute`` in its own process; a Celery worker runs the same call
in its task. One claim, one failure path, one attempts policy (``farm.pipeline.states``):

- the claim hands out a lease, renewed every lease/3 s by ``LeaseKeeper``; when a renewal finds
  the lease taken over, the compile child is killed and nothing is published;
- the compile reads only the model snapshot stored by digest, laid out under fixed names in a
  fresh temp dir, in a child process capped in memory and time that dies with us;
- publication uploads every blob (each verified) and then, in one transaction, inserts the
  artifact and moves the build to ``succeeded`` with a guarded UPDATE;
- a deterministic failure (or one at the attempt cap) fails the build, any other is requeued
  with backoff; SIGTERM/SIGINT release the lease at once and the temp dir is removed.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
from farm.core.keys import sha256_file
from farm.core.names import UnsafePathError, inside
from farm.core.settings import Settings
from farm.pipeline import states
from registry.index import Registry
from workers.runner import CompileJob, CompileOutput, Runner, Toolchain, get_runner

log = logging.getLogger("ctxfarm.pipeline")


def backoff(attempt: int) -> float:
    return float(min(5 * 2 ** max(attempt - 1, 0), 300))


@dataclass(frozen=True)
class Result:
    """What ``execute`` did: ``succeeded``, ``failed``, ``retry`` (requeued; ``countdown`` s),
    ``done`` (already final), ``busy`` (another executor holds it), ``exhausted`` (attempt cap:
    failed/worker-lost) or ``lost`` (our lease was taken over; we changed nothing)."""

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

    def _run(self) -> None:
        interval = max(self.lease_seconds / 3, 0.2)
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


def fetch_bundle(registry: Registry, files: list[dict[str, Any]], dest: Path) -> Path:
    """Lay the stored model snapshot out in ``dest`` (each blob verified by digest) under its
    canonical names; returns the .onnx path. Every name was validated when the model was
    recorded, and is checked again here: a tampered row can't write outside ``dest``."""
    from registry.store.base import download

    if not files or not all(f.get("stored") for f in files):
        raise StorageError("the model snapshot was never stored",
                           hint="submit the model again (farm build / farm submit store it first)")
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        try:
            path = inside(dest, str(f["path"]))
        except UnsafePathError as exc:
            raise StorageError(f"the stored model snapshot lists an unsafe path: {exc}") from None
        download(registry.store, f["digest"], path, size=int(f["size"]))
    return dest / files[0]["path"]


def publish(registry: Registry, lease: states.Lease, row: BuildRow, target: Target, out: CompileOutput,
            signer: Any = None) -> tuple[int, str]:
    """Blobs first (each verified), then one transaction: artifact rows, signature, and the
    guarded running -> succeeded. Returns (artifact id, manifest digest)."""
    from registry import manifest as mf
    from registry.index import add_signature, insert_artifact
    from registry.store.base import put_bytes, put_file

    try:
        files = []
        for f in out.files:
            digest, size = sha256_file(f.path)
            put_file(registry.store, f.path, expected=digest)
            files.append({"name": f.name, "role": f.role, "digest": digest, "size": size, "mediaType": f.media_type})
        log_info = put_bytes(registry.store, out.log.encode("utf-8"))
        manifest = mf.make_manifest(
            model_digest=row.model_digest, build_key=row.build_key, backend=row.backend,
            target={"ref": target.ref, "name": target.name, "soc_model": target.soc_model,
                    "htp_arch": target.htp_arch, "compute_capability": target.compute_capability},
            toolchain=out.toolchain.to_dict(), options=row.options, options_digest=row.options_digest,
            ctx_model=out.ctx_model, files=files, epcontext=out.epcontext, placement=out.placement,
            compile_seconds=out.compile_seconds, built_at=datetime.now(UTC).isoformat(timespec="seconds"),
            log={"digest": log_info.digest, "size": log_info.size, "mediaType": "text/plain"},
        )
        data, manifest_digest = mf.encode(manifest)
        put_bytes(registry.store, data, expected=manifest_digest)
    except OSError as exc:
        raise StorageError(f"publishing the artifact failed: {exc}") from None
    all_files = [*files, {"name": "build.log", "role": "log", "digest": log_info.digest, "size": log_info.size,
                          "mediaType": "text/plain; charset=utf-8"}]
    ep_sdk = next((n.get("ep_sdk_version") for n in out.epcontext if n.get("ep_sdk_version")), None)
    with registry.db.session() as s:
        art = insert_artifact(s, lease.build_id, manifest_digest=manifest_digest, manifest_size=len(data),
                              ctx_model=out.ctx_model, files=all_files, ep_sdk_version=ep_sdk,
                              compile_seconds=out.compile_seconds, nodes_ep=out.placement["ep_nodes"],
                              nodes_cpu=out.placement["cpu_nodes"])
        if signer is not None:
            add_signature(s, manifest_digest, signer.public_b64, signer.sign(manifest_digest))
        states.succeed(s, lease, log=out.log)  # raises LeaseLostError: the insert rolls back too
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
                 backend: str = "qnn", worker_id: int | None = None, owner: str | None = None):
        self.settings = settings
        self.registry = registry
        self.runner: Runner = runner or get_runner(backend)
        self.toolchain: Toolchain = self.runner.toolchain()
        self.owner = owner or states.owner_base()
        self.worker_id = worker_id
        self.signer = signer_for(settings)
        self.gpu = os.environ.get("CTXFARM_GPU_TARGET")
        sweep_job_dirs()

    # -- the one path ----------------------------------------------------------------------------

    def execute(self, build_id: int) -> Result:
        s_ = self.settings
        with self.registry.db.session() as s:
            c = states.claim(s, build_id, owner=self.owner, lease_seconds=s_.lease_seconds,
                             max_attempts=s_.max_attempts)
            row = _read_row(s, build_id) if c.action == "run" else None
        if c.lease is None or row is None:
            return Result(c.action, build_id)
        lease = c.lease
        try:
            return self._run(lease, row)
        except BaseException as exc:
            # Ctrl-C, SIGTERM (Interrupted), SystemExit: give the build back at once.
            reason = f"signal {exc.signum}" if isinstance(exc, Interrupted) else type(exc).__name__
            try:
                with self.registry.db.session() as s:
                    states.release(s, lease, reason)
            except Exception:
                log.warning("could not release build %s after %s", build_id, reason, exc_info=True)
            raise

    def _run(self, lease: states.Lease, row: BuildRow) -> Result:
        s_ = self.settings
        try:
            self._check_route(row)
            target = load_catalog().get(row.target, backend=row.backend)
            with LeaseKeeper(self.registry, lease, s_.lease_seconds) as keeper, \
                    tempfile.TemporaryDirectory(prefix=f"{JOB_PREFIX}{os.getpid()}-") as tmp:
                model_path = fetch_bundle(self.registry, row.files, Path(tmp) / "model")
                job = CompileJob(model_path, target, row.options, s_.compile_timeout, s_.compile_memory_mb,
                                 verify_load=True, cancel=keeper.lost)
                out = self.runner.compile(job, Path(tmp) / "work")
                keeper.check()
                artifact_id, digest = publish(self.registry, lease, row, target, out, self.signer)
            self._record_self_probe(artifact_id, out)
        except LeaseLostError:
            log.warning("build %s attempt %s: lease lost; nothing published", lease.build_id, lease.attempt)
            return Result("lost", lease.build_id)
        except FarmError as exc:
            return self._failed(lease, exc.code if not isinstance(exc, StorageError) else "storage-error",
                                exc.message, exc.details.get("log"))
        except Exception as exc:  # a bug or an unexpected library error: bounded retries, then failed
            log.error("build %s: unexpected error", lease.build_id, exc_info=True)
            return self._failed(lease, "toolchain-error", f"unexpected {type(exc).__name__}: {exc}",
                                traceback.format_exc()[-8000:])
        if self.worker_id:
            from registry.index import heartbeat

            with self.registry.db.session() as s:
                heartbeat(s, self.worker_id, jobs_done_delta=1)
        log.info("build %s published %s", lease.build_id, digest)
        return Result("succeeded", lease.build_id, artifact_id=artifact_id)

    def _check_route(self, row: BuildRow) -> None:
        tc = self.toolchain
        if (row.backend, row.toolchain) != (tc.backend, tc.version):
            raise _Misrouted(f"misrouted: this executor serves {tc.backend} {tc.version}, the build needs "
                             f"{row.backend} {row.toolchain}")
        if row.backend == "trt" and self.gpu:
            from workers.trt.runner import serves

            if not serves(self.gpu, row.target, row.options):
                raise _Misrouted(f"misrouted: this worker's GPU is {self.gpu}, the build is for {row.target}")

    def _failed(self, lease: states.Lease, code: str, message: str, text: str | None) -> Result:
        s_ = self.settings
        with self.registry.db.session() as s:
            if code in DETERMINISTIC_FAILURES or code == "no-worker" or lease.attempt >= s_.max_attempts:
                ok = states.fail(s, lease, code, message, text)
                return Result("failed" if ok else "lost", lease.build_id)
            delay = backoff(lease.attempt)
            ok = states.requeue(s, lease, code, message, text, delay=delay)
        return Result("retry" if ok else "lost", lease.build_id, countdown=delay)

    def _record_self_probe(self, artifact_id: int, out: CompileOutput) -> None:
        """The compile child loaded the fresh context under its own toolchain: evidence."""
        from registry.index import record_verdict

        loaded = out.self_load or {"ok": False, "error": "the compile child did not load the context"}
        verdict, detail = ("loads", None) if loaded.get("ok") else ("fails", str(loaded.get("error"))[:2000])
        with self.registry.db.session() as s:
            record_verdict(s, artifact_id, self.toolchain.backend, self.toolchain.version, verdict, "probe", detail)

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
            if art is None or art.backend != tc.backend:
                return None
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


JOB_PREFIX = "ctxfarm-job-"


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
                    b.model_digest, [dict(f) for f in (model.files if model else [])])


# ---- signals: SIGTERM/SIGINT unwind the build like Ctrl-C ----------------------------------------

@contextmanager
def interruptible(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT raise ``Interrupted`` in the main thread: the compile
    child is killed, the lease released, temp dirs removed; the caller exits. Only the main
    thread can install handlers: elsewhere this is a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


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

