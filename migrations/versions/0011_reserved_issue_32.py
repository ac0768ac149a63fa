"""ownership and per-token quotas (issue 32)

Reserved in the chain so that the round's issues can each add schema without renumbering; until
its issue fills it in, it changes nothing.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 22:10:00.000000
"""

from __future__ import annotations

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
