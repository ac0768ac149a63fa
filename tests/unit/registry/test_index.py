from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from farm.errors import NotFoundError
from registry.index import (
    artifact_for_build,
    claim_build,
    counts,
    fail_build,
    find_artifact,
    get_build,
    list_artifacts,
    now,
    record_model,
    resolve_model_ref,
    set_tag,
    tags_of,
)
from registry.models import Build, Tag, TagEvent
from tests.common.index_rows import add_artifact, add_model, digest, spec


@pytest.fixture
def model(db):
    with db.session() as s:
        return add_model(s, "m1", name="resnet").digest


def claim(db, build_spec, *, lease=60.0, owner="a", **kw):
    with db.session() as s:
        return claim_build(s, build_spec, lease_seconds=lease, owner=owner, **kw)


def build_row(db, build_id) -> Build:
    with db.session() as s:
        return get_build(s, build_id)


# ---- claim_build --------------------------------------------------------------------------------

def test_first_claim_compiles(db, model):
    c = claim(db, spec(model), owner="host:1")
    assert (c.action, c.state, c.attempt) == ("compile", "running", 1)
    row = build_row(db, c.build_id)
    assert (row.state, row.attempts, row.lease_owner) == ("running", 1, "host:1")
    assert row.lease_expires_at is not None and row.started_at is not None


def test_second_claim_while_lease_is_live_is_busy(db, model):
    first = claim(db, spec(model), owner="a")
    second = claim(db, spec(model), owner="b")
    assert (second.action, second.build_id, second.attempt) == ("busy", first.build_id, 1)
    assert build_row(db, first.build_id).lease_owner == "a"


def test_other_key_is_its_own_build(db, model):
    a = claim(db, spec(model, target="SM8650"))
    b = claim(db, spec(model, target="SM8750"))
    c = claim(db, spec(model, toolchain="2.49.40"))
    d = claim(db, spec(model, options={"graph_optimization": 3}))
    assert {x.action for x in (a, b, c, d)} == {"compile"}
    assert len({a.build_id, b.build_id, c.build_id, d.build_id}) == 4


def test_after_success_the_answer_is_done(db, model):
    with db.session() as s:
        art = add_artifact(s, model)
        build_id = art.build_id
    c = claim(db, spec(model), owner="b")
    assert (c.action, c.build_id, c.state) == ("done", build_id, "succeeded")
    with db.session() as s:
        assert artifact_for_build(s, build_id).digest == art.digest


@pytest.mark.parametrize("code", ["unsupported-ops", "invalid-model", "bad-options"])
def test_deterministic_failure_is_done(db, model, code):
    first = claim(db, spec(model))
    with db.session() as s:
        fail_build(s, first.build_id, code, "nope", "log text")
    c = claim(db, spec(model), owner="b")
    assert (c.action, c.state, c.attempt) == ("done", "failed", 1)
    row = build_row(db, first.build_id)
    assert (row.error_code, row.error_message, row.log) == (code, "nope", "log text")
    assert row.lease_owner is None and row.finished_at is not None


@pytest.mark.parametrize("code", ["timeout", "worker-lost", "toolchain-error", "storage-error", "no-worker"])
def test_infra_failure_is_compiled_again(db, model, code):
    first = claim(db, spec(model), owner="a")
    with db.session() as s:
        fail_build(s, first.build_id, code, "infra", None)
    c = claim(db, spec(model), owner="b")
    assert (c.action, c.build_id, c.state) == ("compile", first.build_id, "running")
    row = build_row(db, first.build_id)
    assert (row.state, row.attempts, row.lease_owner) == ("running", 2, "b")
    assert row.error_code is None and row.error_message is None and row.finished_at is None
    # and now the retry holds a live lease
    assert claim(db, spec(model), owner="c").action == "busy"


def test_expired_lease_is_taken_over(db, model):
    dead = claim(db, spec(model), lease=-1, owner="dead")
    c = claim(db, spec(model), owner="alive")
    assert (c.action, c.build_id) == ("compile", dead.build_id)
    row = build_row(db, dead.build_id)
    assert (row.lease_owner, row.attempts) == ("alive", 2)
    assert row.lease_expires_at.replace(tzinfo=None) > now().replace(tzinfo=None) + timedelta(seconds=30)


def test_takeover_reports_the_attempt_it_recorded(db, model):
    first = claim(db, spec(model))
    with db.session() as s:
        fail_build(s, first.build_id, "timeout", "too slow", None)
    c = claim(db, spec(model))
    assert build_row(db, first.build_id).attempts == 2
    assert c.attempt == 2


def test_lost_insert_race_reads_the_winner(db, model):
    """Two submitters both see no row; the loser's INSERT hits the UNIQUE key and it waits."""
    winner = claim(db, spec(model), owner="winner")
    with db.session() as s:
        real_scalar = s.scalar
        calls = []

        def scalar(stmt, *a, **kw):
            calls.append(stmt)
            # The first lookup happens "before" the winner committed.
            return None if len(calls) == 1 else real_scalar(stmt, *a, **kw)

        s.scalar = scalar  # type: ignore[method-assign]
        c = claim_build(s, spec(model), lease_seconds=60, owner="loser")
    assert (c.action, c.build_id) == ("busy", winner.build_id)
    with db.session() as s:
        assert len(s.scalars(select(Build)).all()) == 1


def test_infra_failures_stop_after_max_attempts(db, model):
    for attempt in (1, 2, 3):
        c = claim(db, spec(model), max_attempts=3)
        assert c.action == "compile"
        assert build_row(db, c.build_id).attempts == attempt
        with db.session() as s:
            fail_build(s, c.build_id, "timeout", "too slow", None)
    assert claim(db, spec(model), max_attempts=3).action != "compile"


# ---- models and tags ----------------------------------------------------------------------------

def test_record_model_is_idempotent(db, model):
    with db.session() as s:
        again = record_model(s, digest=model, onnx_digest=digest("other"), size=2, files=[], name="other")
        assert (again.first_name, again.size) == ("resnet", 1)  # the first record stands
    assert counts_of(db)["models"] == 1


def counts_of(db):
    with db.session() as s:
        return counts(s)


def events(db):
    with db.session() as s:
        return [(e.name, e.tag, e.model_digest, e.previous_digest)
                for e in s.scalars(select(TagEvent).order_by(TagEvent.id))]


def test_set_tag_records_history_only_when_it_moves(db, model):
    with db.session() as s:
        other = add_model(s, "m2", name="resnet").digest
    with db.session() as s:
        assert set_tag(s, "resnet", "latest", model) is True
    with db.session() as s:
        assert set_tag(s, "resnet", "latest", model) is False
    assert events(db) == [("resnet", "latest", model, None)]
    with db.session() as s:
        assert set_tag(s, "resnet", "latest", other) is True
    assert events(db) == [("resnet", "latest", model, None), ("resnet", "latest", other, model)]
    with db.session() as s:
        rows = s.scalars(select(Tag)).all()
        assert [(t.name, t.tag, t.model_digest) for t in rows] == [("resnet", "latest", other)]
        assert tags_of(s, other) == ["resnet:latest"]
        assert tags_of(s, model) == []


def test_resolve_model_ref(db, model):
    with db.session() as s:
        v2 = add_model(s, "m2", name="resnet").digest
        set_tag(s, "resnet", "latest", model)
        set_tag(s, "resnet", "v2", v2)
    with db.session() as s:
        assert resolve_model_ref(s, "resnet:v2") == v2
        assert resolve_model_ref(s, "resnet:latest") == model
        assert resolve_model_ref(s, "resnet") == model
        assert resolve_model_ref(s, model) == model
        assert resolve_model_ref(s, model.removeprefix("sha256:")[:8]) == model
        assert resolve_model_ref(s, "sha256:" + v2.removeprefix("sha256:")[:8]) == v2


def test_resolve_model_ref_unknown(db, model):
    with db.session() as s:
        set_tag(s, "resnet", "latest", model)
    with db.session() as s:
        for ref in ("resnet:v9", "bert", digest("never recorded"), "abc", "zzzzzzzz"):
            with pytest.raises(NotFoundError) as info:
                resolve_model_ref(s, ref)
            assert info.value.code == "not-found"
        assert "resnet:latest" in info.value.hint


def test_resolve_model_ref_unknown_in_an_empty_index(db):
    with db.session() as s, pytest.raises(NotFoundError) as info:
        resolve_model_ref(s, "resnet")
    assert "farm build" in info.value.hint


def test_resolve_model_ref_ambiguous_prefix(db):
    a, b = "sha256:abcdef" + "0" * 57 + "1", "sha256:abcdef" + "0" * 57 + "2"
    with db.session() as s:
        for d in (a, b):
            record_model(s, digest=d, onnx_digest=d, size=1, files=[], name="x")
    with db.session() as s:
        with pytest.raises(NotFoundError):
            resolve_model_ref(s, "abcdef")
        assert resolve_model_ref(s, "abcdef" + "0" * 57 + "2") == b
        with pytest.raises(NotFoundError):
            resolve_model_ref(s, "abcde")  # too short to be taken as a prefix


# ---- artifacts ----------------------------------------------------------------------------------

def test_publish_artifact_rows(db, model):
    with db.session() as s:
        art = add_artifact(s, model, toolchain="2.49.40")
        art_id, art_digest, build_id = art.id, art.digest, art.build_id
    with db.session() as s:
        a = find_artifact(s, art_digest)
        assert a.id == art_id
        assert [(f.name, f.role) for f in a.files] == [("m_ctx.onnx", "ctx-model"), ("manifest.json", "manifest")]
        assert a.size == 100  # payload files only, not the manifest
        assert a.build.state == "succeeded" and a.build.lease_owner is None
        assert (a.target, a.toolchain, a.model_digest) == ("SM8650", "2.49.40", model)
        assert find_artifact(s, a.short_id).id == art_id
        assert find_artifact(s, art_digest.removeprefix("sha256:")[:6].upper()).id == art_id
        assert build_id == a.build_id
    assert counts_of(db) == {"models": 1, "tags": 0, "builds": 1, "artifacts": 1, "artifact_files": 2,
                             "builds_unfinished": 0}


@pytest.mark.parametrize("ref", ["abc", "xyz123456", "sha256:zzzzzz", "ffffffffff"])
def test_find_artifact_not_found(db, model, ref):
    with db.session() as s:
        add_artifact(s, model)
    with db.session() as s, pytest.raises(NotFoundError):
        find_artifact(s, ref)


def test_list_artifacts_filters_and_orders_newest_first(db, model):
    with db.session() as s:
        old = add_artifact(s, model, target="SM8650", toolchain="2.47.0").digest
        new = add_artifact(s, model, target="SM8650", toolchain="2.51.0").digest
        other = add_artifact(s, model, target="SM8750").digest
    with db.session() as s:
        assert [a.digest for a in list_artifacts(s, target="SM8650")] == [new, old]
        assert [a.digest for a in list_artifacts(s, model_digest=model)] == [other, new, old]
        assert list_artifacts(s, backend="trt") == []
        assert len(list_artifacts(s, limit=1)) == 1


def test_get_build_missing(db):
    with db.session() as s, pytest.raises(NotFoundError):
        get_build(s, 12345)


def test_unfinished_builds_counted(db, model):
    claim(db, spec(model))
    assert counts_of(db)["builds_unfinished"] == 1
