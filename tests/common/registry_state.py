"""Snapshots of a registry (row counts + blob digests) to prove an operation changed nothing."""

from __future__ import annotations

from typing import Any

from farm.core.settings import Settings


def snapshot(settings: Settings) -> dict[str, Any]:
    from registry.index import Registry, counts

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            rows = counts(s)
        blobs = sorted(b.digest for b in reg.store.iter_blobs())
    finally:
        reg.close()
    return {"rows": rows, "blobs": blobs}
