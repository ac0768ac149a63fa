"""``farm cancel RELEASE | --build ID`` (and ``POST /v1/{releases,builds}/ID/cancel``): stop
queued and running builds, embedded or in the cluster, through the one guarded transition
(``states.cancel``).

A queued build becomes ``failed`` with code ``cancelled`` at once; its broker message, if a worker
takes it later, finds the row final and is acknowledged and dropped (no revoke by task id is
needed: tasks are sent by name and reload their row). A running build is changed the same way;
the executor running it finds its lease gone at its next renewal (every few seconds,
``execute.LeaseKeeper``), kills the compile child and publishes nothing. ``cancelled`` is not a
deterministic failure: submitting the same build again queues it again.

A genai package's release also cancels its packages' twin builds (the parts compiled alone for
the twin check, sent at submit; ``farm.pipeline.genai.twin_builds.cancel_twins``) that no live
release waits on, the same way; a published package's twin left pending is recorded cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from farm.core.settings import Settings
from farm.pipeline import states
from farm.pipeline.events import Publisher
from registry.index import Registry


@dataclass(frozen=True)
class Cancelled:
    build: int
    was: str  # the state read before cancelling
    now: str  # "cancelled", "kept" (another release still wants it), or the final state it already had
    twin: bool = False  # ``build`` is a genai part's twin build (its own table and ids)

    def to_dict(self) -> dict[str, Any]:
        if self.twin:
            return {"twin_build": self.build, "was": self.was, "now": self.now}
        return {"build": self.build, "was": self.was, "now": self.now}


def cancel(settings: Settings, *, release_id: int | None = None, build_id: int | None = None,
           registry: Registry | None = None, reason: str = "farm cancel", caller: int | None = None,
           admin: bool = True) -> list[Cancelled]:
    """Cancel one build, or every build of a release. ``caller``/``admin``: the token asking
    through the service (a local ``farm cancel`` is admin). A release is cancelled by its owner or
    an admin; to anyone else it does not exist (``not-found``). A cancelled release no longer
    wants its builds; a build another release still wants is kept (``now: kept``) and cancelled
    when the last release that wants it is. ``--build`` by an admin cancels the build outright;
    by a submit token only when every release still wanting it is that token's (else ``kept``),
    and not at all (``not-found``) when none of them is."""
    from sqlalchemy import select, update

    from farm.core.errors import NotFoundError, UsageError
    from registry.models import Release, ReleaseBuild

    if (release_id is None) == (build_id is None):
        raise UsageError("cancel a release or a build", hint="farm cancel RELEASE_ID, or farm cancel --build BUILD_ID")
    own = registry is None
    reg = registry or Registry.open(settings)
    try:
        with reg.db.session() as s:
            if release_id is not None:
                release = s.get(Release, release_id)
                if release is None or not (admin or release.owner_token_id == caller):
                    raise NotFoundError(f"no release {release_id}", hint="`farm submit` prints a release's id "
                                                                         "(a token sees only its own releases)")
                # Guarded: a second cancel finds it cancelled and changes nothing. A genai package's
                # part releases (made by its submission, for it alone) go with it: else they would
                # still want the parts' builds, kept compiling for a package that is cancelled.
                parts = [int(p) for p in (release.matrix or {}).get("part_releases") or []]
                s.execute(update(Release).where(Release.id.in_([release_id, *parts]), Release.cancelled_at.is_(None))
                          .values(cancelled_at=states.now()).execution_options(synchronize_session=False))
                ids = list(s.scalars(select(ReleaseBuild.build_id).where(ReleaseBuild.release_id == release_id)
                                     .order_by(ReleaseBuild.build_id)))
            else:
                assert build_id is not None
                ids = [states.get_build(s, build_id).id]
                if not admin:
                    owners = _wanting(s, build_id, live_only=False)
                    if caller not in owners:
                        raise NotFoundError(f"no build {build_id}", hint="`farm status RELEASE` lists a release's "
                                                                         "builds (a token sees only its own)")
        out: list[Cancelled] = []
        events = Publisher(settings.broker_url)
        for bid in ids:
            with reg.db.session() as s:
                was = str(states.get_build(s, bid).state)
                if was in ("queued", "running") and _kept(s, bid, build_id is not None, admin, caller):
                    out.append(Cancelled(bid, was, "kept"))
                    continue
                now = states.cancel(s, bid, reason)
            out.append(Cancelled(bid, was, now))
            if now == "cancelled":
                events.publish(bid, states.BuildState.FAILED.value)  # long polls answer at once
        if release_id is not None:
            out += _cancel_twins(reg, ids, reason)
        return out
    finally:
        if own:
            reg.close()


def _wanting(s: Any, build_id: int, *, live_only: bool) -> list[int | None]:
    """The owners of the releases that want ``build_id`` (live: not cancelled)."""
    from sqlalchemy import select

    from registry.models import Release, ReleaseBuild

    q = (select(Release.owner_token_id).join(ReleaseBuild, ReleaseBuild.release_id == Release.id)
         .where(ReleaseBuild.build_id == build_id))
    if live_only:
        q = q.where(Release.cancelled_at.is_(None))
    return list(s.scalars(q))


def _kept(s: Any, build_id: int, by_build: bool, admin: bool, caller: int | None) -> bool:
    """Whether a release the cancel does not speak for still wants the build."""
    if by_build:
        return not admin and any(o != caller for o in _wanting(s, build_id, live_only=True))
    return bool(_wanting(s, build_id, live_only=True))  # the cancelled release is no longer live


def _cancel_twins(reg: Registry, build_ids: list[int], reason: str) -> list[Cancelled]:
    """The twin builds of the genai package builds among ``build_ids`` that no live release
    waits on, cancelled (after the builds: a package cancelled first publishes nothing)."""
    from farm.pipeline.genai.twin_builds import cancel_twins

    with reg.db.session() as s:
        packages = [b for b in build_ids if states.part_builds(s, b) is not None]
        if not packages:
            return []
        return [Cancelled(t, was, now, twin=True) for t, was, now in cancel_twins(s, packages, reason)]
