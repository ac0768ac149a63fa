"""Tags that ``farm promote`` moved: they move only by promote or rollback until ``farm tag --ungate``
(``registry.index.set_tag`` and ``delete_tag`` ask here; ``registry.promotion`` sets and lifts the gate)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from farm.core.errors import TagGatedError
from registry.models import TagGate


def gated(session: Session, name: str, tag: str) -> bool:
    return session.scalar(select(TagGate.id).where(TagGate.name == name, TagGate.tag == tag)) is not None


def check_not_gated(session: Session, name: str, tag: str) -> None:
    """Refuse a plain tag move of a tag promote moved."""
    if gated(session, name, tag):
        raise TagGatedError(f"{name}:{tag} was moved by farm promote: it moves only on evidence",
                            hint=f"farm promote NAME:FROM --to {tag}, farm promote --rollback {name}:{tag}, or "
                                 f"farm tag --ungate {name}:{tag} first")
