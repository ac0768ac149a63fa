"""What the fleet can make besides context binaries, read from where it is announced: the live
workers' rows in the index (a cluster), or this process's own environment (the embedded farm).
The decisions made from it are ``farm.core.capabilities``'s."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from farm.core.capabilities import Capabilities, Fleet
from farm.core.settings import Settings


def merge(found: Iterable[Capabilities | None]) -> Capabilities | None:
    """The capabilities of one toolchain's workers together (what any of them makes; why for
    the rest); None when none of them announced any."""
    known = [c for c in found if c is not None]
    if not known:
        return None
    makes = frozenset().union(*(c.makes for c in known))
    lacks: dict[str, str] = {}
    for c in known:
        for cap, why in c.lacks.items():
            if cap not in makes:
                lacks.setdefault(cap, why)
    return Capabilities(makes, lacks)


def fleet_of(settings: Settings, reg: Any) -> dict[tuple[str, str], Capabilities | None]:
    """(backend, toolchain) -> what its live workers make. A toolchain with no live worker is
    answered by the newest worker row of it (stopped or dead): ``--sdk V --allow-queue`` for an
    SDK whose workers were seen unable is refused, not queued for ever."""
    from registry.index import all_workers, live_workers

    live: dict[tuple[str, str], list[Capabilities | None]] = {}
    out: dict[tuple[str, str], Capabilities | None] = {}
    with reg.db.session() as s:
        for w in live_workers(s, stale_after=settings.worker_stale_after):
            live.setdefault((w.backend, w.toolchain), []).append(Capabilities.from_extra(w.extra))
        out = {k: merge(v) for k, v in live.items()}
        for w in all_workers(s):  # newest first
            out.setdefault((w.backend, w.toolchain), Capabilities.from_extra(w.extra))
    return out


def fleet_here(served: Iterable[tuple[str, str]]) -> Fleet:
    """The embedded farm: each toolchain installed here makes what this environment holds."""
    from workers.capabilities import here

    return {(b, v): here(b) for b, v in served}
