"""Cluster mode: releases over a target x toolchain matrix, queued to Celery workers.

``submit_release``: validate everything, check the broker, upload the model bundle (blobs
first), then one transaction writes the model, tag, release and queued build rows (the UNIQUE
build key dedupes against everything already built or queued), and only after the commit are
the tasks sent, by name, to their toolchain queues.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.catalog import Target, parse_target
from farm.config import Settings
from farm.errors import BadOptionsError, FarmError, NoWorkerError
from farm.keys import build_key, options_digest
from farm.options import normalize, parse_pairs


@dataclass
class ReleaseStatus:
    release_id: int
    model: str
    builds: list[dict[str, Any]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return all(b["state"] in ("succeeded", "failed") for b in self.builds)

    @property
    def ok(self) -> bool:
        return all(b["state"] == "succeeded" for b in self.builds)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.builds:
            out[b["state"]] = out.get(b["state"], 0) + 1
        return out


def served_toolchains(settings: Settings, reg: Any) -> dict[tuple[str, str], list[str]]:
    """(backend, toolchain) -> names of live workers serving it."""
    from registry.index import live_workers

    with reg.db.session() as s:
        workers = live_workers(s, stale_after=settings.worker_stale_after)
        out: dict[tuple[str, str], list[str]] = {}
        for w in workers:
            out.setdefault((w.backend, w.toolchain), []).append(w.name)
    return out


def _matrix(target_refs: Sequence[str], sdks: Sequence[str], served: dict[tuple[str, str], list[str]]
            ) -> list[tuple[Target, str]]:
    if not target_refs:
        raise FarmError("no target given", hint="add --target qnn:SM8650 (see `farm targets`)")
    targets: list[Target] = []
    for ref in target_refs:
        t = parse_target(ref)
        if t not in targets:
            targets.append(t)
    pairs: list[tuple[Target, str]] = []
    for t in targets:
        versions = list(dict.fromkeys(sdks)) or sorted(v for (b, v) in served if b == t.backend)
        if not versions:
            raise NoWorkerError(f"no --sdk given and no live {t.backend} worker to take one from",
                                hint="start workers (infra/farm-up.sh) or pass --sdk 2.51.0 --allow-queue")
        pairs.extend((t, v) for v in versions)
    return pairs


def submit_release(settings: Settings, model: str | Path, target_refs: Sequence[str], sdks: Sequence[str] = (),
                   option_pairs: Sequence[str] = (), *, name: str | None = None, tag: str | None = None,
                   allow_queue: bool = False, registry: Any = None, app: Any = None) -> ReleaseStatus:
    from farm.celery_app import COMPILE_TASK, check_broker, compile_queue, make_app, send
    from farm.submit import load_bundle
    from registry.index import (
        BuildSpec,
        Registry,
        queue_build,
        record_model,
        release_builds,
        set_tag,
    )
    from registry.models import Release, ReleaseBuild
    from registry.store.base import put_file

    model_path = Path(model)
    own = registry is None
    reg = registry or Registry.open(settings)
    try:
        raw = parse_pairs(option_pairs)
        served = served_toolchains(settings, reg)
        matrix = _matrix(target_refs, sdks, served)
        unserved = sorted({(t.backend, v) for t, v in matrix if (t.backend, v) not in served})
        if unserved and not allow_queue:
            have = ", ".join(f"{b} {v}" for b, v in sorted(served)) or "none"
            raise NoWorkerError(
                "no live worker serves " + ", ".join(f"{b} {v}" for b, v in unserved),
                hint=f"served now: {have}. Start such a worker, or pass --allow-queue to queue and wait",
                details={"served": [f"{b}:{v}" for b, v in sorted(served)]})
        options = {t: normalize(t.backend, raw, t) for t, _ in matrix}
        bundle = load_bundle(reg, model_path)  # invalid-model before anything is written
        specs = []
        for t, version in matrix:
            opts = options[t]
            od = options_digest(opts)
            specs.append((t, version, BuildSpec(build_key(bundle.digest, t.backend, t.name, version, od),
                                                bundle.digest, t.backend, t.name, version, opts, od)))
        if _needs_compiles(reg, [spec.build_key for _, _, spec in specs]):
            # Something will be sent: the broker must answer before anything is written.
            app = app or make_app(settings)
            check_broker(app)
        # Blobs first: the bundle, content-addressed (a re-submission uploads nothing new).
        files = bundle.files_json()
        paths = [bundle.path] + [bundle.root / f.path for f in bundle.external]
        for entry, path in zip(files, paths, strict=True):
            if not _stored(reg.store, entry["digest"], entry["size"]):
                put_file(reg.store, path, expected=entry["digest"])
            entry["stored"] = True
        display = name or bundle.stem
        to_send: list[tuple[int, str]] = []
        with reg.db.session() as s:
            m = record_model(s, digest=bundle.digest, onnx_digest=bundle.onnx.digest, size=bundle.size,
                             files=files, name=display)
            if not all(f.get("stored") for f in m.files):
                m.files = files  # recorded earlier by an embedded build, now stored too
            if name:
                set_tag(s, name, tag or "latest", bundle.digest)
            release = Release(model_digest=bundle.digest, label=f"{name}:{tag or 'latest'}" if name else display,
                              matrix={"targets": [t.ref for t, _ in matrix], "toolchains": [v for _, v in matrix],
                                      "options": raw})
            s.add(release)
            s.flush()
            for t, version, spec in specs:
                hw_compat = spec.options.get("hardware_compatibility_level") == "ampere_plus"
                queue = compile_queue(t.backend, version, "ampere_plus" if hw_compat else t.name)
                build_id, needs_message = queue_build(s, spec, queue)
                s.add(ReleaseBuild(release_id=release.id, build_id=build_id))
                if needs_message:
                    to_send.append((build_id, queue))
            release_id = release.id
        # After the commit: a worker that gets the message finds the row.
        if to_send and app is None:
            app = make_app(settings)
        for build_id, queue in to_send:
            send(app, COMPILE_TASK, [build_id], queue)
        with reg.db.session() as s:
            return _status(s, release_id, release_builds(s, release_id))
    finally:
        if own:
            reg.close()


def _needs_compiles(reg: Any, keys: list[str]) -> bool:
    """Will queue_build want to send anything for these keys (new, or failed for an infra reason)?"""
    from sqlalchemy import select

    from farm.errors import DETERMINISTIC_FAILURES
    from registry.models import Build

    with reg.db.session() as s:
        rows = {k: (st, code) for k, st, code in s.execute(
            select(Build.build_key, Build.state, Build.error_code).where(Build.build_key.in_(keys)))}
    return any(k not in rows or (rows[k][0] == "failed" and rows[k][1] not in DETERMINISTIC_FAILURES) for k in keys)


def _stored(store: Any, digest: str, size: int) -> bool:
    from farm.errors import BlobNotFound

    try:
        return bool(store.stat(digest).size == size)
    except BlobNotFound:
        return False


def _status(session: Any, release_id: int, builds: list[Any]) -> ReleaseStatus:
    from registry.index import artifact_for_build
    from registry.models import Release

    rel = session.get(Release, release_id)
    st = ReleaseStatus(release_id, rel.label if rel else "")
    for b in builds:
        art = artifact_for_build(session, b.id) if b.state == "succeeded" else None
        st.builds.append({
            "build": b.id, "target": f"{b.backend}:{b.target}", "toolchain": b.toolchain, "state": b.state,
            "attempts": b.attempts, "error_code": b.error_code, "error_message": b.error_message,
            "artifact": art.digest if art else None, "compile_seconds": art.compile_seconds if art else None,
            "worker": b.worker,
        })
    return st


def release_status(settings: Settings, release_id: int, registry: Any = None) -> ReleaseStatus:
    from registry.index import Registry, release_builds
    from registry.models import Release

    reg = registry or Registry.open(settings)
    try:
        with reg.db.session() as s:
            if s.get(Release, release_id) is None:
                from farm.errors import NotFoundError

                raise NotFoundError(f"no release {release_id}")
            return _status(s, release_id, release_builds(s, release_id))
    finally:
        if registry is None:
            reg.close()


def wait_release(settings: Settings, release_id: int, *, timeout: float | None = None, poll: float = 1.0,
                 on_change: Callable[[ReleaseStatus], None] | None = None, registry: Any = None) -> ReleaseStatus:
    """Poll SQL until every build of the release is final (fan-in in SQL, not chords)."""
    from registry.index import Registry

    reg = registry or Registry.open(settings)
    deadline = None if timeout is None else time.monotonic() + timeout
    last: Any = None
    try:
        while True:
            st = release_status(settings, release_id, registry=reg)
            snapshot = [(b["build"], b["state"], b["attempts"]) for b in st.builds]
            if snapshot != last and on_change:
                on_change(st)
            last = snapshot
            if st.done:
                return st
            if deadline is not None and time.monotonic() > deadline:
                from farm.errors import CompileTimeoutError

                raise CompileTimeoutError(f"release {release_id} not finished after {timeout:g} s",
                                          hint=f"it keeps running; `farm status {release_id}` shows progress")
            time.sleep(poll)
    finally:
        if registry is None:
            reg.close()


def validate_sdks(sdks: Sequence[str]) -> None:
    import re

    for v in sdks:
        if not re.fullmatch(r"\d+(\.\d+){1,3}", v):
            raise BadOptionsError(f"--sdk {v!r} is not a version like 2.51.0")
