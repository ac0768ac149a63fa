"""Early compiles: an uncached ``farm build`` starts its first compiles before it imports the pipeline.

Before its first compile, a ``farm build`` call imported the pipeline (SQLAlchemy and the ORM
models), onnx and the model check, opened the index and recorded the builds: most of a call's
fixed cost on a small model, spent while the warm compile hosts it had just spawned sat ready.
None of it changes what a compile writes. So the CLI, right after the cached path missed
(``farm.pipeline.cached``), starts the compiles of the first builds (as many as the embedded pool
runs at once, in its order) on a private copy of the model, laid out as the executor lays out a
snapshot (``model.onnx`` in a fresh job dir), and then runs the pipeline as always: validation,
snapshot, records, claim. The executor that claims a build adopts the early compile of the same
build instead of starting another (``Executor._run``), and only when it is the compile the
executor would run itself:

- the same build key (model digest, backend, target, toolchain version, options digest), so the
  same options and toolchain;
- the same files: the copy is written from the very bytes that were hashed, and its (path,
  sha256, size) must equal the claimed row's snapshot listing, whose blobs the store verified:
  the bytes compiled are the bytes recorded;
- the same memory cap, time limit and self-probe (``verify_load``) as the executor's own job.

A build the index already answers (a call that only sets a tag, a deterministic failure not
retried) starts no early compile. An early compile no claimed build adopts is discarded: another
executor holds the build or finished it meanwhile, the request or the model is refused, the
model changed, the cap differs. A discarded
compile is cancelled (its host kills the job) and its dir removed when the call ends
(``EarlyCompiles.close``). An early compile records and publishes nothing: the claim, the lease,
the publication and the self-probe verdict stay the executor's, as for every build; a failure it
raises is handled by the executor's one failure path after the claim, as if its own compile had
raised it.

Only plain models compile early (no group, no genai package), only QNN targets (warm hosts), and
only a model that can hold no external data: its bytes do not contain ``location``, the key every
external-data entry of an ONNX tensor carries (``external_data`` is a list of key/value strings).
Any other model is laid out by the pipeline, which knows its files only after inspecting it.
Bounded in size (``EARLY_MAX_BYTES``): on a big model the fixed cost is noise beside the compile.

This module imports no SQLAlchemy, onnx or onnxruntime (the CLI calls it before those imports).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.core.settings import Settings

log = logging.getLogger("ctxfarm.pipeline")

EARLY_MAX_BYTES = 64 * 1024 * 1024
CLOSE_WAIT_S = 10.0


class _Flag:
    """The early job's cancel flag: its own (discarded) or, once adopted, the executor's too."""

    def __init__(self) -> None:
        self.own = threading.Event()
        self.linked: Any = None

    def is_set(self) -> bool:
        linked = self.linked
        return self.own.is_set() or (linked is not None and linked.is_set())


@dataclass
class EarlyCompile:
    """One compile started early: its build key, what it compiles and under which limits."""

    key: str
    files: list[dict[str, Any]]  # [{"path", "digest", "size"}]: the copy it compiles
    memory_mb: int
    timeout: float
    verify_load: bool
    dir: Path  # the job dir: model/ (the copy) and work/ (the runner's)
    started: float = field(default_factory=time.perf_counter)
    future: Future[Any] = field(default_factory=Future)
    call_seconds: float = 0.0  # the runner's call, as the executor times its own
    flag: _Flag = field(default_factory=_Flag)

    def matches(self, key: str, files: list[dict[str, Any]], memory_mb: int, timeout: float,
                verify_load: bool) -> bool:
        def listing(fs: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
            return [(str(f["path"]), str(f["digest"]), int(f["size"])) for f in fs]

        return (key == self.key and listing(files) == listing(self.files) and memory_mb == self.memory_mb
                and timeout == self.timeout and verify_load == self.verify_load)

    def result(self, cancel: Any) -> Any:
        """The runner's CompileOutput (or what it raised), the job stopped when ``cancel`` is set."""
        self.flag.linked = cancel
        return self.future.result()

    def discard(self) -> None:
        self.flag.own.set()

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class EarlyCompiles:
    """The early compiles of one call, by build key; ``take`` hands one to the executor that
    claimed its build, ``close`` discards the rest."""

    def __init__(self) -> None:
        self._by_key: dict[str, EarlyCompile] = {}
        self._discarded: list[EarlyCompile] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._by_key

    def take(self, key: str, files: list[dict[str, Any]], *, memory_mb: int, timeout: float,
             verify_load: bool) -> EarlyCompile | None:
        """The early compile of this build when it is the one the executor would run (see the
        module docstring); the caller owns it then (``remove`` its dir when done). One that does
        not match is discarded here (``close`` waits for it and removes its dir)."""
        with self._lock:
            early = self._by_key.pop(key, None)
            if early is None:
                return None
            if early.matches(key, files, memory_mb, timeout, verify_load):
                return early
            self._discarded.append(early)
        early.discard()
        return None

    def add(self, early: EarlyCompile, run: Any) -> None:
        with self._lock:
            self._by_key[early.key] = early
        threading.Thread(target=run, name=f"early-{early.key[:12]}", daemon=True).start()

    def close(self) -> None:
        """Discard every compile not taken, wait for its job to stop, remove its dir."""
        with self._lock:
            left = list(self._by_key.values()) + self._discarded
            self._by_key.clear()
            self._discarded = []
        for early in left:
            early.discard()
        for early in left:
            try:
                # Its job stops within the host's cancel poll once it runs; a host still starting
                # is waited for, up to a bound: a discarded job publishes nothing either way, and
                # it ends with this process (PR_SET_PDEATHSIG).
                early.future.exception(timeout=CLOSE_WAIT_S)
            except TimeoutError:
                log.warning("an early compile did not stop within %s s: left to end with the process", CLOSE_WAIT_S)
            finally:
                early.remove()


@contextmanager
def interruptible(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT raise ``Interrupted`` in the main thread: the compile
    child is killed, the lease released, temp dirs removed; the caller exits. Only the main
    thread can install handlers: elsewhere this is a no-op. (Here, not in farm.pipeline.execute,
    so that ``farm build`` holds it from its first early compile on, before that import.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from farm.core.errors import Interrupted

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def start(settings: Settings, models: Sequence[str | Path], target_refs: Sequence[str],
          option_pairs: Sequence[str] = (), *, require_full_offload: bool = False,
          retry_failed: bool = False, into: EarlyCompiles | None = None,
          progress: Sequence[Any] = ()) -> EarlyCompiles:
    """Start the compiles of the first builds of ``build_many(settings, models, target_refs,
    option_pairs)`` that can compile early (see the module docstring) and that the index does not
    answer already (a call that only moves a tag compiles nothing), in ``into`` (made by the
    caller before, so that an interruption half-way still closes what was started) or a new
    ``EarlyCompiles``. ``progress[i]`` hears ``compiling`` for each build of models[i] that starts
    (the pipeline says the same when it claims the build: one state, timed from here). Never
    raises for the request: a request the pipeline would refuse starts nothing, and the pipeline
    says why."""
    from farm.core.errors import FarmError

    early = EarlyCompiles() if into is None else into
    if not settings.early_compile:
        return early
    try:
        _start(settings, models, target_refs, option_pairs, require_full_offload, retry_failed, early, progress)
    except FarmError:
        pass  # the pipeline raises it with its own words
    except Exception:  # noqa: BLE001 - an early compile is an optimisation: never a new failure
        log.warning("no early compile", exc_info=True)
    return early


def _start(settings: Settings, models: Sequence[str | Path], target_refs: Sequence[str],
           option_pairs: Sequence[str], require_full_offload: bool, retry_failed: bool,
           early: EarlyCompiles, progress: Sequence[Any] = ()) -> None:
    from farm.core.bundle import ONNX_NAME
    from farm.core.groups import check_build_support
    from farm.core.keys import build_key, bundle_digest, options_digest, sha256_bytes
    from farm.pipeline.memory import PeakModel, build_jobs
    from farm.pipeline.submission import parse_build_request
    from workers.backends import get_runner

    req = parse_build_request(target_refs, option_pairs, None, None, require_full_offload)
    qnn = [t for t in req.targets if t.backend == "qnn"]
    if not qnn:
        return
    runner = get_runner("qnn")
    if not getattr(runner, "warm_host", False):
        return
    version = runner.toolchain().version
    for t in qnn:
        check_build_support(t, version, group=False)  # refused: the pipeline says so
    # The embedded pool's first builds, in its order (model by model, target by target).
    slots = build_jobs(settings, len(models) * len(req.targets))
    read: dict[str, bytes | None] = {}
    first: list[tuple[bytes, Any, str, int]] = []  # (the model's bytes, target, build key, model index)
    for i, model in enumerate(models):
        for t in req.targets:
            if slots <= 0:
                break
            slots -= 1
            if t.backend != "qnn":
                continue
            if str(model) not in read:
                read[str(model)] = _model_bytes(Path(model))
            data = read[str(model)]
            if data is None:
                continue
            key = build_key(bundle_digest(sha256_bytes(data), []), t.backend, t.name, version,
                            options_digest(req.options[t]))
            first.append((data, t, key, i))
    answered = _answered(settings, [k for _, _, k, _ in first], retry_failed)
    for data, t, key, i in first:
        if key in answered or key in early:
            continue
        job = _job_dir()
        (job / "model").mkdir()
        (job / "model" / ONNX_NAME).write_bytes(data)
        # The executor's cap for a model of this size (farm.pipeline.execute: the default peak
        # line until builds are recorded; a fitted line that caps otherwise discards it).
        cap = (PeakModel().cap_mb(len(data), settings.compile_memory_mb) if settings.compile_memory_auto
               else settings.compile_memory_mb)
        e = EarlyCompile(key, [{"path": ONNX_NAME, "digest": sha256_bytes(data), "size": len(data)}], cap,
                         settings.compile_timeout, True, job)
        early.add(e, _runner_call(runner, e, t, req.options[t]))
        if i < len(progress):
            progress[i]("compiling", t.ref, {"toolchain": version, "attempt": 1})


def _answered(settings: Settings, keys: list[str], retry_failed: bool) -> set[str]:
    """The keys the index answers without a compile (``farm.pipeline.cached``'s rule: succeeded
    with an artifact not marked broken, or failed for a deterministic reason and not retried)."""
    from farm.core.errors import DETERMINISTIC_FAILURES
    from registry.lite import open_index
    from registry.reads import builds_by_key

    index = open_index(settings.database_url) if keys else None
    if index is None:
        return set()
    with index:
        rows = builds_by_key(index, keys)
    return {k for k, b in rows.items()
            if (b.state == "succeeded" and b.artifact is not None and b.artifact_status != "broken")
            or (b.state == "failed" and not retry_failed and b.error_code in DETERMINISTIC_FAILURES)}


def _job_dir() -> Path:
    from farm.pipeline.bundles import JOB_PREFIX

    return Path(tempfile.mkdtemp(prefix=f"{JOB_PREFIX}{os.getpid()}-"))


def _model_bytes(src: Path) -> bytes | None:
    """The .onnx's bytes when it can compile early (readable, small, naming no external data)."""
    from farm.core.bundle import names_no_external_data

    try:
        if not src.is_file() or src.stat().st_size > EARLY_MAX_BYTES:
            return None
        data = src.read_bytes()
    except OSError:
        return None
    if not data or len(data) > EARLY_MAX_BYTES or not names_no_external_data(data):
        return None
    return data


def _runner_call(runner: Any, early: EarlyCompile, target: Any, options: dict[str, Any]) -> Any:
    from workers.runner import CompileJob

    def run() -> None:
        job = CompileJob(early.dir / "model" / early.files[0]["path"], target, options, early.timeout,
                         early.memory_mb, verify_load=early.verify_load, cancel=early.flag)
        t = time.perf_counter()
        try:
            out = runner.compile(job, early.dir / "work")
        except BaseException as exc:
            early.call_seconds = time.perf_counter() - t
            early.future.set_exception(exc)
        else:
            early.call_seconds = time.perf_counter() - t
            early.future.set_result(out)

    return run
