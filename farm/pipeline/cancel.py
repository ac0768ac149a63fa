"""``farm cancel RELEASE | --build ID`` (and ``POST /v1/{releases,builds}/ID/cancel``): stop
queued and running builds, embedded or in the cluster, through the one guarded transition
(``states.cancel``).

A queued build becomes ``failed`` with code ``cancelled`` at once; its broker message, if a worker
takes it later, finds the row final and is acknowledged and dropped (no revoke by task id is
needed: tasks are sent by name and reload their row). A running build is changed the same way;
the executor running it finds its lease gone at its next renewal (every few seconds,
``execute.LeaseKeeper``), kills the compile child and publishes nothing. ``cancelled`` is not a
deterministic failure: submitting the same build again queues it again.
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
    now: str  # "cancelled", or the final state it already had

    def to_dict(self) -> dict[str, Any]:
        return {"build": self.build, "was": self.was, "now": self.now}


def cancel(settings: Settings, *, release_id: int | None = None, build_id: int | None = None,
           registry: Registry | None = None, reason: str = "farm cancel") -> list[Cancelled]:
    """Cancel one build, or every build of a release (a build the release shares with another
    release is cancelled for both: it is one build)."""
    from sqlalchemy import select

    from farm.core.errors import NotFoundError, UsageError
    from registry.models import Release, ReleaseBuild

    if (release_id is None) == (build_id is None):
        raise UsageError("cancel a release or a build", hint="farm cancel RELEASE_ID, or farm cancel --build BUILD_ID")
    own = registry is None
    reg = registry or Registry.open(settings)
    try:
        with reg.db.session() as s:
            if release_id is not None:
                if s.get(Release, release_id) is None:
                    raise NotFoundError(f"no release {release_id}", hint="`farm submit` prints a release's id")
                ids = list(s.scalars(select(ReleaseBuild.build_id).where(ReleaseBuild.release_id == release_id)
                                     .order_by(ReleaseBuild.build_id)))
            else:
                assert build_id is not None
                ids = [states.get_build(s, build_id).id]
        out: list[Cancelled] = []
        events = Publisher(settings.broker_url)
        for bid in ids:
            with reg.db.session() as s:
                was = str(states.get_build(s, bid).state)
                now = states.cancel(s, bid, reason)
            out.append(Cancelled(bid, was, now))
            if now == "cancelled":
                events.publish(bid, states.BuildState.FAILED.value)  # long polls answer at once
        return out
    finally:
        if own:
            reg.close()
