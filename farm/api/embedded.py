"""Builds inside the service process when there is no broker (the embedded farm)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from farm.core.settings import Settings
from farm.pipeline import states
from registry.index import Registry

log = logging.getLogger(__name__)


class EmbeddedRunner:
    """Without a broker the service builds in-process, one build at a time, on the executor.

    No one reads a pool future's result: whatever a build raises past the pipeline's own
    handlers is handled here (``_ended_by``): the build ends ``failed`` with a code (the
    exception's own, else ``internal-error``), its package's fan-in runs, so its release
    finishes and frees the token's quota. Nothing stays queued for a run that never comes."""

    def __init__(self, settings: Settings, reg: Registry):
        self.settings, self.reg = settings, reg
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="build")
        self.lock = threading.Lock()
        self.executors: dict[str, Any] = {}

    def submit(self, build_ids: list[int]) -> None:
        from farm.pipeline.accuracy import compiling

        for build_id in build_ids:
            compiling(1)  # background accuracy checks wait until it is done (or never runs)
            self.pool.submit(self._run, build_id).add_done_callback(_done)

    def _run(self, build_id: int) -> None:
        from farm.pipeline.accuracy import compiling

        try:
            self._build(build_id)
        except BaseException as exc:  # noqa: BLE001 - a pool future's exception would be lost
            self._ended_by(build_id, exc)
        finally:
            compiling(-1)

    def _build(self, build_id: int) -> None:
        from farm.pipeline.execute import Executor
        from farm.pipeline.genai import execute_package

        with self.reg.db.session() as s:
            backend = states.get_build(s, build_id).backend
        if backend not in self.executors:
            self.executors[backend] = Executor(self.settings, self.reg, backend=backend)
        for _ in range(self.settings.max_attempts + 1):
            # A genai package's build compiles nothing: it is assembled from its parts' builds
            # (None: not a package build); one whose parts are not all final waits, unclaimed.
            r = execute_package(self.executors[backend], build_id) or self.executors[backend].execute(build_id)
            if r.outcome == "succeeded" and r.artifact_id is not None:
                from farm.pipeline.accuracy import after_publish

                after_publish(self.settings, self.reg, build_id, r.artifact_id)  # a thread: off the answer's path
            if r.outcome in ("succeeded", "failed", "exhausted"):
                self._fan_in(build_id)
            if r.outcome != "retry":
                return
            time.sleep(min(r.countdown, 30))

    def _fan_in(self, build_id: int) -> None:
        """A worker's ``after_part``: the package builds whose last part this was are built
        next, on this runner."""
        from farm.pipeline.genai import ready_packages

        with self.reg.db.session() as s:
            ready = [pkg for pkg, _ in ready_packages(s, build_id)]
        self.submit(ready)

    def _ended_by(self, build_id: int, exc: BaseException) -> None:
        """``build_id``'s thread raised ``exc``: end the build with a code if it is still
        queued or held by this process, then run the fan-in (a failed part fails its package).
        Each step is tried on its own: a database that refuses one is logged, never raised
        into a future no one reads."""
        from farm.core.errors import BUILD_FAILURE_CODES, FarmError

        log.error("build %s: %s escaped the embedded runner", build_id, type(exc).__name__,
                  exc_info=(type(exc), exc, exc.__traceback__))
        code = exc.code if isinstance(exc, FarmError) and exc.code in BUILD_FAILURE_CODES else "internal-error"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        message = f"{type(exc).__name__} in the embedded runner: {first}"
        if isinstance(exc, FarmError):
            message = f"{exc.code}: {exc.message}"[:1500]
        self._abandon(build_id, code, message)
        try:
            self._fan_in(build_id)
        except Exception as again:
            # No package of this part would ever be sent: end them too.
            log.error("build %s: fan-in after %s failed", build_id, type(exc).__name__, exc_info=True)
            try:
                from farm.pipeline.genai import packages_of

                with self.reg.db.session() as s:
                    packages = packages_of(s, build_id)
            except Exception:
                log.error("build %s: its packages can't be read", build_id, exc_info=True)
                return
            for pkg in packages:
                self._abandon(pkg, "internal-error", f"the fan-in after part build {build_id} raised "
                                                     f"{type(again).__name__}: {str(again)[:300]}")

    def _abandon(self, build_id: int, code: str, message: str) -> None:
        try:
            with self.reg.db.session() as s:
                ended = states.abandon(s, build_id, states.owner_base(), code, message)
            ex = next(iter(self.executors.values()), None)
            if ended and ex is not None:
                ex.events.publish(build_id, states.BuildState.FAILED.value)
        except Exception:
            log.error("build %s: could not end it (%s)", build_id, code, exc_info=True)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)  # cancelled ones hold no check back


def _done(f: Future[None]) -> None:
    from farm.pipeline.accuracy import compiling

    if f.cancelled():
        compiling(-1)
