"""How many builds embedded ``farm build`` compiles at once (farm.pipeline.memory.build_jobs, also
farm.pipeline.plan.build_jobs)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from farm.core.settings import Settings
from farm.pipeline import memory, plan


def test_bounded_by_cpus_builds_and_memory(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    monkeypatch.setattr(memory, "meminfo_mb", lambda: 20_000)
    capped = dataclasses.replace(settings, compile_memory_mb=6144)
    assert plan.build_jobs(capped, 12) == 3  # 20 000 MiB available / 6 144 MiB each
    assert plan.build_jobs(capped, 2) == 2  # no more than there are builds
    assert plan.build_jobs(dataclasses.replace(settings, compile_memory_mb=0), 12) == 4  # no cap: the CPUs
    monkeypatch.setattr(memory, "meminfo_mb", lambda: 1000)
    assert plan.build_jobs(capped, 12) == 1  # never none
    monkeypatch.setattr(memory, "meminfo_mb", lambda: None)  # no /proc/meminfo: the CPUs
    assert plan.build_jobs(capped, 12) == 4
