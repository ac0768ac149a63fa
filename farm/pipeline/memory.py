"""Memory planning for compiles: predict a build's peak RSS, know what this host holds, admit
compiles so that what runs at once fits.

A compile's peak grows with its model: the EP holds the graph, the weights and the context it
writes. The prediction is a line, ``base + ratio x model size``, fitted per (backend, toolchain)
from the peaks recorded on earlier builds (``builds.phases["child.peak_rss_kib"]``, the compile
process's VmHWM); with no history it starts from measured facts (QNN 2.51.0, x86_64, bench/memory.py:
fp32 MatMul chains of 64 MiB, 256 MiB, 512 MiB, 1 GiB and 2 GiB peaked at 302, 761, 1,613, 2,392
and 4,440 MiB; vgg19, 548 MiB of weights, at 1.6 GiB; a 2.25 GiB external-data model at 4.9 GB). The size is the bundle's
declared size: a model that makes its weights in the graph (ConstantOfShape, RandomNormal; the
onnx wheel's "light" models) is predicted from the base alone.

``MemoryGate`` admits compiles against a capacity (MemAvailable, within a cgroup's limit, measured
whenever none of the process's compiles runs): a build waits while the predicted peaks of those running would not leave room
for its own, and one whose prediction exceeds the whole capacity is refused before it starts
(``resource-limit``, with the numbers) instead of being killed by the kernel halfway through.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from farm.core.errors import ResourceLimitError
from farm.core.hostmem import CAP_FACTOR, available_mb, cgroup_free_mb, meminfo_mb  # noqa: F401 (this module's names)

MIB = 1024 * 1024

# A line through the measured peaks above: 200 MiB + 2.05 x the model (bench/memory.py: within
# 10 % of each chain but the 512 MiB one, -22 %; vgg19 -16 %; the 2.25 GiB model +5 %).
DEFAULT_BASE_MB = 200.0
DEFAULT_RATIO = 2.05
# Models this small say nothing about the ratio (their peak is the runtime itself): they fit the
# base only; models at least this big fit the ratio.
RATIO_MIN_MODEL_MB = 256.0
HISTORY = 200  # the most recent successful builds of a toolchain the fit reads
# What admission keeps free beside the compiles (the executor, the page cache the store needs).
RESERVE_MB = 512
# The default cap of a compile is CAP_FACTOR (farm.core.hostmem) times its predicted peak, never
# below the floor (FARM_COMPILE_MEMORY_MB, 6 GiB by default).
PEAK_KEY = "child.peak_rss_kib"


@dataclass(frozen=True)
class Sample:
    model_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class PeakModel:
    """``peak = base_mb + ratio x model MiB``; ``samples``: how many measured peaks it was fitted on."""

    base_mb: float = DEFAULT_BASE_MB
    ratio: float = DEFAULT_RATIO
    samples: int = 0

    def predict_mb(self, model_bytes: int) -> int:
        return int(round(self.base_mb + self.ratio * model_bytes / MIB))

    def cap_mb(self, model_bytes: int, floor_mb: int) -> int:
        """The address-space cap for a compile of this model: CAP_FACTOR x the prediction, at least
        ``floor_mb``; 0 (no cap) stays 0."""
        if floor_mb <= 0:
            return 0
        return max(floor_mb, int(CAP_FACTOR * self.predict_mb(model_bytes)))


def fit(samples: Iterable[Sample]) -> PeakModel:
    """A robust line through measured (model size, peak RSS) pairs: medians, not least squares,
    so one odd build does not move it. Small models fit the base; big ones the ratio; what is
    missing keeps its default."""
    pts = [(s.model_bytes / MIB, s.peak_bytes / MIB) for s in samples if s.model_bytes >= 0 and s.peak_bytes > 0]
    if not pts:
        return PeakModel()
    small = [p for p in pts if p[0] < RATIO_MIN_MODEL_MB]
    big = [p for p in pts if p[0] >= RATIO_MIN_MODEL_MB]
    ratio = DEFAULT_RATIO
    base = DEFAULT_BASE_MB
    for _ in range(8 if big and small else 1):  # each refines the other; a few rounds settle both
        if small:
            base = statistics.median(peak - ratio * size for size, peak in small)
        if big:
            ratio = max(statistics.median((peak - base) / size for size, peak in big), 0.1)
    return PeakModel(max(base, 64.0), ratio, len(pts))


def history(session: Any, backend: str, toolchain: str, limit: int = HISTORY) -> list[Sample]:
    """The recorded (model size, peak) of this toolchain's latest successful builds."""
    from sqlalchemy import select

    from registry.models import Build, Model

    rows = session.execute(
        select(Model.size, Build.phases).join(Model, Model.digest == Build.model_digest)
        .where(Build.backend == backend, Build.toolchain == toolchain, Build.state == "succeeded",
               Build.phases.is_not(None))
        .order_by(Build.id.desc()).limit(limit)).all()
    out = []
    for size, phases in rows:
        peak = (phases or {}).get(PEAK_KEY)
        if isinstance(peak, int | float) and not isinstance(peak, bool) and peak > 0:
            out.append(Sample(int(size), int(peak) * 1024))
    return out


# ---- what this host holds ------------------------------------------------------------------------

def build_jobs(settings: Any, builds: int) -> int:
    """How many builds embedded ``farm build`` compiles at once: one per CPU this process may
    use, no more than there are builds, and only as many as MemAvailable holds at the compile
    memory cap (FARM_COMPILE_MEMORY_MB) each; at least one."""
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs = min(cpus, builds)
    available = meminfo_mb()
    if settings.compile_memory_mb > 0 and available is not None:
        jobs = min(jobs, available // settings.compile_memory_mb)
    return max(jobs, 1)


# ---- admission -----------------------------------------------------------------------------------

class MemoryGate:
    """Admits compiles whose predicted peaks fit ``capacity_mb`` together (threads of one process:
    the embedded pool, a worker's executor). The first build always runs if it fits the capacity
    at all; the others wait for room. ``capacity_mb`` None: no accounting (nothing known)."""

    def __init__(self, capacity_mb: int | None, measure: Callable[[], int | None] | None = None):
        self.capacity_mb = capacity_mb
        self.reserved_mb = 0
        self.running = 0
        self.waiting = 0  # admissions of normal priority waiting for room: a low one lets them go first
        self._measure = measure
        self._cond = threading.Condition()

    @classmethod
    def for_host(cls) -> MemoryGate:
        def measure() -> int | None:
            free = available_mb()
            return None if free is None else max(free - RESERVE_MB, 0)

        return cls(measure(), measure)

    def check(self, need_mb: int, what: str) -> None:
        """Refuse a compile that would not fit this host even alone. With nothing of ours
        running, the capacity is measured again first: a long-lived worker follows the host."""
        if self._measure is not None and self.running == 0:
            with self._cond:
                if self.running == 0:
                    self.capacity_mb = self._measure()
        if self.capacity_mb is not None and need_mb > self.capacity_mb:
            raise ResourceLimitError(
                f"{what}: the compile is predicted to peak at {need_mb} MiB and this host has {self.capacity_mb} MiB "
                f"for compiles (MemAvailable less {RESERVE_MB} MiB): not started",
                hint="build it on a worker with more memory, or cut the model into parts; the prediction is "
                     "fitted on this toolchain's recorded peaks (docs/large-models.md)")

    @contextmanager
    def admit(self, need_mb: int, what: str, stop: Any = None, poll: float = 0.5, *,
              low: bool = False) -> Iterator[None]:
        """Hold ``need_mb`` while the block runs; wait until it fits beside those running (``stop``:
        an Event-like flag that ends the wait by raising Interrupted). ``low`` (a genai part's twin
        build): it also waits while an admission of normal priority waits, so a compile that a
        publication waits on is never kept out by one that only follows it."""
        self.check(need_mb, what)
        with self._cond:
            counted = False
            try:
                while ((low and self.waiting > 0) or (self.capacity_mb is not None and self.running
                                                      and self.reserved_mb + need_mb > self.capacity_mb)):
                    if not low and not counted:
                        self.waiting += 1
                        counted = True
                    if stop is not None and stop.is_set():
                        from farm.core.errors import Interrupted, LeaseLostError

                        if getattr(stop, "signum", None):
                            raise Interrupted(stop.signum)
                        raise LeaseLostError(f"{what}: stopped while waiting for memory")
                    self._cond.wait(poll)
            finally:
                if counted:
                    self.waiting -= 1
                    self._cond.notify_all()
            self.reserved_mb += need_mb
            self.running += 1
        try:
            yield
        finally:
            with self._cond:
                self.reserved_mb -= need_mb
                self.running -= 1
                self._cond.notify_all()
