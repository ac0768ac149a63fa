"""Graph groups assembled from models the index already holds (``POST /v1/groups``): each
member was uploaded (or found held) as a model of its own; the group's ``group.json`` is written
to the store and the group recorded as a model whose snapshot lists the members' stored files
under fixed directories (farm.core.groups). A release of the group's digest then builds it like
any model. No member file is read or copied: the blobs are already in the store by digest."""

from __future__ import annotations

from typing import Any

from farm.core.errors import BadGroupError, NotFoundError
from farm.core.groups import GROUP_FILE, group_listing
from registry.index import Registry


def record_group(reg: Registry, graphs: list[tuple[str, str]], *, name: str | None = None, tag: str | None = None,
                 force_tag: bool = False) -> dict[str, Any]:
    """Record the group of ``graphs`` ((graph name, model digest or NAME:TAG) in order); returns
    ``{"digest", "graphs": [{"name", "model"}], "size", "tag_moved"}``. Each member must be a
    recorded, stored, single model (not itself a group)."""
    from farm.pipeline.plan import check_name_tag, record_snapshot
    from registry.index import resolve_model_ref
    from registry.models import Model
    from registry.store.base import put_bytes

    name, tag = check_name_tag(name, tag)
    members: list[tuple[str, str, list[dict[str, Any]]]] = []
    with reg.db.session() as s:
        for graph, ref in graphs:
            digest = resolve_model_ref(s, ref)
            m = s.get(Model, digest)
            if m is None or not m.files or not all(f.get("stored") for f in m.files):
                raise NotFoundError(f"graph {graph!r}: model {ref[:80]!r} is not stored here",
                                    hint="upload it first (POST /v1/models), then name its digest")
            if m.files[0].get("path") == GROUP_FILE:
                raise BadGroupError(f"graph {graph!r}: {digest[:19]} is itself a graph group")
            members.append((graph, digest, [dict(f) for f in m.files]))
    desc, digest, listing = group_listing(members)
    put_bytes(reg.store, desc, expected=listing[0]["digest"])
    size = sum(int(f["size"]) for f in listing)  # as GroupBundle.size: each graph's bundle in full
    with reg.db.session() as s:
        moved = record_snapshot(s, digest, listing[0]["digest"], size, [{**f, "stored": True} for f in listing],
                                name, tag, "+".join(g for g, _, _ in members), force_tag=force_tag)
    return {"digest": digest, "graphs": [{"name": g, "model": d} for g, d, _ in members], "size": size,
            "tag_moved": moved}
