"""What this host holds now: MemAvailable, within a cgroup (v2) limit. Read by the compile
planner (``farm.pipeline.memory``) and by the genai twin's plan (``workers.qnn.genai``), which
sits below the pipeline: here, below both."""

from __future__ import annotations

from pathlib import Path

MIB = 1024 * 1024
# RLIMIT_AS counts address space, which runs above RSS (vgg19: VmPeak 2.5 GiB at RSS 1.6 GiB): a
# child's cap is this many times its predicted peak RSS (a compile's, farm.pipeline.memory; a
# genai twin check's, workers.qnn.genai), never below the caller's floor.
CAP_FACTOR = 2.0


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def meminfo_mb(field: str = "MemAvailable", path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_free_mb(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What this process's cgroup (v2) may still use: memory.max less memory.current; None when
    unlimited or not a cgroup v2 host."""
    limit, used = _read_int(root / "memory.max"), _read_int(root / "memory.current")
    if limit is None or used is None:
        return None
    return max(limit - used, 0) // MIB


def available_mb() -> int | None:
    """Memory a compile started now may use: MemAvailable, within the cgroup's limit."""
    figures = [v for v in (meminfo_mb(), cgroup_free_mb()) if v is not None]
    return min(figures) if figures else None
