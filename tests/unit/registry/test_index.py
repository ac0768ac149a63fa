from __future__ import annotations

import pytest
from sqlalchemy import select

from farm.core.errors import FarmError, NotFoundError, TagConflictError
from registry.index import (
    counts,
    delete_tag,
    find_artifact,
    get_build,
    list_artifacts,
    record_model,
    resolve_model_ref,
    resolve_model_refs,
    set_tag,
    tag_source,
    tag_view,
    tags_of,
)
from registry.models import Build, Tag, TagEvent
from tests.common.index_rows import add_artifact, add_model, digest, spec


@pytest.fixture
def model(db):
    with db.session() as s:
        return add_model(s, "m1", name="resnet").digest


def build_row(db, build_id) -> Build:
    with db.session() as s:
        return get_build(s, build_id)


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


def test_set_tag_records_history_only_when_it_changes(db, model):
    with db.session() as s:
        other = add_model(s, "m2", name="resnet").digest
    with db.session() as s:
        first = set_tag(s, "resnet", "latest", model)
        assert (first.changed, first.moved, first.previous) == (True, False, None)
    with db.session() as s:
        again = set_tag(s, "resnet", "latest", model)
        assert (again.changed, again.moved) == (False, False)
    assert events(db) == [("resnet", "latest", model, None)]
    with db.session() as s:
        move = set_tag(s, "resnet", "latest", other, force=True)
        assert move.moved and move.as_move() == {"tag": "resnet:latest", "from": model, "to": other}
    assert events(db) == [("resnet", "latest", model, None), ("resnet", "latest", other, model)]
    with db.session() as s:
        rows = s.scalars(select(Tag)).all()
        assert [(t.name, t.tag, t.model_digest) for t in rows] == [("resnet", "latest", other)]
        assert tags_of(s, other) == ["resnet:latest"]
        assert tags_of(s, model) == []


def test_moving_a_tag_needs_force_and_a_refusal_writes_nothing(db, model):
    with db.session() as s:
        other = add_model(s, "m2", name="resnet").digest
        set_tag(s, "resnet", "stable", model)
    with pytest.raises(TagConflictError) as info, db.session() as s:
        set_tag(s, "resnet", "stable", other)
    assert info.value.code == "tag-conflict" and "--force" in (info.value.hint or "")
    assert info.value.details == {"tag": "resnet:stable", "current": model, "requested": other}
    assert events(db) == [("resnet", "stable", model, None)]
    with db.session() as s:
        assert tags_of(s, model) == ["resnet:stable"]


def test_delete_tag_and_history(db, model):
    with db.session() as s:
        other = add_model(s, "m2", name="resnet").digest
        set_tag(s, "resnet", "stable", model)
        set_tag(s, "resnet", "stable", other, force=True)
    with db.session() as s:
        assert delete_tag(s, "resnet", "stable") == other
    with db.session() as s:
        view = tag_view(s, "resnet", "stable")
        with pytest.raises(NotFoundError):
            delete_tag(s, "resnet", "stable")
        with pytest.raises(NotFoundError):
            tag_view(s, "resnet", "never")
    assert view["digest"] is None
    assert [(e["action"], e["digest"], e["previous"]) for e in view["history"]] == [
        ("created", model, None), ("moved", other, model), ("deleted", other, None)]
    assert all(e["at"].endswith("Z") for e in view["history"])


def test_tag_source_takes_an_artifact_a_digest_or_a_ref(db, model):
    with db.session() as s:
        art = add_artifact(s, model, target="SM8650").digest
        set_tag(s, "resnet", "latest", model)
    with db.session() as s:
        assert tag_source(s, art[7:19]) == (model, art)
        assert tag_source(s, art) == (model, art)
        assert tag_source(s, model) == (model, None)
        assert tag_source(s, model[7:15]) == (model, None)
        assert tag_source(s, "resnet") == (model, None)
        with pytest.raises(NotFoundError):
            tag_source(s, "abcdef0123")


def test_bare_names_list_every_tag_and_resolve_latest(db, model):
    with db.session() as s:
        v2 = add_model(s, "m2", name="resnet").digest
        set_tag(s, "resnet", "stable", model)
        set_tag(s, "resnet", "v2", v2)
    with db.session() as s:
        assert resolve_model_refs(s, "resnet") == sorted([model, v2])
        assert resolve_model_refs(s, "resnet:v2") == [v2]
        with pytest.raises(NotFoundError) as info:
            resolve_model_ref(s, "resnet")  # a single answer: NAME means NAME:latest
        assert "has no tag latest" in info.value.message
        assert info.value.hint == "its tags: resnet:stable, resnet:v2"
        with pytest.raises(NotFoundError):
            resolve_model_refs(s, "bert")


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


def test_find_artifact_not_found(db, model):
    with db.session() as s:
        add_artifact(s, model)
    with db.session() as s, pytest.raises(NotFoundError):
        find_artifact(s, "ffffffffff")


@pytest.mark.parametrize("ref", ["abc", "xyz123456", "sha256:zzzzzz", "../../etc", ""])
def test_a_malformed_artifact_id_is_a_usage_error(db, model, ref):
    """Not an id at all is a bad argument (exit 2), not a missing artifact."""
    with db.session() as s:
        add_artifact(s, model)
    with db.session() as s, pytest.raises(FarmError) as info:
        find_artifact(s, ref)
    assert info.value.code == "usage" and info.value.exit_code == 2


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
    from farm.pipeline import states

    with db.session() as s:
        states.enqueue(s, spec(model), None)
    assert counts_of(db)["builds_unfinished"] == 1
