"""The twin's figures on a published genai package (its artifact's ``description["twin"]``): read
(``twin_of``, ``twin_status``) and written (``record_twin``), ``pending`` at publication, what a
twin that raised records. Below both the twin check (``twin``) and the twin builds
(``twin_builds``), which read and write them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def _description(reg: Any, artifact: str) -> dict[str, Any] | None:
    from registry.index import find_artifact

    with reg.db.session() as s:
        return find_artifact(s, artifact).description


def twin_pending() -> dict[str, Any]:
    """The twin of a package published before its twin ran (``farm show``: ``twin pending``)."""
    return {"status": "pending", "since": datetime.now(UTC).isoformat(timespec="seconds"),
            "detail": "published; the twin (the parts compiled without sharing, run on the simulator) runs after "
                      "publication: farm build --genai of the same export runs it if none is running"}


def twin_cancelled(reason: str) -> dict[str, Any]:
    """The twin of a published package whose release was cancelled before its twin was
    recorded: ``unverified`` and ``cancelled``, the twin not run rather than left ``pending``
    (``farm show`` says why); like a cancelled build, not a verdict: the package's next
    submission runs it (``twin_to_run``; on a cluster ``twin_builds.reopen_cancelled_twin``)."""
    return {"status": "unverified", "cancelled": True,
            "detail": f"cancelled ({reason}) at {datetime.now(UTC).isoformat(timespec='seconds')} before the twin "
                      "ran; submitting the package again runs it"}


def twin_to_run(description: dict[str, Any] | None) -> bool:
    """Whether a published package's twin is still to run: ``pending``, or cancelled."""
    tw = twin_of(description)
    return tw is not None and (tw.get("status") == "pending" or tw.get("cancelled") is True)


def twin_status(description: dict[str, Any] | None) -> str | None:
    """``pending``, ``ok``, ``unverified``, ``runtime-crashed``; None: no twin was asked for."""
    tw = twin_of(description)
    return str(tw.get("status")) if tw is not None else None


def raised_twin(what: str, exc: BaseException) -> dict[str, Any]:
    """The twin of a package whose twin (``what`` of it) raised: ``unverified`` with what it raised."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return {"status": "unverified", "detail": f"internal-error: {what + ' raised ' if what else ''}"
                                              f"{type(exc).__name__}: {first}"}


def record_twin(reg: Any, artifact: str, tw: dict[str, Any]) -> None:
    """The twin's figures on a published package (its description's ``twin``)."""
    from registry.index import find_artifact

    with reg.db.session() as s:
        art = find_artifact(s, artifact)
        art.description = {**(art.description or {}), "twin": tw}


def twin_of(description: dict[str, Any] | None) -> dict[str, Any] | None:
    """The twin's figures of an artifact (None: not a genai package, or no twin ran)."""
    if not isinstance(description, dict):
        return None
    tw = description.get("twin")
    return tw if isinstance(tw, dict) else None
