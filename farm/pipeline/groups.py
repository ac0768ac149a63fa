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
    from farm.pipeline.plan import check_name_tag, check_tag_free, record_snapshot
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
    check_tag_free(reg, digest, name, tag, force_tag)  # a refused group leaves no group.json blob
    put_bytes(reg.store, desc, expected=listing[0]["digest"])
    size = sum(int(f["size"]) for f in listing)  # as GroupBundle.size: each graph's bundle in full
    with reg.db.session() as s:
        moved = record_snapshot(s, digest, listing[0]["digest"], size, [{**f, "stored": True} for f in listing],
                                name, tag, "+".join(g for g, _, _ in members), force_tag=force_tag)
    return {"digest": digest, "graphs": [{"name": g, "model": d} for g, d, _ in members], "size": size,
            "tag_moved": moved}


def load_group(settings: Any, members: list[tuple[str, str]], *, display: str | None = None) -> Any:
    """The GroupBundle of ``members`` ((graph name, .onnx path) in order). A group the index
    already records is recognized without reading the weights again: each member's digest comes
    from ``farm.core.digests`` (remembered by each file's stat under FARM_HOME/cache, as
    ``farm submit --server`` does), which names the group's ``group.json``, which names the
    recorded group; its listing then describes the local files (the member digests cover every
    file's digest). Anything else, or a file whose stat changed, is inspected in full
    (``inspect_group``: every check)."""
    import tempfile
    from pathlib import Path

    from farm.core.bundle import BundleFile, ModelBundle
    from farm.core.digests import local_bundle, memo_path
    from farm.core.errors import FarmError, InvalidModelError
    from farm.core.groups import (
        GroupBundle,
        GroupMember,
        check_members,
        descriptor,
        inspect_group,
        member_dir,
        member_onnx,
    )
    from farm.core.keys import canonical_json, sha256_bytes
    from registry.index import find_model_by_onnx

    check_members(members)
    memo = memo_path(settings.home)
    local: list[tuple[str, Path, Any]] = []
    for name, path in members:
        try:
            local.append((name, Path(path), local_bundle(Path(path), memo)))
        except InvalidModelError as exc:
            raise InvalidModelError(f"graph {name!r}: {exc.message}", hint=exc.hint) from None
        except (FarmError, OSError):
            return inspect_group(members, display=display)
    desc = canonical_json(descriptor([(n, lb.digest) for n, _, lb in local]))
    desc_digest = sha256_bytes(desc)
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            recorded = [(m.digest, [dict(f) for f in m.files]) for m in find_model_by_onnx(s, desc_digest)
                        if m.files and m.files[0].get("path") == GROUP_FILE]
    finally:
        reg.close()
    if not recorded:
        return inspect_group(members, display=display)
    digest, listing = recorded[0]
    by_path = {f["path"]: f for f in listing}
    group_members = []
    for i, (name, onnx_path, lb) in enumerate(local):
        head = by_path.get(member_onnx(i))
        prefix = f"{member_dir(i)}/"
        ext = tuple(BundleFile(f["path"][len(prefix):], f["digest"], int(f["size"])) for f in listing
                    if f["path"].startswith(prefix) and f["path"] != member_onnx(i))
        if head is None or sorted(e.path for e in ext) != sorted(rel for rel, _ in lb.members[1:]):
            return inspect_group(members, display=display)
        group_members.append(GroupMember(name, ModelBundle(path=onnx_path.absolute(), digest=lb.digest,
                                                           onnx=BundleFile("", head["digest"], int(head["size"])),
                                                           external=ext)))
    tmp = Path(tempfile.mkdtemp(prefix="ctxfarm-group-"))
    (tmp / GROUP_FILE).write_bytes(desc)
    return GroupBundle(tuple(group_members), desc, digest, BundleFile("", desc_digest, len(desc)),
                       display or "+".join(n for n, _, _ in local), tmp)
