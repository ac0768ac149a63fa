"""Times as every front door writes them: ISO 8601 in UTC with a ``Z`` (RFC 3339).

The index stores aware UTC datetimes; SQLite hands them back naive, so a naive datetime is UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime


def utc(dt: datetime) -> datetime:
    """``dt`` as an aware UTC datetime (naive means UTC: what SQLite returns)."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def iso(dt: datetime | None) -> str | None:
    """``2026-11-22T07:07:56Z`` (whole seconds), or None."""
    if dt is None:
        return None
    return utc(dt).isoformat(timespec="seconds").replace("+00:00", "Z")


def human(dt: datetime | None) -> str:
    """``2026-11-22 07:07 UTC`` for text output; empty for None."""
    return "" if dt is None else utc(dt).strftime("%Y-%m-%d %H:%M UTC")
