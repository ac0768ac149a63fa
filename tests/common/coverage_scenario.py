"""A run of index changes of every kind that touches coverage (queue, claim, fail, retry, publish,
probe verdicts, broken marks, deletes), checking after each that the kept cells and summary equal
a recompute from the builds. Shared by the SQLite (unit) and PostgreSQL (integration) tests."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from farm.pipeline import states
from registry import reports
from registry.coverage import Scope, compact, models_page, recomputed_matches, summary
from registry.index import record_verdict, set_tag
from registry.models import ApiToken, Artifact, ArtifactFile, Build, CompatVerdict, CoverageCell
from tests.common.index_rows import add_artifact, add_model, spec

Sessions = Callable[[], AbstractContextManager[Session]]


def _check(s: Session, step: str) -> None:
    diffs = recomputed_matches(s)
    assert diffs == [], f"after {step}: {diffs}"


def _fail(s: Session, model: str, target: str, toolchain: str, code: str = "unsupported-ops") -> int:
    build_id, _ = states.enqueue(s, spec(model, target=target, toolchain=toolchain), None, retry_failed=True)
    claim = states.claim(s, build_id, owner="t", lease_seconds=60, max_attempts=3)
    assert claim.lease is not None
    assert states.fail(s, claim.lease, code, "no", None)
    return build_id


def run(sessions: Sessions) -> dict[str, Any]:
    """Every step in its own transaction (as writers commit them); returns digests by label."""
    with sessions() as s:
        a = add_model(s, "a", name="alpha").digest
        b = add_model(s, "b", name="beta").digest
        c = add_model(s, "c", name="gamma").digest
        set_tag(s, "alpha", "stable", a)
        set_tag(s, "beta", "stable", b)
        set_tag(s, "gamma", "dev", c)
    with sessions() as s:
        a8650 = add_artifact(s, a, target="SM8650", toolchain="2.51.0").id
        add_artifact(s, a, target="SM8650", toolchain="2.50.0")
        a8750 = add_artifact(s, a, target="SM8750", toolchain="2.51.0").id
        _check(s, "publish")
    with sessions() as s:
        failed = _fail(s, b, "SM8650", "2.51.0")
        _fail(s, b, "SM8750", "2.51.0", code="compile-timeout")
        _check(s, "failures")
    with sessions() as s:
        # A retry of the failed build: failed -> queued -> running -> succeeded (the same row).
        build_id, queued = states.enqueue(s, spec(b, target="SM8650", toolchain="2.51.0"), None, retry_failed=True)
        assert queued and build_id == failed
        _check(s, "retry queued")
        claim = states.claim(s, build_id, owner="t", lease_seconds=60, max_attempts=3)
        assert claim.lease is not None
        _check(s, "retry claimed")
        states.succeed(s, claim.lease, log=None)
        _check(s, "retry succeeded, no artifact yet")
    with sessions() as s:
        states.enqueue(s, spec(c, target="SM8650", toolchain="2.51.0"), None)
        # A second options set in the same cell (a failed one): the cell stays "built".
        add_artifact(s, c, target="SM8750", toolchain="2.51.0")
        _fail_other = spec(c, target="SM8750", toolchain="2.51.0", options={"graph_optimization": 3})
        build_id, _ = states.enqueue(s, _fail_other, None)
        claim = states.claim(s, build_id, owner="t", lease_seconds=60, max_attempts=3)
        assert claim.lease is not None
        states.fail(s, claim.lease, "unsupported-ops", "no", None)
        _check(s, "queued + two option sets")
    with sessions() as s:
        record_verdict(s, a8650, "qnn", "2.51.0", "loads", "probe")
        s.flush()
        _check(s, "probe loads")
        record_verdict(s, a8650, "qnn", "2.51.0", "fails", "probe", "crash")
        s.flush()
        _check(s, "probe verdict changed")
        record_verdict(s, a8650, "qnn", "2.52.0", "loads", "probe")
        s.flush()
        _check(s, "second runtime")
    with sessions() as s:
        token = ApiToken(name="phone", scope="read", token_hash="0" * 64)
        s.add(token)
        s.flush()
        report = reports.record(s, a8650, token.id, {
            "device_id": "d1", "device_model": "phone", "soc": "SM8650", "os": "android 15",
            "runtime_backend": "qnn", "runtime_version": "2.51.0", "ort_version": "1.23.0", "outcome": "loads"})
        _check(s, "device report")
        reports.record(s, a8650, token.id, {
            "device_id": "d1", "device_model": "phone", "soc": "SM8650", "os": "android 15",
            "runtime_backend": "qnn", "runtime_version": "2.51.0", "ort_version": "1.23.0", "outcome": "loads"})
        _check(s, "device report again")
    with sessions() as s:
        summed = {(r.target, r.toolchain): r for r in summary(s, compact_over=None).rows}
        assert summed[("SM8650", "2.51.0")].device_verified == 1
        reports.revoke(s, report_id=report)
        _check(s, "device report revoked")
    with sessions() as s:
        s.execute(update(Artifact).where(Artifact.id == a8750).values(status="broken"))
        _check(s, "marked broken")
    with sessions() as s:
        # gc-like removal of a whole build: verdicts and files go with the artifact.
        old = s.scalar(select(Artifact).where(Artifact.model_digest == a, Artifact.toolchain == "2.50.0"))
        assert old is not None
        build = old.build_id
        s.execute(delete(CompatVerdict).where(CompatVerdict.artifact_id == old.id))
        s.execute(delete(ArtifactFile).where(ArtifactFile.artifact_id == old.id))
        s.execute(delete(Artifact).where(Artifact.id == old.id))
        _check(s, "artifact deleted")
        s.execute(delete(Build).where(Build.id == build))
        _check(s, "build deleted")
    return {"a": a, "b": b, "c": c}


def check_reads(sessions: Sessions, digests: dict[str, Any]) -> None:
    """The summary and the pages after ``run``, then again after folding the deltas."""
    for fold in (False, True):
        with sessions() as s:
            if fold:
                assert compact(s)
                _check(s, "compact")
            whole = {(r.target, r.toolchain): r for r in summary(s, compact_over=None).rows}
            r = whole[("SM8650", "2.51.0")]
            # alpha built (probe verdicts: fails then loads under 2.52), beta built by its retry,
            # gamma queued.
            assert (r.built, r.building, r.failed, r.wanted, r.missing) == (2, 1, 0, 3, 0), r
            assert r.probe_verified == 1
            r = whole[("SM8750", "2.51.0")]
            # alpha broken, beta failed, gamma built (one options set failed beside it).
            assert (r.built, r.broken, r.failed, r.wanted, r.missing) == (1, 1, 1, 3, 0), r
            # 2.50.0: alpha's build was deleted: the SDK column is gone.
            assert ("SM8650", "2.50.0") not in whole
            stable = {(r.target, r.toolchain): r for r in summary(s, Scope(tag="stable")).rows}
            assert stable[("SM8750", "2.51.0")].wanted == 2
            assert (stable[("SM8750", "2.51.0")].broken, stable[("SM8750", "2.51.0")].failed) == (1, 1)
            prefix = summary(s, Scope(prefix="gam"))
            assert [(r.target, r.built, r.building) for r in prefix.rows] == [("SM8650", 0, 1), ("SM8750", 1, 0)]
            # Paging: one model a page, in name order, every model once.
            seen, cursor = [], None
            while True:
                page = models_page(s, limit=1, cursor=cursor)
                seen += [m.name for m in page.models]
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert seen == ["alpha", "beta", "gamma"]
            missing = models_page(s, state="missing")
            assert [m.name for m in missing.models] == ["alpha", "beta"]
            beta = missing.models[1]
            assert beta.missing == [{"target": "qnn:SM8750", "toolchain": "2.51.0",
                                     "state": "failed(compile-timeout)"}]
            failed = models_page(s, state="failed", target="qnn:SM8750")
            assert [m.name for m in failed.models] == ["beta"]
            alpha = models_page(s, Scope(prefix="alpha")).models[0]
            cell = next(c for c in alpha.cells if c["target"] == "qnn:SM8650")
            assert [(v["runtime"], v["verdict"]) for v in cell["verdicts"]] == [("2.51.0", "fails"),
                                                                               ("2.52.0", "loads")]


def run_tag_moves(sessions: Sessions, digests: dict[str, Any]) -> None:
    """After ``run``: a tag scope follows NAME:TAGs as they are added, moved and deleted (a model
    with two NAME:TAGs of one TAG counts once), checked against a recompute at each step."""
    from registry.index import delete_tag

    b, c = digests["b"], digests["c"]

    def stable() -> dict[tuple[str, str], Any]:
        with sessions() as s:
            return {(r.target, r.toolchain): r for r in summary(s, Scope(tag="stable"), compact_over=None).rows}

    with sessions() as s:
        set_tag(s, "gamma", "stable", c)
        _check(s, "gamma gains stable")
    assert stable()[("SM8750", "2.51.0")].wanted == 3
    with sessions() as s:
        set_tag(s, "alpha", "stable", b, force=True)  # b is beta:stable already: alpha leaves the scope
        _check(s, "alpha:stable moved to beta's digest")
    rows = stable()
    assert rows[("SM8750", "2.51.0")].wanted == 2 and rows[("SM8750", "2.51.0")].broken == 0
    with sessions() as s:
        delete_tag(s, "beta", "stable")  # alpha:stable still points at b
        _check(s, "beta:stable deleted")
    assert stable()[("SM8750", "2.51.0")].failed == 1
    with sessions() as s:
        delete_tag(s, "alpha", "stable")
        delete_tag(s, "gamma", "stable")
        _check(s, "last stable tags deleted")
    assert stable() == {}
    with sessions() as s:
        compact(s)
        _check(s, "compact")


MULTI = "SM8650+SM8750"


def run_multi_soc(sessions: Sessions) -> str:
    """A model built only as one multi-SoC binary (SM8650+SM8750): queued, published, verified by
    a device of one SoC, beside a failed SM8650 build of its own, marked broken, deleted; each
    covered SoC's cell counts it (no cell of its own), checked against a recompute at each step.
    Returns the model's digest with the multi-SoC artifact published again."""
    with sessions() as s:
        d = add_model(s, "d", name="delta").digest
        set_tag(s, "delta", "stable", d)
        build_id, _ = states.enqueue(s, spec(d, target=MULTI, toolchain="2.51.0"), None)
        _check(s, "multi-SoC queued")
        assert _cells(s, d) == {("SM8650", "2.51.0"): "building", ("SM8750", "2.51.0"): "building"}
        claim = states.claim(s, build_id, owner="t", lease_seconds=60, max_attempts=3)
        assert claim.lease is not None
        assert states.fail(s, claim.lease, "compile-timeout", "slow", None)
        _check(s, "multi-SoC failed")
        assert set(_cells(s, d).values()) == {"failed"}
    with sessions() as s:
        s.execute(delete(Build).where(Build.id == build_id))
        art = add_artifact(s, d, target=MULTI, toolchain="2.51.0")
        _check(s, "multi-SoC published")
        assert _cells(s, d) == {("SM8650", "2.51.0"): "built", ("SM8750", "2.51.0"): "built"}
        _fail(s, d, "SM8650", "2.51.0")
        _check(s, "a failed per-SoC build beside it")
        assert _cells(s, d)[("SM8650", "2.51.0")] == "built"
    with sessions() as s:
        token = ApiToken(name="phone-d", scope="read", token_hash="1" * 64)
        s.add(token)
        s.flush()
        reports.record(s, art.id, token.id, {
            "device_id": "d9", "device_model": "phone", "soc": "SM8650", "os": "android 15",
            "runtime_backend": "qnn", "runtime_version": "2.51.0", "ort_version": "1.23.0", "outcome": "loads"})
        _check(s, "device report on the multi-SoC artifact")
        verified = {t for t, n in s.execute(select(CoverageCell.target, CoverageCell.device_verified)
                                            .where(CoverageCell.model_digest == d)) if n}
        assert verified == {"SM8650"}  # the SM8750 half was not loaded by anyone
    with sessions() as s:
        s.execute(update(Artifact).where(Artifact.id == art.id).values(status="broken"))
        _check(s, "multi-SoC marked broken")
        assert _cells(s, d) == {("SM8650", "2.51.0"): "broken", ("SM8750", "2.51.0"): "broken"}
    with sessions() as s:
        gone = s.get(Artifact, art.id)
        assert gone is not None
        build = gone.build_id
        s.execute(delete(ArtifactFile).where(ArtifactFile.artifact_id == art.id))
        s.execute(delete(Artifact).where(Artifact.id == art.id))
        s.execute(delete(Build).where(Build.id == build))
        _check(s, "multi-SoC deleted")
        assert _cells(s, d) == {("SM8650", "2.51.0"): "failed"}
    with sessions() as s:
        add_artifact(s, d, target=MULTI, toolchain="2.51.0")
        _check(s, "multi-SoC published again")
        assert not any("+" in r.target for r in summary(s, compact_over=None).rows)
    return d


def _cells(s: Session, digest: str) -> dict[tuple[str, str], str]:
    return {(t, tc): st for t, tc, st in s.execute(
        select(CoverageCell.target, CoverageCell.toolchain, CoverageCell.state)
        .where(CoverageCell.model_digest == digest))}


def check_multi_soc_reads(sessions: Sessions, d: str) -> None:
    """After ``run_multi_soc``: the summary, the drill-down and --missing's query count the
    multi-SoC build in both SoCs' cells, named in ``via``."""
    with sessions() as s:
        for sc in (None, Scope(tag="stable"), Scope(prefix="del")):
            rows = {(r.target, r.toolchain): r for r in summary(s, sc, compact_over=None).rows}
            assert all("+" not in t for t, _ in rows), rows
            for soc in ("SM8650", "SM8750"):
                assert rows[(soc, "2.51.0")].built >= 1 and rows[(soc, "2.51.0")].missing == 0
        page = models_page(s, Scope(prefix="delta"))
        [model] = page.models
        assert model.missing == []
        cells = {c["target"]: c for c in model.cells}
        assert set(cells) == {"qnn:SM8650", "qnn:SM8750"}
        assert all(c["state"] == "built" and c["via"] == [f"qnn:{MULTI}"] for c in cells.values())
        missing = models_page(s, Scope(prefix="delta"), state="missing")
        assert missing.models == []
        sm8650 = models_page(s, Scope(prefix="delta"), target="qnn:SM8650")
        assert [c["via"] for c in sm8650.models[0].cells] == [[f"qnn:{MULTI}"]]
