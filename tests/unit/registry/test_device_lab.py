"""The device lab's index rules on SQLite: enrollment tokens are single use and expire; leases
go to one device, come back when they run out, never twice to one device for one cell; a
promotion moves and gates its tag; a rollback; revocation strikes."""

from __future__ import annotations

import base64
import os
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from farm.core.errors import (
    EnrollmentInvalidError,
    LeaseLostError,
    NotDeviceEvidenceError,
    TagConflictError,
    TagGatedError,
    UsageError,
)
from registry.devices import create_enrollment, enroll, list_devices, parse_duration, revoke_device
from registry.index import delete_tag, set_tag
from registry.models import Device, VerificationJob
from registry.promotion import promote, rollback, ungate
from registry.verification import ensure_jobs, lease, renew
from tests.common.index_rows import add_artifact, add_model

KEY = base64.b64encode(bytes(range(32))).decode()


def _device(s, name: str, soc: str = "simulator", arch: str = "x86_64") -> Device:
    key = base64.b64encode(os.urandom(32)).decode()
    return enroll(s, create_enrollment(s, name).token, key, soc, {"arch": arch})[0]


def test_an_enrollment_token_is_single_use_and_expires(db) -> None:
    with db.session() as s:
        tok = create_enrollment(s, "a").token
        dev, bearer = enroll(s, tok, KEY, "simulator", {"arch": "x86_64"})
        assert dev.simulator and dev.key_id and bearer.startswith("cfk_")
        with pytest.raises(EnrollmentInvalidError, match="already used"):
            enroll(s, tok, KEY, "simulator", {"arch": "x86_64"})
        late = create_enrollment(s, "b").token
        s.execute(update(Device).where(Device.name == "b").values(enroll_expires_at=datetime.now(UTC) - timedelta(1)))
        with pytest.raises(EnrollmentInvalidError, match="expired"):
            enroll(s, late, KEY, "simulator", {"arch": "x86_64"})
        with pytest.raises(EnrollmentInvalidError, match="unknown"):
            enroll(s, "cfe_nope", KEY, "simulator", {"arch": "x86_64"})
        with pytest.raises(UsageError, match="enrolled already"):
            enroll(s, create_enrollment(s, "twin").token, KEY, "simulator", {"arch": "x86_64"})
        with pytest.raises(NotDeviceEvidenceError):
            _device(s, "c", soc="SM8650", arch="x86_64")
        phone = _device(s, "d", soc="snapdragon-8-gen-3", arch="arm64-v8a")
        assert phone.soc == "SM8650" and not phone.simulator and phone.facts["arch"] == "aarch64"
        assert {d["name"]: d["state"] for d in list_devices(s)} == {"a": "enrolled", "b": "expired", "c": "waiting",
                                                                    "d": "enrolled", "twin": "waiting"}


def test_leases_one_device_each_and_back_when_run_out(db) -> None:
    with db.session() as s:
        model = add_model(s, "m", name="mm").digest
        art = add_artifact(s, model, target="SM8650")
        assert ensure_jobs(s, art.id, "SM8650", 2) == 2 and ensure_jobs(s, art.id, "SM8650", 2) == 0
        a, b = _device(s, "a"), _device(s, "b")
        phone = _device(s, "p", soc="SM8750", arch="aarch64")
        first = lease(s, a)
        assert first is not None and first.soc == "SM8650"
        assert lease(s, a) is None  # never a second job of a cell it holds
        assert lease(s, phone) is None  # another SoC's jobs
        assert lease(s, b, ["SM8750"]) is None  # narrowed to another SoC
        assert lease(s, a, runtime="2.47.0") is None  # built with a newer SDK than the agent's
        second = lease(s, b)
        assert second is not None and second.job_id != first.job_id
        c = _device(s, "c")
        assert lease(s, c) is None
        s.execute(update(VerificationJob).where(VerificationJob.id == first.job_id)
                  .values(lease_until=datetime.now(UTC) - timedelta(seconds=1)))
        taken = lease(s, c)
        assert taken is not None and taken.job_id == first.job_id and taken.nonce != first.nonce
        # Renewing: the holder with its nonce, nobody else.
        assert renew(s, c, taken.job_id, taken.nonce, lease_s=60) > datetime.now(UTC) + timedelta(seconds=50)
        for who, nonce in ((a, first.nonce), (a, taken.nonce), (c, first.nonce), (b, taken.nonce)):
            with pytest.raises(LeaseLostError):
                renew(s, who, taken.job_id, nonce)


def test_promotion_gates_its_tag_and_rolls_back(db) -> None:
    with db.session() as s:
        old = add_model(s, "old", name="mm").digest
        new = add_model(s, "new", name="mm").digest
        add_artifact(s, new, target="SM8650")
        set_tag(s, "mm", "stable", old)
        set_tag(s, "mm", "cand", new)
        out = promote(s, "mm", "cand", "stable", "devices>=1 per soc")
        assert out["met"] is False and out["account"]["socs"]["SM8650"]["jobs_open"] == 1
        from registry.models import DeviceVerification

        dev = _device(s, "a")
        job = lease(s, dev)
        s.add(DeviceVerification(job_id=job.job_id, device_id=dev.id, artifact_id=s.get(VerificationJob, job.job_id)
                                 .artifact_id, soc="SM8650", simulator=True, nonce=job.nonce, outcome="ok", body={},
                                 signature="x"))
        s.flush()
        assert promote(s, "mm", "cand", "stable", "devices>=1 per soc")["met"] is False  # simulator
        out = promote(s, "mm", "cand", "stable", "devices>=1 per soc", allow_simulator=True, by="ops")
        assert out["moved"] and out["previous"] == old and out["digest"] == new
        with pytest.raises(TagGatedError):
            set_tag(s, "mm", "stable", old, force=True)
        with pytest.raises(TagGatedError):
            delete_tag(s, "mm", "stable")
        back = rollback(s, "mm", "stable", by="ops")
        assert back["digest"] == old and back["previous"] == new
        with pytest.raises(TagGatedError):
            set_tag(s, "mm", "stable", new, force=True)
        assert ungate(s, "mm", "stable") and not ungate(s, "mm", "stable")
        with pytest.raises(TagConflictError):
            set_tag(s, "mm", "stable", new)  # ungated: the plain rule again
        assert set_tag(s, "mm", "stable", new, force=True).moved
        assert revoke_device(s, "a") == 1
        assert promote(s, "mm", "cand", "stable", "devices>=1 per soc", allow_simulator=True)["met"] is False


def test_durations() -> None:
    assert [parse_duration(d) for d in ("90", "90s", "30m", "12h", "7D", "30d")] == [90, 90, 1800, 43200, 604800, 2592000]
    for bad in ("0", "31d", "-1h", "1w", "", "h", "1.5h"):
        with pytest.raises(UsageError, match="--expires"):
            parse_duration(bad)


def test_jobs_are_for_what_resolve_serves_each_soc(db) -> None:
    from registry.promotion import targets_of

    with db.session() as s:
        model = add_model(s, "m", name="mm").digest
        plain = add_artifact(s, model, target="SM8650", toolchain="2.51.0")
        add_artifact(s, model, target="SM8650", toolchain="2.51.0", options={"graph_optimization": 3})
        older_sdk = add_artifact(s, model, target="SM8750", toolchain="2.47.0")
        add_artifact(s, model, target="SM8550", status="broken")
        add_artifact(s, model, target="SM8650+SM8750", toolchain="2.51.0")
        got = targets_of(s, model)
        assert set(got) == {"SM8650", "SM8750"} and got["SM8750"] == older_sdk.id
        assert got["SM8650"] == plain.id  # resolve's order: default options before the newest build


def test_a_lease_finds_the_devices_job_however_deep_in_the_queue(db) -> None:
    """Sixty open jobs ahead of it that this agent may not take (built with a newer SDK than its
    runtime, another SoC's, a cell it reported on): the one it may take is still found."""
    with db.session() as s:
        for i in range(60):
            model = add_model(s, f"new-{i}", name=f"new{i}").digest
            ensure_jobs(s, add_artifact(s, model, target="SM8650", toolchain="2.51.0").id, "SM8650", 1)
            ensure_jobs(s, add_artifact(s, model, target="SM8750", toolchain="2.47.0").id, "SM8750", 1)
        old = add_model(s, "old", name="old").digest
        want = add_artifact(s, old, target="SM8650", toolchain="2.47.0")
        ensure_jobs(s, want.id, "SM8650", 1)
        phone = _device(s, "p", soc="SM8650", arch="aarch64")
        got = lease(s, phone, runtime="2.47.0")
        assert got is not None and got.artifact == want.digest and got.soc == "SM8650"
        assert lease(s, phone, runtime="2.47.0") is None  # nothing else it may take
        sim = _device(s, "sim")
        got = lease(s, sim, ["SM8650"], runtime="2.47.0")  # a simulator narrowed to one SoC
        assert got is None  # the only 2.47.0 SM8650 job is held by the phone
        assert lease(s, sim, ["SM8750"], runtime="2.47.0") is not None
