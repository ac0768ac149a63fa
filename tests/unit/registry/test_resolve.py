from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from farm.core.catalog import parse_target
from farm.core.errors import NoMatchError
from registry.models import Artifact
from registry.resolve import Device, Verdict, describe, qnn_rule, rank, resolve, verdict
from tests.common.index_rows import add_artifact, add_model, default_options, digest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_, DEFAULT_OPTS = default_options("qnn", "SM8650")


def device(target: str = "SM8650", runtime: str = "2.51.0") -> Device:
    return Device("qnn", parse_target(f"qnn:{target}"), runtime)


def art(target: str = "SM8650", toolchain: str = "2.51.0", *, label: str | None = None,
        options_digest: str = DEFAULT_OPTS, minutes: int = 0) -> Artifact:
    """An Artifact object that never touches a database."""
    label = label or f"{target}-{toolchain}-{options_digest}-{minutes}"
    return Artifact(digest=digest(label), model_digest=digest("model"), backend="qnn", target=target,
                    toolchain=toolchain, options_digest=options_digest, status="active",
                    created_at=T0 + timedelta(minutes=minutes))


# ---- the QNN rule ---------------------------------------------------------------------------------

@pytest.mark.parametrize("built", ["2.51.0", "2.49.40", "2.47.0"])
def test_same_soc_same_or_older_sdk_loads(built):
    v = qnn_rule(art(toolchain=built), device(runtime="2.51.0"))
    assert v == Verdict(True, "rule", v.reason)
    assert built in v.reason and "2.51.0" in v.reason


def test_newer_sdk_fails():
    v = qnn_rule(art(toolchain="2.51.0"), device(runtime="2.49.40"))
    assert not v.loads
    assert "2.51.0" in v.reason and "newer" in v.reason and "2.49.40" in v.reason


def test_other_soc_older_arch_fails_naming_the_arch():
    v = qnn_rule(art(target="SM8550"), device(target="SM8650"))
    assert not v.loads
    assert "SM8550" in v.reason and "v73" in v.reason and "v75" in v.reason


def test_other_soc_newer_arch_fails_naming_the_arch():
    v = qnn_rule(art(target="SM8750"), device(target="SM8650"))
    assert not v.loads
    assert "newer HTP arch" in v.reason and "v79" in v.reason


def test_other_soc_same_arch_still_fails():
    # SM8550 and SC8380XP are both v73, but a context is built for one soc_model.
    v = verdict(art(target="SC8380XP"), device(target="SM8550"))
    assert not v.loads
    assert "SC8380XP" in v.reason and "SM8550" in v.reason


# ---- ranking ---------------------------------------------------------------------------------------

def test_newest_loadable_toolchain_wins():
    arts = [art(toolchain="2.47.0"), art(toolchain="2.49.40"), art(toolchain="2.52.0")]
    good, bad = rank(arts, device(runtime="2.51.0"))
    assert [a.toolchain for a, _ in good] == ["2.49.40", "2.47.0"]
    assert [a.toolchain for a, _ in bad] == ["2.52.0"]


def test_numeric_not_lexicographic_toolchain_order():
    good, _ = rank([art(toolchain="2.9.0"), art(toolchain="2.10.0")], device(runtime="2.51.0"))
    assert good[0][0].toolchain == "2.10.0"


def test_default_options_preferred_then_newest():
    custom = art(options_digest=digest("custom options"), minutes=5)
    default_old = art(minutes=1)
    default_new = art(minutes=2)
    good, _ = rank([custom, default_old, default_new], device())
    assert [a for a, _ in good] == [default_new, default_old, custom]


def test_toolchain_beats_options():
    newer_custom = art(toolchain="2.51.0", options_digest=digest("custom"))
    older_default = art(toolchain="2.49.40")
    good, _ = rank([older_default, newer_custom], device())
    assert good[0][0] is newer_custom


def test_not_loadable_nearest_first():
    arts = [art(target="SM8550", toolchain="2.52.0"), art(target="SM8650", toolchain="2.53.0"),
            art(target="SM8650", toolchain="2.52.0")]
    good, bad = rank(arts, device(runtime="2.51.0"))
    assert good == []
    assert [(a.target, a.toolchain) for a, _ in bad] == [("SM8650", "2.53.0"), ("SM8650", "2.52.0"),
                                                         ("SM8550", "2.52.0")]


def test_describe():
    a = art()
    d = describe(a, qnn_rule(a, device()))
    assert d["verdict"] == "loads" and d["source"] == "rule" and d["artifact"] == a.digest


# ---- resolve against the index ----------------------------------------------------------------------

@pytest.fixture
def model(db):
    with db.session() as s:
        return add_model(s, "resolve-model").digest


def test_resolve_picks_newest_loadable(db, model):
    with db.session() as s:
        add_artifact(s, model, toolchain="2.47.0")
        want = add_artifact(s, model, toolchain="2.49.40").digest
        add_artifact(s, model, target="SM8750", toolchain="2.51.0")
    with db.session() as s:
        a, v = resolve(s, model, device(runtime="2.51.0"))
    assert (a.digest, a.toolchain, v.loads) == (want, "2.49.40", True)


def test_resolve_skips_broken_and_other_models(db, model):
    with db.session() as s:
        other = add_model(s, "other-model").digest
        want = add_artifact(s, model, toolchain="2.47.0").digest
        add_artifact(s, model, toolchain="2.49.40", status="broken")
        add_artifact(s, other, toolchain="2.49.40")
    with db.session() as s:
        assert resolve(s, model, device())[0].digest == want


def test_miss_without_artifacts(db, model):
    with db.session() as s, pytest.raises(NoMatchError) as info:
        resolve(s, model, device(), model_label="resnet:latest")
    exc = info.value
    assert exc.code == "no-match" and exc.exit_code == 3
    assert "resnet:latest" in exc.message
    # A device reads the hint (through the service, or its own farm fetch): what is needed, no
    # operator's command it could not run.
    assert "needed: a build of it for qnn:SM8650" in exc.hint and "farm " not in exc.hint
    assert exc.details == {"nearest": []}


def test_miss_names_nearest_candidate_and_what_is_needed(db, model):
    with db.session() as s:
        near = add_artifact(s, model, toolchain="2.51.0")
        near_id, near_digest = near.short_id, near.digest
        add_artifact(s, model, target="SM8550", toolchain="2.47.0")
    with db.session() as s, pytest.raises(NoMatchError) as info:
        resolve(s, model, device(runtime="2.49.40"))
    exc = info.value
    assert "none of the 2 qnn artifact(s)" in exc.message and "2.49.40" in exc.message
    assert exc.hint.startswith(f"nearest: {near_id} SM8650 QNN 2.51.0")
    assert "QNN <= 2.49.40" in exc.hint  # a build the runtime can load...
    assert "runtime >= 2.51.0" in exc.hint  # ...or a runtime that can load the build
    assert "farm " not in exc.hint
    assert exc.details["nearest"][0]["artifact"] == near_digest
    assert [n["target"] for n in exc.details["nearest"]] == ["SM8650", "SM8550"]


def test_miss_for_another_soc_asks_for_a_build_for_it(db, model):
    with db.session() as s:
        add_artifact(s, model, target="SM8550")
    with db.session() as s, pytest.raises(NoMatchError) as info:
        resolve(s, model, device(target="SM8650"))
    assert "needed: a build for qnn:SM8650" in info.value.hint
    assert "v73" in info.value.hint
