"""The coverage summary kept by triggers equals a recompute after every kind of change (SQLite;
the PostgreSQL run is tests/integration/test_coverage_summary_postgres.py), and the drill-down
pages with a cursor."""

from __future__ import annotations

import pytest

from farm.core.errors import UsageError
from registry.coverage import Scope, decode_cursor, encode_cursor, models_page, rebuild, recomputed_matches, summary
from tests.common import coverage_scenario


def test_incremental_equals_recomputed_after_every_change(db):
    digests = coverage_scenario.run(db.session)
    coverage_scenario.check_reads(db.session, digests)


def test_multi_soc_build_counts_in_each_socs_cell(db):
    coverage_scenario.check_multi_soc_reads(db.session, coverage_scenario.run_multi_soc(db.session))
    with db.session() as s:
        rebuild(s)
        assert recomputed_matches(s) == []


def test_tag_scopes_follow_tag_moves(db):
    coverage_scenario.run_tag_moves(db.session, coverage_scenario.run(db.session))


def test_rebuild_gives_the_same_tables(db):
    coverage_scenario.run(db.session)
    with db.session() as s:
        before = summary(s, compact_over=None).to_dict()
        rebuild(s)
        assert recomputed_matches(s) == []
        assert summary(s, compact_over=None).to_dict() == before


def test_empty_index_has_an_empty_summary_and_page(db):
    with db.session() as s:
        assert summary(s).rows == []
        page = models_page(s)
        assert page.models == [] and page.next_cursor is None


@pytest.mark.parametrize("cursor", ["", "x" * 700, "bm90IGpzb24", encode_cursor("a", "sha256:abc").upper(),
                                    "WyJhIiwgInNoYTI1NjouLi8uLi9ldGMiXQ"])
def test_bad_cursors_are_usage_errors(db, cursor):
    with db.session() as s, pytest.raises(UsageError):
        if not cursor:
            decode_cursor(cursor)
        models_page(s, cursor=cursor)


def test_cursor_round_trips():
    d = "sha256:" + "a" * 64
    assert decode_cursor(encode_cursor("näme", d)) == ("näme", d)


@pytest.mark.parametrize("kwargs", [{"state": "exploded"}, {"target": "SM8650"}, {"target": "nope:SM8650"}])
def test_bad_filters_are_usage_errors(db, kwargs):
    with db.session() as s, pytest.raises(UsageError):
        models_page(s, **kwargs)


def test_prefix_with_like_wildcards_matches_literally(db):
    coverage_scenario.run(db.session)
    with db.session() as s:
        assert summary(s, Scope(prefix="%")).rows == []
        assert summary(s, Scope(prefix="a_pha")).rows == []


@pytest.mark.parametrize("target", ['SM8650+a"b', "x\\\\y+SM8750", "+SM8650+", "[]+{}", "SM8650+SM8650"])
def test_hostile_multi_targets_written_by_hand_keep_the_tables_consistent(db, target):
    """A row no front door would accept (quotes, backslashes, empty parts, JSON): the triggers'
    split (SQLite's goes through JSON) neither fails the write nor drifts from the recompute."""
    from registry.models import Build, CoverageCell
    from tests.common.index_rows import add_model

    with db.session() as s:
        m = add_model(s, "h", name="hostile").digest
        s.add(Build(build_key="f" * 64, model_digest=m, backend="qnn", target=target, toolchain="2.51.0",
                    options={}, options_digest="sha256:" + "0" * 64, state="queued"))
        s.flush()
        assert recomputed_matches(s) == []
        parts = {p for p in target.split("+")}
        assert {t for (t,) in s.query(CoverageCell.target)} == parts
