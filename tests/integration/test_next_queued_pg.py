"""Two workers taking their next build from the PostgreSQL index at the same moment
get two different builds (``FOR UPDATE SKIP LOCKED``), and each claim succeeds."""

from __future__ import annotations

from farm.pipeline import states
from registry.db import Database
from tests.common.index_rows import add_model, spec


def test_two_workers_asking_at_once_get_two_builds(pg_url: str) -> None:
    db = Database(pg_url)
    try:
        with db.session() as s:
            model = add_model(s, "m1", name="resnet").digest
        with db.session() as s:
            ids = [states.enqueue(s, spec(model, target=t), "q")[0] for t in ("SM8650", "SM8750", "SC8380XP")]
        with db.session() as a, db.session() as b:
            first = states.next_queued(a, "q")  # row locked until a's transaction ends
            second = states.next_queued(b, "q")  # skips it
            assert first == ids[0] and second == ids[1]
            assert states.claim(a, first, owner="a", lease_seconds=60, max_attempts=3).action == "run"
            assert states.claim(b, second, owner="b", lease_seconds=60, max_attempts=3).action == "run"
        with db.session() as s:
            assert states.next_queued(s, "q") == ids[2]
    finally:
        db.dispose()
