"""Builds inside the service process when there is no broker (the embedded farm)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from farm.core.settings import Settings
from farm.pipeline import states
from registry.index import Registry


class EmbeddedRunner:
    """Without a broker the service builds in-process, one build at a time, on the executor."""

    def __init__(self, settings: Settings, reg: Registry):
        self.settings, self.reg = settings, reg
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="build")
        self.lock = threading.Lock()
        self.executors: dict[str, Any] = {}

    def submit(self, build_ids: list[int]) -> None:
        from farm.pipeline.accuracy import compiling

        for build_id in build_ids:
            compiling(1)  # background accuracy checks wait until it is done (or never runs)
            self.pool.submit(self._run, build_id).add_done_callback(
                lambda f: compiling(-1) if f.cancelled() else None)

    def _run(self, build_id: int) -> None:
        from farm.pipeline.accuracy import compiling

        try:
            self._build(build_id)
        finally:
            compiling(-1)

    def _build(self, build_id: int) -> None:
        from farm.pipeline.execute import Executor
        from farm.pipeline.genai import execute_package, ready_packages

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
                # The genai fan-in, as a worker's ``after_part``: the package builds whose
                # last part this was are built next, on this runner.
                with self.reg.db.session() as s:
                    ready = [pkg for pkg, _ in ready_packages(s, build_id)]
                self.submit(ready)
            if r.outcome != "retry":
                return
            time.sleep(min(r.countdown, 30))

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)  # cancelled ones hold no check back
