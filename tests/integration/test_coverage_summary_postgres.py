"""The coverage summary on PostgreSQL: the triggers (PL/pgSQL) keep cells and counters equal to a
recompute after every kind of change, also when two transactions touch cells of one (model,
target) at once; the drill-down pages with its cursor."""

from __future__ import annotations

import threading

from registry.coverage import recomputed_matches, summary
from registry.db import Database
from tests.common import coverage_scenario
from tests.common.index_rows import add_artifact, add_model, spec


def test_incremental_equals_recomputed_on_postgres(pg_url):
    db = Database(pg_url)
    try:
        digests = coverage_scenario.run(db.session)
        coverage_scenario.check_reads(db.session, digests)
        coverage_scenario.run_tag_moves(db.session, digests)
    finally:
        db.dispose()


def test_multi_soc_build_counts_in_each_socs_cell_on_postgres(pg_url):
    db = Database(pg_url)
    try:
        coverage_scenario.check_multi_soc_reads(db.session, coverage_scenario.run_multi_soc(db.session))
    finally:
        db.dispose()


def test_concurrent_touches_of_one_model_target_count_it_once(pg_url):
    """Two writers add the first cells of (model, SM8650) on two SDKs at once: each sees no cell
    of the other's; the lock on (model, backend, target) makes the second count after the first."""
    from farm.pipeline import states

    db = Database(pg_url)
    try:
        with db.session() as s:
            m = add_model(s, "m", name="m").digest
        with db.session() as s1:
            states.enqueue(s1, spec(m, toolchain="2.50.0"), None)
            done = threading.Event()

            def other() -> None:
                with db.session() as s2:
                    add_artifact(s2, m, toolchain="2.51.0")
                done.set()

            t = threading.Thread(target=other)
            t.start()
            # The other writer waits on the lock this transaction holds until it commits.
            assert not done.wait(0.5)
        t.join(30)
        assert done.is_set()
        with db.session() as s:
            assert recomputed_matches(s) == []
            rows = {r.toolchain: r for r in summary(s, compact_over=None).rows}
            assert rows["2.50.0"].wanted == 1 and rows["2.50.0"].building == 1
            assert rows["2.51.0"].built == 1
    finally:
        db.dispose()


def test_hostile_multi_targets_written_by_hand_on_postgres(pg_url):
    from registry.models import Build

    db = Database(pg_url)
    try:
        with db.session() as s:
            m = add_model(s, "h", name="hostile").digest
            for i, target in enumerate(['SM8650+a"b', "x\\y+SM8750", "+SM8650+", "[]+{}", "SM8650+SM8650"]):
                s.add(Build(build_key=f"{i:064d}", model_digest=m, backend="qnn", target=target, toolchain="2.51.0",
                            options={}, options_digest="sha256:" + "0" * 64, state="queued"))
                s.flush()
                assert recomputed_matches(s) == [], target
    finally:
        db.dispose()
