"""Evidence without servers: accuracy figures and the gate, seeded inputs, the report
scope, report validation on both sides, aggregation (one device counts once, revocation) and
resolve's order (device > probe > rule; failing on N devices is not served)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from farm.core.catalog import load_catalog
from farm.core.errors import AccuracyBelowThresholdError, AccuracyUnverifiedError, NoMatchError, NotFoundError, UsageError
from registry import evidence
from registry.lite import SessionRows
from registry.reports import DeviceEvidence, device_verdicts, quarantined, record, record_many, revoke, summary
from registry.resolve import Device, rank, resolve
from registry.tokens import allows, create_token, token_identity
from tests.common.hostile_reports import CASES
from tests.common.index_rows import add_artifact, add_model
from workers.qnn.accuracy import PSNR_CAP, compare, seeded_inputs

# ---- figures ---------------------------------------------------------------------------------------


def test_compare_identical_noisy_and_broken_outputs() -> None:
    ref = np.linspace(-1, 1, 64, dtype=np.float32)
    assert compare(ref, ref) == {"psnr_db": PSNR_CAP, "cosine": 1.0, "max_abs_error": 0.0}
    noisy = ref + np.float32(1e-3)
    got = compare(ref, noisy)
    assert got["psnr_db"] == pytest.approx(60.0, abs=0.01)  # peak 1, mse 1e-6
    assert got["max_abs_error"] == pytest.approx(1e-3, rel=1e-3) and got["cosine"] > 0.999
    assert compare(ref, -ref)["cosine"] == pytest.approx(-1.0)
    nan = ref.copy()
    nan[3] = np.nan
    assert compare(ref, nan)["psnr_db"] == 0.0 and compare(ref, nan)["max_abs_error"] is None
    assert "shape" in compare(ref, ref[:10])["error"]


def test_seeded_inputs_are_deterministic_by_dtype_and_dynamic_dims() -> None:
    specs = [("x", "tensor(float)", ["batch", 3]), ("ids", "tensor(int64)", [2, -1]), ("m", "tensor(bool)", [4])]
    a = seeded_inputs(specs, 0, {"batch": 5})
    b = seeded_inputs(specs, 0, {"batch": 5})
    assert a["x"].shape == (5, 3) and a["x"].dtype == np.float32 and a["ids"].shape == (2, 1)
    assert a["ids"].dtype == np.int64 and a["m"].dtype == bool
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(seeded_inputs(specs, 1, {"batch": 5})["x"], a["x"])
    with pytest.raises(ValueError, match="no seeded input"):
        seeded_inputs([("s", "tensor(string)", [1])], 0, {})


def _view(status: str = "ok", outputs: list[dict[str, object]] | None = None) -> dict[str, object]:
    outputs = outputs if outputs is not None else [{"name": "y", "psnr_db": 9.8, "cosine": 0.83, "max_abs_error": 15.6},
                                                    {"name": "z", "psnr_db": 78.6, "cosine": 1.0, "max_abs_error": 0.007}]
    worst, name = evidence.summarize({"status": status, "outputs": outputs})
    return {"status": status, "outputs": outputs, "min_psnr_db": worst, "worst_output": name, "runtime": "qnn:2.51.0",
            "detail": None if status == "ok" else "skipped: over 300 s", "inputs": "seeded:0"}


def test_gate_names_the_worst_output_and_its_figures() -> None:
    art = "sha256:" + "a" * 64
    refusal = evidence.gate(_view(), 30.0, art)
    assert isinstance(refusal, AccuracyBelowThresholdError)
    assert "output 'y'" in refusal.message and "9.8 dB" in refusal.message and "cosine 0.83" in refusal.message
    assert "aaaaaaaaaaaa" in (refusal.hint or "")
    assert evidence.gate(_view(), 5.0, art) is None
    assert isinstance(evidence.gate(_view("skipped", []), 5.0, art), AccuracyUnverifiedError)
    assert isinstance(evidence.gate(None, 5.0, art), AccuracyUnverifiedError)
    assert evidence.summarize({"status": "ok", "outputs": _view()["outputs"]}) == (9.8, "y")
    assert evidence.headline([_view()]) == "9.8 dB" and evidence.headline([]) == "-"


def test_min_psnr_is_checked() -> None:
    from farm.pipeline.accuracy import check_min_psnr
    from farm.pipeline.submission import ReleaseRequest

    assert check_min_psnr(30) == 30.0 and check_min_psnr(None) is None
    for bad in (-1, 201, float("nan"), float("inf"), True):
        with pytest.raises(UsageError):
            check_min_psnr(bad)
        with pytest.raises(UsageError):
            ReleaseRequest.parse(["qnn:SM8650"], ["2.51.0"], {}, min_psnr=bad)
    assert ReleaseRequest.parse(["qnn:SM8650"], ["2.51.0"], {}, min_psnr=25).min_psnr == 25.0


def test_accuracy_rows_and_reuse(db) -> None:  # type: ignore[no-untyped-def]
    with db.session() as s:
        m = add_model(s)
        a, b = add_artifact(s, m.digest), add_artifact(s, m.digest, target="SM8750")
        key = evidence.numerics_key(m.digest, ["sha256:" + "1" * 64], "qnn", "2.51.0", evidence.SEEDED)
        assert key != evidence.numerics_key(m.digest, ["sha256:" + "2" * 64], "qnn", "2.51.0", evidence.SEEDED)
        row = evidence.record(s, a.id, "qnn", "2.51.0", evidence.SEEDED, key, {"status": "ok", **_view()})
        assert (row.min_psnr_db, row.worst_output) == (9.8, "y")
        again = evidence.record(s, a.id, "qnn", "2.51.0", evidence.SEEDED, key, {"status": "ok", **_view()})
        assert again.status == "ok" and len(evidence.of_artifacts(s, [a.id])[a.id]) == 1  # replaced
        assert evidence.reusable(s, key, b.id) is not None and evidence.reusable(s, key, a.id) is None
        crashed = evidence.numerics_key(m.digest, [], "qnn", "2.51.0", evidence.SEEDED)
        evidence.record(s, b.id, "qnn", "2.51.0", evidence.SEEDED, crashed,
                        {"status": "runtime-crashed", "detail": "signal 11"})
        assert evidence.reusable(s, crashed, a.id) is None, "a crash may be the host's: never reused"


# ---- scopes and report validation -------------------------------------------------------------------

def test_report_scope_is_apart_from_the_ladder(db) -> None:  # type: ignore[no-untyped-def]
    assert allows("report", "report") and allows("admin", "report")
    assert not any(allows("report", n) for n in ("read", "submit", "admin"))
    assert not allows("read", "report") and not allows("submit", "report") and not allows(None, "report")
    assert allows("admin", "read") and allows("submit", "read") and not allows("read", "submit")
    with db.session() as s:
        tok = create_token(s, "fleet", "report")
        ident = token_identity(s, tok)
        assert ident is not None and ident[1:] == ("fleet", "report")
        assert token_identity(s, tok + "x") is None and token_identity(s, "nope") is None


def _body(**over: object) -> dict[str, object]:
    return {"artifact": "sha256:" + "b" * 64, "device_id": "d1", "device_model": "Phone", "soc": "SM8650",
            "os": "Android 15", "arch": "aarch64", "runtime_version": "2.51.0", "onnxruntime": "1.31.1",
            "outcome": "loads", **over}


@pytest.mark.parametrize("over", [
    {"load_ms": "12"}, {"load_ms": True}, {"load_ms": -1}, {"load_ms": 1e12}, {"psnr_db": 500},
    {"outcome": "maybe"}, {"unknown": 1}, {"device_id": "../x"}, {"device_id": ""}, {"device_id": "x" * 129},
    {"error": "e" * 4001}, {"os": "a\x00b"}, {"reported_at": "2999-01-01T00:00:00Z"},
    {"reported_at": "2026-01-01T00:00:00"}, {"reported_at": "yesterday"}, {"reported_at": 5},
    {"runtime_version": "latest"}, {"artifact": "sha256:abc"}, {"fingerprint": "a b"},
])
def test_hostile_report_fields_are_refused(over: dict[str, object]) -> None:
    from farm.api.routes.reports import _parse

    with pytest.raises(UsageError):
        _parse(json.dumps(_body(**over)).encode())


@pytest.mark.parametrize("case", [c for c in CASES if c[2] == 400 and c[3] == "usage"], ids=lambda c: c[0])
def test_hostile_corpus_refused_by_validation(case: tuple[str, dict[str, object], int, str]) -> None:
    from farm.api.routes.reports import _parse
    from tests.common.hostile_reports import good_report

    with pytest.raises(UsageError):
        _parse(json.dumps(good_report("sha256:" + "b" * 64, **case[1])).encode())


@pytest.mark.parametrize("case", [c for c in CASES if c[2] == 422 or c[3] == "unknown-target"], ids=lambda c: c[0])
def test_hostile_corpus_refused_by_admission(case: tuple[str, dict[str, object], int, str]) -> None:
    """Parsed fine, then refused by ``registry.reports.admit`` against an SM8650 / QNN 2.51.0 build."""
    from farm.api.routes.reports import _parse
    from farm.core.errors import FarmError
    from registry.reports import ArtifactRef
    from registry.resolve import admit
    from tests.common.hostile_reports import good_report

    r = _parse(json.dumps(good_report("sha256:" + "b" * 64, **case[1])).encode())
    ref = ArtifactRef(1, "qnn", "SM8650", "2.51.0", "model_ctx.onnx", {})
    with pytest.raises(FarmError) as caught:
        admit(ref, load_catalog().get(r.soc, backend="qnn"), r.runtime_version, r.arch)
    assert caught.value.code == case[3]


def test_multi_soc_build_admits_only_its_socs_and_the_rule() -> None:
    from farm.core.errors import ReportRuntimeMismatchError, ReportSocMismatchError
    from registry.reports import ArtifactRef
    from registry.resolve import admit

    cat = load_catalog()
    ref = ArtifactRef(1, "qnn", "SM8650+SM8750", "2.51.0", "model_ctx.onnx", {})
    admit(ref, cat.get("SM8750", backend="qnn"), "2.51.0", "aarch64")
    admit(ref, cat.get("SM8650", backend="qnn"), "2.52.0", "armv7")
    with pytest.raises(ReportSocMismatchError):
        admit(ref, cat.get("SM8550", backend="qnn"), "2.51.0", "aarch64")
    with pytest.raises(ReportRuntimeMismatchError):
        admit(ref, cat.get("SM8650", backend="qnn"), "2.50.0", "aarch64")


def test_good_reports_parse() -> None:
    from farm.api.routes.reports import _parse

    now = datetime.now(UTC).isoformat()
    r = _parse(json.dumps(_body(load_ms=12, first_inference_ms=3.5, reported_at=now, error="x: y é 中")).encode())
    assert r.load_ms == 12.0 and r.reported_at is not None and r.error == "x: y é 中" and r.arch == "aarch64"
    assert _parse(json.dumps(_body(arch="arm64-v8a")).encode()).arch == "aarch64"
    for raw in (b"", b"[]", b"{", b"null"):
        with pytest.raises(UsageError):
            _parse(raw)


def test_client_side_report_is_checked_before_it_leaves() -> None:
    from farm.client_report import make_report

    body = make_report(artifact="sha256:" + "c" * 64, soc="SM8650", runtime_version="2.51.0", outcome="fails",
                       onnxruntime="1.31.1", device="dev-1", error="x" * 10_000 + "CAUSE", load_ms=3)
    assert body["error"].endswith("CAUSE") and len(body["error"]) == 4000 and body["load_ms"] == 3.0
    assert body["reported_at"].endswith("Z") and body["arch"]
    dirty = make_report(artifact="sha256:" + "c" * 64, soc="SM8650", runtime_version="2.51.0", outcome="fails",
                        onnxruntime="1.31.1", device="d", arch="arm64", device_model="P\x9b31m\u202eX",
                        error="line1\r\nline2\tend\u2028")
    from farm.core.text import unprintable

    assert unprintable(dirty["device_model"]) is None and unprintable(dirty["error"]) is None
    assert dirty["error"] == "line1  line2 end "
    for bad in ({"outcome": "ok"}, {"artifact": "x"}, {"load_ms": -1}, {"load_ms": float("nan")}, {"device": "a b"}):
        kw = {"artifact": "sha256:" + "c" * 64, "soc": "SM8650", "runtime_version": "2.51.0", "outcome": "loads",
              "onnxruntime": "1.31.1", "device": "d", **bad}
        with pytest.raises(UsageError):
            make_report(**kw)  # type: ignore[arg-type]


# ---- aggregation and resolve --------------------------------------------------------------------------

FIELDS = {"device_model": "Phone", "soc": "SM8650", "os": "Android", "arch": "aarch64", "runtime_backend": "qnn",
          "runtime_version": "2.51.0", "ort_version": "1.31.1", "outcome": "loads", "load_ms": 10.0}


def test_one_device_counts_once_and_revocation(db) -> None:  # type: ignore[no-untyped-def]
    with db.session() as s:
        m = add_model(s)
        a = add_artifact(s, m.digest)
        create_token(s, "t1", "report")
        create_token(s, "t2", "report")
        (t1, t2) = sorted(r[0] for r in s.execute(__import__("sqlalchemy").text("SELECT id FROM api_tokens")))
        first = record(s, a.id, t1, {**FIELDS, "device_id": "d1"})
        assert record(s, a.id, t1, {**FIELDS, "device_id": "d1", "load_ms": 30.0}) == first  # replaced
        ids = record_many(s, [(a.id, t1, {**FIELDS, "device_id": "d2", "load_ms": 20.0}),
                              (a.id, t1, {**FIELDS, "device_id": "d2", "load_ms": 20.0}),
                              (a.id, t2, {**FIELDS, "device_id": "d9", "outcome": "fails", "error": "QNN_X"})])
        assert ids[0] == ids[1] != ids[2]
        (entry,) = summary(s, [a.id])[a.id]
        assert (entry["devices"], entry["loads"], entry["fails"], entry["reports"]) == (3, 2, 1, 5)
        assert entry["load_ms_p50"] == 30.0 and entry["last_error"] == "QNN_X"
        ev = device_verdicts(SessionRows(s), [a.id], "qnn", "2.51.0", "SM8650")[a.id]
        assert (ev.loads, ev.fails) == (2, 1)
        assert device_verdicts(SessionRows(s), [a.id], "qnn", "2.51.0", "SM8750") == {}
        assert revoke(s, token_name="t1") == 2
        ev = device_verdicts(SessionRows(s), [a.id], "qnn", "2.51.0", "SM8650")[a.id]
        assert (ev.loads, ev.fails) == (0, 1)
        assert revoke(s, report_id=ids[2]) == 1 and summary(s, [a.id]) == {}
        # A device reporting again after revocation counts again.
        record(s, a.id, t1, {**FIELDS, "device_id": "d1"})
        assert summary(s, [a.id])[a.id][0]["loads"] == 1


def test_resolve_order_device_then_probe_then_rule(db) -> None:  # type: ignore[no-untyped-def]
    sm8650 = load_catalog().get("SM8650", backend="qnn")
    device = Device("qnn", sm8650, "2.51.0")
    with db.session() as s:
        m = add_model(s)
        older = add_artifact(s, m.digest, toolchain="2.47.0")
        newer = add_artifact(s, m.digest, toolchain="2.51.0")
        rows = SessionRows(s)
        art, v = resolve(rows, m.digest, device)
        assert art.id == newer.id and v.source == "rule"
        create_token(s, "fleet", "report")
        create_token(s, "other", "report")
        tok, tok2 = sorted(r[0] for r in s.execute(__import__("sqlalchemy").text("SELECT id FROM api_tokens")))
        record(s, older.id, tok, {**FIELDS, "device_id": "d1"})
        record(s, older.id, tok, {**FIELDS, "device_id": "d2"})
        art, v = resolve(rows, m.digest, device)
        assert art.id == newer.id and v.source == "rule", "one token's devices alone: no preference"
        record(s, older.id, tok2, {**FIELDS, "device_id": "e1"})
        art, v = resolve(rows, m.digest, device)
        assert art.id == older.id and v.source == "device" and "loaded on 3 device(s) (2 report tokens)" in v.reason
        for i in range(3):
            record(s, older.id, tok, {**FIELDS, "device_id": f"bad{i}", "outcome": "fails", "error": "E"})
        art, v = resolve(rows, m.digest, device)
        assert art.id == older.id and "3 failed" in v.reason, "loads on independent devices: still served"
        revoke(s, token_name="fleet")
        revoke(s, token_name="other")
        for i in range(3):
            record(s, newer.id, tok, {**FIELDS, "device_id": f"n{i}", "outcome": "crashed", "error": "SIGSEGV"})
        art, v = resolve(rows, m.digest, device)
        assert art.id == newer.id and v.source == "rule", "one token, three ids: not independent, still served"
        record(s, newer.id, tok2, {**FIELDS, "device_id": "m1", "outcome": "fails", "error": "E"})
        art, v = resolve(rows, m.digest, device)
        assert art.id == older.id and v.source == "rule", "failing on 4 devices of 2 tokens: not served"
        art, v = resolve(rows, m.digest, device, fail_devices=5)
        assert art.id == newer.id


def test_device_evidence_never_overrides_the_rule(db) -> None:  # type: ignore[no-untyped-def]
    """Reports that loads under an older runtime than the build's SDK (written past the service's
    check, straight into the table) never make resolve serve it to that runtime."""
    sm8650 = load_catalog().get("SM8650", backend="qnn")
    with db.session() as s:
        m = add_model(s)
        newer = add_artifact(s, m.digest, toolchain="2.51.0")
        create_token(s, "a", "report")
        create_token(s, "b", "report")
        t1, t2 = sorted(r[0] for r in s.execute(__import__("sqlalchemy").text("SELECT id FROM api_tokens")))
        for t in (t1, t2):
            record(s, newer.id, t, {**FIELDS, "device_id": f"d{t}", "runtime_version": "2.47.0"})
        with pytest.raises(NoMatchError):
            resolve(SessionRows(s), m.digest, Device("qnn", sm8650, "2.47.0"))


def test_token_revocation_withdraws_its_reports(db) -> None:  # type: ignore[no-untyped-def]
    from registry.tokens import revoke_token

    with db.session() as s:
        m = add_model(s)
        a = add_artifact(s, m.digest)
        create_token(s, "a", "report")
        create_token(s, "b", "report")
        t1, t2 = sorted(r[0] for r in s.execute(__import__("sqlalchemy").text("SELECT id FROM api_tokens")))
        for t in (t1, t2):
            for i in range(2):
                record(s, a.id, t, {**FIELDS, "device_id": f"d{i}", "outcome": "fails", "error": "E"})
        assert [q["artifact"] for q in quarantined(SessionRows(s), 3)] == [a.digest]
        revoke_token(s, "b")
        assert quarantined(SessionRows(s), 3) == []
        why = s.execute(__import__("sqlalchemy").text(
            "SELECT DISTINCT revoked_why FROM device_reports WHERE token_id = :t"), {"t": t2}).scalars().all()
        assert why == ["token revoked"]


def test_lift_strikes_the_failures_of_one_cell(db) -> None:  # type: ignore[no-untyped-def]
    from registry.reports import lift

    with db.session() as s:
        m = add_model(s)
        a = add_artifact(s, m.digest)
        create_token(s, "a", "report")
        create_token(s, "b", "report")
        t1, t2 = sorted(r[0] for r in s.execute(__import__("sqlalchemy").text("SELECT id FROM api_tokens")))
        for t in (t1, t2):
            for i in range(2):
                record(s, a.id, t, {**FIELDS, "device_id": f"d{i}", "outcome": "crashed", "error": "SIGSEGV"})
        (q,) = quarantined(SessionRows(s), 3)
        assert (q["failed_devices"], q["failed_tokens"], q["soc"], q["runtime"]) == (4, 2, "SM8650", "qnn:2.51.0")
        assert "behind 2 token(s)" in q["why"]
        with pytest.raises(NotFoundError):
            lift(s, a.id, "qnn", "2.51.0", "SM8750")
        assert lift(s, a.id, "qnn", "2.51.0", "SM8650") == 4
        assert quarantined(SessionRows(s), 3) == []


def test_rank_never_serves_another_soc_on_device_evidence() -> None:
    from tests.common.index_rows import T0

    sm8650 = load_catalog().get("SM8650", backend="qnn")

    class A:
        def __init__(self, id_: int, target: str):
            self.id, self.target, self.toolchain, self.options_digest = id_, target, "2.51.0", ""
            self.created_at = T0
            self.build = type("B", (), {"options": {}})()

    good, bad = rank([A(1, "SM8750")], Device("qnn", sm8650, "2.51.0"),
                     devices={1: DeviceEvidence(loads=5, last_at=T0 + timedelta(days=1))})
    assert good == [] and bad[0][1].source == "rule"


# ---- coverage tells the truth about evidence ------------------------------------------------------

def test_coverage_marks_cells_only_groups_or_multi_soc_built_as_unverified(db) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    from registry.coverage import coverage, models_page

    with db.session() as s:
        m = add_model(s)
        add_artifact(s, m.digest, target="SM8650+SM8750")  # SM8650 and SM8750 cells: multi-SoC only
        group = add_artifact(s, m.digest, target="SM8550")
        s.execute(text("UPDATE artifacts SET ctx_model = 'g0_ctx.onnx' WHERE id = :i"), {"i": group.id})
        add_artifact(s, m.digest, target="SM8650", toolchain="2.52.0")  # a plain one: verifiable
        add_artifact(s, m.digest, target="SM8750", toolchain="2.52.0")
        add_artifact(s, m.digest, target="SM8650+SM8750", toolchain="2.52.0")
    with db.session() as s:
        cells = {(c["target"], c["toolchain"]): c for c in coverage(s).to_dict()["cells"]}
        page = {(c["target"], c["toolchain"]): c for mc in models_page(s).models for c in mc.cells}
    for view in (cells, page):
        assert "multi-SoC" in view[("qnn:SM8650", "2.51.0")]["unverified"]
        assert "multi-SoC" in view[("qnn:SM8750", "2.51.0")]["unverified"]
        assert "graph group" in view[("qnn:SM8550", "2.51.0")]["unverified"]
        assert view[("qnn:SM8650", "2.52.0")]["unverified"] is None
        assert view[("qnn:SM8650", "2.51.0")]["via"] == ["qnn:SM8650+SM8750"]
    # Device confirmations beside it: a device of SM8750 loaded the multi-SoC binary.
    with db.session() as s:
        create_token(s, "fleet", "report")
        tok = s.execute(text("SELECT id FROM api_tokens")).scalar()
        multi = s.execute(text("SELECT id FROM artifacts WHERE target = 'SM8650+SM8750' AND toolchain = '2.51.0'")
                          ).scalar()
        record(s, multi, tok, {**FIELDS, "soc": "SM8750", "device_id": "p1"})
    with db.session() as s:
        cells = {(c["target"], c["toolchain"]): c for c in coverage(s).to_dict()["cells"]}
        page = {(c["target"], c["toolchain"]): c for mc in models_page(s).models for c in mc.cells}
    assert cells[("qnn:SM8750", "2.51.0")]["devices"] == page[("qnn:SM8750", "2.51.0")]["devices"] == 1
    assert cells[("qnn:SM8650", "2.51.0")]["devices"] == page[("qnn:SM8650", "2.51.0")]["devices"] == 0
    assert "multi-SoC" in cells[("qnn:SM8750", "2.51.0")]["unverified"]


def test_cli_coverage_table_shows_via_and_unverified(capsys) -> None:  # type: ignore[no-untyped-def]
    import argparse

    from farm.cli.ops_cmd import _print_coverage

    digest = "sha256:" + "a" * 64
    cov = {"toolchains": {"qnn": ["2.51.0"]}, "runtimes": {}, "models": [{"digest": digest, "tags": [], "name": "m"}],
           "cells": [{"model": digest, "tags": ["m:v1"], "target": "qnn:SM8650", "toolchain": "2.51.0",
                      "state": "built", "builds": 1, "codes": [], "probe_verified": False,
                      "via": ["qnn:SM8650+SM8750"], "unverified": "built only as a multi-SoC binary (...)",
                      "devices": 2, "verdicts": []}]}
    assert _print_coverage(cov, argparse.Namespace(json=False, verdicts=False)) == 0
    out = capsys.readouterr().out
    assert "built \u2713device\u00d72 unverified via SM8650+SM8750" in out


def test_report_triggers_touch_and_bump_only_on_what_can_change(db) -> None:  # type: ignore[no-untyped-def]
    """One token's reports never move a resolve answer: no generation bump (cached answers live);
    another token's do. A batch's coverage stays equal to a recompute (the first live loads of an
    (artifact, SoC) in a multi-row insert touches the cell)."""
    from sqlalchemy import text

    from registry.coverage import recomputed_matches

    def generation(s, digest):  # type: ignore[no-untyped-def]
        return s.execute(text("SELECT generation FROM model_generations WHERE model_digest = :m"),
                         {"m": digest}).scalar()

    with db.session() as s:
        m = add_model(s)
        a = add_artifact(s, m.digest)
        create_token(s, "a", "report")
        create_token(s, "b", "report")
        t1, t2 = sorted(r[0] for r in s.execute(text("SELECT id FROM api_tokens")))
    with db.session() as s:
        g0 = generation(s, m.digest)
        record_many(s, [(a.id, t1, {**FIELDS, "device_id": f"d{i}", "outcome": o})
                        for i, o in enumerate(["fails", "loads", "loads", "crashed"])])
        record_many(s, [(a.id, t1, {**FIELDS, "device_id": "d1"})])  # a replay
        assert generation(s, m.digest) == g0
        assert recomputed_matches(s) == []
        cell = s.execute(text("SELECT device_verified FROM coverage_cells WHERE model_digest = :m"),
                         {"m": m.digest}).scalar()
        assert cell == 1
        record_many(s, [(a.id, t2, {**FIELDS, "device_id": "e1"})])
        assert generation(s, m.digest) > g0
        revoke(s, token_name="a")
        revoke(s, token_name="b")
        assert recomputed_matches(s) == []
        assert s.execute(text("SELECT device_verified FROM coverage_cells WHERE model_digest = :m"),
                         {"m": m.digest}).scalar() == 0


def test_tensorrt_reports_obey_the_tensorrt_rule() -> None:
    """A GPU on x86_64 is a device (the farm has no GPU); the engine's GPU arch (unless built
    hardware-compatible) and its exact TensorRT version bind the report as they bind resolve."""
    from farm.core.errors import ReportRuntimeMismatchError, ReportSocMismatchError
    from registry.reports import ArtifactRef
    from registry.resolve import admit

    cat = load_catalog()
    ref = ArtifactRef(1, "trt", "sm_89", "10.14.1.48+linux-x86-64", "model_ctx.onnx", {})
    admit(ref, cat.get("sm_89", backend="trt"), "10.14.1.48+linux-x86-64", "x86_64")
    with pytest.raises(ReportSocMismatchError):
        admit(ref, cat.get("sm_86", backend="trt"), "10.14.1.48+linux-x86-64", "x86_64")
    with pytest.raises(ReportRuntimeMismatchError):
        admit(ref, cat.get("sm_89", backend="trt"), "10.13.0.35+linux-x86-64", "x86_64")
    compat = ArtifactRef(2, "trt", "sm_89", "10.14.1.48", "model_ctx.onnx", {"hardware_compatibility_level": "ampere_plus"})
    admit(compat, cat.get("sm_86", backend="trt"), "10.14.1.48", "aarch64")
    with pytest.raises(ReportSocMismatchError):
        admit(compat, cat.get("sm_75", backend="trt"), "10.14.1.48", "x86_64")
