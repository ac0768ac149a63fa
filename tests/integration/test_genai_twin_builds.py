"""A genai part's twin compile is a build of its own (farm.pipeline.genai.twin_builds): keyed by
the part's group, the HTP arch's reference SoC, toolchain and options with the twin marker,
cached like any build, never served. For real: the tiny export of tests/common/genai.py, its
parts and their twins compiled by QNN 2.51.0 in the embedded farm, the twin check on the HTP
simulator on those contexts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from farm.core.settings import Settings
from tests.common.cli import farm
from tests.common.genai import make_export

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnxruntime_qnn")


def _twin_rows(settings: Settings) -> dict[int, dict[str, Any]]:
    from sqlalchemy import select

    from registry.index import Registry
    from registry.models import TwinBuild

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            return {t.id: {"target": t.target, "state": t.state, "attempts": t.attempts, "options": dict(t.options),
                           "finished_at": t.finished_at, "error_code": t.error_code,
                           "digests": sorted(f["digest"] for f in (t.output or {}).get("files") or [])}
                    for t in s.scalars(select(TwinBuild))}
    finally:
        reg.close()


def _index(settings: Settings, sql: str) -> Any:
    from sqlalchemy import text

    from registry.index import Registry

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            return s.execute(text(sql)).scalar()
    finally:
        reg.close()


def _twin_of(env: dict[str, str], ref: str, soc: str = "SM8650") -> dict[str, Any]:
    """The twin of REF's package for SOC as ``farm resolve`` answers it."""
    res = json.loads(farm(env, "resolve", "--model", ref, "--soc", soc, "--qnn", "2.51.0", "--json").stdout)
    return dict(res["twin"])


def test_twin_builds_are_cached_per_arch_and_never_served(settings: Settings, farm_env: dict[str, str],
                                                         tmp_path: Path) -> None:
    export = str(make_export(tmp_path / "export"))
    build = ("build", "--genai", export, "--name", "llm/tb", "--tag", "t", "--json")
    farm(farm_env, *build, "-t", "qnn:SM8650")
    tw = _twin_of(farm_env, "llm/tb:t")
    # The check ran on the parts' twin builds: compiled as builds, nothing compiled in the check.
    first = _twin_rows(settings)
    assert tw["status"] == "ok" and tw["compiled"] == "given", tw
    assert sorted(tw["twin_builds"]["builds"]) == sorted(first) and len(first) == 2
    assert all(r["state"] == "succeeded" and r["target"] == "SM8650" and r["options"]["twin"]
               and r["options"]["graph_optimization"] == 1 and r["digests"] for r in first.values()), first

    # Never served: no artifact, no coverage cell counts it, no answer names its files.
    assert _index(settings, "SELECT count(*) FROM artifacts") == _index(settings, "SELECT count(*) FROM builds") == 3
    assert _index(settings, "SELECT sum(builds) FROM coverage_cells") == 3
    twin_files = {d for r in first.values() for d in r["digests"]}
    answers = [farm(farm_env, *argv).stdout for argv in (
        ("resolve", "--model", "llm/tb:t", "--soc", "SM8650", "--qnn", "2.51.0", "--json"),
        ("coverage", "--json"), ("ls", "--json"), ("show", "llm/tb:t", "--json"))]
    assert not [d for d in twin_files if any(d in a for a in answers)]

    # A twin left pending (Ctrl-C during it): the same command again runs the check on the
    # twin builds it has, compiling none of them again.
    from farm.pipeline.genai import twin_pending
    from registry.index import Registry
    from registry.models import Artifact

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            art = s.query(Artifact).filter(Artifact.ctx_model == "genai_config.json").one()
            art.description = {**(art.description or {}), "twin": twin_pending()}
    finally:
        reg.close()
    farm(farm_env, *build, "-t", "qnn:SM8650")
    again = _twin_of(farm_env, "llm/tb:t")
    assert again["status"] == "ok" and again["compiled"] == "given", again
    assert _twin_rows(settings) == first

    # The same export with a SoC of another arch (v79): only its twin parts compile.
    farm(farm_env, *build, "-t", "qnn:SM8650", "-t", "qnn:SM8750")
    rows = _twin_rows(settings)
    assert {i: r for i, r in rows.items() if i in first} == first
    assert sorted(r["target"] for i, r in rows.items() if i not in first) == ["SM8750", "SM8750"]


def test_the_socs_of_one_htp_arch_share_their_twin_builds(settings: Settings, farm_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    """SC8380XP, QCS9100 and SM8550 are all HTP v73: their packages' twins run on the twin builds
    compiled once for SM8550 (the arch's first SoC in the catalog), in one command or the next."""
    export = str(make_export(tmp_path / "export"))
    build = ("build", "--genai", export, "--name", "llm/v73", "--tag", "t", "--json")
    farm(farm_env, *build, "-t", "qnn:SC8380XP", "-t", "qnn:QCS9100")
    first = _twin_rows(settings)
    assert len(first) == 2 and all(r["state"] == "succeeded" and r["target"] == "SM8550" for r in first.values()), first
    for soc in ("SC8380XP", "QCS9100"):
        tw = _twin_of(farm_env, "llm/v73:t", soc)
        assert tw["status"] == "ok" and tw["compiled"] == "given", tw
        assert sorted(tw["twin_builds"]["builds"]) == sorted(first) and tw["twin_builds"]["target"] == "SM8550"
        assert tw["compile_options"]["soc_model"] == "43", tw  # what they were compiled with: SM8550's
        assert tw["tokens_matched"] == tw["tokens_compared"] > 0, tw

    farm(farm_env, *build, "-t", "qnn:SM8550")  # a second command, a third SoC of the arch: no twin build
    assert _twin_rows(settings) == first
    tw = _twin_of(farm_env, "llm/v73:t", "SM8550")
    assert tw["status"] == "ok" and sorted(tw["twin_builds"]["builds"]) == sorted(first), tw


def fail_twin_build(settings: Settings, *, part: int) -> int:
    """The twin build of ``part`` of the (one) package build in the index, failed as a previous
    run's that passed its memory cap would be (``resource-limit``: deterministic, answered again
    from the index), through the state machine's own transitions. Returns its id."""
    from farm.pipeline import states
    from farm.pipeline.genai import package_twins
    from registry.index import Registry
    from registry.models import Build, TwinBuild

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            pkg_id = next(b.id for b in s.query(Build).all() if states.part_builds(s, b.id) is not None)
            twins = package_twins(s, pkg_id)
        assert twins is not None
        with reg.db.session() as s:
            c = states.claim(s, twins[part], owner="test", lease_seconds=60, max_attempts=3, table=TwinBuild)
            assert c.lease is not None
            assert states.fail(s, c.lease, "resource-limit", "the compile passed its memory cap", None)
        return twins[part]
    finally:
        reg.close()


NO_TWIN = ("-t", "qnn:SM8650", "--name", "llm/nt", "--tag", "t")


@pytest.fixture(scope="module")
def built_no_twin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    """The tiny export's package built for SM8650 with --no-twin (`farm build --genai`), once per
    module: its FARM_HOME (each test below works on a copy), the export and the command's answer."""
    import os

    base = tmp_path_factory.mktemp("no-twin")
    export = str(make_export(base / "export"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | {"FARM_HOME": str(base / "home")}
    first = json.loads(farm(env, "build", "--genai", export, *NO_TWIN, "--json", "--no-twin").stdout)
    return base / "home", export, first


def _home_from(built: tuple[Path, str, dict[str, Any]], settings: Settings) -> None:
    import shutil

    shutil.copytree(built[0], settings.home, dirs_exist_ok=True)


def test_a_twin_build_that_failed_leaves_the_twin_unverified_and_the_package_published(
        settings: Settings, farm_env: dict[str, str], built_no_twin: tuple[Path, str, dict[str, Any]]) -> None:
    _home_from(built_no_twin, settings)
    export, first = built_no_twin[1], built_no_twin[2]
    build = ("build", "--genai", export, *NO_TWIN, "--json")
    (package,) = first["builds"]
    failed = fail_twin_build(settings, part=0)
    farm(farm_env, *build)  # the twin is evidence: the command succeeds, the package stays the answer
    res = json.loads(farm(farm_env, "resolve", "--model", "llm/nt:t", "--soc", "SM8650", "--qnn", "2.51.0",
                          "--json").stdout)
    assert res["artifact"] == package["artifact"]
    tw = res["twin"]
    assert tw["status"] == "unverified" and "part 0's twin build" in tw["detail"] and "resource-limit" in tw["detail"]
    rows = _twin_rows(settings)
    assert rows[failed]["state"] == "failed" and len(rows) == 2


def test_a_worker_killed_during_the_twin_leaves_it_pending_and_the_next_worker_records_it(
        settings: Settings, built_no_twin: tuple[Path, str, dict[str, Any]]) -> None:
    """What a worker killed mid-twin leaves: the package published with its twin ``pending``
    (since long ago), one twin build running under a lease that lapsed. The package's build sent
    again (what the next submission does once the twin is pending past the budget) finds it on a
    worker's executor: the lapsed twin build is taken over, the other one built, the twin recorded."""
    from datetime import timedelta

    from sqlalchemy import update

    from farm.pipeline import states
    from farm.pipeline.execute import Executor
    from farm.pipeline.genai import execute_package, package_twins, twin_pending
    from registry.index import Registry
    from registry.models import Artifact, Build, TwinBuild

    _home_from(built_no_twin, settings)  # the package built with --no-twin
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            pkg_id = next(b.id for b in s.query(Build).all() if states.part_builds(s, b.id) is not None)
            twins = package_twins(s, pkg_id)
            art = s.query(Artifact).filter(Artifact.build_id == pkg_id).one()
            long_ago = (states.now() - timedelta(hours=1)).isoformat(timespec="seconds")
            art.description = {**(art.description or {}), "twin": {**twin_pending(), "since": long_ago}}
        assert twins is not None
        with reg.db.session() as s:
            dead = states.claim(s, twins[0], owner="killed", lease_seconds=60, max_attempts=3, table=TwinBuild)
            assert dead.lease is not None
            s.execute(update(TwinBuild).where(TwinBuild.id == twins[0])
                      .values(lease_expires_at=states.now() - timedelta(seconds=1)))
        result = execute_package(Executor(settings, reg), pkg_id)
        assert result is not None and result.outcome == "done"
        with reg.db.session() as s:
            tw = s.query(Artifact).filter(Artifact.build_id == pkg_id).one().description["twin"]
            rows = {t.id: (t.state, t.attempts) for t in s.query(TwinBuild).all()}
    finally:
        reg.close()
    assert tw["status"] == "ok" and tw["compiled"] == "given", tw
    assert rows == {twins[0]: ("succeeded", 2), twins[1]: ("succeeded", 1)}
