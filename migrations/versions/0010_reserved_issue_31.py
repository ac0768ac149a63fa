"""device evidence: platform, independence, withdrawal (issue 31)

Reserved in the chain so that the round's issues can each add schema without renumbering; until
its issue fills it in, it changes nothing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 22:10:00.000000
"""

from __future__ import annotations

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
