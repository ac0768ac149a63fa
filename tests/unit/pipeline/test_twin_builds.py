"""A genai package's twin builds are keyed by the HTP arch (farm.pipeline.genai.twin_builds): the
packages of two SoCs of one arch queue each part's twin build once, compiled for the arch's
reference SoC; another arch, other options or a multi-SoC target queue their own."""

from __future__ import annotations

import pytest

from farm.core.catalog import load_catalog
from farm.pipeline import states
from farm.pipeline.genai.links import link_parts
from farm.pipeline.genai.twin_builds import enqueue_twins, package_twins, twin_spec
from tests.common.index_rows import add_model, spec

V73 = ("SM8550", "SC8380XP", "QCS9100")


def test_the_first_soc_of_an_arch_in_the_catalog_stands_for_it() -> None:
    cat = load_catalog()
    for name in V73:
        assert cat.arch_reference(cat.get(name, backend="qnn")).name == "SM8550"
    for name, ref in (("SM8475", "SM8450"), ("SA8295", "SM8350"), ("SM8650", "SM8650"), ("SM8750", "SM8750")):
        assert cat.arch_reference(cat.get(name, backend="qnn")).name == ref
    for ref in ("qnn:SM8650+SM8750", "qnn:SM8550+SC8380XP", "trt:sm_90"):
        t = cat.get(ref)
        assert cat.arch_reference(t) is t  # no one arch: itself
    for t in cat.of_backend("qnn"):  # deterministic: every SoC of an arch names the same one
        ref = cat.arch_reference(t)
        assert ref.htp_arch == t.htp_arch and cat.arch_reference(ref) is ref


def test_twin_spec_keys_by_the_arch_and_compiles_for_its_reference_soc() -> None:
    opts = {"graph_optimization": 3, "vtcm_mb": 0}
    v73 = [twin_spec("sha256:" + "a" * 64, "qnn", name, "2.51.0", opts) for name in V73]
    assert {s.build_key for s in v73} == {v73[0].build_key} and {s.target for s in v73} == {"SM8550"}
    assert v73[0].options["twin"] and v73[0].options["graph_optimization"] == 1
    others = [twin_spec("sha256:" + "a" * 64, "qnn", name, "2.51.0", opts) for name in ("SM8650", "SM8450")]
    assert [s.target for s in others] == ["SM8650", "SM8450"]
    assert len({v73[0].build_key, *(s.build_key for s in others)}) == 3
    # Still apart: another group, toolchain or option, and the part build's own key.
    key = v73[0].build_key
    assert twin_spec("sha256:" + "b" * 64, "qnn", "SC8380XP", "2.51.0", opts).build_key != key
    assert twin_spec("sha256:" + "a" * 64, "qnn", "SC8380XP", "2.49.40", opts).build_key != key
    assert twin_spec("sha256:" + "a" * 64, "qnn", "SC8380XP", "2.51.0", {**opts, "vtcm_mb": 4}).build_key != key
    assert spec("sha256:" + "a" * 64, target="SM8550", options=opts).build_key != key
    # A multi-SoC target, or a name the catalog no longer knows, keeps its own name.
    assert twin_spec("sha256:" + "a" * 64, "qnn", "SM8650+SM8750", "2.51.0", opts).target == "SM8650+SM8750"
    assert twin_spec("sha256:" + "a" * 64, "qnn", "SM9999", "2.51.0", opts).target == "SM9999"


@pytest.fixture
def digests(db) -> list[str]:
    """The package's digest, then its two parts' digests."""
    with db.session() as s:
        return [add_model(s, "package", name="pkg").digest,
                *(add_model(s, f"group-{i}", name=f"part{i}").digest for i in range(2))]


def _package(s, digests: list[str], target: str) -> int:
    """A package build for ``target`` linked to its parts' builds, as a submission leaves them."""
    pkg_id, _ = states.enqueue(s, spec(digests[0], target=target), None)
    link_parts(s, pkg_id, [states.enqueue(s, spec(g, target=target), None)[0] for g in digests[1:]])
    return pkg_id


def test_two_socs_of_one_arch_queue_their_twin_builds_once(db, digests) -> None:
    opts = {"graph_optimization": 3}
    queued = {}
    with db.session() as s:
        for name in ("SM8550", "SC8380XP", "QCS9100", "SM8650"):
            got = enqueue_twins(s, [twin_spec(g, "qnn", name, "2.51.0", opts) for g in digests[1:]], "q")
            queued[name] = ([i for i, _ in got], sum(q for _, q in got))
    assert queued["SM8550"][1] == 2
    assert queued["SC8380XP"] == queued["QCS9100"] == (queued["SM8550"][0], 0)  # the same rows, nothing queued
    assert queued["SM8650"][1] == 2 and not set(queued["SM8650"][0]) & set(queued["SM8550"][0])


def test_a_package_for_a_second_soc_of_the_arch_finds_the_first_ones_twin_builds(db, digests) -> None:
    """``package_twins`` (what a worker runs after publishing a package): the SC8380XP package's
    parts' twin builds are the SM8550 package's, compiled for SM8550; an SM8650 package's are its own."""
    from sqlalchemy import func, select

    from registry.models import TwinBuild

    with db.session() as s:
        first = package_twins(s, _package(s, digests, "SM8550"))
        second = package_twins(s, _package(s, digests, "SC8380XP"))
        count = s.scalar(select(func.count()).select_from(TwinBuild))
        other = package_twins(s, _package(s, digests, "SM8650"))
        targets = {i: s.get(TwinBuild, i).target for i in (*(first or []), *(other or []))}
    assert first is not None and len(first) == 2 and second == first and count == 2
    assert other is not None and not set(other) & set(first)
    assert [targets[i] for i in first] == ["SM8550", "SM8550"] and [targets[i] for i in other] == ["SM8650", "SM8650"]
