"""The SQL that keeps the coverage summary and the resolve generations up to date: trigger bodies
for PostgreSQL (PL/pgSQL functions) and SQLite (INSTEAD OF triggers on two views, SQLite's only
way to call a block of statements), from one template, and the full recompute.

Why triggers: a cell changes when a build changes state, an artifact is inserted, deleted or
marked broken, a probe verdict or a device report is recorded, through the ORM, the bare connections of the fast paths
(``registry.lite``) or by hand. A trigger sees every one of them in the writer's own transaction;
an application hook would have to be remembered at each.

One touch of a cell (model, backend, target, toolchain):

1. (PostgreSQL) take a transaction lock on (model, backend, target): every toolchain's cell of it
   and its "wanted" mark change under it, and the statements after the lock see what the previous
   holder committed (READ COMMITTED: a fresh snapshot per statement);
2. append the change of the summary counters, new minus old, to ``coverage_deltas`` (nothing
   when nothing changed): an append, so builds finishing together never queue on a counter row;
3. replace the cell row by its recompute from the builds (a few rows, by index).

A cell's state: built (a succeeded build whose artifact is not broken), else building (queued or
running), else broken, else failed: the order ``registry.coverage`` has always shown.

A multi-SoC QNN build (target ``SM8650+SM8750``, docs/groups.md; migration 0009) has no cell of its own:
it counts in the cell of each SoC it names, beside that SoC's own builds, and a change of it
touches each of those cells. A device report on it verifies only the cell of the SoC the device
has (the other SoCs were not loaded).
"""

from __future__ import annotations

# Counters of coverage_deltas, the summary's columns, per scope ('' the whole farm, ``tag:T`` the
# models with a NAME:T). ``cells``: (model, target, toolchain) cells
# with any build; ``wanted``: models with a build for the target on any toolchain, counted on the
# (backend, target) (a delta row carries it on the toolchain whose touch changed it).
COUNTERS = ("cells", "built", "building", "broken", "failed", "probe_verified", "device_verified", "wanted")

# Per cell, from its builds (``b``) and their artifacts (``a``); ``t`` is the cell's target (a
# SoC; ``b.target`` may be a multi-SoC target naming it): device-verified when a device of that
# SoC reported (registry.reports: admitted, not struck) that it loaded the artifact (migration
# 0010: the report's own SoC, never the build's). No column newer than 0008 here: the migrations
# before 0010 run this code too.
def cell_counts(t: str) -> str:
    return f"""
count(*) AS builds,
coalesce(sum(CASE WHEN b.state = 'succeeded' AND coalesce(a.status, 'active') = 'active' THEN 1 ELSE 0 END), 0)
  AS succeeded,
coalesce(sum(CASE WHEN b.state IN ('queued', 'running') THEN 1 ELSE 0 END), 0) AS building,
coalesce(sum(CASE WHEN b.state = 'failed' THEN 1 ELSE 0 END), 0) AS failed,
coalesce(sum(CASE WHEN b.state = 'succeeded' AND a.status = 'broken' THEN 1 ELSE 0 END), 0) AS broken,
coalesce(sum(CASE WHEN b.state = 'succeeded' AND a.status = 'active' AND EXISTS (
  SELECT 1 FROM compat_verdicts v WHERE v.artifact_id = a.id AND v.source = 'probe' AND v.verdict = 'loads')
  THEN 1 ELSE 0 END), 0) AS probe_verified,
coalesce(sum(CASE WHEN b.state = 'succeeded' AND a.status = 'active' AND EXISTS (
  SELECT 1 FROM device_reports r WHERE r.artifact_id = a.id AND r.outcome = 'loads' AND r.revoked_at IS NULL
  AND r.soc = {t})
  THEN 1 ELSE 0 END), 0) AS device_verified"""


def covers(t: str, dialect: str) -> str:
    """SQL: build ``b`` counts in the cell of target ``t``: its own target, or a multi-SoC QNN
    target that names ``t`` between its '+'s (a substring test, no pattern characters)."""
    find = "strpos" if dialect == "postgresql" else "instr"
    return (f"(b.target = {t} OR (b.backend = 'qnn' AND {find}('+' || b.target || '+', '+' || {t} || '+') > 0"
            f" AND {find}(b.target, '+') > 0))")


def covered(be: str, t: str, dialect: str) -> tuple[str, str]:
    """A FROM item that lists the cell targets a build or artifact (backend ``be``, target ``t``)
    counts in, and its column: the SoCs of a multi-SoC QNN target, else the target itself."""
    if dialect == "postgresql":
        return (f"unnest(CASE WHEN {be} = 'qnn' THEN string_to_array({t}, '+')"
                f" ELSE ARRAY[{t}::text] END) AS s(target)", "s.target")
    # SQLite: split through JSON (json_each is a table-valued function, allowed in triggers where
    # a recursive WITH is not); quotes and backslashes escaped first so any target parses.
    escaped = f"replace(replace({t}, '\\', '\\\\'), '\"', '\\\"')"
    return (f"json_each(CASE WHEN {be} = 'qnn' THEN '[\"' || replace({escaped}, '+', '\",\"') || '\"]'"
            f" ELSE json_array({t}) END) AS s", "s.value")


_STATE = ("CASE WHEN r.succeeded > 0 THEN 'built' WHEN r.building > 0 THEN 'building'"
          " WHEN r.broken > 0 THEN 'broken' ELSE 'failed' END")

CELL_COLUMNS = ("state", "builds", "succeeded", "building", "failed", "broken", "probe_verified", "device_verified")


def _contribution_parts(alias: str) -> list[tuple[str, str]]:
    """(expression, counter) of the summary counters of the cell rows ``alias``."""
    def n(cond: str) -> str:
        return f"coalesce(sum(CASE WHEN {cond} THEN 1 ELSE 0 END), 0)"
    s = f"{alias}.state"
    return [("count(*)", "cells"),
            (n(f"{s} = 'built'"), "built"),
            (n(f"{s} = 'building'"), "building"),
            (n(f"{s} = 'broken'"), "broken"),
            (n(f"{s} = 'failed'"), "failed"),
            (n(f"{s} = 'built' AND {alias}.probe_verified > 0"), "probe_verified"),
            (n(f"{s} = 'built' AND {alias}.device_verified > 0"), "device_verified")]


def _contribution(alias: str) -> str:
    """The summary counters of the cell rows ``alias`` (zero or one row here; many in rebuild)."""
    return ", ".join(f"{expr} AS {name}" for expr, name in _contribution_parts(alias))


def _scopes(m: str) -> str:
    """The summary scopes a model's cells count in: the whole farm ('') and ``tag:T`` for each
    TAG of its NAME:TAGs (a channel such as ``stable``)."""
    return f"SELECT '' AS scope UNION SELECT DISTINCT 'tag:' || tag FROM tags WHERE model_digest = {m}"


def tag_statements(m: str, tag: str, sign: int) -> list[str]:
    """A model gains (``sign`` 1) or loses (-1) a tag scope: its cells' counters and its wanted
    marks added to or taken from ``tag:TAG``. Runs only when the change made the model's first
    row with that TAG, or removed its last (the guard counts the rows after the change)."""
    after = f"(SELECT count(*) FROM tags WHERE model_digest = {m} AND tag = {tag}) = {1 if sign > 0 else 0}"
    cols = ", ".join(COUNTERS)
    signed = ", ".join(f"{'' if sign > 0 else '-'}{expr}" for expr, _ in _contribution_parts("c"))
    zeros = ", ".join("0" for _ in COUNTERS[1:-1])
    return [
        f"INSERT INTO coverage_deltas (scope, backend, target, toolchain, {cols})"
        f" SELECT 'tag:' || {tag}, c.backend, c.target, c.toolchain, {signed}, 0 FROM coverage_cells c"
        f" WHERE c.model_digest = {m} AND {after} GROUP BY c.backend, c.target, c.toolchain",
        f"INSERT INTO coverage_deltas (scope, backend, target, toolchain, {cols})"
        f" SELECT 'tag:' || {tag}, c.backend, c.target, '', 0, {zeros}, {sign} FROM coverage_cells c"
        f" WHERE c.model_digest = {m} AND {after} GROUP BY c.backend, c.target",
    ]


def touch_statements(m: str, be: str, tg: str, tc: str, dialect: str) -> list[str]:
    """The statements of one touch, the key given as SQL expressions (parameters, NEW.x); ``tg``
    is a cell's target (a SoC, never a multi-SoC target)."""
    key = f"model_digest = {m} AND backend = {be} AND target = {tg} AND toolchain = {tc}"
    # By the index (model_digest, backend, target) on its first two columns: a model's builds.
    recompute = (f"SELECT {cell_counts(tg)} FROM builds b LEFT JOIN artifacts a ON a.build_id = b.id"
                 f" WHERE b.model_digest = {m} AND b.backend = {be} AND {covers(tg, dialect)} AND b.toolchain = {tc}")
    new_cell = f"SELECT {_STATE} AS state, r.* FROM ({recompute}) r WHERE r.builds > 0"
    pair = f"model_digest = {m} AND backend = {be} AND target = {tg}"
    wanted_new = (f"CASE WHEN n.cells > 0 OR EXISTS (SELECT 1 FROM coverage_cells WHERE {pair}"
                  f" AND toolchain <> {tc}) THEN 1 ELSE 0 END")
    wanted_old = f"CASE WHEN EXISTS (SELECT 1 FROM coverage_cells WHERE {pair}) THEN 1 ELSE 0 END"
    diffs = [f"n.{c} - o.{c} AS d_{c}" for c in COUNTERS if c != "wanted"]
    diffs.append(f"{wanted_new} - {wanted_old} AS d_wanted")
    delta = (
        f"INSERT INTO coverage_deltas (scope, backend, target, toolchain, {', '.join(COUNTERS)})"
        f" SELECT sc.scope, {be}, {tg}, {tc}, {', '.join('d.d_' + c for c in COUNTERS)} FROM ("
        f"SELECT {', '.join(diffs)}"
        f" FROM (SELECT {_contribution('x')} FROM ({new_cell}) x) n,"
        f" (SELECT {_contribution('y')} FROM coverage_cells y WHERE y.{key.replace(' AND ', ' AND y.')}) o) d,"
        f" ({_scopes(m)}) sc"
        f" WHERE {' OR '.join(f'd.d_{c} <> 0' for c in COUNTERS)}"
    )
    replace = (
        f"INSERT INTO coverage_cells (model_digest, backend, target, toolchain, {', '.join(CELL_COLUMNS)})"
        f" SELECT {m}, {be}, {tg}, {tc}, {', '.join('c.' + c for c in CELL_COLUMNS)} FROM ({new_cell}) c"
    )
    return [delta, f"DELETE FROM coverage_cells WHERE {key}", replace]


def cells_recompute(dialect: str) -> str:
    """Every cell recomputed from the builds: (model_digest, backend, target, toolchain, state,
    counts...), a multi-SoC build in each of its SoCs' cells."""
    item, col = covered("b.backend", "b.target", dialect)
    # Each (build, SoC) once: a hand-written SM8650+SM8650 counts its build once, as a touch does.
    pairs = f"SELECT DISTINCT b.id AS build_id, {col} AS target FROM builds b CROSS JOIN {item}"
    recompute = (f"SELECT b.model_digest, b.backend, bt.target, b.toolchain, {cell_counts('bt.target')}"
                 f" FROM ({pairs}) bt JOIN builds b ON b.id = bt.build_id LEFT JOIN artifacts a ON a.build_id = b.id"
                 " GROUP BY b.model_digest, b.backend, bt.target, b.toolchain")
    return (f"SELECT r.model_digest, r.backend, r.target, r.toolchain, {_STATE},"
            f" {', '.join('r.' + c for c in CELL_COLUMNS[1:])} FROM ({recompute}) r")


def rebuild(dialect: str) -> list[str]:
    """Recompute every cell and the summary from the builds (the migrations, the bench's bulk
    load, and the tests' oracle: incremental must equal this)."""
    zeros = ", ".join("0" for _ in COUNTERS[1:-1])
    return [
        "DELETE FROM coverage_cells",
        "DELETE FROM coverage_deltas",
        f"INSERT INTO coverage_cells (model_digest, backend, target, toolchain, {', '.join(CELL_COLUMNS)})"
        f" {cells_recompute(dialect)}",
        f"INSERT INTO coverage_deltas (scope, backend, target, toolchain, {', '.join(COUNTERS)})"
        f" SELECT '', c.backend, c.target, c.toolchain, {_contribution('c')}, 0 FROM coverage_cells c"
        " GROUP BY c.backend, c.target, c.toolchain",
        f"INSERT INTO coverage_deltas (scope, backend, target, toolchain, {', '.join(COUNTERS)})"
        f" SELECT '', c.backend, c.target, '', 0, {zeros}, count(DISTINCT c.model_digest) FROM coverage_cells c"
        " GROUP BY c.backend, c.target",
        f"INSERT INTO coverage_deltas (scope, backend, target, toolchain, {', '.join(COUNTERS)})"
        f" SELECT 'tag:' || t.tag, c.backend, c.target, c.toolchain, {_contribution('c')}, 0"
        f" FROM coverage_cells c JOIN ({_MODEL_TAGS}) t ON t.model_digest = c.model_digest"
        " GROUP BY t.tag, c.backend, c.target, c.toolchain",
        f"INSERT INTO coverage_deltas (scope, backend, target, toolchain, {', '.join(COUNTERS)})"
        f" SELECT 'tag:' || t.tag, c.backend, c.target, '', 0, {zeros}, count(DISTINCT c.model_digest)"
        f" FROM coverage_cells c JOIN ({_MODEL_TAGS}) t ON t.model_digest = c.model_digest"
        " GROUP BY t.tag, c.backend, c.target",
    ]


_MODEL_TAGS = "SELECT DISTINCT model_digest, tag FROM tags"


# ---- device reports: touch and bump only on what can change, at fleet rate ---------------------------
#
# A fleet sends reports by the thousand: a touch (locks, a delta, a cell rewrite) and a generation
# bump (every cached resolve answer of the model dropped) per report row was most of what a
# report cost the database, and what made resolve's tail grow while reports arrived. A report row
# changes a coverage cell only when it is the first live ``loads`` of its (artifact, SoC) (the
# lowest id: in a multi-row insert the triggers see the whole statement), or when an update
# changes its outcome, SoC or whether it is struck; it can change a resolve answer only when
# another token has a live report in its (artifact, runtime, SoC) group: device evidence counts
# from two distinct tokens on (registry.reports.MIN_TOKENS), so one token's reports never move it.
# No column newer than 0008 is named here: the migrations before 0010 run this code too.

def _first_live_loads(row: str) -> str:
    return (f"{row}.outcome = 'loads' AND {row}.revoked_at IS NULL AND NOT EXISTS (SELECT 1 FROM device_reports r"
            f" WHERE r.artifact_id = {row}.artifact_id AND r.soc = {row}.soc AND r.outcome = 'loads'"
            f" AND r.revoked_at IS NULL AND r.id < {row}.id)")


def _another_token(row: str) -> str:
    # Two range seeks on ix_device_reports_group_token (below and above this token), not a scan of
    # every report of one token.
    group = (f"SELECT 1 FROM device_reports r WHERE r.artifact_id = {row}.artifact_id"
             f" AND r.runtime_backend = {row}.runtime_backend AND r.runtime_version = {row}.runtime_version"
             f" AND r.soc = {row}.soc AND r.revoked_at IS NULL AND r.token_id")
    return f"(EXISTS ({group} < {row}.token_id) OR EXISTS ({group} > {row}.token_id))"


def _report_changed(distinct: str) -> str:
    return (f"(OLD.outcome {distinct} NEW.outcome OR OLD.soc {distinct} NEW.soc"
            f" OR (OLD.revoked_at IS NULL) <> (NEW.revoked_at IS NULL))")


# ---- PostgreSQL ---------------------------------------------------------------------------------

_PG_FUNCTIONS = ("coverage_touch(varchar, varchar, varchar, varchar)",
                 "coverage_touch_build(varchar, varchar, varchar, varchar)", "model_generation_bump(varchar)",
                 "coverage_builds_trigger()", "coverage_artifacts_trigger()", "coverage_verdicts_trigger()",
                 "coverage_reports_trigger()", "coverage_tags_trigger()",
                 "coverage_signatures_trigger()")
_PG_TRIGGERS = (("coverage_builds", "builds"), ("coverage_builds_state", "builds"),
                ("coverage_artifacts", "artifacts"), ("coverage_artifacts_status", "artifacts"),
                ("coverage_verdicts", "compat_verdicts"), ("coverage_reports", "device_reports"),
                ("coverage_signatures", "signatures"), ("coverage_tags", "tags"))

# A build moving between queued and running leaves its cell "building": no touch (claims and
# lease renewals stay as cheap as before).
_STATE_CLASS_CHANGED = ("OLD.state IS DISTINCT FROM NEW.state"
                        " AND NOT (OLD.state IN ('queued', 'running') AND NEW.state IN ('queued', 'running'))")


def _pg_install() -> list[str]:
    body = ";\n  ".join(touch_statements("p_model", "p_backend", "p_target", "p_toolchain", "postgresql"))
    item, col = covered("p_backend", "p_target", "postgresql")
    return [
        f"""CREATE FUNCTION coverage_touch(p_model varchar, p_backend varchar, p_target varchar,
                                          p_toolchain varchar) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF p_model IS NULL THEN
    RETURN;
  END IF;
  -- Shared on the model (a tag change takes it exclusively: its scopes then stand still), then one
  -- lock per (model, backend, target): its cells and its wanted mark change under it.
  PERFORM pg_advisory_xact_lock_shared(hashtext('ctxfarm.coverage.model'), hashtext(p_model));
  PERFORM pg_advisory_xact_lock(hashtext('ctxfarm.coverage'), hashtext(p_model || '/' || p_backend || '/' || p_target));
  {body};
END $$""",
        # A build's or artifact's target: each SoC's cell, in name order (two transactions touching
        # cells of one model take the locks in the same order).
        f"""CREATE FUNCTION coverage_touch_build(p_model varchar, p_backend varchar, p_target varchar,
                                                p_toolchain varchar) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  t varchar;
BEGIN
  FOR t IN SELECT DISTINCT {col} FROM {item} ORDER BY 1 LOOP
    PERFORM coverage_touch(p_model, p_backend, t, p_toolchain);
  END LOOP;
END $$""",
        f"""CREATE FUNCTION coverage_tags_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND OLD.model_digest = NEW.model_digest AND OLD.tag = NEW.tag THEN
    RETURN NULL;
  END IF;
  IF TG_OP <> 'INSERT' THEN
    PERFORM pg_advisory_xact_lock(hashtext('ctxfarm.coverage.model'), hashtext(OLD.model_digest));
    {";".join(tag_statements("OLD.model_digest", "OLD.tag", -1))};
  END IF;
  IF TG_OP <> 'DELETE' THEN
    PERFORM pg_advisory_xact_lock(hashtext('ctxfarm.coverage.model'), hashtext(NEW.model_digest));
    {";".join(tag_statements("NEW.model_digest", "NEW.tag", 1))};
  END IF;
  RETURN NULL;
END $$""",
        """CREATE FUNCTION model_generation_bump(p_model varchar) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF p_model IS NULL THEN
    RETURN;
  END IF;
  INSERT INTO model_generations (model_digest, generation) VALUES (p_model, 1)
  ON CONFLICT (model_digest) DO UPDATE SET generation = model_generations.generation + 1;
END $$""",
        """CREATE FUNCTION coverage_builds_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    PERFORM coverage_touch_build(NEW.model_digest, NEW.backend, NEW.target, NEW.toolchain);
  ELSE
    PERFORM coverage_touch_build(OLD.model_digest, OLD.backend, OLD.target, OLD.toolchain);
  END IF;
  RETURN NULL;
END $$""",
        """CREATE FUNCTION coverage_artifacts_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    PERFORM coverage_touch_build(OLD.model_digest, OLD.backend, OLD.target, OLD.toolchain);
    PERFORM model_generation_bump(OLD.model_digest);
  ELSE
    PERFORM coverage_touch_build(NEW.model_digest, NEW.backend, NEW.target, NEW.toolchain);
    PERFORM model_generation_bump(NEW.model_digest);
  END IF;
  RETURN NULL;
END $$""",
        """CREATE FUNCTION coverage_verdicts_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  aid integer;
BEGIN
  IF TG_OP = 'DELETE' THEN
    aid := OLD.artifact_id;
  ELSE
    aid := NEW.artifact_id;
  END IF;
  PERFORM coverage_touch_build(a.model_digest, a.backend, a.target, a.toolchain) FROM artifacts a WHERE a.id = aid;
  PERFORM model_generation_bump(a.model_digest) FROM artifacts a WHERE a.id = aid;
  RETURN NULL;
END $$""",
        f"""CREATE FUNCTION coverage_reports_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  row_ device_reports%ROWTYPE;
  touch boolean;
  bump boolean;
BEGIN
  IF TG_OP = 'DELETE' THEN
    row_ := OLD;
    touch := OLD.outcome = 'loads' AND OLD.revoked_at IS NULL;
    bump := true;
  ELSIF TG_OP = 'UPDATE' AND {_report_changed("IS DISTINCT FROM")} THEN
    row_ := NEW;
    touch := true;
    bump := true;
  ELSE  -- a new report, or a device reporting again (a replay)
    row_ := NEW;
    touch := TG_OP = 'INSERT' AND {_first_live_loads("NEW")};
    bump := {_another_token("NEW")};
  END IF;
  IF touch THEN
    PERFORM coverage_touch_build(a.model_digest, a.backend, a.target, a.toolchain) FROM artifacts a
      WHERE a.id = row_.artifact_id;
  END IF;
  IF bump THEN
    PERFORM model_generation_bump(a.model_digest) FROM artifacts a WHERE a.id = row_.artifact_id;
  END IF;
  RETURN NULL;
END $$""",
        """CREATE FUNCTION coverage_signatures_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  subject varchar;
BEGIN
  IF TG_OP = 'DELETE' THEN
    subject := OLD.artifact_digest;
  ELSE
    subject := NEW.artifact_digest;
  END IF;
  PERFORM model_generation_bump(a.model_digest) FROM artifacts a WHERE a.digest = subject;
  RETURN NULL;
END $$""",
        "CREATE TRIGGER coverage_builds AFTER INSERT OR DELETE ON builds"
        " FOR EACH ROW EXECUTE FUNCTION coverage_builds_trigger()",
        f"CREATE TRIGGER coverage_builds_state AFTER UPDATE OF state ON builds FOR EACH ROW"
        f" WHEN ({_STATE_CLASS_CHANGED}) EXECUTE FUNCTION coverage_builds_trigger()",
        "CREATE TRIGGER coverage_artifacts AFTER INSERT OR DELETE ON artifacts"
        " FOR EACH ROW EXECUTE FUNCTION coverage_artifacts_trigger()",
        "CREATE TRIGGER coverage_artifacts_status AFTER UPDATE OF status ON artifacts FOR EACH ROW"
        " WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION coverage_artifacts_trigger()",
        "CREATE TRIGGER coverage_verdicts AFTER INSERT OR UPDATE OR DELETE ON compat_verdicts"
        " FOR EACH ROW EXECUTE FUNCTION coverage_verdicts_trigger()",
        "CREATE TRIGGER coverage_reports AFTER INSERT OR UPDATE OR DELETE ON device_reports"
        " FOR EACH ROW EXECUTE FUNCTION coverage_reports_trigger()",
        "CREATE TRIGGER coverage_signatures AFTER INSERT OR UPDATE OR DELETE ON signatures"
        " FOR EACH ROW EXECUTE FUNCTION coverage_signatures_trigger()",
        "CREATE TRIGGER coverage_tags AFTER INSERT OR UPDATE OR DELETE ON tags"
        " FOR EACH ROW EXECUTE FUNCTION coverage_tags_trigger()",
    ]


def _pg_uninstall() -> list[str]:
    return ([f"DROP TRIGGER IF EXISTS {name} ON {table}" for name, table in _PG_TRIGGERS]
            + [f"DROP FUNCTION IF EXISTS {f}" for f in reversed(_PG_FUNCTIONS)])


# ---- SQLite -------------------------------------------------------------------------------------

_SQLITE_TRIGGERS = ("coverage_builds_insert", "coverage_builds_delete", "coverage_builds_state",
                    "coverage_artifacts_insert", "coverage_artifacts_delete", "coverage_artifacts_status",
                    "coverage_verdicts_insert", "coverage_verdicts_update", "coverage_verdicts_delete",
                    "coverage_reports_insert", "coverage_reports_update", "coverage_reports_delete",
                    "coverage_reports_insert_bump", "coverage_reports_replay_bump", "coverage_reports_delete_bump",
                    "coverage_signatures_insert", "coverage_signatures_delete",
                    "coverage_tags_insert", "coverage_tags_delete", "coverage_tags_update",
                    "coverage_touches_do", "coverage_build_touches_do", "model_generation_bumps_do")
_SQLITE_VIEWS = ("coverage_touches", "coverage_build_touches", "model_generation_bumps")


def _sqlite_install() -> list[str]:
    touch = ";\n  ".join(touch_statements("NEW.model_digest", "NEW.backend", "NEW.target", "NEW.toolchain", "sqlite"))
    item, col = covered("NEW.backend", "NEW.target", "sqlite")
    state_changed = _STATE_CLASS_CHANGED.replace("IS DISTINCT FROM", "IS NOT")

    def calls(row: str, *, bump: bool) -> str:
        out = (f"INSERT INTO coverage_build_touches (model_digest, backend, target, toolchain)"
               f" VALUES ({row}.model_digest, {row}.backend, {row}.target, {row}.toolchain);")
        if bump:
            out += f" INSERT INTO model_generation_bumps (model_digest) VALUES ({row}.model_digest);"
        return out

    def via_artifact(row: str) -> str:
        return ("INSERT INTO coverage_build_touches (model_digest, backend, target, toolchain)"
                f" SELECT model_digest, backend, target, toolchain FROM artifacts WHERE id = {row}.artifact_id;"
                " INSERT INTO model_generation_bumps (model_digest)"
                f" SELECT model_digest FROM artifacts WHERE id = {row}.artifact_id;")

    def touch_only(row: str) -> str:
        return ("INSERT INTO coverage_build_touches (model_digest, backend, target, toolchain)"
                f" SELECT model_digest, backend, target, toolchain FROM artifacts WHERE id = {row}.artifact_id;")

    def bump_only(row: str) -> str:
        return ("INSERT INTO model_generation_bumps (model_digest)"
                f" SELECT model_digest FROM artifacts WHERE id = {row}.artifact_id;")

    def tags(row: str, sign: int) -> str:
        return " ".join(st + ";" for st in tag_statements(f"{row}.model_digest", f"{row}.tag", sign))

    def bump_signed(row: str) -> str:
        return ("INSERT INTO model_generation_bumps (model_digest)"
                f" SELECT model_digest FROM artifacts WHERE digest = {row}.artifact_digest;")

    return [
        # Views that select nothing: inserting into one runs its INSTEAD OF trigger, a procedure call.
        "CREATE VIEW coverage_touches AS SELECT '' AS model_digest, '' AS backend, '' AS target,"
        " '' AS toolchain WHERE 0",
        "CREATE VIEW coverage_build_touches AS SELECT '' AS model_digest, '' AS backend, '' AS target,"
        " '' AS toolchain WHERE 0",
        "CREATE VIEW model_generation_bumps AS SELECT '' AS model_digest WHERE 0",
        # A build's or artifact's target: one touch per SoC cell it counts in.
        "CREATE TRIGGER coverage_build_touches_do INSTEAD OF INSERT ON coverage_build_touches BEGIN"
        f" INSERT INTO coverage_touches (model_digest, backend, target, toolchain)"
        f" SELECT DISTINCT NEW.model_digest, NEW.backend, {col}, NEW.toolchain FROM {item}; END",
        f"CREATE TRIGGER coverage_touches_do INSTEAD OF INSERT ON coverage_touches BEGIN\n  {touch};\nEND",
        "CREATE TRIGGER model_generation_bumps_do INSTEAD OF INSERT ON model_generation_bumps"
        " WHEN NEW.model_digest IS NOT NULL BEGIN"
        # Not INSERT OR IGNORE: the conflict clause of the statement that fired the trigger (an
        # upsert's) would override it.
        " INSERT INTO model_generations (model_digest, generation) SELECT NEW.model_digest, 0"
        " WHERE NOT EXISTS (SELECT 1 FROM model_generations WHERE model_digest = NEW.model_digest);"
        " UPDATE model_generations SET generation = generation + 1 WHERE model_digest = NEW.model_digest; END",
        f"CREATE TRIGGER coverage_builds_insert AFTER INSERT ON builds BEGIN {calls('NEW', bump=False)} END",
        f"CREATE TRIGGER coverage_builds_delete AFTER DELETE ON builds BEGIN {calls('OLD', bump=False)} END",
        f"CREATE TRIGGER coverage_builds_state AFTER UPDATE OF state ON builds WHEN {state_changed}"
        f" BEGIN {calls('NEW', bump=False)} END",
        f"CREATE TRIGGER coverage_artifacts_insert AFTER INSERT ON artifacts BEGIN {calls('NEW', bump=True)} END",
        f"CREATE TRIGGER coverage_artifacts_delete AFTER DELETE ON artifacts BEGIN {calls('OLD', bump=True)} END",
        "CREATE TRIGGER coverage_artifacts_status AFTER UPDATE OF status ON artifacts"
        f" WHEN OLD.status IS NOT NEW.status BEGIN {calls('NEW', bump=True)} END",
        f"CREATE TRIGGER coverage_verdicts_insert AFTER INSERT ON compat_verdicts BEGIN {via_artifact('NEW')} END",
        f"CREATE TRIGGER coverage_verdicts_update AFTER UPDATE ON compat_verdicts BEGIN {via_artifact('NEW')} END",
        f"CREATE TRIGGER coverage_verdicts_delete AFTER DELETE ON compat_verdicts BEGIN {via_artifact('OLD')} END",
        f"CREATE TRIGGER coverage_reports_insert AFTER INSERT ON device_reports WHEN {_first_live_loads('NEW')}"
        f" BEGIN {touch_only('NEW')} END",
        f"CREATE TRIGGER coverage_reports_insert_bump AFTER INSERT ON device_reports WHEN {_another_token('NEW')}"
        f" BEGIN {bump_only('NEW')} END",
        f"CREATE TRIGGER coverage_reports_update AFTER UPDATE ON device_reports WHEN {_report_changed('IS NOT')}"
        f" BEGIN {via_artifact('NEW')} END",
        "CREATE TRIGGER coverage_reports_replay_bump AFTER UPDATE ON device_reports"
        f" WHEN NOT {_report_changed('IS NOT')} AND {_another_token('NEW')} BEGIN {bump_only('NEW')} END",
        "CREATE TRIGGER coverage_reports_delete AFTER DELETE ON device_reports"
        f" WHEN OLD.outcome = 'loads' AND OLD.revoked_at IS NULL BEGIN {touch_only('OLD')} END",
        f"CREATE TRIGGER coverage_reports_delete_bump AFTER DELETE ON device_reports BEGIN {bump_only('OLD')} END",
        f"CREATE TRIGGER coverage_tags_insert AFTER INSERT ON tags BEGIN {tags('NEW', 1)} END",
        f"CREATE TRIGGER coverage_tags_delete AFTER DELETE ON tags BEGIN {tags('OLD', -1)} END",
        "CREATE TRIGGER coverage_tags_update AFTER UPDATE OF model_digest, tag ON tags"
        " WHEN OLD.model_digest IS NOT NEW.model_digest OR OLD.tag IS NOT NEW.tag"
        f" BEGIN {tags('OLD', -1)} {tags('NEW', 1)} END",
        f"CREATE TRIGGER coverage_signatures_insert AFTER INSERT ON signatures BEGIN {bump_signed('NEW')} END",
        f"CREATE TRIGGER coverage_signatures_delete AFTER DELETE ON signatures BEGIN {bump_signed('OLD')} END",
    ]


def _sqlite_uninstall() -> list[str]:
    return ([f"DROP TRIGGER IF EXISTS {name}" for name in _SQLITE_TRIGGERS]
            + [f"DROP VIEW IF EXISTS {name}" for name in _SQLITE_VIEWS])


def install(dialect: str) -> list[str]:
    """Statements that (re)create the triggers and what they call, for ``dialect``."""
    if dialect == "postgresql":
        return _pg_uninstall() + _pg_install()
    if dialect == "sqlite":
        return _sqlite_uninstall() + _sqlite_install()
    raise ValueError(f"no coverage triggers for {dialect}")


def uninstall(dialect: str) -> list[str]:
    if dialect == "postgresql":
        return _pg_uninstall()
    if dialect == "sqlite":
        return _sqlite_uninstall()
    raise ValueError(f"no coverage triggers for {dialect}")


def compact(dialect: str) -> list[str]:
    """Fold the deltas into one row per (backend, target, toolchain). PostgreSQL: one statement,
    one snapshot (a delta committed meanwhile is neither summed nor deleted), run by one session
    at a time (the caller holds the advisory lock); SQLite: writers are serialized already."""
    sums = ", ".join(f"sum({c})" for c in COUNTERS)
    cols = f"scope, backend, target, toolchain, {', '.join(COUNTERS)}"
    nonzero = " OR ".join(f"sum({c}) <> 0" for c in COUNTERS)
    if dialect == "postgresql":
        return [f"WITH gone AS (DELETE FROM coverage_deltas RETURNING *)"
                f" INSERT INTO coverage_deltas ({cols}) SELECT scope, backend, target, toolchain, {sums} FROM gone"
                f" GROUP BY scope, backend, target, toolchain HAVING {nonzero}"]
    return ["CREATE TEMP TABLE IF NOT EXISTS coverage_folded AS SELECT * FROM coverage_deltas WHERE 0",
            "DELETE FROM coverage_folded",
            f"INSERT INTO coverage_folded ({cols}) SELECT scope, backend, target, toolchain, {sums}"
            f" FROM coverage_deltas GROUP BY scope, backend, target, toolchain HAVING {nonzero}",
            "DELETE FROM coverage_deltas",
            f"INSERT INTO coverage_deltas ({cols}) SELECT {cols} FROM coverage_folded"]
