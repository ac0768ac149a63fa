"""Cancelling a genai package's release also cancels its twin builds (farm.pipeline.cancel,
farm.pipeline.genai.twin_builds.cancel_twins): queued and running ones no live release waits
on; one another release's package shares (the same part) is kept; a cancelled twin build's
message is dropped; a published package's pending twin is recorded cancelled, run again by the
next submission."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from farm.core.settings import Settings
from farm.pipeline import states
from farm.pipeline.cancel import cancel
from farm.pipeline.genai.links import link_parts
from farm.pipeline.genai.twin import run_twin
from farm.pipeline.genai.twin_builds import (
    enqueue_twins,
    execute_twin,
    reopen_cancelled_twin,
    twin_orphaned,
    twin_spec,
    twin_wanted,
)
from farm.pipeline.genai.twin_record import twin_of, twin_pending
from registry.index import Registry, artifact_for_build
from registry.models import Release, ReleaseBuild, TwinBuild
from tests.common.index_rows import add_artifact, add_model, spec

GENAI_Q = "compile.qnn.2.51.0.genai"


@pytest.fixture
def reg(settings: Settings) -> Iterator[Registry]:
    r = Registry.open(settings)
    yield r
    r.close()


def release(s: Any, model: str, builds: Sequence[int], parts: Sequence[int] = ()) -> int:
    """A release holding ``builds``; ``parts``: its part releases (a genai package's)."""
    r = Release(model_digest=model, label="t", matrix={"genai": bool(parts), "part_releases": list(parts)})
    s.add(r)
    s.flush()
    for b in builds:
        s.add(ReleaseBuild(release_id=r.id, build_id=b))
    s.flush()
    return int(r.id)


def submit(reg: Registry, package: str, groups: Sequence[str], *, published: bool = False,
           target: str = "SM8650") -> tuple[int, int, list[int]]:
    """As ``submit_package`` records one: a release per part, the package's release holding the
    package build and its parts', and each part's twin build queued. Returns (release, package
    build, twin builds in part order)."""
    with reg.db.session() as s:
        pkg = add_model(s, package, name=package).digest
        digests = [add_model(s, g, name=g).digest for g in groups]
        parts = [states.enqueue(s, spec(d, target=target), "compile.qnn.2.51.0")[0] for d in digests]
        if published:
            art = add_artifact(s, pkg)
            art.description = {"twin": twin_pending()}
            pkg_build = int(art.build_id)
        else:
            pkg_build = states.enqueue(s, spec(pkg, target=target), GENAI_Q)[0]
        link_parts(s, pkg_build, parts)
        part_releases = [release(s, d, [p]) for d, p in zip(digests, parts, strict=True)]
        rel = release(s, pkg, [pkg_build, *parts], part_releases)
        twins = [i for i, _ in enqueue_twins(s, [twin_spec(d, "qnn", target, "2.51.0",
                                                           dict(spec(d, target=target).options))
                                                 for d in digests], GENAI_Q)]
    return rel, pkg_build, twins


def twin_row(reg: Registry, twin_id: int) -> tuple[str, str | None]:
    with reg.db.session() as s:
        t = states.get_build(s, twin_id, TwinBuild)
        return str(t.state), t.error_code


def test_cancel_a_package_release_cancels_its_queued_twin_builds(settings: Settings, reg: Registry) -> None:
    rel, pkg_build, twins = submit(reg, "pkg", ["g0", "g1"])
    done = [c.to_dict() for c in cancel(settings, release_id=rel, registry=reg)]
    assert [d for d in done if "twin_build" in d] == [
        {"twin_build": t, "was": "queued", "now": "cancelled"} for t in twins]
    assert {"build": pkg_build, "was": "queued", "now": "cancelled"} in done
    assert [twin_row(reg, t) for t in twins] == [("failed", "cancelled")] * 2
    # Cancelling again finds them final: nothing to report, nothing changed.
    assert [c for c in cancel(settings, release_id=rel, registry=reg) if c.twin] == []


def test_a_twin_build_another_live_release_waits_on_is_kept(settings: Settings, reg: Registry) -> None:
    """Two packages with one part in common share its twin build (keyed by the part): the first
    cancel keeps it, the last one stops it."""
    rel_a, _, (shared, only_a) = submit(reg, "pkg-a", ["g0", "g1"])
    rel_b, _, (shared_b, only_b) = submit(reg, "pkg-b", ["g0", "g2"])
    assert shared_b == shared
    done = {c.build: c.now for c in cancel(settings, release_id=rel_a, registry=reg) if c.twin}
    assert done == {shared: "kept", only_a: "cancelled"}
    assert twin_row(reg, shared) == ("queued", None) and twin_row(reg, only_b) == ("queued", None)
    done = {c.build: c.now for c in cancel(settings, release_id=rel_b, registry=reg) if c.twin}
    assert done == {shared: "cancelled", only_b: "cancelled"}
    assert twin_row(reg, shared) == ("failed", "cancelled")


def test_a_twin_build_a_package_for_another_soc_of_its_arch_waits_on_is_kept(settings: Settings,
                                                                              reg: Registry) -> None:
    """Twin builds are keyed by the HTP arch's reference SoC: an SC8380XP package (v73) shares
    its twin builds with the SM8550 one. Cancelling the SM8550 release keeps them for it."""
    rel_a, _, twins_a = submit(reg, "pkg-a", ["g0", "g1"], target="SM8550")
    _, _, twins_b = submit(reg, "pkg-b", ["g0", "g1"], target="SC8380XP")
    assert twins_b == twins_a
    done = {c.build: c.now for c in cancel(settings, release_id=rel_a, registry=reg) if c.twin}
    assert done == {t: "kept" for t in twins_a}
    assert [twin_row(reg, t) for t in twins_a] == [("queued", None)] * 2


def test_a_running_twin_build_loses_its_lease_and_a_late_message_is_dropped(settings: Settings,
                                                                            reg: Registry) -> None:
    rel, _, (running, queued) = submit(reg, "pkg", ["g0", "g1"])
    with reg.db.session() as s:
        lease = states.claim(s, running, owner="w", lease_seconds=60, max_attempts=3, table=TwinBuild).lease
    assert lease is not None
    done = {c.build: (c.was, c.now) for c in cancel(settings, release_id=rel, registry=reg) if c.twin}
    assert done == {running: ("running", "cancelled"), queued: ("queued", "cancelled")}
    with reg.db.session() as s:
        assert states.renew(s, lease, 60) is False  # the worker's keeper stops the compile
    # The queued one's message, taken later: its claim finds the row final; no runner is reached
    # (this executor has none), nothing is claimed.
    ex = SimpleNamespace(registry=reg, settings=settings, owner="late-worker")
    assert execute_twin(ex, queued).outcome == "done"
    with reg.db.session() as s:
        t = states.get_build(s, queued, TwinBuild)
        assert (t.state, t.error_code, t.attempts, t.worker) == ("failed", "cancelled", 0, None)


def test_a_published_packages_pending_twin_is_recorded_cancelled_and_run_again_on_resubmit(
        settings: Settings, reg: Registry) -> None:
    rel, pkg_build, twins = submit(reg, "pkg", ["g0", "g1"], published=True)
    done = cancel(settings, release_id=rel, registry=reg)
    assert {c.build: c.now for c in done if not c.twin}[pkg_build] == "succeeded"  # published stays published
    assert [twin_row(reg, t) for t in twins] == [("failed", "cancelled")] * 2
    with reg.db.session() as s:
        art = artifact_for_build(s, pkg_build)
        assert art is not None
        tw = twin_of(art.description)
        assert tw is not None and (tw["status"], tw["cancelled"]) == ("unverified", True)
        assert "cancelled (farm cancel)" in tw["detail"]
        # A message of the cancelled release taken later (the package's fallback) runs nothing.
        assert not twin_orphaned(settings, s, pkg_build)
    with reg.db.session() as s:
        # Not a verdict: the next submission runs the twin (its builds queued again, the
        # package's message sent for its twin at once).
        assert twin_wanted(s, pkg_build) and reopen_cancelled_twin(s, pkg_build)
        assert twin_orphaned(settings, s, pkg_build)
        assert [states.enqueue(s, states.BuildSpec(**_spec_of(s, t)), GENAI_Q, table=TwinBuild)[1]
                for t in twins] == [True, True]


def test_a_twin_check_that_finds_its_twin_builds_cancelled_says_so(settings: Settings, reg: Registry,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker checking a published package's twin when its release is cancelled: its twin
    builds end cancelled, and what it records is ``unverified`` and cancelled (run again by the
    next submission), not a twin that failed."""
    rel, _, twins = submit(reg, "pkg", ["g0", "g1"], published=True)
    cancel(settings, release_id=rel, registry=reg)
    monkeypatch.setattr("farm.core.genai.read_export", lambda path: None)  # no part is read: the first failed
    tw = run_twin(settings, SimpleNamespace(backend="qnn", target="SM8650", options={}), tmp_path, twins=twins,
                  reg=reg)
    assert (tw["status"], tw.get("cancelled")) == ("unverified", True)
    assert "did not succeed: cancelled" in tw["detail"]


def test_a_package_another_live_release_holds_keeps_its_twin(settings: Settings, reg: Registry) -> None:
    """The same package submitted twice: one package build, held by both releases; the first
    cancel keeps the package, its twin builds and its pending twin."""
    rel, pkg_build, twins = submit(reg, "pkg", ["g0", "g1"], published=True)
    with reg.db.session() as s:
        release(s, states.get_build(s, pkg_build).model_digest, [pkg_build, *(states.part_builds(s, pkg_build) or [])])
    assert [c for c in cancel(settings, release_id=rel, registry=reg) if c.twin] == []
    assert [twin_row(reg, t) for t in twins] == [("queued", None)] * 2
    with reg.db.session() as s:
        art = artifact_for_build(s, pkg_build)
        assert art is not None and (twin_of(art.description) or {}).get("status") == "pending"


def _spec_of(s: Any, twin_id: int) -> dict[str, Any]:
    t = states.get_build(s, twin_id, TwinBuild)
    return {"build_key": t.build_key, "model_digest": t.model_digest, "backend": t.backend, "target": t.target,
            "toolchain": t.toolchain, "options": dict(t.options), "options_digest": t.options_digest}


def test_farm_cancel_says_how_many_twin_builds_it_cancelled_and_kept(settings: Settings, reg: Registry,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from farm.cli import cancel_cmd

    rel, _, _ = submit(reg, "pkg-a", ["g0", "g1"])
    submit(reg, "pkg-b", ["g0"])  # shares part g0: its build and its twin build are kept
    args = argparse.Namespace(release=rel, build=None, server=None, token=None, json=False)
    assert cancel_cmd.run("cancel", args, settings) == 0
    out = capsys.readouterr().out
    assert "2 build(s) cancelled, 0 already finished, 1 kept" in out and "1 twin build(s) cancelled, 1 kept" in out, out
