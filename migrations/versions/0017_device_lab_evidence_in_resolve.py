"""device lab evidence in resolve's answer: its cached answers follow the lab's reports

Resolve's answer now carries what enrolled devices confirmed of the artifact (``device_lab``) and,
with FARM_RESOLVE_PREFER_FASTEST, may pick the artifact they measured fastest
(``registry.lab``, ``registry.resolve._lab``). The service keeps answers per model generation
(``model_generations``): a report accepted (``device_verifications`` insert), struck (its device
revoked: ``struck_at`` set) or deleted bumps the generation of the artifact's model, so the next
question reads them. The lab's reports come at the pace of verification jobs, not a fleet's:
each bumps.

Triggers only (no table or column): ``alembic check`` has nothing to compare.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 18:10:00.000000
"""

from __future__ import annotations

from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

# The statements are kept here, not imported: a migration says what it did when it ran.
_PG = [
    """CREATE FUNCTION device_lab_generation_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
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
END $$""",
    "CREATE TRIGGER device_lab_generation AFTER INSERT OR DELETE ON device_verifications"
    " FOR EACH ROW EXECUTE FUNCTION device_lab_generation_trigger()",
    "CREATE TRIGGER device_lab_generation_struck AFTER UPDATE OF struck_at ON device_verifications FOR EACH ROW"
    " WHEN (OLD.struck_at IS DISTINCT FROM NEW.struck_at) EXECUTE FUNCTION device_lab_generation_trigger()",
]


def _sqlite_bump(row: str) -> str:
    # As migration 0008's model_generation_bumps: a row made at 0, then counted up (no UPSERT in
    # a trigger body on every SQLite this runs on).
    model = f"(SELECT a.model_digest FROM artifacts a WHERE a.id = {row}.artifact_id)"
    return (f" INSERT INTO model_generations (model_digest, generation) SELECT {model}, 0"
            f" WHERE {model} IS NOT NULL AND NOT EXISTS (SELECT 1 FROM model_generations WHERE model_digest = {model});"
            f" UPDATE model_generations SET generation = generation + 1 WHERE model_digest = {model};")


_SQLITE = [
    f"CREATE TRIGGER device_lab_generation_insert AFTER INSERT ON device_verifications BEGIN{_sqlite_bump('NEW')} END",
    f"CREATE TRIGGER device_lab_generation_delete AFTER DELETE ON device_verifications BEGIN{_sqlite_bump('OLD')} END",
    "CREATE TRIGGER device_lab_generation_struck AFTER UPDATE OF struck_at ON device_verifications"
    f" WHEN OLD.struck_at IS NOT NEW.struck_at BEGIN{_sqlite_bump('NEW')} END",
]


def upgrade() -> None:
    for statement in (_PG if op.get_bind().dialect.name == "postgresql" else _SQLITE):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS device_lab_generation_struck ON device_verifications")
        op.execute("DROP TRIGGER IF EXISTS device_lab_generation ON device_verifications")
        op.execute("DROP FUNCTION IF EXISTS device_lab_generation_trigger()")
    else:
        for name in ("device_lab_generation_insert", "device_lab_generation_delete", "device_lab_generation_struck"):
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
