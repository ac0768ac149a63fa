"""The link between a package's build and its parts' builds (``GenaiPart`` rows): which package
builds a part build feeds, and which of them are ready to assemble (the fan-in's messages)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def link_parts(s: Any, package_build_id: int, part_build_ids: Sequence[int]) -> None:
    """In the caller's transaction: the package build is assembled from these part builds."""
    from registry.models import GenaiPart

    for i, b in enumerate(part_build_ids):
        s.merge(GenaiPart(package_build_id=package_build_id, part=i, part_build_id=int(b)))


def packages_of(s: Any, part_build_id: int) -> list[int]:
    """The package builds that use this part build."""
    from sqlalchemy import select

    from registry.models import GenaiPart

    return [int(p) for p in s.scalars(select(GenaiPart.package_build_id)
                                      .where(GenaiPart.part_build_id == part_build_id))]


def ready_packages(s: Any, part_build_id: int) -> list[tuple[int, str]]:
    """(package build id, queue) of queued package builds using this part build whose parts are
    all final now: the fan-in's messages to send."""
    from farm.pipeline import states
    from registry.models import Build

    out = []
    for pkg_id in packages_of(s, part_build_id):
        b = s.get(Build, pkg_id)
        if b is None or b.state != states.BuildState.QUEUED or not b.queue:
            continue
        parts = states.part_builds(s, pkg_id) or []
        if all(s.get(Build, p) is not None and s.get(Build, p).state in states.FINAL for p in parts):
            out.append((int(pkg_id), str(b.queue)))
    return out
