"""device lab reports bump a model's generation through model_generation_bump()

Migration 0017's PostgreSQL trigger function ``device_lab_generation_trigger`` wrote its own
``INSERT ... ON CONFLICT`` on ``model_generations``: a second copy of what the SQL function
``model_generation_bump(model)`` (registry.coverage_sql, made by migration 0008) does for
artifacts, verdicts and device reports. Its body now calls that function, so how a generation is
bumped is said once. Same trigger, same rows bumped: a report on an artifact (inserted, struck,
deleted) bumps the artifact's model, a row whose artifact is gone bumps nothing.

SQLite has no stored functions: its triggers (0017's) are left as they are. No table or column:
``alembic check`` has nothing to compare.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 22:10:00.000000
"""

from __future__ import annotations

from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None

# The statements are kept here, not imported: a migration says what it did when it ran.
# CREATE OR REPLACE keeps the function's identity, so the two triggers 0017 made stay bound to it.
_UPGRADE = """CREATE OR REPLACE FUNCTION device_lab_generation_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  aid integer;
BEGIN
  IF TG_OP = 'DELETE' THEN
    aid := OLD.artifact_id;
  ELSE
    aid := NEW.artifact_id;
  END IF;
  PERFORM model_generation_bump(a.model_digest) FROM artifacts a WHERE a.id = aid;
  RETURN NULL;
END $$"""

# 0017's body, word for word.
_DOWNGRADE = """CREATE OR REPLACE FUNCTION device_lab_generation_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  aid integer;
BEGIN
  IF TG_OP = 'DELETE' THEN
    aid := OLD.artifact_id;
  ELSE
    aid := NEW.artifact_id;
  END IF;
  INSERT INTO model_generations (model_digest, generation)
    SELECT a.model_digest, 1 FROM artifacts a WHERE a.id = aid
  ON CONFLICT (model_digest) DO UPDATE SET generation = model_generations.generation + 1;
  RETURN NULL;
END $$"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_UPGRADE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_DOWNGRADE)
