"""Device lab evidence (registry.lab) on SQLite: medians, the speed-per-SDK flag, what counts
(enrolled devices of the SoC, outcome ok) and what does not (simulators, revoked devices), and
resolve's prefer-fastest never leaving what the compatibility rule serves. Reports go through
the real signature path (tests.common.lab)."""

from __future__ import annotations

import math

import pytest

from farm.core.catalog import load_catalog
from farm.core.errors import NoMatchError, UsageError
from farm.core.signed_reports import canonical
from registry.devices import revoke_device
from registry.lab import median, of_artifacts, of_models, slower, slower_text
from registry.lite import SessionRows
from registry.resolve import Device, describe, resolve
from registry.verification import ensure_jobs, parse_body
from tests.common.hostile_lab_reports import CASES, body_text
from tests.common.index_rows import add_artifact, add_model
from tests.common.lab import enroll_device, report_next


def test_median() -> None:
    assert median([]) is None and median([None]) is None
    assert median([3.0]) == 3.0
    assert median([48.0, 30.0, 40.0]) == 40.0
    assert median([29.0, 31.0]) == 30.0
    assert median([1.0, None, 5.0, math.nan]) == 3.0  # what is not a number takes no part


def test_slower_flags_at_one_point_two_times_the_fastest() -> None:
    assert slower({"2.49.40": 30.0, "2.51.0": 48.0}) == {"2.51.0": {"ratio": 1.6, "vs": "2.49.40", "vs_p50_ms": 30.0}}
    assert slower({"2.49.40": 30.0, "2.51.0": 36.0})["2.51.0"]["ratio"] == 1.2  # at the threshold: flagged
    assert slower({"2.49.40": 30.0, "2.51.0": 35.9}) == {}
    assert slower({"2.51.0": 48.0}) == {}  # nothing to compare with
    assert slower({"2.49.40": None, "2.51.0": 48.0}) == {}  # an SDK without timings takes no part
    three = slower({"2.47.0": 50.0, "2.49.40": 30.0, "2.51.0": 31.0})
    assert set(three) == {"2.47.0"} and three["2.47.0"]["vs"] == "2.49.40"
    assert slower({"2.49.40": 30.0, "2.51.0": 30.0}) == {}  # a tie flags nothing
    assert slower_text(slower({"2.49.40": 30.0, "2.51.0": 48.0})["2.51.0"]) == "slower: 1.6x vs QNN 2.49.40"
    assert slower_text(None) == ""


@pytest.fixture
def two_sdks(db):
    """One model, SM8650 artifacts built with QNN 2.49.40 and 2.51.0, two jobs each."""
    with db.session() as s:
        model = add_model(s, "m", name="mm").digest
        old = add_artifact(s, model, target="SM8650", toolchain="2.49.40")
        new = add_artifact(s, model, target="SM8650", toolchain="2.51.0")
        for art in (old, new):
            ensure_jobs(s, art.id, "SM8650", 3)
        yield s, model, old, new


def test_speed_per_sdk_simulator_and_revoked(two_sdks) -> None:
    s, model, old, new = two_sdks
    phones = [enroll_device(s, f"phone-{i}") for i in range(3)]
    sim = enroll_device(s, "sim", soc="simulator", arch="x86_64")
    other = enroll_device(s, "phone-8750", soc="SM8750")
    figures = {old.digest: [{"p50_ms": 29.0, "psnr_db": 60.0, "load_ms": 100.0},
                            {"p50_ms": 31.0, "psnr_db": 62.0, "load_ms": 120.0}],
               new.digest: [{"p50_ms": 47.0, "psnr_db": 61.0, "load_ms": 90.0},
                            {"p50_ms": 49.0, "psnr_db": 61.0, "load_ms": 110.0}]}
    for i, phone in enumerate(phones[:2]):
        for _ in range(2):  # each phone: both artifacts (one job of each cell)
            report_next(s, phone, {d: f[i] for d, f in figures.items()})
    rows = SessionRows(s)
    cells = of_models(rows, [model])
    a, b = cells[(model, "qnn", "SM8650", "2.49.40")], cells[(model, "qnn", "SM8650", "2.51.0")]
    assert (a.devices, a.p50_ms, a.psnr_db, a.load_ms, a.slower) == (2, 30.0, 61.0, 110.0, None)
    assert (b.devices, b.p50_ms) == (2, 48.0)
    assert b.slower == {"ratio": 1.6, "vs": "2.49.40", "vs_p50_ms": 30.0}

    # A simulator's report, however fast, is no device evidence: counted apart, timings unread.
    got, _ = report_next(s, sim, {old.digest: {"p50_ms": 0.1}, new.digest: {"p50_ms": 0.1}}, ["SM8650"])
    cells = of_models(rows, [model])
    sim_cell = cells[(model, "qnn", "SM8650", "2.51.0" if got == new.digest else "2.49.40")]
    assert sim_cell.simulator_reports == 1 and sim_cell.devices == 2
    assert cells[(model, "qnn", "SM8650", "2.51.0")].slower["ratio"] == 1.6
    assert cells[(model, "qnn", "SM8650", "2.49.40")].p50_ms == 30.0

    # A third phone reports the newer SDK fast; revoked, its report is struck and not counted.
    report_next(s, phones[2], {old.digest: {"p50_ms": 1.0}, new.digest: {"p50_ms": 1.0}})
    assert any(c.devices == 3 for c in of_models(rows, [model]).values())
    assert revoke_device(s, "phone-2") == 1
    cells = of_models(rows, [model])
    assert {k[3]: (c.devices, c.p50_ms) for k, c in cells.items()} == {"2.49.40": (2, 30.0), "2.51.0": (2, 48.0)}
    # A device of another SoC has no job of SM8650 (its SoC is the enrollment's, not the report's).
    from registry.verification import lease

    assert lease(s, other.row) is None
    per_artifact = of_artifacts(rows, {new.id: new.target})
    assert [c.to_dict()["devices"] for c in per_artifact[new.id]] == [2]


def test_resolve_prefers_the_fastest_only_when_asked_and_only_what_the_rule_serves(two_sdks) -> None:
    s, model, old, new = two_sdks
    phones = [enroll_device(s, f"phone-{i}") for i in range(2)]
    for phone in phones:
        for _ in range(2):
            report_next(s, phone, {old.digest: {"p50_ms": 30.0}, new.digest: {"p50_ms": 48.0}})
    rows = SessionRows(s)
    sm8650 = load_catalog().get("SM8650", backend="qnn")
    device = Device("qnn", sm8650, "2.51.0")
    plain, v = resolve(rows, model, device)
    assert plain.digest == new.digest and plain.preferred is None  # the rule's pick: the newest SDK
    assert describe(plain, v)["device_lab"] == [{"soc": "SM8650", "devices": 2, "failed": 0, "p50_ms": 48.0,
                                                 "psnr_db": None, "load_ms": None, "simulator_reports": 0}]
    fast, v = resolve(rows, model, device, prefer_fastest=True)
    assert fast.digest == old.digest
    assert describe(fast, v)["preferred"] == {"by": "device-latency", "p50_ms": 30.0, "devices": 2,
                                              "over": new.digest, "over_toolchain": "2.51.0", "over_p50_ms": 48.0}
    # Promotion makes its jobs on what resolve answers the agents, as the service is set.
    from registry.promotion import targets_of

    assert targets_of(s, model) == {"SM8650": new.id}
    assert targets_of(s, model, prefer_fastest=True) == {"SM8650": old.id}
    # Another SoC's device: no SM8650 artifact serves it, whatever was measured (the explained miss).
    sm8750 = Device("qnn", load_catalog().get("SM8750", backend="qnn"), "2.51.0")
    with pytest.raises(NoMatchError):
        resolve(rows, model, sm8750, prefer_fastest=True)


def test_prefer_fastest_never_serves_what_the_rule_refuses(two_sdks) -> None:
    s, model, old, new = two_sdks
    for phone in (enroll_device(s, "phone-0"), enroll_device(s, "phone-1")):
        for _ in range(2):  # the newer SDK is the fast one here
            report_next(s, phone, {old.digest: {"p50_ms": 48.0}, new.digest: {"p50_ms": 30.0}})
    rows = SessionRows(s)
    sm8650 = load_catalog().get("SM8650", backend="qnn")
    # A QNN 2.49.40 runtime can't load a context built with 2.51.0: the slower one it is, unflagged.
    got, v = resolve(rows, model, Device("qnn", sm8650, "2.49.40"), prefer_fastest=True)
    assert got.digest == old.digest and "preferred" not in describe(got, v)
    # A 2.51.0 runtime: the rule's pick is the fastest already, nothing preferred.
    got, v = resolve(rows, model, Device("qnn", sm8650, "2.51.0"), prefer_fastest=True)
    assert got.digest == new.digest and "preferred" not in describe(got, v)


def test_an_answer_without_lab_reports_is_unchanged(db) -> None:
    with db.session() as s:
        model = add_model(s, "m", name="mm").digest
        art = add_artifact(s, model, target="SM8650")
        device = Device("qnn", load_catalog().get("SM8650", backend="qnn"), "2.51.0")
        for prefer in (False, True):
            got, v = resolve(SessionRows(s), model, device, prefer_fastest=prefer)
            assert got.digest == art.digest
            assert "device_lab" not in describe(got, v) and "preferred" not in describe(got, v)


@pytest.mark.parametrize(("case", "field", "raw"), CASES, ids=[c[0] for c in CASES])
def test_absurd_figures_are_refused_by_parse_body(case: str, field: str, raw: str) -> None:
    good = {"job": 1, "nonce": "n" * 32, "device": "phone", "artifact": "sha256:" + "0" * 64, "soc": "SM8650",
            "outcome": "ok", "runs": 5, "p50_ms": 30.0, "psnr_db": 60.0, "load_ms": 100.0}
    assert parse_body(canonical(good))["p50_ms"] == 30.0
    with pytest.raises(UsageError, match=f"body.{field}"):
        parse_body(body_text(good, field, raw))


def test_a_revoked_device_token_strikes_its_lab_reports_and_every_cache_hears_of_it(two_sdks) -> None:
    from registry.tokens import revocation_version, revoke_token

    s, model, old, new = two_sdks
    a, b = enroll_device(s, "phone-a"), enroll_device(s, "phone-b")
    for phone in (a, b):
        report_next(s, phone, {old.digest: {"p50_ms": 30.0}, new.digest: {"p50_ms": 48.0}})
    rows = SessionRows(s)
    assert sum(c.devices for c in of_models(rows, [model]).values()) == 2
    version = revocation_version(s)
    revoke_token(s, "device:phone-a")  # the device's bearer token, revoked as a token
    assert sum(c.devices for c in of_models(rows, [model]).values()) == 1
    assert revocation_version(s) == version + 1
    revoke_device(s, "phone-b")  # revoking the device revokes its token: caches must hear of it too
    assert revocation_version(s) == version + 2
    assert of_models(rows, [model]) == {}


def test_jobs_for_every_sdk_go_to_agents_of_the_runtime_resolve_answers_them(db) -> None:
    from farm.core.errors import NotFoundError
    from registry.promotion import sdk_jobs
    from registry.verification import lease

    with db.session() as s:
        model = add_model(s, "m", name="mm").digest
        old = add_artifact(s, model, target="SM8650", toolchain="2.49.40")
        new = add_artifact(s, model, target="SM8650", toolchain="2.51.0")
        add_artifact(s, model, target="SM8650+SM8750", toolchain="2.51.0")  # multi-SoC: no jobs of its own
        rows = sdk_jobs(s, model, 2)
        assert [(r["soc"], r["toolchain"], r["artifact"], r["jobs_made"], r["jobs_open"]) for r in rows] == [
            ("SM8650", "2.49.40", old.digest, 2, 2), ("SM8650", "2.51.0", new.digest, 2, 2)]
        assert [r["jobs_made"] for r in sdk_jobs(s, model, 2)] == [0, 0]  # made once
        with pytest.raises(UsageError):
            sdk_jobs(s, model, 0)
        with pytest.raises(NotFoundError):
            sdk_jobs(s, add_model(s, "other", name="other").digest, 1)
        # An agent on QNN 2.51.0 is answered the 2.51.0 artifact: it never takes the 2.49.40 job,
        # which goes to an agent on 2.49.40.
        newer = enroll_device(s, "phone-251")
        older = enroll_device(s, "phone-249")
        first = lease(s, newer.row, runtime="2.51.0")
        assert first is not None and first.artifact == new.digest
        assert lease(s, newer.row, runtime="2.51.0") is None
        got = lease(s, older.row, runtime="2.49.40")
        assert got is not None and got.artifact == old.digest
