"""build compatibility strings and ORT model packages (issue 30)

Reserved in the chain so that the round's issues can each add schema without renumbering; until
its issue fills it in, it changes nothing.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 22:10:00.000000
"""

from __future__ import annotations

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
